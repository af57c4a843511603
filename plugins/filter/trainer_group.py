"""The trainer_group filter: a trainer group's barriers, plan and verdict, judged from what every member
registered (plugin_utils/_group.py, pure and tested). The role's group deploy asks the same questions through the
trainer_group action (plugins/action/trainer_group.py), whose answers it registers; status asks this filter."""
from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.trainer.plugins.plugin_utils._group import (
    as_one,
    barrier,
    failure_words,
    group_plan,
    not_whole,
    strays,
    verdict,
)

KINDS = ("whole", "barrier", "watch", "plan", "verdict", "status", "stray")


def _read(members, hostvars, var):
    out = {}
    for m in members:
        try:
            value = hostvars[m].get(var)
        except KeyError:
            continue
        out[m] = value if isinstance(value, dict) else {}
    return out


def _own_group(hostvars, member):
    try:
        return hostvars[member].get("trainer_group") or ""
    except KeyError:  # not known here: not judged
        return None


def strays_of(host, hostvars):
    """Why ``host`` (whose own trainer_group is empty) may not be deployed alone: a host of one of its inventory
    groups names that group as its trainer_group -> words, or None."""
    own = hostvars[host].get("group_names") or []
    for name in own:
        members = [h for h in hostvars if name in (hostvars[h].get("group_names") or [])]
        if any(_own_group(hostvars, h) == name for h in members):
            return strays(name, members, dict((h, _own_group(hostvars, h)) for h in members))
    return None


def trainer_group(members, kind, hostvars, var, what="", in_run=None):
    """``kind`` whole: is every member in this run (``var``: the group's name, ``in_run``: the play's hosts);
    barrier: did every member pass the phase registered as ``var`` (``what`` names it; ``in_run``:
    the hosts still in the play, ansible_play_hosts); watch: a barrier over trainer_status's watch
    (trainer_watch_s), which fails a member whose trainer it saw not healthy;
    plan: the group's plan from every member's first read (``var``: its registered result; ``what``: the
    group's name; ``in_run``: the hosts of this run); verdict: was every member's job (``var``) proved;
    status: does the group run as one proved job (``var``: every member's status read; ``what``: the group's
    name; ``in_run``: the hosts of this run)."""
    if kind == "stray":  # (var: this host, whose own trainer_group is empty) -> dict(refused)
        return dict(refused=strays_of(var, hostvars))
    if kind not in KINDS:
        raise AnsibleFilterError("trainer_group: kind must be one of %s, not %r" % (", ".join(KINDS), kind))
    members = list(members or [])
    if not members:
        raise AnsibleFilterError("trainer_group: the group has no members (is trainer_group an inventory group?)")
    if kind == "whole":  # (var: the group's name) -> dict(refused)
        own = dict((m, _own_group(hostvars, m)) for m in members)
        return dict(refused=strays(var, members, own) or not_whole(var, members, list(in_run or [])))
    results = _read(members, hostvars, var)
    if kind in ("barrier", "watch"):
        return barrier(members, results, what or var, alive=None if in_run is None else list(in_run),
                       health=kind == "watch")
    if kind == "status":  # (var: every member's trainer_status result; what: the group's name)
        return as_one(what, members, results, None if in_run is None else list(in_run))
    if kind == "verdict":  # (what: the group's check, registered on every member; empty - not judged)
        return verdict(members, results, _read(members, hostvars, what) if what else None)
    return group_plan(what, members, dict((m, (results.get(m) or {}).get("plan") or {}) for m in members),
                      list(in_run or []))


def trainer_group_failure(restart, rollback_release, rollback=None):
    """What a failed group restart ends with, in words (_group.failure_words)."""
    return failure_words(restart or {}, rollback_release, rollback if isinstance(rollback, dict) else None)


class FilterModule:
    def filters(self):
        return {"trainer_group": trainer_group, "trainer_group_failure": trainer_group_failure}
