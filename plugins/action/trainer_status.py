# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_status (documented in the module): Ansible's own run of the
module, its payload kept between runs (plugins/plugin_utils/_payload_cache.py); before it, the entry point's input
check (O(check)); after it, the lines the entry point shows (O(show)); or, with O(verdict), status's verdict from
the reads registered earlier in the play - nothing read on the target."""
from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.dflash.trainer.plugins.module_utils.plan.target_checks import message
from ansible_collections.dflash.trainer.plugins.plugin_utils._freezer import frozen_checked
from ansible_collections.dflash.trainer.plugins.plugin_utils._group import as_one
from ansible_collections.dflash.trainer.plugins.plugin_utils._input_check import entry_check
from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload
from ansible_collections.dflash.trainer.plugins.plugin_utils._reads import (
    as_expected,
    history_lines,
    log_lines,
    status_verdict,
)

# the fact a group's verdict is set as (the collection's API reads it: dflash_trainer/results.py GROUP_STATUS_FACT)
GROUP_STATUS_FACT = "__trainer_group_status"
# O(show): the lines of a read each read-only entry point shows
SHOWN = {"log": log_lines, "history": history_lines}
# O(check): the entry points whose whole input check this action runs (the deploy's run trainer_validate)
CHECKED = ("status",)


def reads(members, hostvars, var):
    """What each member registered as ``var`` (member -> its result, {} when not a dict); a member not known here
    is left out."""
    out = {}
    for m in members:
        try:
            value = hostvars[m].get(var)
        except KeyError:
            continue
        out[m] = value if isinstance(value, dict) else {}
    return out


def judge_group(group, hostvars):
    """``group`` (name, members, read: the variable every member registered its read in, in_run: the hosts of this
    run) judged as one proved job from ``hostvars`` -> dict(group_status, group_failed, ansible_facts)."""
    if not isinstance(group, dict) or not group.get("members") or not group.get("read"):
        raise AnsibleActionFail("group needs name, members (the group's hosts) and read (the variable of their reads)")
    members, in_run = list(group["members"]), group.get("in_run")
    status = as_one(group.get("name") or "", members, reads(members, hostvars, group["read"]),
                    None if in_run is None else list(in_run))
    return dict(group_status=status, group_failed=status.get("ok") is False, ansible_facts={GROUP_STATUS_FACT: status})


def judge(unit, verdict, task_vars):
    """O(verdict) (read: the variable this host and every member of its group registered its read in, group: its
    trainer group's name or empty, in_run: the hosts of this run) -> the task's result: status_verdict of this host's
    read and, for a member, of its group as a whole (also set as the fact GROUP_STATUS_FACT)."""
    if not isinstance(verdict, dict) or not verdict.get("read"):
        raise AnsibleActionFail("verdict needs read (the variable this host registered its read in)")
    hostvars = task_vars.get("hostvars") or {}
    host = task_vars.get("inventory_hostname")
    own = reads([host], hostvars, verdict["read"]).get(host) or {}
    name = verdict.get("group") or ""
    group = {}
    if name:
        members = (task_vars.get("groups") or {}).get(name)
        if not members:
            raise AnsibleActionFail("trainer_group %s names no inventory group" % name)
        group = judge_group(dict(name=name, members=members, read=verdict["read"], in_run=verdict.get("in_run")),
                            hostvars)
    result = status_verdict(unit, own, group.get("group_status"))
    result.update(changed=False, **({"ansible_facts": group["ansible_facts"]} if group else {}))
    return result


class ActionModule(KeptPayload, NormalAction):
    """dflash.trainer.trainer_status, run as ansible.builtin.normal runs a module. A read (status, logs, history:
    the run's first contact) fails at once, naming the freeze, when the container is frozen (the pct connection's
    frozen_check); a watch after a proof (watch_s) waits a freeze out, as the proof does.

    With O(check), the entry point's input check runs first, here (plugin_utils/_input_check.py, as trainer_validate
    runs it): a refused input fails the task with the check's message (RV(input_refused)) before anything reaches the
    target. With O(show), the lines the entry point shows are made of the read (plugin_utils/_reads.py).

    Its verdicts, for the role's steps: V(as_expected) - the trainer runs its proved release healthily, or was
    stopped on purpose (RV(health)); a watch (O(watch_s)) fails the task when the trainer did not stay up. With
    O(verdict), nothing is read: status's verdict is made of this host's read and its group's (RV(ok), RV(failure),
    RV(lines)). A watch that passed says what it saw (its V(msg), shown as ansible.builtin.debug's is)."""

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        args = dict(self._task.args)
        verdict, entry, spec, show = (args.pop(k, None) for k in ("verdict", "check", "spec", "show"))
        self._task.args = args
        if verdict is not None:
            return judge(args.get("unit"), verdict, task_vars)
        if show is not None and show not in SHOWN:
            raise AnsibleActionFail("show must be one of %s, not %r" % (", ".join(sorted(SHOWN)), show))
        if entry is not None and entry not in CHECKED:
            raise AnsibleActionFail("check must be one of %s, not %r" % (", ".join(CHECKED), entry))
        checked = {}
        if entry is not None:
            checked = self._check(entry, boolean(spec or False, strict=False), task_vars)
            if checked.get("failed"):
                return checked
        elif spec is not None and boolean(spec, strict=False):
            raise AnsibleActionFail("spec needs check (the entry point whose argument spec to check)")
        watch_s = args.get("watch_s")
        with frozen_checked(self._connection, on=not watch_s):
            result = super().run(tmp, task_vars)
        result.update(checked)
        health = result.get("health") if isinstance(result.get("health"), dict) else {}
        result["as_expected"] = as_expected(result)
        if watch_s and not result.get("failed") and "health" in result and not health.get("ok"):
            result.update(failed=True, msg="%s did not stay up for trainer_watch_s=%s s after its proof: %s" % (
                args.get("unit"), watch_s, health.get("words")))
        elif watch_s and not result.get("failed"):  # what the watch saw, shown as ansible.builtin.debug's msg is
            result.update(msg="watched %s s after the proof: %s" % (result.get("watched_s", 0), health.get("words")),
                          _ansible_verbose_always=True)
        if show is not None and not result.get("failed"):
            result["lines"] = SHOWN[show](result)
        return result

    def _check(self, entry, spec, task_vars):
        """The input check of ``entry`` -> the refusal to answer with (failed, msg, input_refused), or what the
        accepted inputs say (in_group)."""
        variables, problems, refused = entry_check(self._task, self._templar, task_vars, entry, spec=spec)
        if refused is None and problems:
            refused = dict(failed=True, msg=message(problems, entry), problems=[str(p) for p in problems])
        if refused is not None:
            return dict(refused, changed=False, input_refused=True)
        # a member of a trainer group (trainer_group): status judges its group as a whole (O(verdict))
        return dict(in_group=bool(variables.get("trainer_group")))
