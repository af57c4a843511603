# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_status (documented in the module): Ansible's own run of the
module, its payload kept between runs (plugins/plugin_utils/_payload_cache.py)."""
from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.dflash.trainer.plugins.plugin_utils._freezer import frozen_checked
from ansible_collections.dflash.trainer.plugins.plugin_utils._group import as_one
from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload

# the fact a group's verdict is set as (the collection's API reads it: dflash_trainer/results.py GROUP_STATUS_FACT)
GROUP_STATUS_FACT = "__trainer_group_status"


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
    run) judged as one proved job from ``hostvars`` -> the task's result."""
    if not isinstance(group, dict) or not group.get("members") or not group.get("read"):
        raise AnsibleActionFail("group needs name, members (the group's hosts) and read (the variable of their reads)")
    members, in_run = list(group["members"]), group.get("in_run")
    status = as_one(group.get("name") or "", members, reads(members, hostvars, group["read"]),
                    None if in_run is None else list(in_run))
    return dict(changed=False, group_status=status, group_failed=status.get("ok") is False,
                ansible_facts={GROUP_STATUS_FACT: status})


class ActionModule(KeptPayload, NormalAction):
    """dflash.trainer.trainer_status, run as ansible.builtin.normal runs a module. A read (status, logs, history:
    the run's first contact) fails at once, naming the freeze, when the container is frozen (the pct connection's
    frozen_check); a watch after a proof (watch_s) waits a freeze out, as the proof does.

    Its verdicts, for the role's steps: V(as_expected) - the trainer runs its proved release healthily, or was
    stopped on purpose (RV(health)); a watch (O(watch_s)) fails the task when the trainer did not stay up. With
    O(group), nothing is read: the group is judged from its members' reads (plugin_utils/_group.py's as_one). A
    watch that passed says what it saw (its V(msg), shown as ansible.builtin.debug's is)."""

    def run(self, tmp=None, task_vars=None):
        args = dict(self._task.args)
        group = args.pop("group", None)
        self._task.args = args
        if group is not None:
            return judge_group(group, (task_vars or {}).get("hostvars") or {})
        watch_s = args.get("watch_s")
        with frozen_checked(self._connection, on=not watch_s):
            result = super().run(tmp, task_vars)
        health = result.get("health") if isinstance(result.get("health"), dict) else {}
        result["as_expected"] = bool(health.get("ok") or health.get("stopped"))
        if watch_s and not result.get("failed") and "health" in result and not health.get("ok"):
            result.update(failed=True, msg="%s did not stay up for trainer_watch_s=%s s after its proof: %s" % (
                args.get("unit"), watch_s, health.get("words")))
        elif watch_s and not result.get("failed"):  # what the watch saw, shown as ansible.builtin.debug's msg is
            result.update(msg="watched %s s after the proof: %s" % (result.get("watched_s", 0), health.get("words")),
                          _ansible_verbose_always=True)
        return result
