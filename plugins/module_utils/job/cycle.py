# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restart cycle's steps - stop, drain, start, prove; the purge is ``target.inductor_cache``'s - as
functions of a command runner and a clock, used by the restart job (trainer_restart, job.steps), which runs the
whole cycle, and the rollback, on the target so that nothing the controller does is load-bearing
after the stop.

A step returns its details or raises ``StepFailed`` (message + details). Every command is bounded
(``target.command``); every wait is ``job.wait.poll_until`` over a judge (``proof.readiness``), with an
injectable clock and sleep.
"""

from __future__ import annotations

import re
import time

from ansible_collections.dflash.trainer.plugins.module_utils.proof.log_file import LogFileReader
from ansible_collections.dflash.trainer.plugins.module_utils.target.nvidia_smi import (
    NvidiaSmiError,
    memory_by_index,
    read_gpus,
)
from ansible_collections.dflash.trainer.plugins.module_utils.proof.progress_elsewhere import (
    LOOK_AFTER_S,
    LOOK_EVERY_S,
    Finder,
    cgroup_pids,
    log_shows_progress,
)
from ansible_collections.dflash.trainer.plugins.module_utils.proof.progress_file import ProgressFileReader, ProgressView
from ansible_collections.dflash.trainer.plugins.module_utils.proof.readiness import (
    FAILED,
    fmt_s,
    READY,
    DrainJudge,
    Judge,
    Snapshot,
    expectations as readiness_expectations,
    log_missing,
    setting,
)
from ansible_collections.dflash.trainer.plugins.module_utils.target.command import CommandTimeout
from ansible_collections.dflash.trainer.plugins.module_utils.target.systemd import (
    int_prop,
    is_active,
    is_running,
    parse_show,
    restart_baseline,
    SHOW_PROPERTIES,
    show_argv,
    start_argv,
    start_decision,
)
from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import summarize
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import (
    LineBound,
    ProgressAnalysis,
    RegexTimeout,
    StartLog,
)
from ansible_collections.dflash.trainer.plugins.module_utils.proof.unit_gpu import (
    BY_PROCESS,
    cgroup_of as read_cgroup,
    rule_words,
    unit_memory,
)
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import (
    DONE as WAIT_DONE,
    TIMEOUT as WAIT_TIMEOUT,
    done,
    failed,
    poll_until,
    waiting,
)

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
# the restart job's proof reads this start's log this often between its observations of the unit and the
# GPUs (every trainer_ready_interval_s): a step, the hold's start and an error line are seen within it
LOG_POLL_S = 0.1


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

def drain(run, nvidia_smi, gpus=None, max_mib=1024, consecutive=2, interval_s=0.1, timeout_s=60.0,
          clock=time.monotonic, sleep=time.sleep, tick=None, allowance=None):
    """Poll until every selected GPU is at or below max_mib (+ its ``allowance``: other tenants'
    memory) (DrainJudge) -> details. The trainer is stopped, nothing competes for nvidia-smi, and the
    judge wants ``consecutive`` readings in a row: 0.1 s apart confirms as well as 0.25 s, sooner."""
    # the judge counts from the wait's start (elapsed seconds: start 0), the deadline is the waiter's
    judge = DrainJudge(max_mib=max_mib, consecutive=consecutive, timeout_s=timeout_s, gpus=gpus, start=0.0,
                       allowance=allowance)
    began = clock()

    def observe():
        try:
            # memory decides; the process list only names the holders in the failure message, so it is read
            # (a second nvidia-smi call) only by the readings that can end the wait at its deadline
            last = clock() - began >= timeout_s - interval_s
            return read_gpus(run, nvidia_smi, processes=last)[0]
        except NvidiaSmiError as exc:
            raise StepFailed(str(exc), samples=judge.samples)

    def judge_drain(listed, elapsed):
        verdict = judge.observe(elapsed, listed)
        if verdict.state == READY:
            return done(verdict.details)
        if verdict.state == FAILED:
            return failed(verdict.reason, verdict.details)
        return waiting("%s (%s s of %s)" % (verdict.reason, fmt_s(elapsed), fmt_s(timeout_s)), verdict.details)

    out = poll_until(observe, judge_drain, timeout_s, interval_s, clock=clock, sleep=sleep, on_wait=_ticker(tick))
    if out.state == WAIT_DONE:
        return dict(out.value)
    raise StepFailed(out.words, **(out.value or {}))


def _ticker(tick):
    """on_wait for poll_until: tell ``tick`` what the step still waits for."""
    if tick is None:
        return None
    return lambda verdict, _elapsed: tick(waiting=verdict.words)


# ---------------------------------------------------------------------------------------------
# (purge: target.inductor_cache.purge, beside its judge of what the cache holds)


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
    """Memory the trainer holds where nvidia-smi cannot say whose memory is whose (``proof.unit_gpu``: no
    process listed, host PIDs): each GPU's reading less what it held before the start (the drain's last
    sample: another tenant's memory, a residue below the drain limit), never below 0."""
    if not baseline:
        return gpus_mib
    return {i: (None if m is None else max(0, m - (baseline.get(i) or 0))) for i, m in gpus_mib.items()}


def prove(run, systemctl, nvidia_smi, unit, log_path, expect, regexes, interval_s=1.0,
          clock=time.monotonic, sleep=time.sleep, tick=None, measure_s=None, extra_regexes=None, baseline=None,
          progress_path=None, progress_from=None, log_interval_s=None, cgroup_of=None, paused=None):
    """Poll the unit, the GPUs and this start's log until the Judge says READY (-> the proof's
    details, with ``figures``: tok/s median, p10, p90 and n over the last ``measure_s`` seconds
    (default the hold), and the user's named figures) or FAILED (StepFailed with the reason and
    the log tail). A ``measure_s`` longer than the hold keeps watching after READY; the trainer
    failing then fails the proof. The trainer's GPU memory is what the unit's processes hold
    (``proof.unit_gpu.unit_memory``: nvidia-smi's processes by control group; ``cgroup_of`` reads a pid's);
    where nvidia-smi cannot say whose memory is whose, each GPU's reading less ``baseline`` ({index: MiB}
    held before the start, never counted as the trainer's: see ``ours``), and the proof says so
    (``gpu_memory``). ``progress_path``: the trainer's own progress file, read from
    ``progress_from`` (``proof.progress_file.progress_start``, taken right before the start): progress
    comes from it, the marker, the exit reason and the tail from ``log_path``, errors from both
    (``proof.progress_file.ProgressView``). ``log_interval_s`` (shorter than ``interval_s``): the log alone is
    read this often between the observations of the unit and the GPUs, so that the Judge times a step and
    the hold's start when the log showed them (``Snapshot.step_seen_at``, ``log_ready_at``), and an error
    line is judged at once; None: the log is read with each observation only. ``paused``: the
    ``job.wait.PausedClock`` to read time and sleep with (in place of ``clock`` and ``sleep``) - time the proof did
    not run (its container frozen) is not the trainer's: the verdict says how long it was (``paused_s``)."""
    if paused is not None:
        clock, sleep = paused.clock, paused.sleep
    # the searches of each line run under a time bound that ends at the proof's deadline at the latest
    # (proof.trainer_log.LineBound): a regex that backtracks without end on a real line ends the proof as a
    # verdict naming it, never holds the job (and its lease) past the deadline
    bound = LineBound(clock=clock)
    follower = StartLog(expect.invocation_id, ready_regex=regexes["ready_regex"],
                        step_regex=regexes["step_regex"], tokps_regex=regexes["tokps_regex"],
                        error_regexes=regexes["error_regexes"], extra_regexes=extra_regexes, bound=bound)
    marks = []  # (elapsed, counts) per poll: the measurement window's start
    reader = LogFileReader(log_path, follower)
    progress = None
    if progress_path:
        progress = ProgressFileReader(progress_path, ProgressAnalysis(
            ready_regex=regexes["ready_regex"], step_regex=regexes["step_regex"], tokps_regex=regexes["tokps_regex"],
            error_regexes=regexes["error_regexes"], extra_regexes=extra_regexes, bound=bound), progress_from)
        view = ProgressView(follower, progress.analysis)

    def analysis():
        """What the Judge reads as this start's log."""
        return view if progress is not None else follower.analysis
    # the Judge counts from the wait's start (elapsed seconds, start 0): its deadline is the waiter's
    judge = Judge(expect, start=0.0)
    # the unit's control group: whose processes' GPU memory is the trainer's
    show_cmd = show_argv(unit, properties=SHOW_PROPERTIES + ("ControlGroup",), systemctl=systemctl)
    extra_s = max(0.0, (measure_s or 0) - expect.hold_s)
    found = {"proof": None, "until": None}  # the proof once READY; the end of the measurement (elapsed)

    log_only = bool(log_interval_s) and log_interval_s < interval_s
    seen = {"observed_at": None, "step": None, "step_at": None, "ready_at": None, "last": None,
            "smi_warnings": (), "gpu_rule": None}

    def read_log():
        """Read this start's log (and progress file) -> elapsed seconds; note when it first showed its
        highest step and when its conditions first all held."""
        try:
            reader.poll()
        except (IOError, OSError) as exc:
            raise StepFailed("Unable to read log %s: %s" % (log_path, exc))
        if progress is not None:
            try:
                progress.poll()
            except (IOError, OSError) as exc:
                raise StepFailed("Unable to read the progress file %s: %s" % (progress_path, exc))
        now = clock() - began
        log = analysis()
        step = log.max_step if getattr(log, "marker", None) is not None else None
        if step is not None and (seen["step"] is None or step > seen["step"]):
            seen.update(step=step, step_at=now)
        ready = not log_missing(expect, log)
        seen["ready_at"] = (seen["ready_at"] if seen["ready_at"] is not None else now) if ready else None
        return now

    def observe():
        """-> (unit properties, GPUs, why the log cannot prove this start or None); None between the
        observations (``log_interval_s``): only the log was read, and it shows no error."""
        if log_only and seen["observed_at"] is not None:
            now = read_log()
            last = seen["last"]
            due = min(seen["observed_at"] + interval_s, last.wake_at if last.wake_at is not None else now)
            if now < due - 1e-3 and not analysis().errors:
                return None
        seen["observed_at"] = clock() - began
        # unit first, log last: the log is then at least as fresh as the unit state
        rc, out, err = call(run, show_cmd)
        if rc != 0:
            raise StepFailed("Unable to read unit %s: %s" % (unit, (err or out).strip()))
        props = parse_show(out)
        try:
            gpus, seen["smi_warnings"] = read_gpus(run, nvidia_smi, processes=True, name_of=_no_name)
        except NvidiaSmiError as exc:
            raise StepFailed(str(exc), reason=str(exc), log_tail=follower.analysis.tail(expect.tail_lines))
        read_log()
        if not is_running(props):
            follower.finish()  # the process is gone: a last line without newline is final
            if progress is not None:
                progress.finish()
        # a log that lost this start's marker (truncated or replaced by something else, and no
        # continuation marker from the launcher) cannot prove it
        # nor can a progress file that is not the trainer's own (proof.progress_file.trust_problem)
        return props, gpus, reader.problem(clock(), LOG_LOST_GRACE_S) or (progress and progress.problem)

    def snapshot(props, gpus, elapsed):
        group = props.get("ControlGroup")
        mib, rule = unit_memory(gpus, group, cgroup_of or read_cgroup, seen["smi_warnings"])
        if is_running(props) or seen["gpu_rule"] is None:  # a process gone has no control group left
            seen["gpu_rule"] = rule_words(rule, gpus, group)
        if rule != BY_PROCESS:
            mib = ours(memory_by_index(gpus), baseline)
        return Snapshot(now=elapsed, unit=props, gpus_mib=mib,
                        log=analysis(), step_seen_at=seen["step_at"], log_ready_at=seen["ready_at"],
                        elsewhere=look_elsewhere(props, elapsed))

    # a log without progress: where the trainer writes it (proof.progress_elsewhere), looked for now and then
    finder = None if progress else Finder(exclude=[log_path, log_path + ".start"])

    def look_elsewhere(props, elapsed):
        if finder is None or log_shows_progress(analysis()) or elapsed < LOOK_AFTER_S:
            return None
        if finder.found is None and (seen.get("looked") is None or elapsed - seen["looked"] >= LOOK_EVERY_S):
            seen["looked"] = elapsed
            finder.look(cgroup_pids(props.get("ControlGroup")))
        return finder.found

    def judge_proof(observed, elapsed):
        if observed is None:  # only the log was read: the last observation's verdict stands
            last = seen["last"]
            return waiting(last.words, wake_at=last.wake_at, deadline=last.deadline)
        seen["last"] = verdict = judge_observation(observed, elapsed)
        return verdict

    def judge_observation(observed, elapsed):
        props, gpus, lost = observed
        verdict = judge.observe(snapshot(props, gpus, elapsed))
        marks.append((elapsed, _counts(analysis())))
        if verdict.state == READY:
            if found["until"] is None:
                proof = dict(verdict.details, msg=verdict.reason, gpu_memory=seen["gpu_rule"])
                if paused is not None and paused.paused_s:
                    proof["paused_s"] = round(paused.paused_s, 1)
                if baseline and any(baseline.values()):
                    proof["baseline_mib"] = {i: m for i, m in baseline.items() if m}
                    proof["baseline_words"] = ", ".join(
                        "GPU %s %s MiB" % (i, m) for i, m in sorted(proof["baseline_mib"].items()))
                if progress is not None:
                    proof["progress_file"] = progress.describe()
                found.update(proof=proof, until=elapsed + extra_s)
                bound.deadline = began + max(expect.timeout_s, found["until"])
            if elapsed >= found["until"]:
                window = float(measure_s or expect.hold_s)
                return done(dict(found["proof"], figures=measured(analysis(), marks, elapsed, window)))
        if verdict.state == FAILED:
            return failed(verdict.reason, verdict)
        if lost:
            return failed(lost)
        if found["until"] is not None:  # measuring after READY: the proof's deadline no longer applies
            return waiting("measuring throughput", wake_at=found["until"],
                           deadline=max(expect.timeout_s, found["until"]))
        return waiting("waiting for: %s (%s s of %s)" % (verdict.reason, fmt_s(elapsed), fmt_s(expect.timeout_s)),
                       wake_at=judge.wake_at)

    def regex_failed(exc):
        reason = "the proof stopped reading the log: %s" % exc
        tail = follower.analysis.tail(expect.tail_lines)
        return StepFailed(failure_msg(reason, tail, expect.tail_lines), ready=False, reason=reason, log_tail=tail,
                          regex=exc.label, line=exc.line_no)

    began = clock()
    bound.deadline = began + expect.timeout_s
    try:
        out = poll_until(observe, judge_proof, expect.timeout_s, log_interval_s if log_only else interval_s,
                         clock=clock, sleep=sleep, on_wait=_ticker(tick))
    except RegexTimeout as exc:
        raise regex_failed(exc)
    if progress is not None:
        progress.close()  # a later poll (the exit's grace below) opens it again where it ended
    if out.state == WAIT_DONE:
        return out.value
    verdict = out.value
    if verdict is None:  # the log lost this start (the Judge decides at its deadline: never a timeout)
        reason = out.words if out.state != WAIT_TIMEOUT else "not ready after %s s (%s): %s" % (
            fmt_s(expect.timeout_s), setting("timeout_s", expect.timeout_s), out.words)
        raise StepFailed(failure_msg(reason, [], expect.tail_lines), ready=False, reason=reason, log_tail=[])
    props, gpus, _lost = out.snapshot
    if is_running(props) and analysis().errors:
        # give the process a moment to exit so the verdict carries its exit status
        exited = poll_until(lambda: _show_soft(run, show_cmd), _exited, ERROR_EXIT_GRACE_S, 0.1,
                            clock=clock, sleep=sleep, first={})
        if exited.state == WAIT_DONE:
            try:
                reader.poll()
                follower.finish()
                if progress is not None:
                    progress.poll().finish()
            except RegexTimeout as exc:
                raise regex_failed(exc)
            verdict = judge.observe(snapshot(exited.value, gpus, out.elapsed + exited.elapsed))
    details = dict(verdict.details)
    if seen["gpu_rule"]:
        details["gpu_memory"] = seen["gpu_rule"]
    tail = details.get("log_tail") or []
    details.pop("reason", None)
    reason = verdict.reason
    if found["until"] is not None:
        reason = "after it was proved ready, during the throughput measurement: " + reason
    low = [i for i, m in (details.get("gpus_mib") or {}).items() if m is not None and m < expect.min_mib]
    if low and seen["gpu_rule"]:  # which memory was counted as the trainer's, for the GPUs it does not hold
        reason += "; counted as the trainer's: %s" % seen["gpu_rule"]
    if paused is not None and paused.paused_s:
        details["paused_s"] = round(paused.paused_s, 1)
        reason += " (%s s when the proof did not run - its container frozen - not counted)" % fmt_s(paused.paused_s)
    msg = failure_msg(reason, tail, expect.tail_lines)
    if progress is not None:
        msg += progress.words(expect.tail_lines)
        details["progress_tail"] = list(progress.analysis.lines)[-expect.tail_lines:]
    raise StepFailed(msg, ready=False, reason=reason, **details)


def _no_name(_pid):
    """The proof needs no process names (nvidia-smi's are forgeable, /proc's are not needed)."""
    return None


def _show_soft(run, show_cmd):
    """The unit's properties, {} when systemctl show fails (a hang still raises StepFailed)."""
    rc, out, _err = call(run, show_cmd)
    return parse_show(out) if rc == 0 else {}


def _exited(props, _elapsed):
    """Judge: the process has exited (its properties say so)."""
    return done(props) if props and not is_running(props) else waiting("the process to exit")


def expectations(invocation_id, n_restarts, p):
    """Expectations from the proof's parameters (trainer_restart's option names)."""
    return readiness_expectations(invocation_id, n_restarts, p, gpus=p.get("gpus"))
