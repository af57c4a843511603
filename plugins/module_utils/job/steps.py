# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The wiring of the restart job (``trainer_restart``) on the target, apart from the module.

``Steps`` binds the cycle's steps (systemd, GPUs, the log) to the module's parameters and
``Layout`` the release root; ``run_restart`` is the job's entry (the lease, the state file, the
outcome); ``detach`` runs it in a grandchild detached from the connection; ``job_recorded`` and
``job_ended`` judge the job's state file for the one waiter (``job.wait.poll_until``); ``summary``,
``job_message`` and ``wait_report`` shape what the module returns; ``before_start`` pre-flights
and installs in the same remote call, before the job is started.

Everything here is imported when the module loads: the detached job is a fork of the module's
process, never a re-exec, so it needs no file of the module's payload once it runs.
"""

from __future__ import annotations

import os
import time

from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import (
    LOG_POLL_S,
    START_TIMEOUT_S,
    STOP_MARGIN_S,
    StepFailed,
    compile_regexes,
    drain,
    expectations,
    prove,
    show,
    start,
    stop,
)
from ansible_collections.dflash.trainer.plugins.module_utils.target.config_id import job_config_id, unit_path_of
from ansible_collections.dflash.trainer.plugins.module_utils.target.inductor_cache import CacheRefused, purge
from ansible_collections.dflash.trainer.plugins.module_utils.target.install import (
    ProvedConfig,
    change_reasons,
    config_files,
    install_all,
)
from ansible_collections.dflash.trainer.plugins.module_utils.job.result import JobResult
from ansible_collections.dflash.trainer.plugins.module_utils.job.state import (
    DIED,
    ENDED,
    NOT_ON_RECORD,
    job_end,
    outcome_words,
    pid_start,
    read_state,
    write_state,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.ledger import append_ledger, ledger_path, read_ledger
from ansible_collections.dflash.trainer.plugins.module_utils.job.lock import LeaseKeeper, play_lease, release
from ansible_collections.dflash.trainer.plugins.module_utils.target.node_gpu import mib_by_index
from ansible_collections.dflash.trainer.plugins.module_utils.proof.preflight import run_preflight
from ansible_collections.dflash.trainer.plugins.module_utils.proof.progress_file import collision, progress_start
from ansible_collections.dflash.trainer.plugins.module_utils.release.root import (
    _Lock,
    read_current,
    read_last_good,
    releases_dir,
    switch_current,
    write_last_good,
)
from ansible_collections.dflash.trainer.plugins.module_utils.job.restart import RestartJob
from ansible_collections.dflash.trainer.plugins.module_utils.target.command import Runner
from ansible_collections.dflash.trainer.plugins.module_utils.target.secrets import cut, mask, read_secrets
from ansible_collections.dflash.trainer.plugins.module_utils.target.systemd import int_prop, is_running, state_words
from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import PROVED, REASON_CHARS, entry
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import DONE, FAILED, PausedClock, done, failed, waiting


def reproof_settings(p):
    """The proof's settings for a release brought back with the configuration it was proved with (its proof is
    in the ledger): the same conditions - the unit active on this start, its GPUs held, the step counter rising
    (twice at least within the window, the judge's own rule) - held for the stall window, the least in which the
    judge can see progress, instead of the whole hold; and no throughput window after it."""
    settings = expectations("", 0, p)  # the settings in force, a default for any not given
    return dict(p, hold_s=min(settings.hold_s, settings.stall_s), measure_s=None)


class Steps(object):
    """The cycle's steps, bound to this module's parameters."""

    def __init__(self, p, systemctl, nvidia_smi, tick):
        self.p, self.systemctl, self.nvidia_smi, self.tick = p, systemctl, nvidia_smi, tick
        self.baseline = None
        self.regexes = compile_regexes(p["ready_regex"], p["step_regex"], p["tokps_regex"], p["error_regexes"])
        why = collision(p)  # the trainer's own progress file is only read: never a file the collection writes
        if why:
            raise StepFailed("trainer_progress_path: " + why)
        self.progress_from = None  # where the progress file ended right before the last start

    # The stop and the drain, like the proof, wait on a PausedClock: a container frozen while they wait (a
    # suspend-mode backup) is not counted against their deadlines

    def stop(self):
        return stop(Runner(self.p["stop_timeout_s"] + STOP_MARGIN_S, clock=PausedClock().clock), self.systemctl,
                    self.p["unit"])

    def drain(self):
        paused = PausedClock()
        deadline = paused.clock() + self.p["drain_timeout_s"]
        try:
            details = drain(Runner(deadline=deadline, clock=paused.clock), self.nvidia_smi, gpus=self.p["gpus"],
                            max_mib=self.p["drain_max_mib"], timeout_s=self.p["drain_timeout_s"], tick=self.tick,
                            allowance=mib_by_index(self.p["gpu_foreign_mib"]), clock=paused.clock,
                            sleep=paused.sleep)
        except StepFailed as exc:
            self.baseline = exc.details.get("gpus_mib")  # a start that goes ahead anyway (bringing back)
            raise
        self.baseline = details.get("gpus_mib")  # memory there before the start is never the trainer's
        return details

    def purge(self):
        try:
            return purge(self.p["purge_dir"])
        except CacheRefused as exc:  # refused: a step that failed, in the purge's words
            raise StepFailed(exc.msg)

    def start(self):
        if self.p.get("progress_path"):  # the trainer is stopped: its progress file ends here
            self.progress_from = progress_start(self.p["progress_path"])
        return start(Runner(), self.systemctl, self.p["unit"], start_run=Runner(START_TIMEOUT_S))

    def prove(self, invocation_id, n_restarts, reproof=False):
        p = reproof_settings(self.p) if reproof else self.p
        # a freeze of the container (a suspend-mode backup) stops the trainer and this job alike: the proof's
        # clock stops with them (PausedClock), so that a frozen minute is never judged a stall or a timeout
        paused = PausedClock()
        deadline = paused.clock() + p["timeout_s"]
        return prove(Runner(deadline=deadline, clock=paused.clock), self.systemctl, self.nvidia_smi, p["unit"],
                     p["log_path"], expectations(invocation_id, n_restarts, p), self.regexes,
                     interval_s=p["interval_s"], tick=self.tick, measure_s=p["measure_s"],
                     extra_regexes=p["measure_regexes"], baseline=self.baseline,
                     progress_path=p.get("progress_path") or None, progress_from=self.progress_from,
                     log_interval_s=LOG_POLL_S, paused=paused)

    def unit_state(self):
        try:
            props = show(Runner(), self.systemctl, self.p["unit"])
        except StepFailed as exc:
            return "the unit's state is unknown (%s)" % exc.msg
        if is_running(props):
            return "%s is running (pid %d)" % (self.p["unit"], int_prop(props, "MainPID", 0))
        return "%s is stopped (%s)" % (self.p["unit"], state_words(props))


def _cut_reason(e):
    """A ledger entry whose reason (masked already) is cut to REASON_CHARS: mask first, cut after."""
    if isinstance(e.get("reason"), str):
        e["reason"] = cut(e["reason"], REASON_CHARS)
    return e


class Layout(object):
    def __init__(self, root, secrets=()):
        self.root = root
        self.secrets = secrets
        self.ledger_path = ledger_path(root)

    def ledger(self):
        return read_ledger(self.ledger_path)

    def record(self, entries):
        with _Lock(self.root):
            # a configuration id is a keyed hash, never a value: kept whole (a 3-digit value would mask part of it)
            append_ledger(self.ledger_path, [_cut_reason(dict(mask(e, self.secrets), **(
                {"config": e["config"]} if e.get("config") else {}))) for e in entries])

    def current(self):
        return read_current(self.root)

    def last_good(self):
        return read_last_good(self.root)

    def switch(self, rid):
        with _Lock(self.root):
            switch_current(self.root, rid)

    def mark_good(self, rid):
        with _Lock(self.root):
            write_last_good(self.root, rid)


class JobRecord(object):
    """The job's state file (``p["state_path"]``): who the job is, its phase, what the phase still
    waits for and, at the end, its outcome - secrets masked in every write."""

    def __init__(self, p, pid, secrets=(), keeper=None, clock=time.time, monotonic=time.monotonic):
        self.path, self.secrets, self.keeper, self.clock, self.monotonic = p["state_path"], secrets, keeper, clock, monotonic
        self.state = dict(version=1, job_id=p["job_id"], pid=pid, pid_start=pid_start(pid), owner=p["owner"],
                          started=clock(), started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          reasons=p["reasons"], phase="starting job", done=False, timeline=[])
        self.last_said = 0.0
        self.began = monotonic()

    def save(self):
        write_state(self.path, mask(self.state, self.secrets))

    def tick(self, waiting=None):  # pylint: disable=redefined-outer-name
        """What the phase still waits for, for the watcher (the lease is renewed by its keeper)."""
        now = self.monotonic()
        if waiting and now - self.last_said >= 2.0:
            self.last_said = now
            self.state.update(waiting=waiting)
            self.save()

    def on_phase(self, name, **kw):
        # [phase, seconds since the job began] for each phase: where a restart's time went
        self.state["timeline"].append([name, round(self.monotonic() - self.began, 3)])
        self.state.update(phase=name, phase_at=self.clock(), waiting=None, **kw)
        self.save()
        self.keeper.renew()

    def finish(self, result):
        self.state["timeline"].append(["finished", round(self.monotonic() - self.began, 3)])
        self.state.update(done=True, phase="done", finished=self.clock(), result=result)
        self.save()


def run_restart(p, systemctl, nvidia_smi, pid=None, make_steps=Steps, release_lock=release):
    """The job's entry: record the job, take the lease over, run the restart (and its rollback),
    free the lock, record the outcome -> the result (secrets masked). Never raises for a failed
    step or a crash in the cycle: there is always an outcome and a free lock."""
    pid = os.getpid() if pid is None else pid
    # the configuration proved with the last good release, kept beside it and restored with it
    config = ProvedConfig(p["root"], config_files(p, unit_path=p.get("unit_path") or unit_path_of(p["unit"]),
                                                  launcher_path=p.get("launcher_path"), env_path=p["env_file"]),
                          Runner(60), systemctl)
    secrets = sorted(set(read_secrets(p["env_file"])) | set(config.secrets()), key=lambda v: (-len(v), v))
    record = JobRecord(p, pid, secrets)
    record.save()

    def make_job(keeper):
        steps = make_steps(p, systemctl, nvidia_smi, record.tick)
        return RestartJob(steps, Layout(p["root"], secrets), rollback=p["rollback"], purge=bool(p["purge_dir"]),
                          on_phase=record.on_phase, releases_dir=releases_dir(p["root"]),
                          log_path=p["log_path"], source=p["source"] or None,
                          min_tokps_ratio=p["min_tokps_ratio"] or None, lease=keeper, config=config,
                          config_id=lambda: job_config_id(p), release=p.get("release") or None,
                          mark_good=p.get("mark_good", True), restore_config=p.get("restore_config", False))

    return run_under_lease(p, record, secrets, pid, "restart job", make_job, release_lock=release_lock)


def run_under_lease(p, record, secrets, pid, what, make_job, release_lock=release):
    """Run a job of the restart job's kind (a restart, a stop) to its outcome: take the lease over
    from the play (same token, renewed with the job's id and pid in one guarded rewrite) and renew it
    from a thread for as long as the job runs - a stop as long as TimeoutStopSec or a long proof
    included; ``make_job(keeper)`` builds the job, whose ``run()`` checks the lease is still its own
    before it stops, switches or starts anything. Then free the lock and record the outcome -> the
    result (secrets masked: log tails and failure reasons, a trainer may print a token). Never raises
    for a failed step or a crash: there is always an outcome and a free lock."""
    keeper = record.keeper = LeaseKeeper(p["lock_path"], p["lock_token"], p["lock_lease_s"], job=p["job_id"], job_pid=pid)
    try:
        with keeper:
            result = make_job(keeper).run()
    except StepFailed as exc:  # before the cycle (a bad regex): nothing was stopped
        result = JobResult(ok=False, msg=exc.msg, outcome="nothing was stopped: " + exc.msg).to_dict()
    except Exception as exc:  # pylint: disable=broad-exception-caught  # always an outcome and a free lock
        result = JobResult(ok=False, msg="%s crashed: %r" % (what, exc), outcome="%s crashed: %r" % (what, exc)).to_dict()
    finally:
        # keep_lock: a trainer group's member - the job only stops renewing, so the lock stays the play's (same token)
        # for the rest of its lease: the play takes it back to decide for every member at once
        if p["lock_path"] and not keeper.lost and not p.get("keep_lock"):
            release_lock(p["lock_path"], p["lock_token"])
    result = mask(result, secrets)
    record.finish(result)
    return result


def mark_proved(p, systemctl):
    """After the group's check (trainer_restart O(operation=good)): the release this member's job ``p["job_id"]``
    proved becomes its last good one, the configuration in place is kept beside it and the ledger records it
    proved, dated by that job's end -> dict(release, previous). Raises StepFailed when that job did not prove a
    release."""
    state = read_state(p["state_path"]) or {}
    result = state.get("result") or {}
    if state.get("job_id") != p["job_id"] or not result.get("ok") or not result.get("release"):
        raise StepFailed("restart job %s did not prove a release here; nothing was marked good" % p["job_id"])
    release = result["release"]
    config = ProvedConfig(p["root"], config_files(p, unit_path=p.get("unit_path") or unit_path_of(p["unit"]),
                                                  launcher_path=p.get("launcher_path"), env_path=p["env_file"]),
                          Runner(60), systemctl)
    secrets = sorted(set(read_secrets(p["env_file"])) | set(config.secrets()), key=lambda v: (-len(v), v))
    layout = Layout(p["root"], secrets)
    previous = layout.last_good()
    layout.mark_good(release)
    config.keep(release)
    source = p["source"] or next((e["source"] for e in reversed(layout.ledger())
                                  if e.get("release") == release and e.get("source")), None) or "content %s" % release
    # the entry is dated by the member's own proof (its job's end), not by this call: an activation that started
    # after it - systemd's Restart= between the proof and the group's verdict - is never taken for the proved one
    proved_at = state.get("finished") if isinstance(state.get("finished"), (int, float)) else None
    layout.record([entry(release, PROVED, result.get("figures"), source, "proved with every member of its group",
                         now=proved_at, config=job_config_id(p))])
    return dict(release=release, previous=previous)


def before_start(p, get_bin_path, run, systemctl, install=True):
    """What the start call does before it starts the job, in this order: the pre-flight of
    ``p["preflight"]`` (while the old trainer runs; its environment: ``p["environment_json"]``) and
    the install of ``p["install"]`` (the launcher, environment file ``p["env_content"]`` and unit), the play's lease renewed meanwhile (a pre-flight may outlast
    it) -> the fields for the module's result (``preflight``, ``install``); the files that changed
    join ``p["reasons"]``. Raises proof.preflight.Refused (nothing installed) or
    target.install.InstallError (nothing stopped)."""
    fields = {}
    lock = dict(path=p["lock_path"], token=p["lock_token"], lease_s=p["lock_lease_s"]) if p["lock_path"] else None
    with play_lease(lock):
        if p.get("preflight"):
            # in the unit's environment: the new unit and environment file when this call installs them,
            # else the ones in place
            inst = p.get("install") or {}
            unit = dict(env_content=p.get("env_content") if inst else None, unit_content=inst.get("unit_content"),
                        env_path=inst.get("env_path") or p.get("env_file"),
                        unit_path=inst.get("unit_path") or p.get("unit_path"),
                        launcher_content=inst.get("launcher_content"),
                        launcher_path=inst.get("launcher_path") or p.get("launcher_path"))
            fields["preflight"] = run_preflight(dict(p["preflight"], environment_json=p.get("environment_json") or "{}",
                                                     unit_files=unit), get_bin_path)
        if p.get("install") and install:  # (install False: a trainer group's pre-flight phase)
            fields["install"] = install_all(dict(p["install"], env_content=p.get("env_content") or ""), run, systemctl)
    p["reasons"] = list(p["reasons"]) + [r for r in change_reasons(fields.get("install")) if r not in p["reasons"]]
    return fields


def detach(run):
    """Call ``run()`` in a grandchild detached from this process's session and streams (it
    survives the connection, the controller and this process) -> the grandchild's pid, in words
    ("?" when it did not say)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the detached side, exercised by the lab tests
        try:
            os.close(read_end)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.chdir("/")
            os.write(write_end, b"%d" % os.getpid())
            os.close(write_end)
            run()
        except BaseException:  # exit_json/fail_json end in SystemExit: the outcome is in the state file
            pass
        os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    pid = os.read(read_end, 32).decode() or "?"
    os.close(read_end)
    return pid


def job_recorded(job_id):
    """Judge: the job ``job_id`` has recorded itself in the state file (-> its state)."""
    def judge(state, _elapsed):
        return done(state) if state.get("job_id") == job_id else waiting("restart job %s to record itself" % job_id)
    return judge


def job_message(result):
    msg = result.get("msg") or "restart failed"
    if result.get("outcome") and result.get("outcome") not in msg:
        msg += "\n\n" + result["outcome"]
    return msg


def summary(result, **extra):
    """What the module returns for a finished job -> (ok, fields); ``msg`` among them when not ok."""
    fields = dict(changed=True, finished=True, phase="done", result=result, **extra)
    if not result.get("ok"):
        fields["msg"] = job_message(result)
    return bool(result.get("ok")), fields


def job_ended(job_id):
    """Judge of (state, alive) observations: the job ``job_id`` is done (-> its state), or died
    without an outcome (failed, -> its state); else the phase it is in."""
    def judge(observed, _elapsed):
        state, alive = observed
        end = job_end(state, alive, job_id)
        if end == ENDED:
            return done(state)
        if end == DIED:
            return failed("restart job %s died in phase %s without an outcome" % (job_id, state.get("phase")), state)
        if end == NOT_ON_RECORD:
            return waiting("not started", None)
        phase = state.get("phase", "not started")
        if state.get("waiting"):
            phase = "%s, %s" % (phase, state["waiting"])
        return waiting(phase, state)
    return judge


def wait_report(out, state_path):
    """What operation=wait returns for the waiter's outcome ``out`` of ``job_ended`` -> (ok, fields), with
    the job's timeline ([phase, seconds since it began], ...) and what its phase waits for, for the
    watcher's lines."""
    state = (out.snapshot or (None, None))[0] or {}
    seen = dict(timeline=state.get("timeline") or [], waiting=state.get("waiting") or "")
    if out.state == DONE:
        ok, fields = summary(out.value.get("result") or {}, job=outcome_words(out.value))
        return ok, dict(fields, **seen)
    if out.state == FAILED:
        return False, dict(msg="%s (state %s)" % (out.words, state_path), finished=True,
                           phase=out.value.get("phase"), result={}, **seen)
    return True, dict(changed=False, finished=False, phase=out.words, job=outcome_words(out.value) if out.value else "",
                      **seen)
