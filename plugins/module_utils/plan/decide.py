# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restart plan: what a run of an entry point does, decided once, on the first read.

``make_plan`` is the only place where a run decides whether the trainer restarts, why, on which
release, and whether anything is uploaded, pre-flighted or installed. The first read of every
locked entry point (trainer_plan) computes it on the target from what it read; the role only
carries it out (``when:`` on a plan field) and the restart job does every change a restart makes.
Pure: a table of what was read in, the plan out (tests/unit/test_plan.py).
"""

import math

from ansible_collections.dflash.trainer.plugins.module_utils.plan.fix import extra_vars, fix_line
from ansible_collections.dflash.trainer.plugins.module_utils.target.install import change_reasons

ENTRIES = ("deploy", "restart", "start", "rollback", "stop")

# How the play watches a job: each watch call waits WATCH_WAIT_S on the target (the role's wait_s) and the
# watch gives up after the job's budget (job_budget_s) and WATCH_SPARE more calls.
WATCH_WAIT_S = 10
WATCH_SPARE = 2
# Room in a budget beyond the settings: systemctl stop is bounded by TimeoutStopSec + STOP_MARGIN_S; a start
# before its proof (the launcher, the unit's start) START_MARGIN_S; the watch's own slack END_MARGIN_S.
STOP_MARGIN_S = 30
START_MARGIN_S = 120
END_MARGIN_S = 60
# Without the settings (a standalone caller of trainer_plan): how long to wait for a running job.
DEFAULT_JOB_WAIT_S = 1800


def restart_reasons(before, release, switched=False, install=None, force=False):
    """Why running ``release`` must restart the trainer -> [reason, ...] in words; empty: leave it
    running untouched. The deploy restarts when anything it owns changed, when asked to, and whenever
    the trainer that runs is not the one a proof is on record for.

    ``before``: the first read (running, running_release, last_good, last_job, health);
    ``switched``: ``release`` is not the release ``current`` points at; ``install``: what the install
    would change (unit_changed, env_changed, launcher_changed)."""
    before = before or {}
    reasons = []
    if force:
        reasons.append("forced (trainer_force_restart)")
    if switched:
        reasons.append("release switched to %s" % release)
    reasons.extend(change_reasons(install or {}))
    if not before.get("running"):
        return reasons + ["trainer not running"]
    running_release = before.get("running_release")
    if running_release != release:
        return reasons + ["running release %s is not current %s" % (running_release, release)]
    # "proved" is a recorded fact (last_good), not "running == current": a release switched to by a
    # restart job that a reboot or a kill interrupted runs unproven until a deploy proves it
    last_good = before.get("last_good") or None
    if last_good != release:
        job = (before.get("last_job") or {}).get("words") or "no restart job on record"
        return reasons + ["release %s runs without a proof on record (last proved: %s; %s)"
                          % (release, last_good or "none", job)]
    # the release was proved, but maybe not this start of it: systemd's Restart= after a death, a
    # reboot of the container - the same words status fails with
    health = before.get("health")
    if isinstance(health, dict) and not health.get("ok"):
        reasons.append("the running trainer is not the one proved: %s" % (health.get("words") or "no health read"))
    return reasons


def _plan(entry, release, reasons, status, **kw):
    """The plan's fields: ``restart`` when there are reasons; a restart is always pre-flighted;
    ``no_op``: nothing at all happens past the first read (its lock is released there)."""
    restart = bool(reasons) and not kw.get("refused")
    plan = dict(entry=entry, release=release, restart=restart, reasons=list(reasons) if restart else [],
                preflight=restart, upload=False, install=False, stop=False, disable=False, refused=None,
                current=status.get("current_release"), last_good=status.get("last_good"))
    plan.update(kw)
    plan["no_op"] = not (plan["restart"] or plan["upload"] or plan["install"] or plan["stop"] or plan["refused"])
    return plan


def _seconds(value):
    """A setting in seconds (unset, negative or not finite: 0 - the validator refused those already)."""
    try:
        value = float(value or 0)
    except (TypeError, ValueError):
        return 0.0
    return value if 0 <= value < float("inf") else 0.0


def job_budget_s(entry, settings):
    """How long the play watches the job of ``entry`` (whole seconds) given ``settings`` (stop_timeout_s,
    drain_timeout_s, ready_timeout_s, measure_s; the role's trainer_* of those names):

    - a stop: the stop, the drain and room;
    - every other entry (a restart job): stop + drain + start + proof (and the throughput window), twice
      (the rollback goes through them again), with room."""
    t = dict((k, _seconds((settings or {}).get(k))) for k in
             ("stop_timeout_s", "drain_timeout_s", "ready_timeout_s", "measure_s"))
    if entry == "stop":
        return int(math.ceil(t["stop_timeout_s"] + STOP_MARGIN_S + t["drain_timeout_s"] + END_MARGIN_S))
    cycle = t["stop_timeout_s"] + STOP_MARGIN_S + t["drain_timeout_s"] + START_MARGIN_S + t["ready_timeout_s"] \
        + t["measure_s"]
    return int(2 * cycle + END_MARGIN_S)


def watch_retries(budget_s, wait_s=WATCH_WAIT_S):
    """How many watch calls of ``wait_s`` each cover ``budget_s`` (and WATCH_SPARE more)."""
    return int(math.ceil(float(budget_s) / wait_s)) + WATCH_SPARE


def job_wait_s(intent, settings):
    """How long the first read waits for a running restart job of an earlier run that holds the lock: its
    budget - but a trainer group's member (``hold``) never waits: a member's job still running (an
    interrupted group deploy) refuses the group, it is never attached to member by member."""
    if (intent or {}).get("hold"):
        return 0
    return job_budget_s("restart", settings) if settings else DEFAULT_JOB_WAIT_S


def min_tokps_ratio(intent, settings):
    """The throughput gate of the run's job: the role's trainer_min_tokps_ratio, but none (0) for a forced
    deploy - it accepts a slower release (the gate is for ordinary deploys)."""
    return 0.0 if (intent or {}).get("force") else float((settings or {}).get("min_tokps_ratio") or 0)


def make_plan(intent, status, install=None, settings=None):
    """The plan (``decide``) with what its job takes from the role's ``settings``: V(job_budget_s) and
    V(watch_retries) (see ``job_budget_s``), V(min_tokps_ratio) (absent without settings); and the steps
    the role carries out (``steps``)."""
    plan = decide(intent, status, install)
    if settings:
        plan["job_budget_s"] = job_budget_s(plan["entry"], settings)
        plan["watch_retries"] = watch_retries(plan["job_budget_s"])
        plan["min_tokps_ratio"] = min_tokps_ratio(intent, settings)
    plan.update(steps(plan, install, settings))
    return plan


def steps(plan, install=None, settings=None):
    """The role's steps past the first read, each a boolean the role's ``when:`` reads as it is (nothing
    is decided in YAML; tests/unit/test_one_decider.py), from the plan and the role's ``settings``:
    V(check_mode) (the play's: nothing changes), V(gpu_host_view) (the node's view of the GPUs is read),
    V(watch_s) (trainer_watch_s: how long the proved trainer is watched after a deploy's restart).

    - run_job: a job (restart or stop) runs on the target, watched by the play to its end;
    - start_job: the role starts that job (the first read starts a restart of what is on the target
      itself and sets it false then: trainer_plan);
    - node_view_before / node_view_after: the node's view of the GPUs is read before the job's start (its
      foreign memory is the drain's and the pre-flight's) / after a restart (the proof checked against it);
    - watch: a deploy's proved trainer is watched for watch_s;
    - would_restart: a deploy in check mode says what it would restart (in the first read's report);
    - untouched: a deploy that restarts nothing ran past the first read (only the unit's enablement
      changes, or the install refuses): the trainer is left running (the first read's report says so);
      install_unit: the install runs then;
    - done: nothing is left past the first read (trainer_plan: the restart it started ended proved
      within its call, no watch after it);
    - end: the run ends right after the first read's report (no_op, or done; trainer_plan also ends a run
      whose install it carried out itself);
    - job_operation: the job the run starts (trainer_restart's operation): start (a restart) or stop;
    - would_stop: a stop in check mode says what it would stop (in the first read's report)."""
    settings = settings or {}
    check = bool(settings.get("check_mode"))
    view = bool(settings.get("gpu_host_view"))
    refused = bool(plan.get("refused"))
    run_job = bool(plan.get("restart") or plan.get("stop")) and not (check or refused)
    untouched = plan.get("entry") == "deploy" and not (plan.get("restart") or plan.get("no_op") or refused)
    return dict(
        run_job=run_job, start_job=run_job,
        node_view_before=view and run_job,
        node_view_after=view and run_job and bool(plan.get("restart")),
        watch=run_job and plan.get("entry") == "deploy" and _seconds(settings.get("watch_s")) > 0,
        would_restart=check and plan.get("entry") == "deploy" and bool(plan.get("restart")),
        untouched=untouched,
        install_unit=untouched and not check and bool((install or {}).get("changed")),
        done=False, end=bool(plan.get("no_op")),
        job_operation="stop" if plan.get("stop") else "start",
        would_stop=check and bool(plan.get("stop")))


def decide(intent, status, install=None):
    """-> the plan (a dict) for ``intent`` (entry: deploy | restart | start | rollback | stop; release: the
    release a deploy brings, its id computed on the controller; force; rollback_release), given the
    first read ``status`` (current_release, last_good, releases, running, running_release, health,
    last_job) and, for a deploy, ``install``: what installing the unit, environment file and launcher
    would change (compared, nothing written).

    Fields: entry, release (what runs once the plan is carried out), restart, reasons, preflight, stop,
    upload (a deploy's release is not current: send it), install (the install writes something with no
    restart due: an enablement change), refused (why nothing may be done - the module fails before any
    change), no_op (nothing past the first read), current, last_good."""
    entry = intent.get("entry") or "deploy"
    if entry not in ENTRIES:
        raise ValueError("entry must be one of %s, not %r" % (", ".join(ENTRIES), entry))
    current = status.get("current_release") or None
    if entry == "deploy":
        release = intent.get("release")
        if not release:
            return _plan(entry, None, [], status, refused="no release id to deploy")
        install = install or {}
        reasons = restart_reasons(status, release, switched=current != release, install=install,
                                  force=bool(intent.get("force")))
        # the install must still run (and say why it refuses, or enable the unit), though no restart is due
        install_only = not reasons and bool(install.get("refused") or install.get("enabled_changed"))
        return _plan(entry, release, reasons, status, upload=current != release, install=install_only)
    if entry == "stop":  # a deliberate stop, whatever runs (recorded, so status reads it as on purpose)
        plan = _plan(entry, current, [], status, stop=True, disable=bool(intent.get("disable")))
        plan["reasons"] = ["stop requested"]  # the job's record of why it ran (no restart)
        return plan
    if entry == "rollback":
        target = intent.get("rollback_release") or status.get("last_good") or None
        releases = status.get("releases") or []
        if not target or target == current or target not in releases:
            others = [r for r in releases if r != current]
            return _plan(entry, target, [], status, refused=(
                "nothing to roll back to: current is %s, last good is %s; %s"
                % (current or "none", status.get("last_good") or "none",
                   "name one of the other releases (newest first: %s), the newest with:%s" % (
                       ", ".join(others), fix_line(extra_vars(("trainer_rollback_release", others[0]))))
                   if others else "no other release is on the target (releases: %s)" % (", ".join(releases) or "none"))))
        return _plan(entry, target, ["rollback from %s to %s" % (current or "none", target)], status)
    if not current:
        return _plan(entry, None, [], status, refused="nothing is deployed: no current release (run a deploy first)")
    health = status.get("health") or {}
    if entry == "start":
        if health.get("ok"):  # left running: a restart is the restart entry point
            return _plan(entry, current, [], status, words="already runs its proved release: %s" % health.get("words"))
        return _plan(entry, current, ["start requested (%s)" % (health.get("words") or "state unknown")], status)
    return _plan(entry, current, ["restart requested"], status)


def lock_holder(plan, hold=False, job_started=None):
    """Who holds the deploy lock once a call of the run returned: ``play`` (release it at the end),
    ``job`` (the restart job frees it when it ends) or ``nobody`` (the first read frees it: a refused
    plan, or a no-op unless ``hold`` - a trainer group's member, whose play decides for the group)."""
    if job_started:
        return "job"
    if plan and (plan.get("refused") or plan.get("no_op") and not hold):
        return "nobody"
    return "play"


def last_ran(results):
    """The first of ``results`` (registered results, the latest call first) that ran - a non-empty result,
    not skipped; {} when none did. The role takes a job's outcome so (the watch, else the call that
    started it and ended within it) and who holds the lock (``last_lock_holder``)."""
    for result in results or []:
        if isinstance(result, dict) and result and not result.get("skipped"):
            return result
    return {}


def restart_done(first_read, watch_s=0):
    """Whether a deploy has nothing left past its first read after a restart: the first read (trainer_plan's
    result, ``first_read``) started the plan's restart job, the job ended within that call with its proof
    (``job_start``: finished, its result ok; the job freed the lock) and no watch follows the proof
    (``watch_s``: trainer_watch_s). A failed or unfinished job, or a watch, leaves the rest to the role."""
    job = first_read.get("job_start") if isinstance(first_read, dict) else None
    if not isinstance(job, dict) or not job.get("started") or not job.get("finished") or job.get("failed"):
        return False
    result = job.get("result")
    try:
        watch = float(watch_s or 0)
    except (TypeError, ValueError):
        return False
    return isinstance(result, dict) and result.get("ok") is True and watch <= 0


def last_lock_holder(results, fallback="play"):
    """Who holds the deploy lock after a run's calls that can hand it over -> play | job | nobody | unknown.

    ``results``: the registered results of those calls, the latest first (a trainer group's stop, the lock
    taken back after a group's jobs, the call that starts the job, the first read). The first of them that
    ran answers with its ``lock_holder`` - ``unknown`` when it gave none (its call failed without an
    answer) - but the last, the first read, answers ``fallback`` then, and so does a run none of whose calls
    ran: a run whose first read said nothing holds the lock as far as it knows (its end frees it, missing_ok)."""
    results = list(results or [])
    ran = last_ran(results)
    if not ran:
        return fallback
    default = fallback if ran is results[-1] else "unknown"
    return ran.get("lock_holder", default)
