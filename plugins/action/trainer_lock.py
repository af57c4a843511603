# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_lock (documented in the module): Ansible's own run of the
module, its payload kept between runs (plugins/plugin_utils/_payload_cache.py).

With ``group_hold`` (the controller's own option, never sent to the target): a trainer group's member that took
its lock renews it until every member's task took theirs (plugin_utils/_group_hold.py).

With ``holder`` (the controller's own option, never sent to the target): who holds the lock after the run's
calls that could hand it over (module_utils/plan/decide.py ``last_lock_holder``: play, job, nobody or unknown). A
release (O(state=absent)) runs only when the play holds it, and not in check mode: the task is skipped
otherwise - the restart job frees a lock it took over, the first read one it freed already."""
from __future__ import annotations

from ansible.plugins.action.normal import ActionModule as NormalAction
from ansible.utils.display import Display

from ansible_collections.dflash.trainer.plugins.plugin_utils._group_hold import run_held
from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload

display = Display()


class ActionModule(KeptPayload, NormalAction):
    """dflash.trainer.trainer_lock, run as ansible.builtin.normal runs a module; a group's member held."""

    def run(self, tmp=None, task_vars=None):
        args = dict(self._task.args)
        holder = args.pop("holder", None)
        self._task.args = args
        if holder is not None and (holder != "play" or self._play_context.check_mode):
            return dict(skipped=True, changed=False,
                        skip_reason="the deploy lock is not the play's to release (held by: %s%s)"
                        % (holder, "; check mode" if holder == "play" else ""))
        return run_held(self, super().run, tmp, task_vars, display)
