# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restart cycle's steps - stop, drain, purge, start, prove - as functions of a command
runner and a clock, shared by the single-step modules (gpu_drain, trainer_start, trainer_ready)
and by the restart job (trainer_restart), which runs the whole cycle, and the rollback, on the
target so that nothing the controller does is load-bearing after the stop.

A step returns its details or raises ``StepFailed`` (message + details). Every command is bounded
(``_run``); every wait polls a judge (``_readiness``) with an injectable clock and sleep.
"""

from __future__ import annotations

import os
import re
import shutil
import time

from ansible_collections.dflash.trainer.plugins.module_utils._nvidia_smi import (
    NvidiaSmiError,
    memory_by_index,
    read_gpus,
)
# imported here, never inside a function: the detached restart job runs after Ansible removed the
# module's payload, so a late import fails
from ansible_collections.dflash.trainer.plugins.module_utils._ownership import cache_problem, observe
from ansible_collections.dflash.trainer.plugins.module_utils._readiness import (
    FAILED,
    fmt_s,
    READY,
    DrainJudge,
    Expectations,
    Judge,
    Snapshot,
)
from ansible_collections.dflash.trainer.plugins.module_utils._run import CommandTimeout
from ansible_collections.dflash.trainer.plugins.module_utils._systemd import (
    int_prop,
    is_active,
    is_running,
    parse_show,
    restart_baseline,
    show_argv,
    start_argv,
    start_decision,
)
from ansible_collections.dflash.trainer.plugins.module_utils._throughput import summarize
from ansible_collections.dflash.trainer.plugins.module_utils._trainer_log import LogFileReader, StartLog

# systemctl start waits for the start job: beyond the unit's TimeoutStartSec (90 s by default)
# something else is stuck (systemd itself, a job queue)
START_TIMEOUT_S = 120.0
# systemctl stop waits up to the unit's TimeoutStopSec, then SIGKILL; this much more is a hang
STOP_MARGIN_S = 30.0
# An error line usually comes a few milliseconds before the process exits: wait this long for the
# exit status so the verdict can carry it
ERROR_EXIT_GRACE_S = 1.0
# a log that lost this start's marker gets a continuation marker from the launcher within a
# second; fail with that reason when none came for this long, instead of waiting for timeout_s
LOG_LOST_GRACE_S = 5.0


class StepFailed(Exception):
    """A step of the cycle failed: ``msg`` in words, ``details`` for the result."""

    def __init__(self, msg, **details):
        super(StepFailed, self).__init__(msg)
        self.msg = msg
        self.details = details


def call(run, argv, hint=None):
    """run(argv) -> (rc, out, err); a command that hangs raises StepFailed naming it."""
    try:
        return run(argv)
    except CommandTimeout as exc:
        raise StepFailed(str(exc) + ("; " + hint if hint else ""))


def show(run, systemctl, unit):
    rc, out, err = call(run, show_argv(unit, systemctl=systemctl))
    if rc != 0:
        raise StepFailed("Unable to read unit %s: %s" % (unit, (err or out).strip()))
    return parse_show(out)


# ---------------------------------------------------------------------------------------------
# stop

def stop(run, systemctl, unit):
    """systemctl stop (the whole tree, SIGKILL after TimeoutStopSec); the unit must then be
    inactive or failed."""
    rc, out, err = call(run, [systemctl, "stop", unit])
    if rc != 0:
        raise StepFailed("Unable to stop unit %s: %s" % (unit, (err or out).strip()))
    props = show(run, systemctl, unit)
    if is_active(props):
        raise StepFailed("%s is still %s after systemctl stop (pid %s)" % (
            unit, props.get("ActiveState"), props.get("MainPID")))
    return {"active_state": props.get("ActiveState", "")}


# ---------------------------------------------------------------------------------------------
# drain

def drain(run, nvidia_smi, gpus=None, max_mib=1024, consecutive=2, interval_s=1.0, timeout_s=60.0,
          clock=time.monotonic, sleep=time.sleep, tick=None, allowance=None):
    """Poll until every selected GPU is at or below max_mib (+ its ``allowance``: other tenants'
    memory) (DrainJudge) -> details."""
    start = clock()
    judge = DrainJudge(max_mib=max_mib, consecutive=consecutive, timeout_s=timeout_s, gpus=gpus, start=start,
                       allowance=allowance)
    while True:
        try:
            # the process list only names holders in the failure message; memory decides
            listed, _warnings = read_gpus(run, nvidia_smi)
        except NvidiaSmiError as exc:
            raise StepFailed(str(exc), samples=judge.samples)
        verdict = judge.observe(clock(), listed)
        if verdict.state == READY:
            return dict(verdict.details)
        if verdict.state == FAILED:
            raise StepFailed(verdict.reason, **verdict.details)
        if tick:
            tick(waiting="%s (%s s of %s)" % (verdict.reason, fmt_s(clock() - start), fmt_s(timeout_s)))
        sleep(judge.next_wait(clock(), interval_s))


# ---------------------------------------------------------------------------------------------
# purge

def purge(path, observe_dir=None):
    """Delete the torchinductor cache directory (only ever called while the unit is stopped).

    Judged again here, at the moment of deleting: it must be absent or look like a torchinductor
    cache (``_ownership.cache_problem``), else the purge is refused with StepFailed (the job then
    brings the trainer back) and nothing is deleted. A symlink is removed, never followed; a cache
    that is a mount point is emptied, not removed (removing it fails with EBUSY)."""
    if not path:
        return False
    if os.path.islink(path):
        os.unlink(path)
        return True
    facts = (observe_dir or observe)(path, "cache")
    why = cache_problem(facts)
    if why:
        raise StepFailed("refused to purge %s: it %s; nothing was deleted" % (path, why))
    if not os.path.isdir(path):
        return False
    if os.path.ismount(path):
        for name in os.listdir(path):
            child = os.path.join(path, name)
            if os.path.isdir(child) and not os.path.islink(child):
                shutil.rmtree(child)
            else:
                os.unlink(child)
        return True
    shutil.rmtree(path)
    return True


# ---------------------------------------------------------------------------------------------
# start

def start(run, systemctl, unit, allow_running=False, start_run=None):
    """Start the unit and record this activation -> dict(invocation_id, n_restarts (the
    readiness baseline), main_pid, ...). ``start_run`` runs ``systemctl start`` itself (it
    waits for the start job: give it START_TIMEOUT_S); default ``run``."""
    before = show(run, systemctl, unit)
    action, message = start_decision(unit, before, allow_running)
    if action == "fail":
        raise StepFailed(message, active_state=before.get("ActiveState"),
                         invocation_id=before.get("InvocationID", ""))
    if action == "keep":
        return activation(before, int_prop(before, "NRestarts", 0), False, message)
    # A deliberate start by the deployer must not be refused by the start limit that exists to
    # stop crash loops (a failed proof + rollback already costs two starts): reset it first.
    call(run, [systemctl, "reset-failed", unit])
    rc, out, err = call(start_run or run, start_argv(unit, systemctl=systemctl),
                        hint="the start job may still be queued (systemctl list-jobs)")
    if rc != 0:
        raise StepFailed("Unable to start unit %s: %s" % (unit, (err or out).strip()), rc=rc)
    after = show(run, systemctl, unit)
    return activation(after, restart_baseline(before, after), True)


def activation(props, baseline, started, msg=""):
    return dict(
        invocation_id=props.get("InvocationID", ""),
        main_pid=int_prop(props, "MainPID", 0),
        n_restarts=baseline,
        active_state=props.get("ActiveState", ""),
        sub_state=props.get("SubState", ""),
        started_at=props.get("ExecMainStartTimestamp", ""),
        started=started,
        msg=msg,
    )


# ---------------------------------------------------------------------------------------------
# prove

def compile_regexes(ready_regex, step_regex, tokps_regex, error_regexes):
    """-> dict of compiled patterns; StepFailed naming a pattern that does not compile."""
    out = {}
    for name, rx in (("ready_regex", ready_regex), ("step_regex", step_regex), ("tokps_regex", tokps_regex)):
        try:
            out[name] = re.compile(rx)
        except re.error as exc:
            raise StepFailed("invalid %s %r: %s" % (name, rx, exc))
    errors = []
    for rx in error_regexes or ():
        try:
            errors.append(re.compile(rx))
        except re.error as exc:
            raise StepFailed("invalid error_regexes entry %r: %s" % (rx, exc))
    out["error_regexes"] = errors
    return out


def failure_msg(reason, tail, tail_lines):
    if not tail:
        return reason + "\n(this start's log is empty or has no marker for this invocation)"
    return "%s\nlast %d lines of this start's log:\n%s" % (
        reason, min(len(tail), tail_lines), "\n".join("    " + line for line in tail))


def _counts(analysis):
    return len(analysis.tokps_values), dict((k, len(v)) for k, v in analysis.extra_values.items())


def measured(analysis, marks, now, window_s):
    """Figures over the last ``window_s`` seconds: the values that arrived after the last poll
    before the window began (``marks``: (time, counts) per poll)."""
    tok_from, extra_from = 0, {}
    for t, (n_tok, n_extra) in marks:
        if t < now - window_s:
            tok_from, extra_from = n_tok, n_extra
    figures = {"tok_s": summarize(analysis.tokps_values[tok_from:], window_s)}
    for name, values in analysis.extra_values.items():
        figures[name] = summarize(values[extra_from.get(name, 0):], window_s)
    return figures


def ours(gpus_mib, baseline):
    """Memory the trainer holds: each GPU's reading less what it held before the start (the
    drain's last sample: another tenant's memory, a residue below the drain limit), never below 0."""
    if not baseline:
        return gpus_mib
    return {i: (None if m is None else max(0, m - (baseline.get(i) or 0))) for i, m in gpus_mib.items()}


def prove(run, systemctl, nvidia_smi, unit, log_path, expect, regexes, interval_s=1.0,
          clock=time.monotonic, sleep=time.sleep, tick=None, measure_s=None, extra_regexes=None, baseline=None):
    """Poll the unit, the GPUs and this start's log until the Judge says READY (-> the proof's
    details, with ``figures``: tok/s median, p10, p90 and n over the last ``measure_s`` seconds
    (default the hold), and the user's named figures) or FAILED (StepFailed with the reason and
    the log tail). A ``measure_s`` longer than the hold keeps watching after READY; the trainer
    failing then fails the proof. ``baseline``: {index: MiB} held before the start, never counted
    as the trainer's (see ``ours``)."""
    follower = StartLog(expect.invocation_id, ready_regex=regexes["ready_regex"],
                        step_regex=regexes["step_regex"], tokps_regex=regexes["tokps_regex"],
                        error_regexes=regexes["error_regexes"], extra_regexes=extra_regexes)
    marks = []
    measuring_until = [None]
    reader = LogFileReader(log_path, follower)
    judge = Judge(expect, start=clock())
    show_cmd = show_argv(unit, systemctl=systemctl)

    def observe(props, gpus):
        return judge.observe(Snapshot(now=clock(), unit=props, gpus_mib=ours(memory_by_index(gpus), baseline),
                                      log=follower.analysis))

    while True:
        # unit first, log last: the log is then at least as fresh as the unit state
        rc, out, err = call(run, show_cmd)
        if rc != 0:
            raise StepFailed("Unable to read unit %s: %s" % (unit, (err or out).strip()))
        props = parse_show(out)
        try:
            gpus, _warnings = read_gpus(run, nvidia_smi, processes=False)
        except NvidiaSmiError as exc:
            raise StepFailed(str(exc), reason=str(exc), log_tail=follower.analysis.tail(expect.tail_lines))
        try:
            reader.poll()
        except (IOError, OSError) as exc:
            raise StepFailed("Unable to read log %s: %s" % (log_path, exc))
        if not is_running(props):
            follower.finish()  # the process is gone: a last line without newline is final
        verdict = observe(props, gpus)
        marks.append((clock(), _counts(follower.analysis)))
        if verdict.state == READY:
            if measuring_until[0] is None:
                proof = dict(verdict.details, msg=verdict.reason)
                if baseline and any(baseline.values()):
                    proof["baseline_mib"] = {i: m for i, m in baseline.items() if m}
                    proof["baseline_words"] = ", ".join(
                        "GPU %s %s MiB" % (i, m) for i, m in sorted(proof["baseline_mib"].items()))
                measuring_until[0] = clock() + max(0.0, (measure_s or 0) - expect.hold_s)
            if clock() >= measuring_until[0]:
                window = float(measure_s or expect.hold_s)
                proof["figures"] = measured(follower.analysis, marks, clock(), window)
                return proof
        if verdict.state == FAILED and is_running(props) and follower.analysis.errors:
            # give the process a moment to exit so the verdict carries its exit status
            deadline = clock() + ERROR_EXIT_GRACE_S
            while clock() < deadline:
                sleep(0.1)
                rc, out, _err = call(run, show_cmd)
                later = parse_show(out) if rc == 0 else {}
                if later and not is_running(later):
                    reader.poll()
                    follower.finish()
                    verdict = observe(later, gpus)
                    break
        if verdict.state == FAILED:
            details = dict(verdict.details)
            tail = details.get("log_tail") or []
            details.pop("reason", None)
            reason = verdict.reason
            if measuring_until[0] is not None:
                reason = "after it was proved ready, during the throughput measurement: " + reason
            raise StepFailed(failure_msg(reason, tail, expect.tail_lines), ready=False,
                             reason=reason, **details)
        # still pending: a log that lost this start's marker (truncated or replaced by something
        # else, and no continuation marker from the launcher) cannot prove it; say so now
        lost = reader.problem(clock(), LOG_LOST_GRACE_S)
        if lost:
            raise StepFailed(failure_msg(lost, [], expect.tail_lines), ready=False, reason=lost, log_tail=[])
        if tick:
            tick(waiting=("measuring throughput" if measuring_until[0] is not None else
                          "waiting for: %s (%s s of %s)" % (verdict.reason, fmt_s(clock() - judge.start),
                                                            fmt_s(expect.timeout_s))))
        if measuring_until[0] is not None:  # measuring after READY: the proof's deadline no longer applies
            sleep(max(0.0, min(interval_s, measuring_until[0] - clock())))
        else:
            sleep(judge.next_wait(clock(), interval_s))


def expectations(invocation_id, n_restarts, p):
    """Expectations from the proof's parameters (trainer_ready's option names)."""
    return Expectations(
        invocation_id=invocation_id, n_restarts=n_restarts, gpus=p.get("gpus"), min_mib=p["min_mib"],
        min_steps=p["min_steps"], hold_s=p["hold_s"], stall_s=p["stall_s"], timeout_s=p["timeout_s"],
        tail_lines=p["tail_lines"], ready_regex=p["ready_regex"])
