# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_lock (documented in the module): Ansible's own run of the
module, its payload kept between runs (plugins/plugin_utils/_payload_cache.py).

With ``group_hold`` (the controller's own option, never sent to the target): a trainer group's member that took
its lock renews it until every member's task took theirs (plugin_utils/_group_hold.py)."""
from __future__ import annotations

from ansible.plugins.action.normal import ActionModule as NormalAction
from ansible.utils.display import Display

from ansible_collections.dflash.trainer.plugins.plugin_utils._group_hold import run_held
from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload

display = Display()


class ActionModule(KeptPayload, NormalAction):
    """dflash.trainer.trainer_lock, run as ansible.builtin.normal runs a module; a group's member held."""

    def run(self, tmp=None, task_vars=None):
        return run_held(self, super().run, tmp, task_vars, display)
