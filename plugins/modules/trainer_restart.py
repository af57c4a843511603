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
  - O(operation=start) starts the job detached from the connection (a new session, double fork, no
    standard streams, without the file transfers of Ansible's async wrapper) and returns
    at once, once the job has recorded itself in O(state_path); the role uses this.
  - O(operation=run) runs the whole restart cycle on the target - stop, GPU drain, cache purge, start,
    readiness proof, mark the release good (keeping the configuration it was proved with beside it) -
    and on failure the rollback (C(current) back to the last good release, the unit, environment file
    and launcher proved with it put back, the same cycle again; after an environment-only or forced
    restart of that same release, its proved configuration back) or, with no good release to go back
    to, stops the failed trainer and says nothing was rolled back. Any error in any step ends in a
    restore or a rollback with a recorded reason.
    Started with O(operation=start), it runs detached in the container, so a lost connection or a killed
    C(ansible-playbook) never strands a stopped trainer.
  - It takes the deploy lock's lease over from the play (O(lock_path), O(lock_token), a lease of
    O(lock_lease_s)), renews it from a thread while it runs, and checks it is still its own before it
    stops, switches or starts anything - once it is not, it stops acting and says who holds it. A
    second job refuses to start while one runs. It records its phase in O(state_path) (kept on disk,
    so a reboot in the middle is found by the next run); at the end it records its outcome there and
    releases the lock.
  - O(operation=stop) starts, detached the same way and under the same lease, a deliberate stop - what runs is read
    (release, pid, uptime, the last step and tok/s of this start's log), the unit is stopped (C(systemctl stop), the
    whole tree - systemd's C(Restart=) never brings back a unit stopped so), every trainer GPU drained and, with
    O(disable), the unit disabled - and records it in O(state_path) (kind C(stop)), so that
    M(dflash.trainer.trainer_status) reads it as stopped on purpose; RV(result.stopped) says what was stopped.
  - O(operation=wait) waits up to O(wait_s) for the job O(job_id) and returns its phase, or its
    outcome when it has finished (failing when the restart failed). A job that died without an
    outcome is reported as such, with the unit's state.
author:
  - dflash.trainer maintainers (@dflash)
version_added: 0.1.0
extends_documentation_fragment:
  - dflash.trainer.group_hold
  - dflash.trainer.group_barrier
  - dflash.trainer.log_patterns
  - dflash.trainer.install_files
options:
  operation:
    description: V(start) starts the job detached and returns; V(run) runs it in the foreground
      (for tests); V(wait) watches it; V(stop) starts a deliberate stop the same way as V(start); V(preflight) only
      runs O(preflight) (in the environment of O(install), staged, nothing installed) - a trainer group's first phase,
      on every member before any of them stops. V(check) looks at the member again after every member's own job
      proved it (RV(still)); V(good) marks what the job O(job_id) proved good once the group's check passed - both
      a trainer group's, see O(mark_good).
    type: str
    choices: [start, run, wait, stop, preflight, check, good]
    default: start
  job_id:
    description:
      - The job's id (the play's lock token is a good one).
      - Required, but the action plugin names a job that O(operation=start) or O(operation=stop) starts without one (the
        play's lock token, C(-stop) for a stop, and 8 random digits) and a watch with O(begun) takes it from there.
    type: str
  begun:
    description:
      - With O(operation=wait), the result of the call that started the job (this module's O(operation=start) or
        O(operation=stop), or M(dflash.trainer.trainer_plan)'s C(job_start)) - its V(job_id) and the phases it said are
        the watch's. A call that did not start the job fails the task with its reason, nothing watched; a job that
        ended within it is not watched again. The result then says what the role shows of the job's end - V(ok),
        V(words), V(fail_msg) - and the task does not fail on the job's verdict.
      - Handled by the action plugin; the target never sees it.
    type: dict
  kind:
    description:
      - With O(begun), what the job is - V(restart) (V(words) is its proof) or V(stop) (what was stopped); V(start),
        the operation that started a restart (the role passes its plan's C(job_operation)), is V(restart).
      - Handled by the action plugin; the target never sees it.
    type: str
    choices: [restart, start, stop]
    default: restart
  state_path:
    description: The job's state file in the container.
    type: path
    default: /var/lib/dflash-trainer/restart.json
  wait_s:
    description:
      - With O(operation=wait), how long to wait for the job to finish before returning its phase (default 30).
      - With O(operation=start), how long to wait for it once it started (default 0 - return once it recorded
        itself). A restart that ends within it needs no O(operation=wait) call.
    type: float
  seen:
    description:
      - With O(operation=wait), how many phases of the job's timeline the watcher has shown; the call comes back
        as soon as a phase more has begun (not finished), or at the end of O(wait_s).
    type: int
  watch_calls:
    description:
      - With O(operation=wait), the controller watches the job to its end in one task, in up to this many calls
        of O(wait_s) (a call that comes back with a new phase is not counted), and says each phase as it
        begins and what it waits for - instead of an C(until) loop's "FAILED - RETRYING". Handled by the
        action plugin; the target never sees it.
    type: int
  job:
    description:
      - The restart job's settings, whole - every option below but O(operation), O(release), O(reasons),
        O(min_tokps_ratio), O(install), O(env_content) and O(environment_json) - as the role builds them once
        (C(__trainer_job_args)). An option given on the task itself wins over the same one in O(job) - a call
        names only what differs for it. A key that is no option of the job is refused before anything runs.
        Handled by the action plugin; the target sees the options, never O(job).
    type: dict
  environment_json:
    description: The unit's environment for O(preflight), JSON (a secret, never logged).
    type: str
    default: "{}"
  preflight:
    description:
      - With O(operation=start), pre-flight the release first, as O(operation=preflight) does (the
        same checks and options), while the old trainer still runs; a refusal fails the task with
        RV(preflight_refused), and nothing is installed, stopped or started. O(install) comes next, then the
        job. The play's lease (O(lock_path), O(lock_token)) is renewed meanwhile.
      - It runs in the environment the unit will give the trainer - the unit, environment file and launcher of
        O(install) (O(env_content)) when given, else the ones in place (O(unit_path), O(env_file),
        O(launcher_path)).
    type: dict
    suboptions:
      release_dir:
        description: The release to check.
        type: path
        required: true
      command:
        description: The trainer's command (argv).
        type: list
        elements: str
        required: true
      preflight_command:
        description: The user's pre-flight command, run in the release with no GPU.
        type: list
        elements: str
        default: []
      timeout_s:
        description: Bound on the pre-flight command.
        type: float
        default: 60
      unit:
        description: The unit (its processes are the running trainer's).
        type: str
        required: true
      gpus:
        description: The trainer's GPUs (none held by another process).
        type: list
        elements: int
        default: []
      max_mib:
        description: Memory a GPU may hold and count as free.
        type: int
        default: 1024
      gpu_foreign_mib:
        description: Other tenants' memory per GPU (the node's view).
        type: dict
        default: {}
      nvidia_smi:
        description: nvidia-smi on the target.
        type: str
        default: nvidia-smi
  release:
    description:
      - The release to run - the job switches C(current) to it (under the lease, after the pre-flight, before the
        stop) and, when its proof fails, back to the last good release. Omitted - the release C(current) points at.
    type: str
  unit:
    description: The trainer's unit.
    type: str
  root:
    description: The release root (releases/, current, last_good).
    type: path
  log_path:
    description: The trainer's log.
    type: path
  progress_path:
    description:
      - The trainer's own progress file (its own log, or JSONL records with C(step) and C(tok_s) keys), only
        ever read, from where it ended right before this start; progress is proved from it, the start
        marker, the exit reason and the tail come from O(log_path), errors from both.
      - Empty - progress from O(log_path).
      - Refused (nothing started) when it is, or resolves to, a file the collection writes.
    type: path
    default: ""
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
    default:
      - 'Traceback \(most recent call last\)'
      - CUDA out of memory
      - OutOfMemoryError
      - NCCL error
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
    default: 900
  interval_s:
    description: Poll interval of the proof.
    type: float
    default: 0.5
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
  mark_good:
    description:
      - Record the proved release as C(last_good) (and keep the configuration proved with it, and record it proved
        in the ledger). V(false) - a member of a trainer group, nothing is recorded by the job; once every member's
        job proved it, O(operation=check) looks at every member again at one moment and, when all of them still run
        what was proved, O(operation=good) records it on every member.
    type: bool
    default: true
  restore_config:
    description:
      - Before its start, put back the configuration (unit, environment file, launcher) kept as proved with the
        release it runs, where one is kept - a trainer group's rollback, whose members' jobs do not roll back
        on their own.
    type: bool
    default: false
  keep_lock:
    description:
      - At its end the job stops renewing the deploy lock instead of releasing it, so the lock stays the play's (same
        token) for the rest of its lease (O(lock_lease_s)) - a trainer group's member, whose play takes it back to decide
        for every member at once.
    type: bool
    default: false
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
    default: 15
  proof:
    description:
      - The proof's settings as one dict, over the options of the same names - V(min_mib), V(min_steps), V(hold_s),
        V(stall_s), V(timeout_s), V(tail_lines), V(ready_regex), V(step_regex), V(tokps_regex), V(error_regexes),
        V(interval_s) and any setting the judge gains (the role passes them so, from its variables).
      - An unknown key, or a value of the wrong type, fails the task before anything is started.
    type: dict
    default: {}
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
  unit_path:
    description:
      - The unit file (default C(/etc/systemd/system/<unit>.service)). With O(env_file) and O(launcher_path) (or
        the paths of O(install)) it is the configuration kept beside C(last_good) once a release is proved
        (C(<root>/last_good.config), mode 0600), and put back with that release by a rollback.
    type: path
  launcher_path:
    description: The unit's launcher, kept and restored with the proved configuration (see O(unit_path)).
    type: path
  disable:
    description: With O(operation=stop), disable the unit after the stop, so that it stays stopped across a reboot of
      the container (a start with O(enable) enables it again). Default - it stays enabled and starts at the next boot.
    type: bool
    default: false
  enable:
    description: With O(operation=start), enable the unit before the job when it is disabled (a stop with O(disable)
      disabled it); a failure fails the task with RV(not_started).
    type: bool
    default: false
notes:
  - Each job appends to the release ledger C(<root>/ledger.json) (the last 50 entries) - release, config,
    time, source, verdict, figures - and its result carries C(figures) and C(comparison) with the entry before
    it that was proved and the best.
  - C(config) is the configuration id of the installed unit's trainer command (the words after the launcher's
    C(--)) and environment file - an HMAC-SHA256 keyed with C(<root>/config.key) (random, mode 0600, made by
    the first job), 8 hex characters - so a deploy that changes only the command or the environment is an entry
    of its own; no value can be read back from it.
  - Check mode is not supported by O(operation=run) (the role does not call it in check mode).
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
ok:
  description: With O(begun), the job's verdict (its result's V(ok)) - the action's.
  returned: with O(begun), when the job started
  type: bool
words:
  description: With O(begun) and V(ok), what the role shows - the proof in one line and the throughput beside the
    previous good release's (O(kind=restart)), or what was stopped (O(kind=stop)).
  returned: with O(begun), when the job started
  type: list
  elements: str
fail_msg:
  description: With O(begun), why the job failed or that it did not end within its budget (its phase); V(null) when
    it proved.
  returned: with O(begun), when the job started
  type: str
still:
  description:
    - With O(operation=check), whether the member still runs what its job O(job_id) proved - C(ok), C(msg) (why not -
      its unit not active, another main pid than at its proof, a GPU no longer held, no progress past the
      proof's last step within O(stall_s) where its log shows steps, with the proved start's error lines).
  returned: with O(operation=check)
  type: dict
preflight:
  description: The pre-flight's result (C(checks), C(output)), when O(preflight) was given.
  returned: with operation=start and preflight
  type: dict
preflight_refused:
  description: The pre-flight refused the release; nothing was installed, stopped or started.
  returned: on such a failure
  type: bool
lock_holder:
  description:
    - Who holds the deploy lock when O(operation=start) returns - V(play) (nothing was started - the play releases it),
      V(job) (the job took its lease over and frees it when it ends) or V(unknown) (the job may have started).
  returned: with O(operation=start)
  type: str
install:
  description: What O(install) changed (as M(dflash.trainer.trainer_install) returns it).
  returned: with operation=start and install
  type: dict
install_failed:
  description: O(install) failed; nothing was stopped.
  returned: on such a failure
  type: bool
started:
  description: The job was started (from here on the deploy lock is the job's).
  returned: with operation=start
  type: bool
not_started:
  description:
    - The task failed before the job was started - nothing was stopped, the lock is still the play's. Any other
      failure of O(operation=start) (a lost connection included) may have started the job; it then goes on and
      releases the lock when it ends.
  returned: on such a failure
  type: bool
reasons:
  description: Why the trainer restarts - O(reasons) and the files O(install) changed.
  returned: with operation=start
  type: list
  elements: str
finished:
  description: Whether the job has finished (O(operation=wait)).
  returned: always
  type: bool
phase:
  description: The job's phase (stopping, draining, purging, starting, proving, rolling back, done, ...).
  returned: always
  type: str
timeline:
  description: The job's phases so far, each C([phase, seconds since the job began]) (O(operation=wait)).
  returned: with operation=wait
  type: list
  elements: list
waiting:
  description: What the job's phase still waits for (GPUs held so far, the step reached, the proof's hold), or empty.
  returned: with operation=wait
  type: str
attempts:
  description: How many watch calls the task made (O(watch_calls)).
  returned: with operation=wait and watch_calls
  type: int
result:
  description: The job's result, also kept in its state file (its keys are declared in module_utils/job/result.py).
  returned: when finished
  type: dict
  contains:
    ok:
      description: Whether the release that C(current) pointed at was proved ready (V(false) for any failure,
        even one that a rollback or a restore repaired).
      returned: always
      type: bool
    msg:
      description: Why the restart failed, in words (the failed step's reason, the lost lease, the crash).
      returned: on failure
      type: str
    outcome:
      description: 'What the job did and what runs now, in words (C(ready: ...), C(Rolled back: ...), C(Restored:
        ...), C(No rollback: ...), C(... FAILED as well: ...)), its warnings appended.'
      returned: always
      type: str
    release:
      description: The release the job restarted (its O(release), switched to before the stop; else the one C(current)
        pointed at when the job began).
      returned: unless the job stopped before its cycle (a lost lease, a crash, an invalid pattern)
      type: str
    previous:
      description: The release C(current) pointed at when the job began (before it switched to C(release)).
      returned: unless the job stopped before its cycle (a lost lease, a crash, an invalid pattern)
      type: str
    switched:
      description: Whether the job switched C(current) to C(release) before the stop.
      returned: unless the job stopped before its cycle (a lost lease, a crash, an invalid pattern)
      type: bool
    restarted:
      description: Whether the release was started (the job reached its proof).
      returned: unless the job stopped before its cycle (a lost lease, a crash, an invalid pattern)
      type: bool
    rolled_back:
      description: Whether the job went back to the last good release (see C(rollback_proof) or C(rollback_failure)).
      returned: unless the job stopped before its cycle (a lost lease, a crash, an invalid pattern)
      type: bool
    proof:
      description: 'What proved the release ready (release, invocation_id, main_pid, gpus_mib, step, tok_s,
        seconds_to_ready, with the measured C(figures)); V(null) unless it was proved.'
      returned: unless the job stopped before its cycle (a lost lease, a crash, an invalid pattern)
      type: dict
    started:
      description: What the start reported (invocation_id, main_pid, n_restarts, active_state, sub_state,
        started_at, ...).
      returned: when the release was started and proved (a throughput gate's refusal included)
      type: dict
    figures:
      description: 'The throughput measured after the proof (C(tok_s): median, p10, p90, n, window_s) and
        the named figures.'
      returned: when the release was proved (a throughput gate's refusal included)
      type: dict
    comparison:
      description: The measured throughput against the entry before it that was proved, whichever release and
        configuration it ran, and the best (words, median, release, config, previous_release, previous_config,
        previous_at, previous_median, change_pct, best_median).
      returned: when the release was proved (a throughput gate's refusal included)
      type: dict
    warnings:
      description: What went wrong without changing the verdict (a drain gate or a purge that failed while
        a release was brought back, a release that could not be recorded as last good).
      returned: when there were any
      type: list
      elements: str
    failure:
      description: 'Why the restart failed: the failed step''s reason, the throughput gate''s refusal, an
        unexpected error.'
      returned: when the cycle failed
      type: str
    failed_phase:
      description: The phase the job was in when it failed (stopping, draining, purging, starting, proving,
        gated); after a lost lease, the phase before it.
      returned: when the cycle failed or the lease was lost
      type: str
    log_tail:
      description: The last lines of the failed start's log (empty when the failure read none).
      returned: when the cycle failed
      type: list
      elements: str
    failure_details:
      description: What the failed step reported besides its reason (log_tail, the unit's state, GPU memory,
        ...; C(unexpected) for an error that was not the step's own verdict).
      returned: when the cycle failed
      type: dict
    restored:
      description: 'The release that ran was brought back and proved ready: its stop, drain, purge or start
        failed (nothing was proved wrong with it) and there was no other good release.'
      returned: when it was restored
      type: bool
    rollback_proof:
      description: What proved the release that was brought back ready (the last good one, or the restored
        one).
      returned: after a rollback or a restore that was proved
      type: dict
    rollback_release:
      description: The last good release the job rolled back to.
      returned: when it rolled back
      type: str
    rollback_failure:
      description: Why the rollback or the restore failed as well.
      returned: when it failed
      type: str
    stop_failure:
      description: Why stopping the failed trainer failed (no release to roll back to).
      returned: when that stop failed
      type: str
    lease_lost:
      description: 'The deploy lock stopped being the job''s: it stopped acting, nothing more was stopped,
        switched or started by it.'
      returned: when the lease was lost
      type: bool
    ledger_error:
      description: Why the release ledger could not be written (the verdict stands).
      returned: when it could not be written
      type: str
    stopped:
      description: What a deliberate stop (O(operation=stop)) stopped - running, release, main_pid, invocation_id,
        started_at, seconds_up, step, tok_s (this start's last progress), state_before - by whom (by) and when (at,
        at_words), gpus_mib after the drain, enabled (the unit starts again at the container's boot), disabled;
        status reads it as stopped on purpose.
      returned: after a stop job that reached systemctl stop
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed
from ansible_collections.dflash.trainer.plugins.module_utils.job.group_check import check_member
from ansible_collections.dflash.trainer.plugins.module_utils.job.start import run_job, start_job, wait_for_job
from ansible_collections.dflash.trainer.plugins.module_utils.target.nvidia_smi import locate
from ansible_collections.dflash.trainer.plugins.module_utils.proof.preflight import Refused
from ansible_collections.dflash.trainer.plugins.module_utils.job.options import RESTART_OPTIONS, with_proof
from ansible_collections.dflash.trainer.plugins.module_utils.job.steps import before_start, mark_proved
from ansible_collections.dflash.trainer.plugins.module_utils.target.command import ModuleRunner


def report(module, ok, fields):
    if ok:
        module.exit_json(**fields)
    module.fail_json(**fields)


def run_foreground(module):
    for name in ("unit", "root", "log_path"):
        if not module.params[name]:
            module.fail_json(msg="%s is required with operation=run" % name)
    run_job(module, module.params)


def preflight_only(module):
    """O(operation=preflight): the pre-flight of O(preflight) alone, nothing installed, stopped or started."""
    p = module.params
    if not p["preflight"]:
        module.fail_json(msg="operation=preflight needs preflight")
    try:
        fields = before_start(p, module.get_bin_path, ModuleRunner(module), module.get_bin_path("systemctl", required=True),
                              install=False)
    except Refused as exc:  # the old trainer runs on, untouched
        module.fail_json(preflight_refused=True, not_started=True, lock_holder="play", **exc.result)
    module.exit_json(changed=False, lock_holder="play", **fields)


def group_member(module):
    """O(operation=check) and O(operation=good): a trainer group's member, after its own job proved it."""
    p, systemctl = module.params, module.get_bin_path("systemctl", required=True)
    if p["operation"] == "check":
        module.exit_json(changed=False, still=check_member(p, systemctl, locate(p["nvidia_smi"], module.get_bin_path)
                                                           or p["nvidia_smi"]))
    try:
        module.exit_json(changed=True, **mark_proved(p, systemctl))
    except (StepFailed, IOError, OSError) as exc:
        module.fail_json(msg="Unable to mark the group's release good: %s" % getattr(exc, "msg", exc))


def main():
    module = AnsibleModule(argument_spec=RESTART_OPTIONS, supports_check_mode=True)
    if not module.params["job_id"]:  # the action names a job it starts; a watch takes it from begun
        module.fail_json(msg="job_id is required", not_started=True, lock_holder="play")
    try:
        with_proof(module.params)
    except ValueError as exc:  # before anything is started: the lock is still the play's
        module.fail_json(msg=str(exc), not_started=True, lock_holder="play")
    if module.params["wait_s"] is None:
        module.params["wait_s"] = 30 if module.params["operation"] == "wait" else 0
    if module.params["operation"] == "wait":
        report(module, *wait_for_job(module.params))
    if module.check_mode:
        module.exit_json(changed=True, finished=True, phase="check mode", result={},
                         msg="check mode: the trainer would be %s" % (
                             "stopped" if module.params["operation"] == "stop" else "restarted"))
    if module.params["operation"] == "preflight":
        preflight_only(module)
    if module.params["operation"] in ("check", "good"):
        group_member(module)
    if module.params["operation"] in ("start", "stop"):
        report(module, *start_job(module, module.params, ModuleRunner(module)))
    run_foreground(module)


if __name__ == "__main__":
    main()
