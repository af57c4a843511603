# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The attributes the collection's modules document (community.general's attributes fragment shape).

``dflash.trainer.attributes``: what check_mode and diff_mode mean; the module sets ``support``
(and ``details``). ``dflash.trainer.attributes.read_only``: a module that changes nothing.
A module's own keys win over the fragment's."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
"""

    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    description: Read-only; runs the same in check mode.
  diff_mode:
    support: none
    description: Returns no diff (changes nothing).
"""
