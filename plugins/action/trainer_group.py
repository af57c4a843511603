# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_group (documented in the module): a trainer group's decisions,
made here from what every member registered (plugin_utils/_group.py, pure and tested) - the role's group flow
registers the answer and carries it out; its `when:`s read the answer's fields and decide nothing.

No remote call: the action reads the play's variables (``hostvars``, ``groups``, the hosts in the run) and
fails by itself, with the words, where the group stops (a member outside the run, a barrier one member failed,
a refused plan). An answer with words to say (the group left running, what check mode would restart, the group
proved) carries them as its ``msg``, shown alone by the stdout callback (plugins/callback/concise.py)."""
from __future__ import annotations

import secrets

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.dflash.trainer.plugins.plugin_utils._group import (
    after_job,
    barrier,
    group_plan,
    member_plan,
    not_whole,
    strays,
    verdict,
)
from ansible_collections.dflash.trainer.plugins.module_utils.plan.decide import last_ran

KINDS = ("stray", "whole", "barrier", "plan", "jobs", "verdict")


def _dict(value):
    return dict(value) if hasattr(value, "keys") else {}


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("kind", "results", "phase", "then", "health", "job", "lock_token"))
    _supports_check_mode = True

    def _var(self, task_vars, name, default=None):
        value = task_vars.get(name, default)
        return self._templar.template(value) if value is not None else default

    def _of(self, hostvars, member, name):
        """``name`` as ``member`` registered it ({} when it did not)."""
        try:
            return _dict(hostvars[member].get(name))
        except KeyError:
            return {}

    def _own_group(self, hostvars, member):
        try:
            return hostvars[member].get("trainer_group") or ""
        except KeyError:  # not known here: not judged
            return None

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        result["changed"] = False
        args = self._task.args
        kind = args.get("kind")
        if kind not in KINDS:
            raise AnsibleActionFail("kind must be one of %s, not %r" % (", ".join(KINDS), kind))
        hostvars = task_vars.get("hostvars") or {}
        me = task_vars.get("inventory_hostname")
        name = self._var(task_vars, "trainer_group", "") or ""
        if kind == "stray":
            result.update(self._stray(hostvars, me, name))
            return self._failed(result, result["alone"] and result["refused"])
        members = list((task_vars.get("groups") or {}).get(name) or [])
        if not members:
            raise AnsibleActionFail("trainer group %r has no members (is trainer_group an inventory group?)" % name)
        alive = list(self._var(task_vars, "ansible_play_hosts", []) or [])
        if kind == "whole":
            own = dict((m, self._own_group(hostvars, m)) for m in members)
            result["refused"] = strays(name, members, own) or not_whole(
                name, members, list(self._var(task_vars, "ansible_play_hosts_all", []) or []))
            return self._failed(result, result["refused"])
        results = args.get("results") or ""
        if results:  # every member passed the phase that registered ``results``, or the group stops here
            passed = barrier(members, dict((m, self._of(hostvars, m, results)) for m in members if m in hostvars),
                             args.get("phase") or results, alive=alive, health=bool(args.get("health")))
            result["barrier"] = passed
            if passed["failed"]:
                then = args.get("then") or ""
                return self._failed(result, passed["words"] + ("; %s" % then if then else ""))
        if kind == "plan":
            plans = dict((m, self._of(hostvars, m, results).get("plan") or {}) for m in members)
            plan = group_plan(name, members, plans, list(self._var(task_vars, "ansible_play_hosts_all", []) or []))
            if plan["refused"]:
                return self._failed(dict(result, **plan), plan["refused"])
            digits = "".join(secrets.choice("0123456789") for _i in range(8))
            result.update(member_plan(plan, me, self._play_context.check_mode, args.get("lock_token") or "", digits))
            if result["says"]:  # the group left running, or what check mode would restart
                result.update(msg=result["words"], _ansible_verbose_always=True)
        elif kind == "jobs":
            outcomes = dict((m, last_ran([self._of(hostvars, m, "__trainer_job_watch"),
                                          self._of(hostvars, m, "__trainer_job_start")])) for m in members)
            result["outcome"] = outcomes.get(me) or {}
            result["check"] = bool(verdict(members, outcomes)["ok"])
        elif kind == "verdict":
            result.update(self._verdict(task_vars, hostvars, members, me, args))
            if result["report"]:  # the group proved
                result.update(msg=result["said"], _ansible_verbose_always=True)
        return result

    def _stray(self, hostvars, me, name):
        """Whether this host is deployed alone (its trainer_group is empty) and why it may not be: a host of one of
        its inventory groups names that group as its trainer_group."""
        refused = None
        if not name:
            for group in hostvars[me].get("group_names") or []:
                hosts = [h for h in hostvars if group in (hostvars[h].get("group_names") or [])]
                if any(self._own_group(hostvars, h) == group for h in hosts):
                    refused = strays(group, hosts, dict((h, self._own_group(hostvars, h)) for h in hosts))
                    break
        return dict(alone=not name, refused=refused)

    def _verdict(self, task_vars, hostvars, members, me, args):
        job = args.get("job") or "restart"
        jobs = dict((m, self._of(hostvars, m, "__trainer_group_jobs").get("outcome") or {}) for m in members)
        checks = dict((m, self._of(hostvars, m, "__trainer_group_check")) for m in members)
        plan = _dict(self._var(task_vars, "__trainer_group_plan", {}))
        before = _dict(self._var(task_vars, "__trainer_group_done", {})).get("restart") if job == "rollback" else None
        out = after_job(job, verdict(members, jobs, checks), plan.get("rollback_release"), before,
                        self._var(task_vars, "trainer_watch_s", 0))
        validated = _dict(self._var(task_vars, "__trainer_validated", {}))
        out["source"] = (validated.get("source") or "") if job == "restart" else ""
        outcome = _dict(jobs.get(me)).get("result") or {}
        out["said"] = ["%s: release %s" % (out["words"], plan.get("release")),
                       "%s ready: %s" % (self._var(task_vars, "trainer_unit_name", ""),
                                         _dict(outcome).get("outcome") or "")]
        return out

    @staticmethod
    def _failed(result, why):
        if why:
            result.update(failed=True, msg=why)
        return result
