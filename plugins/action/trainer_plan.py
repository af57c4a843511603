# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_plan (documented in the module): Ansible's own run of the
module, its payload kept between runs (plugins/plugin_utils/_payload_cache.py)."""
from __future__ import annotations

from ansible.plugins.action.normal import ActionModule as NormalAction
from ansible.utils.display import Display

from ansible_collections.dflash.trainer.plugins.plugin_utils._freezer import frozen_checked
from ansible_collections.dflash.trainer.plugins.plugin_utils._group import barrier_first
from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload
from ansible_collections.dflash.trainer.plugins.plugin_utils._watch import outcome, say_start

display = Display()


class ActionModule(KeptPayload, NormalAction):
    """dflash.trainer.trainer_plan, run as ansible.builtin.normal runs a module; the phases of a restart job
    it started (and watched for its first wait) said as the watch says them, and what the role shows of its end
    when it ended within this call (RV(job_start)'s V(ok), V(words), V(fail_msg): plugin_utils/_watch.py) - the
    proof of a restart that ended proved within this call, with nothing after it (the plan's V(done)), is the end
    of RV(report), which the role shows before it ends the run. Its call
    fails at once, naming the freeze, when the container is frozen (the pct connection's frozen_check)."""

    def run(self, tmp=None, task_vars=None):
        judged = barrier_first(self, task_vars)  # a trainer group's barrier, before anything (plugin_utils/_group.py)
        if judged is not None:
            return judged
        # the deploy's first contact: a frozen container is named, not waited for (connection dflash.trainer.pct)
        with frozen_checked(self._connection):
            result = super().run(tmp, task_vars)
        job = result.get("job_start")
        say_start(display, (task_vars or {}).get("inventory_hostname", "?"), job)
        if isinstance(job, dict) and job.get("started") and job.get("finished"):
            job.update(outcome(job, self._task.args.get("unit") or "", job.get("reasons")))
        plan = result.get("plan") if isinstance(result.get("plan"), dict) else {}
        if plan.get("done") and isinstance(job, dict):  # the run ends with this report: the proof is its last lines
            result["report"] = list(result.get("report") or []) + list(job.get("words") or [])
            result["has_report"] = bool(result["report"])
        return result
