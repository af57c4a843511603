#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_restart
short_description: Restart, prove and roll back the trainer as one job on the target
description:
  - O(state=start) starts the job detached from the connection (a new session, double fork, no
    standard streams, without the file transfers of Ansible's async wrapper) and returns
    at once, once the job has recorded itself in O(state_path); the role uses this.
  - O(state=run) runs the whole restart cycle on the target - stop, GPU drain, cache purge, start,
    readiness proof, mark the release good - and on failure the rollback (C(current) back to the
    last good release, the same cycle again) or, with no good release to go back to, stops the
    failed trainer. Any error in any step ends in a restore or a rollback with a recorded reason.
    Started with O(state=start), it runs detached in the container, so a lost connection or a killed
    C(ansible-playbook) never strands a stopped trainer.
  - It takes the deploy lock's lease over from the play (O(lock_path), O(lock_token), a lease of
    O(lock_lease_s)), renews it from a thread while it runs, and checks it is still its own before it
    stops, switches or starts anything - once it is not, it stops acting and says who holds it. A
    second job refuses to start while one runs. It records its phase in O(state_path) (kept on disk,
    so a reboot in the middle is found by the next run); at the end it records its outcome there and
    releases the lock.
  - O(state=wait) waits up to O(wait_s) for the job O(job_id) and returns its phase, or its
    outcome when it has finished (failing when the restart failed). A job that died without an
    outcome is reported as such, with the unit's state.
author:
  - dflash.trainer maintainers (@dflash)
version_added: 0.2.0
extends_documentation_fragment:
  - dflash.trainer.log_patterns
options:
  state:
    description: V(start) starts the job detached and returns; V(run) runs it in the foreground
      (for tests); V(wait) watches it.
    type: str
    choices: [start, run, wait]
    default: run
  job_id:
    description: The job's id (the play's lock token is a good one).
    type: str
    required: true
  state_path:
    description: The job's state file in the container.
    type: path
    default: /var/lib/dflash-trainer/restart.json
  wait_s:
    description: With O(state=wait), how long to wait for the job to finish before returning its phase.
    type: float
    default: 30
  unit:
    description: The trainer's unit.
    type: str
  root:
    description: The release root (releases/, current, last_good).
    type: path
  log_path:
    description: The trainer's log.
    type: path
  purge_dir:
    description: The torchinductor cache directory, deleted while the trainer is stopped; empty - no purge.
    type: str
    default: ""
  gpus:
    description: The trainer's GPUs (drain and proof).
    type: list
    elements: int
  drain_max_mib:
    description: A GPU at or below this many MiB counts as drained.
    type: int
    default: 1024
  gpu_foreign_mib:
    description:
      - Per GPU index, the MiB other tenants hold (from the node's view, P(dflash.trainer.trainer_node_gpus#module)
        before the stop). The drain gate allows it on top of O(drain_max_mib).
      - Whatever a GPU holds after the drain (this included) is never counted as the trainer's by the proof.
    type: dict
    default: {}
  drain_timeout_s:
    description: Seconds the drain may take.
    type: float
    default: 60
  stop_timeout_s:
    description: The unit's TimeoutStopSec (systemctl stop is bounded by it plus 30 s).
    type: float
    default: 30
  min_mib:
    description: Memory every trainer GPU must hold to be ready (MiB).
    type: int
    default: 1024
  error_regexes:
    description: Lines that fail the proof at once.
    type: list
    elements: str
    default: []
  min_steps:
    description: Increasing step values needed.
    type: int
    default: 2
  hold_s:
    description: Seconds every condition must hold, with progress.
    type: float
    default: 10
  stall_s:
    description: The longest gap between step advances.
    type: float
    default: 5
  timeout_s:
    description: The proof's deadline.
    type: float
    default: 300
  interval_s:
    description: Poll interval.
    type: float
    default: 1
  tail_lines:
    description: Lines of the log shown on failure.
    type: int
    default: 20
  nvidia_smi:
    description: The nvidia-smi program.
    type: str
    default: nvidia-smi
  rollback:
    description: Put the last good release back (and prove it) when the proof fails.
    type: bool
    default: true
  reasons:
    description: Why the trainer restarts (recorded in the state file).
    type: list
    elements: str
    default: []
  owner:
    description: Who started the job, in words.
    type: str
    default: unknown
  lock_path:
    description: The deploy lock to renew while the job runs and release at its end; empty - none.
    type: str
    default: ""
  lock_token:
    description: The play's lock token.
    type: str
    default: ""
  lock_lease_s:
    description: The lease the job renews (a job that dies leaves the lock to expire after this).
    type: int
    default: 30
  measure_s:
    description: The throughput window (s) ending after the proof; longer than O(hold_s) keeps watching
      after ready. Unset - the hold.
    type: float
  measure_regexes:
    description: Figures to measure besides tok/s, by name - a regex whose first group is the number
      (e.g. name C(q_hs), regex C(q_hs=(\d+))).
    type: dict
    default: {}
  min_tokps_ratio:
    description: Refuse (and roll back) a release whose median tok/s is below this ratio of the previous
      good release's; 0 - no gate.
    type: float
    default: 0
  source:
    description: What the release was built from (git commit and dirty flag, or a content hash), for the ledger.
    type: str
    default: ""
  env_file:
    description:
      - The trainer's environment file. Its values are secrets - each is replaced by C(***) in the job's
        state file, the ledger, failure messages and log tails (the files are written mode 0600).
    type: path
notes:
  - Each job appends to the release ledger C(<root>/ledger.json) (the last 50 entries) - release, time,
    source, verdict, figures - and its result carries C(figures) and C(comparison) with the previous
    good release and the best.
  - Check mode is not supported by O(state=run) (the role does not call it in check mode).
"""

EXAMPLES = r"""
- name: Restart on the target (a detached job that survives the controller)
  dflash.trainer.trainer_restart:
    state: start
    job_id: "{{ token }}"
    unit: dflash-trainer
    root: /opt/dflash-trainer
    log_path: /workspace/trainer.log
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]

- name: Watch it
  dflash.trainer.trainer_restart:
    state: wait
    job_id: "{{ token }}"
  register: job
  until: job.finished
  retries: 30
  delay: 0
"""

RETURN = r"""
finished:
  description: Whether the job has finished (O(state=wait)).
  returned: always
  type: bool
phase:
  description: The job's phase (stopping, draining, purging, starting, proving, rolling back, done, ...).
  returned: always
  type: str
result:
  description: The job's outcome - ok, release, proof, failure, rolled_back, rollback_proof, outcome (words), log_tail.
  returned: when finished
  type: dict
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils._cycle import (
    START_TIMEOUT_S,
    STOP_MARGIN_S,
    StepFailed,
    compile_regexes,
    drain,
    expectations,
    prove,
    purge,
    show,
    start,
    stop,
)
from ansible_collections.dflash.trainer.plugins.module_utils._lock import LeaseKeeper, release
from ansible_collections.dflash.trainer.plugins.module_utils._nvidia_smi import locate
from ansible_collections.dflash.trainer.plugins.module_utils._release_root import (
    _Lock,
    read_current,
    read_last_good,
    switch_current,
    write_last_good,
)
from ansible_collections.dflash.trainer.plugins.module_utils._restart_job import (
    RestartJob,
    job_alive,
    outcome_words,
    pid_start,
    read_state,
    write_state,
)
from ansible_collections.dflash.trainer.plugins.module_utils._node_gpu import mib_by_index
from ansible_collections.dflash.trainer.plugins.module_utils._run import Runner
from ansible_collections.dflash.trainer.plugins.module_utils._wait import DONE, FAILED, done, failed, poll_until, waiting
from ansible_collections.dflash.trainer.plugins.module_utils._trainer_log import (
    DEFAULT_READY_REGEX,
    DEFAULT_STEP_REGEX,
    DEFAULT_TOKPS_REGEX,
)
from ansible_collections.dflash.trainer.plugins.module_utils._secrets import mask, read_secrets
from ansible_collections.dflash.trainer.plugins.module_utils._throughput import append_ledger, read_ledger
from ansible_collections.dflash.trainer.plugins.module_utils._systemd import int_prop, is_running, state_words


class Steps(object):
    """The cycle's steps, bound to this module's parameters."""

    def __init__(self, p, systemctl, nvidia_smi, tick):
        self.p, self.systemctl, self.nvidia_smi, self.tick = p, systemctl, nvidia_smi, tick
        self.baseline = None
        self.regexes = compile_regexes(p["ready_regex"], p["step_regex"], p["tokps_regex"], p["error_regexes"])

    def stop(self):
        return stop(Runner(self.p["stop_timeout_s"] + STOP_MARGIN_S), self.systemctl, self.p["unit"])

    def drain(self):
        deadline = time.monotonic() + self.p["drain_timeout_s"]
        try:
            details = drain(Runner(deadline=deadline), self.nvidia_smi, gpus=self.p["gpus"],
                            max_mib=self.p["drain_max_mib"], timeout_s=self.p["drain_timeout_s"], tick=self.tick,
                            allowance=mib_by_index(self.p["gpu_foreign_mib"]))
        except StepFailed as exc:
            self.baseline = exc.details.get("gpus_mib")  # a start that goes ahead anyway (bringing back)
            raise
        self.baseline = details.get("gpus_mib")  # memory there before the start is never the trainer's
        return details

    def purge(self):
        return purge(self.p["purge_dir"])

    def start(self):
        return start(Runner(), self.systemctl, self.p["unit"], start_run=Runner(START_TIMEOUT_S))

    def prove(self, invocation_id, n_restarts):
        p = self.p
        deadline = time.monotonic() + p["timeout_s"]
        return prove(Runner(deadline=deadline), self.systemctl, self.nvidia_smi, p["unit"], p["log_path"],
                     expectations(invocation_id, n_restarts, p), self.regexes, interval_s=p["interval_s"],
                     tick=self.tick, measure_s=p["measure_s"], extra_regexes=p["measure_regexes"],
                     baseline=self.baseline)

    def unit_state(self):
        try:
            props = show(Runner(), self.systemctl, self.p["unit"])
        except StepFailed as exc:
            return "the unit's state is unknown (%s)" % exc.msg
        if is_running(props):
            return "%s is running (pid %d)" % (self.p["unit"], int_prop(props, "MainPID", 0))
        return "%s is stopped (%s)" % (self.p["unit"], state_words(props))


class Layout(object):
    def __init__(self, root, secrets=()):
        self.root = root
        self.secrets = secrets
        self.ledger_path = os.path.join(root, "ledger.json")

    def ledger(self):
        return read_ledger(self.ledger_path)

    def record(self, entries):
        with _Lock(self.root):
            append_ledger(self.ledger_path, mask(entries, self.secrets))

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


def run_job(module):
    p = module.params
    for name in ("unit", "root", "log_path"):
        if not p[name]:
            module.fail_json(msg="%s is required with state=run" % name)
    systemctl = module.get_bin_path("systemctl", required=True)
    nvidia_smi = locate(p["nvidia_smi"], module.get_bin_path)
    if nvidia_smi is None:
        module.fail_json(msg="nvidia-smi (%s) not found on the target" % p["nvidia_smi"])
    pid = os.getpid()
    os.umask(0o077)  # the state file, the ledger and their temporary files: 0600 (log tails are kept there)
    secrets = read_secrets(p["env_file"])

    def save():
        write_state(p["state_path"], mask(state, secrets))

    state = dict(version=1, job_id=p["job_id"], pid=pid, pid_start=pid_start(pid), owner=p["owner"],
                 started=time.time(), started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 reasons=p["reasons"], phase="starting job", done=False)
    last_said = [0.0]

    def tick(waiting=None):
        """What the phase still waits for, for the watcher (the lease is renewed by its keeper)."""
        now = time.monotonic()
        if waiting and now - last_said[0] >= 2.0:
            last_said[0] = now
            state.update(waiting=waiting)
            save()

    def on_phase(name, **kw):
        state.update(phase=name, phase_at=time.time(), waiting=None, **kw)
        save()
        keeper.renew()

    save()
    # The job takes the lease over from the play (same token, renewed with the job's id and pid in
    # one guarded rewrite) and renews it from a thread for as long as it runs - a stop as long as
    # TimeoutStopSec or a long proof included; before it stops, switches or starts anything it
    # checks the lease is still its own.
    keeper = LeaseKeeper(p["lock_path"], p["lock_token"], p["lock_lease_s"], job=p["job_id"], job_pid=pid)
    try:
        with keeper:
            steps = Steps(p, systemctl, nvidia_smi, tick)
            job = RestartJob(steps, Layout(p["root"], secrets), rollback=p["rollback"], purge=bool(p["purge_dir"]),
                             on_phase=on_phase, releases_dir=os.path.join(p["root"], "releases"),
                             log_path=p["log_path"], source=p["source"] or None,
                             min_tokps_ratio=p["min_tokps_ratio"] or None, lease=keeper)
            result = job.run()
    except StepFailed as exc:  # before the cycle (a bad regex): nothing was stopped
        result = dict(ok=False, msg=exc.msg, outcome="nothing was stopped: " + exc.msg)
    except Exception as exc:  # pylint: disable=broad-exception-caught  # always an outcome and a free lock
        result = dict(ok=False, msg="restart job crashed: %r" % (exc,), outcome="restart job crashed: %r" % (exc,))
    finally:
        if p["lock_path"] and not keeper.lost:
            release(p["lock_path"], p["lock_token"])
    result = mask(result, secrets)  # log tails and failure reasons: a trainer may print a token
    state.update(done=True, phase="done", finished=time.time(), result=result)
    save()
    summary = dict(changed=True, finished=True, phase="done", result=result)
    if result.get("ok"):
        module.exit_json(**summary)
    module.fail_json(msg=job_message(result), **summary)


def start_detached(module):
    """Run the job in a grandchild detached from this module's session and streams (it survives
    the connection, the controller and this process), return once it has recorded itself."""
    p = module.params
    earlier = read_state(p["state_path"]) or {}
    if earlier.get("job_id") == p["job_id"]:
        module.fail_json(msg="restart job %s was already started" % p["job_id"])
    if job_alive(earlier):
        module.fail_json(msg="refused: %s; one restart at a time" % outcome_words(earlier))
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
            run_job(module)
        except BaseException:  # exit_json/fail_json end in SystemExit: the outcome is in the state file
            pass
        os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    pid = os.read(read_end, 32).decode() or "?"
    os.close(read_end)
    recorded = poll_until(lambda: read_state(p["state_path"]) or {}, job_recorded(p["job_id"]), 10, 0.05)
    if recorded.ok:
        module.exit_json(changed=True, started=True, job_id=p["job_id"], pid=int(pid) if pid.isdigit() else None,
                         phase=recorded.value.get("phase"))
    module.fail_json(msg="restart job %s (pid %s) did not record itself in %s within 10 s"
                     % (p["job_id"], pid, p["state_path"]))


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


def job_ended(job_id):
    """Judge of (state, alive) observations: the job ``job_id`` is done (-> its state), or died
    without an outcome (failed, -> its state); else the phase it is in."""
    def judge(observed, _elapsed):
        state, alive = observed
        mine = state is not None and state.get("job_id") == job_id
        if mine and state.get("done"):
            return done(state)
        if mine and not alive:
            return failed("restart job %s died in phase %s without an outcome" % (job_id, state.get("phase")), state)
        phase = (state or {}).get("phase", "not started") if mine else "not started"
        if mine and state.get("waiting"):
            phase = "%s, %s" % (phase, state["waiting"])
        return waiting(phase, state if mine else None)
    return judge


def observe_job(state_path):
    state = read_state(state_path)
    return state, job_alive(state)


def wait(module, clock=time.monotonic, sleep=time.sleep):
    p = module.params
    out = poll_until(lambda: observe_job(p["state_path"]), job_ended(p["job_id"]), p["wait_s"], 0.25,
                     clock=clock, sleep=sleep)
    if out.state == DONE:
        result = out.value.get("result") or {}
        summary = dict(changed=True, finished=True, phase="done", result=result, job=outcome_words(out.value))
        if result.get("ok"):
            module.exit_json(**summary)
        module.fail_json(msg=job_message(result), **summary)
    if out.state == FAILED:
        module.fail_json(msg="%s (state %s)" % (out.words, p["state_path"]), finished=True,
                         phase=out.value.get("phase"), result={})
    module.exit_json(changed=False, finished=False, phase=out.words, job=outcome_words(out.value) if out.value else "")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["start", "run", "wait"], default="run"),
            job_id=dict(type="str", required=True),
            state_path=dict(type="path", default="/var/lib/dflash-trainer/restart.json"),
            wait_s=dict(type="float", default=30),
            unit=dict(type="str"),
            root=dict(type="path"),
            log_path=dict(type="path"),
            purge_dir=dict(type="str", default=""),
            gpus=dict(type="list", elements="int"),
            drain_max_mib=dict(type="int", default=1024),
            gpu_foreign_mib=dict(type="dict", default={}),
            drain_timeout_s=dict(type="float", default=60),
            stop_timeout_s=dict(type="float", default=30),
            min_mib=dict(type="int", default=1024),
            ready_regex=dict(type="str", default=DEFAULT_READY_REGEX),
            step_regex=dict(type="str", default=DEFAULT_STEP_REGEX),
            tokps_regex=dict(type="str", default=DEFAULT_TOKPS_REGEX),
            error_regexes=dict(type="list", elements="str", default=[]),
            min_steps=dict(type="int", default=2),
            hold_s=dict(type="float", default=10),
            stall_s=dict(type="float", default=5),
            timeout_s=dict(type="float", default=300),
            interval_s=dict(type="float", default=1),
            tail_lines=dict(type="int", default=20),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            rollback=dict(type="bool", default=True),
            reasons=dict(type="list", elements="str", default=[]),
            owner=dict(type="str", default="unknown"),
            lock_path=dict(type="str", default=""),
            lock_token=dict(type="str", default="", no_log=False),
            lock_lease_s=dict(type="int", default=30),
            measure_s=dict(type="float"),
            measure_regexes=dict(type="dict", default={}),
            min_tokps_ratio=dict(type="float", default=0),
            source=dict(type="str", default=""),
            env_file=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    if module.params["state"] == "wait":
        wait(module)
    if module.check_mode:
        module.exit_json(changed=True, finished=True, phase="check mode", result={},
                         msg="check mode: the trainer would be restarted")
    if module.params["state"] == "start":
        start_detached(module)
    run_job(module)


if __name__ == "__main__":
    main()
