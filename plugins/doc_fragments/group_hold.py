# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The O(group_hold) option of the tasks a trainer group runs on every member at once (trainer_lock,
trainer_release, trainer_restart): handled by their action plugins (plugins/plugin_utils/_group_hold.py)."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  group_hold:
    description:
      - A trainer group's member (the controller's own option, never sent to the target). Once this member's own
        work in the task ended, the task renews its deploy lock (M(dflash.trainer.trainer_lock) C(state=renew), every
        quarter lease) until every member's task ended, so that no member's lease runs out while the play waits for
        the slowest one. A killed controller renews nothing, and every lease then runs out on its own.
      - C(key) (the same on every member), C(phase) (which task), C(me), C(members) (every member that runs the
        task), C(lock) (path, token, lease_s; none - nothing renewed) and C(run) (false - nothing to do on this
        member; the task is skipped, but for the hold).
      - Not held (a warning) when the members outnumber the play's forks.
    type: dict
"""
