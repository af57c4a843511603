# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A trainer group: the hosts of one distributed job, restarted, proved and rolled back as one.

The role's group flow (roles/trainer/tasks/group.yml) runs every member in one batch of one play;
each phase is one task on every member at once (Ansible's linear strategy runs a task on every host
before the next), registered, and a barrier before the next: these pure functions judge, from what every
member registered, whether the group may go on (``barrier``), what the group does (``group_plan``:
made once from every member's own plan) and whether the group's restart was proved (``verdict``).
Every member computes the same answer from the same registered results, so no host coordinates. The role asks
through the trainer_group action (plugins/action/trainer_group.py), which registers the group's plan - with what
each member does of it (``member_plan``) - and fails by itself where the group stops; the role's `when:`s only read
those fields.

A barrier is no task of its own: it is judged at the top of the next phase's task, by that task's action
(``group_barrier``, the controller's own option: ``judged``, pure, and ``barrier_first`` / ``run_judged`` for the
actions), before it does anything on its member - every member judges the same registered results, so all go on or
all fail there, with the barrier's words, whatever that task ignores of its own failures. The same option folds the
group's other judgements into the task that carries them out: the group whole in this run (the input check), every
member's job proved (the check that follows it), the group's verdict (the task that marks what was proved good: it
registers what follows the verdict - ``after_job``).
"""
from __future__ import annotations

from ansible.errors import AnsibleActionFail

from ansible_collections.dflash.trainer.plugins.module_utils.plan.decide import last_ran


def _failure(result, health=False):
    """Why a registered task result failed, in words; None when it succeeded (or was skipped). With ``health``
    (trainer_status's watch, trainer_watch_s): a watch that saw the trainer not healthy failed too."""
    if not isinstance(result, dict) or not result:
        return "did not reach this phase"
    if result.get("unreachable"):
        return "unreachable: %s" % (result.get("msg") or "no answer")
    if result.get("failed"):
        return (result.get("msg") or "failed").splitlines()[0]
    seen = result.get("health") if health and not result.get("skipped") else None
    if isinstance(seen, dict) and not seen.get("ok", True):
        return "did not stay up for %s s after the group's proof: %s" % (
            _seconds(result.get("watched_s")), seen.get("words") or "not healthy")
    return None


def _seconds(value):
    try:
        return "%g" % float(value)
    except (TypeError, ValueError):
        return "?"


def barrier(members, results, phase, alive=None, health=False):
    """Whether every member of the group passed ``phase`` -> dict(failed, words, members): ``results``
    maps each member to what it registered for the phase (a skipped task counts as passed); ``alive``:
    the hosts still in the play (a member that failed or was unreachable at any task has left it); ``health``:
    the phase is trainer_status's watch, whose result fails when the trainer was not healthy."""
    failures = []
    for m in members:
        why = "not in this run" if m not in results else _failure(results.get(m), health)
        if why is None and alive is not None and m not in alive:
            why = "left the run (a task failed or it became unreachable)"
        if why:
            failures.append((m, why))
    if failures:
        words = "trainer group: %s failed on %d of %d members - %s" % (
            phase, len(failures), len(members), _listed(failures))
    else:
        words = "trainer group: every member passed %s" % phase
    return dict(failed=bool(failures), words=words, members=[m for m, _why in failures])


def _listed(failures):
    """(member, why) pairs in words: ``m1: why; m2: why``."""
    return "; ".join("%s: %s" % pair for pair in failures)


def not_whole(name, members, in_run):
    """Why the group cannot be deployed in this run (a member outside it: --limit, or unreachable at the
    start); None when every member is in it."""
    outside = [m for m in members if m not in in_run]
    if not outside:
        return None
    return ("trainer group %s is deployed as one: %s %s not in this run (--limit, or unreachable); "
            "run it on the whole group (-l %s); nothing was changed"
            % (name, ", ".join(outside), "is" if len(outside) == 1 else "are", name))


def strays(name, members, own_groups):
    """Why the group cannot be deployed: a host of its inventory group whose own trainer_group is not ``name``
    (empty, or another group) - deployed alone it would restart one rank of the job (``own_groups``: member ->
    its own trainer_group, None or absent: not known); None when every member names the group."""
    astray = [m for m in members if own_groups.get(m, name) not in (None, name)]
    if not astray:
        return None
    return ("trainer group %s: %s %s in its inventory group but %s trainer_group is %s; give every host of the group "
            "trainer_group: %s (a rank is never deployed alone); nothing was changed"
            % (name, ", ".join(astray), "is" if len(astray) == 1 else "are", "its" if len(astray) == 1 else "their",
               " / ".join(sorted(set(repr(own_groups.get(m) or "") for m in astray)))
               .replace("''", "empty"), name))


def group_plan(name, members, plans, in_run):
    """The group's plan from every member's own (``plans``: member -> trainer_plan's plan) ->
    dict(name, members, restart, reasons (member -> its reasons), release, rollback_release, refused,
    no_op, upload (members that need the release sent)).

    A member's plan never restarts one member alone: the group restarts when any member must (a
    changed file, a dead rank, mixed releases), on one release; it is refused when a member is not
    in this run (a group is deployed whole) or the members would run different releases. The release
    to go back to is the last good release every member agrees on (none - the group is stopped)."""
    plan = dict(name=name, members=list(members), restart=False, reasons={}, release=None, rollback_release=None,
                refused=None, no_op=False, upload=[])
    plan["refused"] = not_whole(name, members, in_run)
    if plan["refused"]:
        return plan
    releases = sorted(set(str(plans[m].get("release")) for m in members))
    if len(releases) != 1:
        plan["refused"] = ("trainer group %s: the members would run different releases (%s); give every member "
                           "the same trainer_src; nothing was changed" % (name, ", ".join(releases)))
        return plan
    plan["release"] = releases[0]
    currents = set(plans[m].get("current") for m in members)
    mixed = ["the members run different releases (%s)" % ", ".join(sorted(str(c) for c in currents))] \
        if len(currents) > 1 else []
    for m in members:
        reasons = list(plans[m].get("reasons") or [])
        if plans[m].get("install") and not reasons:
            reasons.append("install changes")
        if reasons or mixed:
            plan["reasons"][m] = reasons + mixed
    plan["restart"] = bool(plan["reasons"])
    plan["no_op"] = not plan["restart"]
    plan["upload"] = [m for m in members if plans[m].get("upload")]
    last_goods = set(plans[m].get("last_good") for m in members)
    plan["rollback_release"] = last_goods.pop() if len(last_goods) == 1 else None
    return plan


def as_one(name, members, statuses, in_run=None):
    """Whether a trainer group runs as one proved job, from every member's status read (``statuses``: member ->
    trainer_status's result) -> dict(ok, words, members): ok True - every member runs healthily (health.ok) one
    and the same release, the last good one of each; False - a member does not (``members`` names them); None - not
    judged: a member was not read in this run (``in_run``: the hosts of this run)."""
    absent = [m for m in members if not isinstance(statuses.get(m), dict) or not statuses.get(m)
              or (in_run is not None and m not in in_run)]
    if absent:
        return dict(ok=None, members=absent, words="trainer group %s: not judged as one - %s not read in this run "
                    "(read every member: -l %s)" % (name, ", ".join(absent), name))
    failures, running = [], {}
    for m in members:
        st = statuses[m]
        health = st.get("health") if isinstance(st.get("health"), dict) else {}
        running[m] = st.get("running_release") or None
        if st.get("unreachable") or st.get("failed"):
            failures.append((m, _failure(st)))
        elif not health.get("ok"):
            failures.append((m, health.get("words") or "not healthy"))
        elif running[m] != st.get("last_good"):
            failures.append((m, "runs %s, its last good release is %s" % (running[m] or "nothing", st.get("last_good"))))
    releases = sorted(set(r or "nothing" for r in running.values()))
    if not failures and len(releases) > 1:
        failures = [(m, "runs %s" % (running[m] or "nothing")) for m in members]
    if failures:
        return dict(ok=False, members=[m for m, _w in failures], words="trainer group %s: not proved as one - %s" % (
            name, _listed(failures)))
    return dict(ok=True, members=[], words="trainer group %s: proved as one - release %s on every member (%s)" % (
        name, releases[0], ", ".join(members)))


def verdict(members, jobs, checks=None):
    """Whether the group's restart was proved: every member's job ended proved (``jobs``: member ->
    the job's outcome as trainer_restart returned it) and, once all had, every member still ran what its
    job proved when all were looked at again at one moment (``checks``: member -> trainer_restart
    operation=check's result; None: not judged) -> dict(ok, words, failed)."""
    failed = []
    for m in members:
        job = jobs.get(m) or {}
        result = job.get("result") or {}
        if not result.get("ok"):
            why = result.get("msg") or job.get("msg") or _failure(job) or "the job did not finish"
            failed.append((m, str(why).splitlines()[0]))
    if not failed and checks is not None:
        for m in members:
            check = checks.get(m) or {}
            still = check.get("still") or {}
            if not still.get("ok"):
                why = still.get("msg") or _failure(check) or "not checked"
                failed.append((m, "proved by its own job, then at the group's check: %s" % str(why).splitlines()[0]))
        if failed:
            return dict(ok=False, failed=[m for m, _why in failed],
                        words="trainer group: %d of %d members no longer ran what was proved when every member "
                              "was proved - %s" % (len(failed), len(members), _listed(failed)))
    if failed:
        return dict(ok=False, failed=[m for m, _why in failed],
                    words="trainer group: %d of %d members failed their proof - %s" % (
                        len(failed), len(members), _listed(failed)))
    return dict(ok=True, failed=[], words="trainer group: every member (%s) proved" % ", ".join(members))


def failure_words(restart, rollback_release, rollback=None):
    """What a failed group restart ends with, in words: ``restart`` the restart's verdict, ``rollback_release``
    the group's last good release (None: there was none, every member was stopped), ``rollback`` the
    rollback's own verdict (every member's rollback job, judged like the restart's)."""
    if rollback_release is None:
        return "%s. No release was proved on every member before: every member was stopped." % restart["words"]
    if rollback and rollback.get("ok"):
        return "%s. Every member was put back on release %s and proved again (%s)." % (
            restart["words"], rollback_release, rollback["words"])
    return "%s. The rollback to release %s failed too - %s: each member is left as its rollback job ended." % (
        restart["words"], rollback_release, (rollback or {}).get("words") or "no member's rollback job ended")


def member_plan(plan, me, check_mode=False, lock_token="", digits=""):
    """The group's plan as one member carries it out (``plan``: group_plan's; ``me``: this member) -> the plan
    and what it means here: ``upload_here`` (this member lacks the release), ``reasons_here`` (this member's
    reasons for its restart job), ``job_ids`` (this member's restart and rollback job ids: the play's lock token,
    the job's name, ``digits``), ``says`` and ``words`` (what the plan says before anything changes: the group
    left running, or what check mode would restart)."""
    out = dict(plan)
    out["upload_here"] = me in (plan.get("upload") or [])
    out["reasons_here"] = list((plan.get("reasons") or {}).get(me) or
                               ["trainer group %s restarts" % plan.get("name")])
    out["job_ids"] = dict((job, "%s-%s-%s" % (lock_token, job, digits)) for job in ("restart", "rollback"))
    words = None
    if plan.get("no_op"):
        words = "trainer group %s left running: release %s on every member" % (plan.get("name"), plan.get("release"))
    elif plan.get("restart") and check_mode:
        words = "would restart trainer group %s on %s: %s" % (plan.get("name"), plan.get("release"),
                                                              plan.get("reasons"))
    out["says"], out["words"] = words is not None, words or ""
    return out


def after_job(job, judged, rollback_release, restart=None, watch_s=0):
    """What the group does once every member's ``job`` (restart or rollback) was judged (``judged``: verdict's
    answer) -> dict(ok, words, members (those that failed), good (mark what every member's job proved good),
    report (say the group proved), rollback (put every member back on ``rollback_release``), stop (no release
    to go back to: stop every member), fail (the run fails, saying ``failure``), watch (trainer_watch_s,
    ``watch_s``, follows the proof), restart (the restart's verdict, kept for the rollback's words)).
    ``restart``: the restart's own verdict, given when ``job`` is the rollback."""
    ok = bool(judged.get("ok"))
    out = dict(ok=ok, words=judged.get("words") or "", members=list(judged.get("failed") or []), good=ok,
               report=False, rollback=False, stop=False, fail=False, failure="", watch=False, restart=None)
    if job == "rollback":
        out["restart"] = restart or {}
        out["fail"] = True
        out["failure"] = failure_words(out["restart"], rollback_release, judged)
        return out
    out["restart"] = dict(ok=ok, words=out["words"], failed=out["members"])
    if ok:
        out["report"] = True
        try:
            out["watch"] = float(watch_s or 0) > 0
        except (TypeError, ValueError):
            out["watch"] = False
        return out
    out["rollback"] = rollback_release is not None
    out["stop"] = not out["rollback"]
    out["fail"] = out["stop"]  # a rollback's own answer fails the run once it ended
    out["failure"] = failure_words(judged, rollback_release) if out["stop"] else ""
    return out


# ------------------------------------------------------------------------------------------------------------------
# group_barrier: a barrier (or another of the group's judgements) folded into the task that follows it

BARRIER_OPTION = "group_barrier"
BARRIER_KEYS = frozenset(("results", "phase", "then", "health", "holder", "whole", "jobs", "verdict"))
JOBS = ("restart", "rollback")
# what every member registered of its job (its start, then its watch) and of the group's check after the jobs:
# the role's registers (roles/trainer/tasks/group.yml)
JOB_START, JOB_WATCH, GROUP_CHECK = "__trainer_job_start", "__trainer_job_watch", "__trainer_group_check"


def checked_barrier(spec):
    """``group_barrier`` as given -> the spec; ValueError saying what is wrong."""
    if not isinstance(spec, dict) or not spec:
        raise ValueError("group_barrier must be a dict (results, phase, then, health, holder, whole, jobs, verdict)")
    unknown = sorted(set(spec) - BARRIER_KEYS)
    if unknown:
        raise ValueError("group_barrier: unknown key(s) %s (known: %s)" % (", ".join(unknown),
                                                                           ", ".join(sorted(BARRIER_KEYS))))
    if spec.get("verdict") not in (None,) + JOBS:
        raise ValueError("group_barrier.verdict must be one of %s, got %r" % (", ".join(JOBS), spec["verdict"]))
    if spec.get("jobs") and not spec.get("results"):
        raise ValueError("group_barrier.jobs needs results (the lock taken back after the jobs)")
    return spec


def job_outcomes(members, registered):
    """Each member's job outcome: its watch's, else the call that started it (``registered``: variable name ->
    member -> what it registered)."""
    watch, start = registered(JOB_WATCH), registered(JOB_START)
    return dict((m, last_ran([watch.get(m), start.get(m)])) for m in members)


def judged(spec, name, me, members, registered, alive=None, in_run=None, own=None, mine=None):
    """The judgement ``spec`` (``group_barrier``) asks of the group before this member's task does anything ->
    dict(stop, skip, fields): ``stop`` - the words every member's task fails with (nothing done on any member);
    ``skip`` - why this task has nothing to do (it is skipped, on every member); ``fields`` - what the task's result
    carries (the barrier's answer; the verdict and what follows it).

    ``name``, ``members``: the group; ``me``: this member; ``registered(var)``: member -> what it registered as
    ``var`` (a member absent from it is not in this run); ``alive``: the hosts still in the play; ``in_run``: the
    hosts of this run; ``own``: member -> its own trainer_group; ``mine``: this member's ``plan`` (the group's plan),
    ``done`` (the restart's verdict, for the rollback's), ``unit`` and ``watch_s``.

    Keys of ``spec``: ``whole`` - every member is in this run and names the group; ``results``, ``phase``, ``then``,
    ``health`` - every member passed the phase it registered as ``results`` (``barrier``); ``jobs`` - then whether
    every member's job proved it (skipped when not: the verdict names them); ``verdict`` (restart or rollback) - the
    group's verdict on that job and what follows it (``after_job``), the task skipped unless it says good."""
    out = dict(stop=None, skip=None, fields={})
    if spec.get("whole"):
        out["stop"] = strays(name, members, own or {}) or not_whole(name, members, list(in_run or []))
        if out["stop"]:
            return out
    if spec.get("results"):
        results = registered(spec["results"])
        passed = barrier(members, dict((m, results[m]) for m in members if m in results),
                         spec.get("phase") or spec["results"], alive=alive, health=bool(spec.get("health")))
        out["fields"]["barrier"] = passed
        if passed["failed"]:
            out["stop"] = passed["words"] + ("; %s" % spec["then"] if spec.get("then") else "")
            return out
    if spec.get("jobs"):
        jobs = verdict(members, job_outcomes(members, registered))
        if not jobs["ok"]:
            out["skip"] = "not every member's job proved it (%s)" % jobs["words"]
    if spec.get("verdict"):
        out["fields"].update(job_verdict(spec["verdict"], me, members, registered, mine or {}))
        if not out["fields"]["good"]:
            out["skip"] = "nothing to mark good: %s" % out["fields"]["words"]
    return out


def job_verdict(job, me, members, registered, mine):
    """The group's verdict on its ``job`` (every member's job proved, and every member still so at the group's
    check) and what follows it (``after_job``), with ``said``: what this member says of a proved group."""
    jobs = job_outcomes(members, registered)
    plan = mine.get("plan") or {}
    before = (mine.get("done") or {}).get("restart") if job == "rollback" else None
    out = after_job(job, verdict(members, jobs, registered(GROUP_CHECK)), plan.get("rollback_release"), before,
                    mine.get("watch_s") or 0)
    outcome = (jobs.get(me) or {}).get("result") or {}
    out["said"] = ["%s: release %s" % (out["words"], plan.get("release")),
                   "%s ready: %s" % (mine.get("unit") or "", outcome.get("outcome") or "")]
    return out


def end_failure(restart, rollback=None):
    """What the group's run ends with (``restart``: the restart's verdict, ``rollback``: the rollback's, as their
    tasks registered them - a rollback that did not run registered its skip) -> the words the run fails with (rolled
    back, or stopped), or None (the group proved)."""
    done = last_ran([rollback, restart])
    return (done.get("failure") or "trainer group: failed") if done.get("fail") else None


def _dict(value):
    return dict(value) if hasattr(value, "keys") else {}


class Play(object):
    """What an action reads of the play for its group's judgement: ``hostvars``, ``groups``, the hosts in the run,
    this member's variables (templated by the action's templar)."""

    def __init__(self, action, task_vars):
        self.action, self.task_vars = action, task_vars or {}
        self.hostvars = self.task_vars.get("hostvars") or {}
        self.me = self.task_vars.get("inventory_hostname")

    def var(self, name, default=None):
        value = self.task_vars.get(name, default)
        return self.action._templar.template(value) if value is not None else default  # pylint: disable=protected-access

    def of(self, member, name):
        """``name`` as ``member`` registered it ({} when it did not)."""
        try:
            return _dict(self.hostvars[member].get(name))
        except KeyError:
            return {}

    def own_group(self, member):
        try:
            return self.hostvars[member].get("trainer_group") or ""
        except KeyError:  # not known here: not judged
            return None

    def group(self):
        """(name, members) of this member's trainer group; AnsibleActionFail when it has none."""
        name = self.var("trainer_group", "") or ""
        members = list((self.task_vars.get("groups") or {}).get(name) or [])
        if not members:
            raise AnsibleActionFail("trainer group %r has no members (is trainer_group an inventory group?)" % name)
        return name, members

    def registered(self, members):
        """var -> member -> what it registered (the members known here)."""
        return lambda var: dict((m, self.of(m, var)) for m in members if m in self.hostvars)

    def judged(self, spec):
        name, members = self.group()
        mine = dict(plan=_dict(self.var("__trainer_group_plan", {})), done=_dict(self.var("__trainer_group_done", {})),
                    unit=self.var("trainer_unit_name", ""), watch_s=self.var("trainer_watch_s", 0)) \
            if spec.get("verdict") else None  # what this member's verdict reads (the role's registers, its unit)
        return judged(spec, name, self.me, members, self.registered(members),
                      alive=list(self.var("ansible_play_hosts", []) or []),
                      in_run=list(self.var("ansible_play_hosts_all", []) or []),
                      own=dict((m, self.own_group(m)) for m in members), mine=mine)


def _judge(action, task_vars):
    """``group_barrier`` popped from the task's args and judged -> (answer, fields): ``answer`` - the task's result
    when it does nothing (a failed barrier: it fails, whatever the task ignores; skipped), else None; ``fields`` -
    what the result of the task's own run carries."""
    args = dict(action._task.args)  # pylint: disable=protected-access  # the task's own args
    spec = args.pop(BARRIER_OPTION, None)
    action._task.args = args  # pylint: disable=protected-access
    if spec is None:
        return None, {}
    try:
        spec = checked_barrier(spec)
    except ValueError as exc:
        raise AnsibleActionFail(str(exc)) from None
    out = Play(action, task_vars).judged(spec)
    if out["stop"]:
        # every member fails here, with the barrier's words: a task that ignores its own failures (judged by the
        # next barrier) does not ignore this one (the strategy reads the worker's task fields back)
        action._task.ignore_errors = False  # pylint: disable=protected-access
        answer = dict(failed=True, msg=out["stop"])  # its words alone, as the barrier's own task said them
        if spec.get("holder"):  # nothing was done: the lock is held as before this task
            answer["lock_holder"] = spec["holder"]
        return answer, {}
    carried = dict((k, v) for k, v in out["fields"].items() if k != "barrier")  # the verdict's fields
    if out["skip"]:
        return dict(carried, skipped=True, changed=False, skip_reason=out["skip"]), {}
    return None, carried


def barrier_first(action, task_vars):
    """At the top of an action's run: its ``group_barrier`` judged before the task does anything -> None (the task
    runs) or the task's result (a failed barrier's, or skipped)."""
    answer, _fields = _judge(action, task_vars)
    return answer


def run_judged(action, run, tmp, task_vars, display=None):
    """An action's ``run(tmp, task_vars)`` after its ``group_barrier`` -> the result, with what the judgement
    carries (the verdict: said, on a proved group, as the watch says its lines)."""
    answer, fields = _judge(action, task_vars)
    if answer is not None:
        return answer
    result = run(tmp, task_vars)
    if fields.get("report") and display is not None:
        host = (task_vars or {}).get("inventory_hostname", "?")
        for line in fields.get("said") or []:
            display.display("[%s] %s" % (host, line))
    return dict(result, **fields) if fields else result
