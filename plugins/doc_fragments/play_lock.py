# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The O(lock) option of the modules a play runs under its deploy lock before the restart job
takes the lease over (trainer_release)."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  lock:
    description:
      - The play's deploy lock (C(path), C(token), C(lease_s)). Its lease is renewed from a thread while the
        module works, however long that takes (a big upload, a slow pre-flight), and only while the play's
        connection holds the module - a killed C(ansible-playbook) stops the renewals, so its lock lapses
        within one lease. Omit to renew nothing.
    type: dict
    suboptions:
      path:
        description: The lock.
        type: path
        required: true
      token:
        description: This play's token.
        type: str
        required: true
      lease_s:
        description: The lease (seconds).
        type: int
        required: true
"""
