# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deliberate stop: ``trainer_restart operation=stop``, run as a job on the target like a restart.

An operator who stops the trainer on purpose gets the same guarantees as a restart: under the
deploy lock (the job takes the play's lease over, renews it, checks it is still its own before it
stops anything, and releases it at the end), recorded in the restart job's state file (so the
next run, ``status`` included, knows the trainer was stopped on purpose, by whom and when) and
detached from the connection (a lost link never leaves a half-told stop). The job

  look (what runs: release, pid, uptime, the last step and tok/s of this start's log)
  -> stop (systemctl stop: the whole tree; systemd's Restart= never restarts a unit stopped so)
  -> drain (every trainer GPU at or below the drain limit)
  -> disable (only when asked: the unit then stays stopped across a reboot of the container)

and its result's ``stopped`` says what it stopped. ``StopJob`` takes its steps as callables, so
tests drive it with fakes; ``run_stop`` wires it to the module's parameters (``job.steps``'s
``Steps`` and ``JobRecord``); status judges what it recorded with ``plan.status.stopped_on_purpose``.
"""

from __future__ import annotations

import os
import time

from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed, call, show
from ansible_collections.dflash.trainer.plugins.module_utils.job.result import JobResult
from ansible_collections.dflash.trainer.plugins.module_utils.job.lock import LeaseLost, release
from ansible_collections.dflash.trainer.plugins.module_utils.job.steps import JobRecord, Steps, run_under_lease
from ansible_collections.dflash.trainer.plugins.module_utils.target.command import Runner
from ansible_collections.dflash.trainer.plugins.module_utils.target.secrets import read_secrets
from ansible_collections.dflash.trainer.plugins.module_utils.plan.status import (
    STOP_KIND,
    fmt_uptime,
    read_log,
    release_from_proc,
)
from ansible_collections.dflash.trainer.plugins.module_utils.target.systemd import int_prop, is_running, runtime_s


def what_runs(props, release_id=None, seconds=None, step=None, tok_s=None):
    """What the stop is about to stop, from the unit's properties before it (``systemctl show``) and what
    was read besides: the release (from its processes' environment or its log's marker), its uptime
    and this start's last step and tok/s."""
    running = is_running(props)
    return dict(running=running, release=release_id or None, main_pid=int_prop(props, "MainPID", 0) if running else 0,
                invocation_id=props.get("InvocationID", "") or None,
                started_at=props.get("ExecMainStartTimestamp", "") or None,
                seconds_up=round(seconds, 1) if running and seconds is not None else None,
                step=step if running else None, tok_s=tok_s if running else None,
                state_before="%s/%s" % (props.get("ActiveState", "?"), props.get("SubState", "?")))


def stop_words(unit, stopped):
    """One line for what the stop did (``stopped``: ``what_runs`` plus by, at_words, enabled, disabled,
    gpus_mib)."""
    if stopped.get("running"):
        what = "stopped %s: release %s, pid %s, up %s" % (
            unit, stopped.get("release") or "?", stopped.get("main_pid"), fmt_uptime(stopped.get("seconds_up")))
        if stopped.get("step") is not None or stopped.get("tok_s") is not None:
            what += ", last step %s at %s tok/s" % (
                "-" if stopped.get("step") is None else stopped["step"],
                "-" if stopped.get("tok_s") is None else stopped["tok_s"])
    else:
        what = "%s was not running (%s); recorded as stopped" % (unit, stopped.get("state_before"))
    what += " - on purpose, by %s at %s" % (stopped.get("by") or "?", stopped.get("at_words") or "?")
    if stopped.get("gpus_mib"):
        what += "; GPUs drained (MiB %s)" % ", ".join("%s: %s" % kv for kv in sorted(stopped["gpus_mib"].items()))
    if stopped.get("disabled"):
        what += "; the unit is disabled: it stays stopped across a reboot of the container until a start"
    elif stopped.get("enabled"):
        what += "; the unit stays enabled: it starts again when the container boots (trainer_stop_disable=true " \
                "keeps it stopped)"
    return what


class StopJob(object):
    """One deliberate stop. ``steps`` provides stop(), drain(), unit_state(); ``look()`` -> ``what_runs``
    before the stop; ``disable()`` (None: not asked) disables the unit; ``enabled()`` -> the unit's
    UnitFileState after it; ``lease`` .check() raises LeaseLost once the lock is not ours."""

    def __init__(self, steps, look, unit, owner="unknown", disable=None, enabled=None, lease=None, on_phase=None,
                 clock=time.time):
        self.steps, self.look, self.unit, self.owner = steps, look, unit, owner
        self.disable, self.enabled, self.lease = disable, enabled, lease
        self.on_phase = on_phase or (lambda phase, **kw: None)
        self.clock = clock
        self.phases = []

    def phase(self, name, **kw):
        self.phases.append(name)
        self.on_phase(name, **kw)

    def run(self):
        """-> the result dict (``job.result`` keys): ``stopped`` says what was stopped, by whom, when."""
        stopped = {}
        try:
            self.phase("looking")
            stopped = dict(self.look())
            if self.lease is not None:
                self.lease.check()  # nothing is stopped for a lock that is no longer ours
            now = self.clock()
            stopped.update(by=self.owner, at=round(now, 3),
                           at_words=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
            self.phase("stopping", release=stopped.get("release"))
            self.steps.stop()
            self.phase("draining", release=stopped.get("release"))
            drained = self.steps.drain() or {}
            stopped["gpus_mib"] = drained.get("gpus_mib") or {}
            if self.disable is not None:
                self.phase("disabling")
                self.disable()
                stopped["disabled"] = True
            stopped["enabled"] = self._enabled()
            words = stop_words(self.unit, stopped)
            self.phase("done")
            return JobResult(ok=True, outcome=words, release=stopped.get("release"), restarted=False,
                             rolled_back=False, proof=None, stopped=stopped).to_dict()
        except LeaseLost as exc:
            msg = ("the stop job stopped acting: the deploy lock is no longer its own (%s); nothing was stopped by it"
                   % exc.msg)
            return self._failed(msg, stopped, lease_lost=True)
        except StepFailed as exc:
            return self._failed("stopping %s failed: %s" % (self.unit, exc.msg), stopped,
                                failure_details=exc.details, failure=exc.msg)
        except Exception as exc:  # pylint: disable=broad-exception-caught  # always an outcome and a free lock
            return self._failed("stopping %s failed: unexpected error: %s: %s" % (self.unit, type(exc).__name__, exc),
                                stopped, failure="unexpected error: %r" % (exc,))

    def _enabled(self):
        try:
            return self.enabled() == "enabled" if self.enabled is not None else None
        except Exception:  # pylint: disable=broad-exception-caught  # bookkeeping
            return None

    def _failed(self, msg, stopped, **extra):
        failed_phase = self.phases[-1] if self.phases else None
        self.phase("done")
        outcome = "%s. %s" % (msg.splitlines()[0], self.steps.unit_state())
        # a stop that reached systemctl stop is on record as deliberate (status says so), its failure with it
        return JobResult(ok=False, msg=msg, outcome=outcome, failed_phase=failed_phase,
                         stopped=stopped if "at" in stopped and failed_phase != "stopping" else None,
                         **extra).to_dict()


# ---------------------------------------------------------------------------------------------
# the wiring on the target

def look(p, systemctl, run=None, monotonic=time.monotonic):
    """``what_runs`` of the unit now: its properties, the release from its processes' environment (else
    the log's marker) and the last progress of this start's log (cheap: read from the start's marker)."""
    run = run or Runner()
    props = show(run, systemctl, p["unit"])
    running = is_running(props)
    pid = int_prop(props, "MainPID", 0)
    release_id = release_from_proc(pid) if running and pid > 0 else None
    step = tok_s = None
    invocation = props.get("InvocationID", "")
    if running and invocation and p.get("log_path") and os.path.exists(p["log_path"]):
        try:
            follower, _where = read_log(p["log_path"], invocation)
            step, tok_s = follower.analysis.last_step, follower.analysis.tok_s
            release_id = release_id or (follower.marker or {}).get("release")
        except (IOError, OSError, ValueError):
            pass
    return what_runs(props, release_id, runtime_s(props, now_monotonic_s=monotonic() if running else None),
                     step, tok_s)


def disable_unit(run, systemctl, unit):
    rc, out, err = call(run, [systemctl, "disable", unit])
    if rc != 0:
        raise StepFailed("Unable to disable unit %s: %s" % (unit, (err or out).strip()))


def unit_file_state(run, systemctl, unit):
    return show(run, systemctl, unit).get("UnitFileState", "")


def enable_unit(run, systemctl, unit):
    """Enable the unit when it is not (a stop with trainer_stop_disable disabled it) -> whether it changed."""
    if unit_file_state(run, systemctl, unit) == "enabled":
        return False
    rc, out, err = call(run, [systemctl, "enable", unit])
    if rc != 0:
        raise StepFailed("Unable to enable unit %s: %s" % (unit, (err or out).strip()))
    return True


def run_stop(p, systemctl, nvidia_smi, pid=None, make_steps=Steps, release_lock=release, look_fn=look):
    """The stop job's entry: record the job (kind ``stop``), take the lease over, stop and drain
    (and disable, with ``p["disable"]``), free the lock, record the outcome -> the result. Never raises."""
    pid = os.getpid() if pid is None else pid
    secrets = sorted(set(read_secrets(p.get("env_file"))), key=lambda v: (-len(v), v))
    record = JobRecord(p, pid, secrets)
    record.state.update(kind=STOP_KIND, reasons=p.get("reasons") or ["stop requested"])
    record.save()
    run = Runner(60)

    def make_job(keeper):
        steps = make_steps(p, systemctl, nvidia_smi, record.tick)
        return StopJob(steps, lambda: look_fn(p, systemctl), p["unit"], owner=p["owner"],
                       disable=(lambda: disable_unit(run, systemctl, p["unit"])) if p.get("disable") else None,
                       enabled=lambda: unit_file_state(run, systemctl, p["unit"]), lease=keeper,
                       on_phase=record.on_phase)

    return run_under_lease(p, record, secrets, pid, "stop job", make_job, release_lock=release_lock)
