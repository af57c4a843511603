# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_group (documented in the module): a trainer group's decisions,
made here from what every member registered (plugin_utils/_group.py, pure and tested) - the role's group flow
registers the answer and carries it out; its `when:`s read the answer's fields and decide nothing.

No remote call: the action reads the play's variables (``hostvars``, ``groups``, the hosts in the run) and
fails by itself, with the words, where the group stops (a stray host, a refused plan, a failed restart, a member
that did not stay up). An answer with words to say (each member's first read, the group left running, what check
mode would restart) carries them as its ``msg``, shown alone by the stdout callback (plugins/callback/concise.py).
The group's barriers are judged by the tasks that follow them (``group_barrier``: plugin_utils/_group.py)."""
from __future__ import annotations

import secrets

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.dflash.trainer.plugins.plugin_utils._group import (
    Play,
    end_failure,
    group_plan,
    member_plan,
    strays,
)

KINDS = ("stray", "plan", "end")


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("kind", "results", "phase", "then", "health", "lock_token"))
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        result["changed"] = False
        args = self._task.args
        kind = args.get("kind")
        if kind not in KINDS:
            raise AnsibleActionFail("kind must be one of %s, not %r" % (", ".join(KINDS), kind))
        play = Play(self, task_vars)
        if kind == "stray":
            result.update(self._stray(play))
            return self._failed(result, result["alone"] and result["refused"])
        if kind == "end":  # the group's run ends: the verdict's failure (the rollback's, when it ran), else the watch's
            failure = end_failure(dict(play.var("__trainer_group_done", {}) or {}),
                                  dict(play.var("__trainer_group_rollback", {}) or {}))
            if failure:
                return self._failed(result, failure)
        judged = play.judged(dict((k, args[k]) for k in ("results", "phase", "then", "health") if args.get(k)))
        result.update(judged["fields"])
        if judged["stop"]:
            return self._failed(result, judged["stop"])
        if kind == "plan":
            result.update(self._plan(play, args))
        return result

    def _plan(self, play, args):
        """The group's plan from every member's first read (``results``), and this member's part of it."""
        name, members = play.group()
        read = args.get("results") or ""
        plans = dict((m, play.of(m, read).get("plan") or {}) for m in members)
        plan = group_plan(name, members, plans, list(play.var("ansible_play_hosts_all", []) or []))
        if plan["refused"]:
            return dict(plan, failed=True, msg=plan["refused"])
        digits = "".join(secrets.choice("0123456789") for _i in range(8))
        out = member_plan(plan, play.me, self._play_context.check_mode, args.get("lock_token") or "", digits)
        # what this member's first read reports (the last restart job, ...), then what the plan says
        report = list(play.of(play.me, read).get("report") or [])
        said = report + ([out["words"]] if out["says"] else [])
        if said:
            out.update(msg=said if report else out["words"], _ansible_verbose_always=True)
        return out

    def _stray(self, play):
        """Whether this host is deployed alone (its trainer_group is empty) and why it may not be: a host of one of
        its inventory groups names that group as its trainer_group."""
        refused = None
        name = play.var("trainer_group", "") or ""
        hostvars = play.hostvars
        if not name:
            for group in hostvars[play.me].get("group_names") or []:
                hosts = [h for h in hostvars if group in (hostvars[h].get("group_names") or [])]
                if any(play.own_group(h) == group for h in hosts):
                    refused = strays(group, hosts, dict((h, play.own_group(h)) for h in hosts))
                    break
        return dict(alone=not name, refused=refused)

    @staticmethod
    def _failed(result, why):
        if why:
            result.update(failed=True, msg=why)
        return result
