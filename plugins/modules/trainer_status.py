#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_status
short_description: Report what the trainer is running, what is deployed, and how it is doing
version_added: "0.1.0"
description:
  - Read-only. Reads the unit with C(systemctl show), the release the running trainer was started
    from, the release C(<trainer_root>/current) points to, C(<trainer_root>/last_good), per-GPU
    memory, and the last progress line of the current invocation's log.
  - The running release is read from C(DFLASH_RELEASE) in the environment of the unit's main process
    or its children (the launcher exports it), else from the log's marker line of the current
    invocation.
  - RV(drift) is V(true) when the running release differs from C(current).
  - The first read of a deploy (with O(lock), O(install) and O(no_op)) also says whether the deploy changes
    anything - a deploy that changes nothing ends in this one remote call, its lock released here.
extends_documentation_fragment:
  - dflash.trainer.install_files
options:
  no_op:
    description:
      - With O(lock) and O(install), judge the deploy of O(no_op.release) on this read. When it changes nothing -
        the release is C(current), runs, has a proof on record and is healthy, O(no_op.force) is off and the install
        would write nothing (compared, never written here) - RV(no_op) is V(true) and the lock is released in this
        call; else RV(no_op_reasons) says why the deploy goes on.
    type: dict
    suboptions:
      release:
        description: The id of the release the deploy brings (computed on the controller, as the release module does).
        type: str
        required: true
      force:
        description: The deploy forces a restart (never a no-op).
        type: bool
        default: false
  unit:
    description: The trainer's systemd unit.
    type: str
    required: true
  lock:
    description:
      - Take the deploy lock first, as P(dflash.trainer.trainer_lock#module) does, then read - the lock and the first
        read of what it protects in one remote call. Refused (or not taken) - the module fails with the reason, the
        holder and RV(lock_refused). Ignored in check mode.
    type: dict
    suboptions:
      path:
        description: The lock file.
        type: path
        required: true
      token:
        description: This play's token.
        type: str
        required: true
      owner:
        description: Who holds it, in words.
        type: str
        default: unknown
      stale_s:
        description: A lock without a lease older than this is taken over.
        type: int
        default: 3600
      lease_s:
        description: The lease (seconds); a holder that stops renewing it loses the lock then.
        type: int
      wait_s:
        description: Seconds to wait for a live holder.
        type: float
        default: 0
      job_wait_s:
        description:
          - When the holder is a restart job that still runs (an earlier play was interrupted), wait up to this
            long for its outcome, then take the lock - the run attaches to the job instead of being refused.
        type: float
        default: 1800
  owned:
    description:
      - Every file a run writes and the directory it purges - C(variable), C(kind) (launcher, env, unit, log,
        log_rotation, log_start, lock, lock_guard, state, metrics, cache, root, program) and C(path) - as
        P(dflash.trainer.trainer_validate#module) returns them. Each path is resolved here (symlinked parents
        included) and must be absent or carry the collection's mark (the cache - look like a torchinductor
        cache), in directories root owns and only root may write; a program (a name looked up on the PATH,
        or a path) must be a file root owns and only root may write; otherwise the module fails before the
        lock is taken, naming the variable and what is there, with RV(lock_refused) and RV(problems).
    type: list
    elements: dict
    default: []
  env_file:
    description: The trainer's environment file; its values are secrets, replaced by C(***) in every log line returned.
    type: path
  trainer_root:
    description: Directory holding C(releases/), the C(current) symlink and C(last_good). Omit to skip.
    type: path
  log_path:
    description: The trainer's log file (with the launcher's marker lines). Omit to skip.
    type: path
  job_state_path:
    description: The restart job's state file; when given, RV(last_job) reports the last restart job.
    type: path
  history:
    description: Return the last this-many entries of the release ledger (C(<trainer_root>/ledger.json)) in RV(history).
    type: int
    default: 0
  watch_s:
    description:
      - Before reading, watch the running trainer up to this many seconds (the unit read every second) and return
        as soon as this start ends - it exited, or systemd started another (C(trainer_watch_s) after a deploy's
        proof). RV(health) then says whether it died after its proof. V(0) - read at once.
    type: float
    default: 0
  log_lines:
    description:
      - Return the last this-many lines of a start's log in RV(log) (V(0) - none). Read from where the
        start begins (the launcher's sidecar C(<log>.start)), at most 1 MiB from the end of the file.
      - Needs O(log_path).
    type: int
    default: 0
  log_invocation:
    description:
      - The start whose log O(log_lines) or O(log_offset) reads (its invocation id, as in the log's marker
        lines). Default - the unit's current invocation, else the last start the launcher recorded.
    type: str
  log_offset:
    description:
      - Follow a log - return in RV(log) the complete lines of the start appended since this byte offset
        (the C(offset) in RV(log) of an earlier call) instead of the last O(log_lines). Goes with O(log_inode); a log
        rotated meanwhile is finished in C(<log>.1), then read from the start's marker in the new file.
    type: int
  log_inode:
    description: The C(inode) in RV(log) of the call that returned O(log_offset).
    type: int
  log_wait_s:
    description:
      - With O(log_offset), wait up to this long for new lines (checking every 0.25 s) before returning
        none - a long poll, so that a follower costs one call per batch of lines.
    type: float
    default: 0
  nvidia_smi:
    description:
      - Name (looked up in E(PATH)) or absolute path of nvidia-smi. When it is missing or fails,
        RV(gpus_mib) is V(null) and RV(gpu_error) says why; the task does not fail.
    type: str
    default: nvidia-smi
attributes:
  check_mode:
    support: full
    description: Read-only; runs in check mode.
  diff_mode:
    support: partial
    description: With O(install), the files it would change (the environment file's values masked).
author:
  - dflash.trainer maintainers (@dflash)
"""

EXAMPLES = r"""
- name: What is the trainer doing?
  dflash.trainer.trainer_status:
    unit: dflash-trainer.service
    trainer_root: /opt/dflash-trainer
    log_path: /var/log/dflash-trainer/trainer.log
  register: __trainer_status

- name: Warn about a deployed but not running release
  ansible.builtin.debug:
    msg: "running {{ __trainer_status.running_release }}, current {{ __trainer_status.current_release }}"
  when: __trainer_status.drift
"""

RETURN = r"""
problems:
  description: What O(owned) refused - one line per variable, saying what is at its path (the module then fails).
  returned: when a path of O(owned) is refused
  type: list
  elements: str
install:
  description: What O(install) would change - C(unit_changed), C(env_changed), C(launcher_changed), C(enabled_changed),
    C(changed) (compared, nothing written); C(refused) when a path holds a file the collection did not write.
  returned: when O(install) is given
  type: dict
no_op:
  description: The deploy (O(no_op)) changes nothing; the lock was released in this call (C(released) in RV(lock)).
  returned: when O(no_op) is given
  type: bool
release_current:
  description: The release the deploy brings (O(no_op.release)) is the one C(current) points at - nothing to upload or
    switch, the role skips the release call.
  returned: when O(no_op) is given
  type: bool
no_op_reasons:
  description: Why the deploy (O(no_op)) goes on, in the words of the restart's reasons (empty with RV(no_op)).
  returned: when O(no_op) is given
  type: list
  elements: str
lock:
  description: What taking the lock did (O(lock) given) - V(action) (take, keep, stale), V(msg), V(previous_owner). V(released) when
    RV(no_op) released it.
  returned: when O(lock) is given, outside check mode
  type: dict
lock_refused:
  description: V(true) when the lock was not taken (the module then fails).
  returned: failure
  type: bool
log:
  description:
    - A start's log (O(log_lines), O(log_offset)) - invocation, release, lines, offset and inode to follow
      from (O(log_offset), O(log_inode) of the next call), ended (a later start followed it), found (the
      log holds a marker of the start), problem (why nothing could be read).
  returned: when O(log_lines) > 0 or O(log_offset) is given
  type: dict
  sample: {"invocation": "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70", "release": "0123456789abcdef",
           "lines": ["step=41 loss=2.10 tok/s=10250.3 queue_target=4 queue_drafter=4"],
           "offset": 18734, "inode": 393242, "ended": false, "found": true, "problem": null}
history:
  description:
    - The release ledger's last O(history) entries, newest first - release, config (the configuration id, null
      for an entry recorded before configurations were), at, verdict, reason, median, p10, p90, n (tok/s), source,
      vs (against the entry before it that was proved - release, config, median, change_pct, words), marks
      (running, current), extra (the named figures).
  returned: when O(history) > 0 and O(trainer_root) is given
  type: list
  elements: dict
health:
  description:
    - Whether the trainer runs its proved release healthily (V(ok)), in V(words) - e.g. C(running release ...,
      proved 5 min ago (unit restarts 0)) or C(died 3 min after its proof - torch.OutOfMemoryError ... (unit
      restarts 1); running again, not proved since) - with V(died) (the ledger's record of a death after the
      proof - after_s, reason, exit, count - or null), V(release), V(proved_at) and V(seconds_since_proof).
    - A trainer stopped on purpose (O(dflash.trainer.trainer_restart#module:state=stop), with O(job_state_path)) and not
      started since reads C(stopped on purpose by ... at ...), with V(stopped) (what the stop recorded - by,
      at_words, release, main_pid, ...); V(ok) stays V(false) (it does not run).
    - Healthy - it runs, the release's newest ledger entry is C(proved), it did not die since, and this start
      of the unit is the one that was proved.
  returned: when O(trainer_root) is given
  type: dict
  sample:
    ok: false
    words: "died 23 s after its proof: torch.OutOfMemoryError: CUDA out of memory (unit restarts: 1); running again,
      not proved since"
    died: {"after_s": 23.0, "reason": "torch.OutOfMemoryError: CUDA out of memory", "exit": "exit status 1", "count": 1}
    release: 1bbe159d6a73a747
    proved_at: "2026-11-30T17:36:02Z"
    seconds_since_proof: 31.0
watched_s:
  description: How long O(watch_s) watched (seconds).
  returned: when O(watch_s) > 0 and the trainer was running
  type: float
  sample: 30.0
last_job:
  description: The last restart job (job_id, phase, done, alive, ok, words) when O(job_state_path) is given and it exists.
  returned: when O(job_state_path) is given
  type: dict
  sample: {"job_id": "x-1", "phase": "done", "done": true, "alive": false, "ok": true, "words": "restart job x-1 (...) ended: ready: ..."}
gpus:
  description: Each GPU nvidia-smi lists (index, name, memory used and total in MiB); V(null) when nvidia-smi failed.
  returned: always
  type: list
  elements: dict
  sample: [{"index": 0, "name": "NVIDIA H200", "memory_used_mib": 30000, "memory_total_mib": 143771}]
load_state:
  description: The unit's LoadState (V(not-found) when no unit of that name exists).
  returned: always
  type: str
  sample: loaded
fragment_path:
  description: The unit's file (FragmentPath); empty when there is none.
  returned: always
  type: str
  sample: /etc/systemd/system/dflash-trainer.service
description:
  description: The unit's Description (units this collection writes say "managed by dflash.trainer").
  returned: always
  type: str
  sample: DFlash trainer (dflash-trainer), managed by dflash.trainer
active_state:
  description: The unit's ActiveState.
  returned: always
  type: str
  sample: active
sub_state:
  description: The unit's SubState.
  returned: always
  type: str
  sample: running
running:
  description: Whether the unit is active and running.
  returned: always
  type: bool
  sample: true
main_pid:
  description: The unit's MainPID (0 when not running).
  returned: always
  type: int
  sample: 4242
invocation_id:
  description: The unit's current InvocationID.
  returned: always
  type: str
  sample: 6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70
n_restarts:
  description: NRestarts.
  returned: always
  type: int
  sample: 0
result:
  description: The unit's Result.
  returned: always
  type: str
  sample: success
started_at:
  description: ExecMainStartTimestamp.
  returned: always
  type: str
  sample: Mon 2026-11-30 04:05:06 UTC
seconds_since_start:
  description: Seconds the main process has run (until its exit when it ended); null when unknown.
  returned: always
  type: float
  sample: 3600.5
exit:
  description: How the main process ended (C(exited with status 1), C(killed by signal KILL)); null while it runs.
  returned: always
  type: str
  sample: null
running_release:
  description: Release id the running trainer was started from; null when not running or unknown.
  returned: always
  type: str
  sample: 0123456789abcdef
running_release_source:
  description: Where RV(running_release) came from, V(environ) or V(log marker).
  returned: always
  type: str
  sample: environ
current_release:
  description: Basename of the C(current) symlink target under O(trainer_root).
  returned: when O(trainer_root) is set
  type: str
  sample: 0123456789abcdef
drift:
  description: V(true) when both releases are known and the running one is not C(current).
  returned: always
  type: bool
  sample: false
last_good:
  description: Content of C(<trainer_root>/last_good), null when absent.
  returned: when O(trainer_root) is set
  type: str
  sample: 0123456789abcdef
config:
  description:
    - The configuration id of the installed unit's trainer command and environment file (a keyed hash made with
      the key the restart job keeps in C(<trainer_root>/config.key); no value can be read back from it), as the
      ledger records it; null when unknown (no O(env_file), no key yet, the unit or the environment file unreadable).
  returned: when O(trainer_root) is set
  type: str
  sample: 1a2b3c4d
gpus_mib:
  description: Memory used per GPU index; null when nvidia-smi is missing or failed.
  returned: always
  type: dict
  sample: {"0": 70000, "1": 70000}
gpu_error:
  description: Why RV(gpus_mib) is null.
  returned: when nvidia-smi is missing or failed
  type: str
  sample: "nvidia-smi failed (exit 9: driver not loaded): ..."
log_release:
  description: Release id in the current invocation's marker line.
  returned: when O(log_path) is set
  type: str
  sample: 0123456789abcdef
last_progress_line:
  description: The last line of the current invocation's log with a step or tok/s value.
  returned: when O(log_path) is set
  type: str
  sample: "step=3600 loss=1.92 tok/s=10250.3 queue_target=4 queue_drafter=4"
tok_s:
  description: The latest tok/s of the current invocation.
  returned: when O(log_path) is set
  type: float
  sample: 10250.3
step:
  description: The latest step of the current invocation.
  returned: when O(log_path) is set
  type: int
  sample: 3600
log_problem:
  description: Why the current invocation's log cannot be read, when the launcher recorded its marker but
    the file no longer holds it (truncated, replaced or removed by something else).
  returned: when O(log_path) is set and the log lost this start's marker
  type: str
  sample: "log was truncated or replaced since this start (the launcher recorded its marker at byte 1024; ...)"
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils._install import (
    ENV_CONTENT_OPTION,
    INSTALL_SUBOPTIONS,
    InstallError,
    install_all,
)
from ansible_collections.dflash.trainer.plugins.module_utils._lock import acquire_waiting, release
from ansible_collections.dflash.trainer.plugins.module_utils._secrets import mask, read_secrets
from ansible_collections.dflash.trainer.plugins.module_utils._job_state import job_alive, observe_job, outcome_words, read_state
from ansible_collections.dflash.trainer.plugins.module_utils._run import ModuleRunner
from ansible_collections.dflash.trainer.plugins.module_utils._config_id import installed_config, unit_path_of
from ansible_collections.dflash.trainer.plugins.module_utils._throughput import history_rows, read_ledger
from ansible_collections.dflash.trainer.plugins.module_utils._nvidia_smi import (
    NvidiaSmiError,
    locate,
    not_found_message,
    read_gpus,
)
from ansible_collections.dflash.trainer.plugins.module_utils._systemd import int_prop, is_running, parse_show, runtime_s, show_argv
from ansible_collections.dflash.trainer.plugins.module_utils._status import (
    LOG_NEEDS_PATH,
    gpu_fields,
    job_over,
    job_summary,
    lock_holder_job,
    lock_refusal,
    lock_taken,
    log_fields,
    no_op_reasons,
    ownership_problems,
    read_log,
    read_log_chunk,
    read_release_marks,
    refusal_message,
    release_fields,
    release_from_proc,
    status_health,
    stopped_on_purpose,
    unit_fields,
    wants_log,
    watch,
)
from ansible_collections.dflash.trainer.plugins.module_utils._wait import poll_until


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", required=True),
            trainer_root=dict(type="path"),
            log_path=dict(type="path"),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            job_state_path=dict(type="path"),
            history=dict(type="int", default=0),
            watch_s=dict(type="float", default=0),
            log_lines=dict(type="int", default=0),
            log_invocation=dict(type="str"),
            log_offset=dict(type="int"),
            log_inode=dict(type="int"),
            log_wait_s=dict(type="float", default=0),
            owned=dict(type="list", elements="dict", default=[]),
            env_file=dict(type="path"),
            no_op=dict(type="dict", options=dict(
                release=dict(type="str", required=True),
                force=dict(type="bool", default=False),
            )),
            install=dict(type="dict", options=INSTALL_SUBOPTIONS),
            env_content=ENV_CONTENT_OPTION,
            lock=dict(type="dict", options=dict(
                path=dict(type="path", required=True),
                token=dict(type="str", required=True, no_log=False),
                owner=dict(type="str", default="unknown"),
                stale_s=dict(type="int", default=3600),
                lease_s=dict(type="int"),
                wait_s=dict(type="float", default=0),
                job_wait_s=dict(type="float", default=1800),
            )),
        ),
        required_together=[("log_offset", "log_inode")],
        required_by=dict(no_op=("install",)),
        supports_check_mode=True,
    )
    p = module.params
    if wants_log(p) and not p["log_path"]:
        module.fail_json(msg=LOG_NEEDS_PATH)
    refused = ownership_problems(p["owned"])
    if refused:
        module.fail_json(msg=refusal_message(refused), problems=refused, lock_refused=True)
    taken = take_lock(module, p["lock"], p["job_state_path"]) if p["lock"] and not module.check_mode else None
    systemctl = module.get_bin_path("systemctl", required=True)
    run = ModuleRunner(module)  # each command bounded: 30 s

    def show():
        return run.or_fail(show_argv(p["unit"], systemctl=systemctl))

    rc, out, err = show()
    if rc != 0:
        module.fail_json(msg="Unable to read unit %s: %s" % (p["unit"], (err or out).strip()))
    props, watched = parse_show(out), None
    if p["watch_s"] > 0 and is_running(props):
        props, watched = watch(show, props, p["watch_s"])
    running, main_pid, invocation = is_running(props), int_prop(props, "MainPID", 0), props.get("InvocationID", "")
    seconds = runtime_s(props, now_monotonic_s=time.monotonic() if running else None)
    result = unit_fields(props, seconds, release_from_proc(main_pid) if running and main_pid > 0 else None)
    if taken is not None:
        result["lock"] = taken

    if p["log_path"]:
        follower = where = None
        if invocation and os.path.exists(p["log_path"]):
            try:
                follower, where = read_log(p["log_path"], invocation)
            except (IOError, OSError) as e:
                module.warn("Unable to read log %s: %s" % (p["log_path"], e))
        result.update(log_fields(follower, where, running, result["running_release"]))
    if wants_log(p):
        result["log"] = read_log_chunk(p, invocation)

    if p["trainer_root"]:
        result.update(release_fields(*read_release_marks(p["trainer_root"]), running_release=result["running_release"]))
    if watched is not None:
        result["watched_s"] = watched
    if p["trainer_root"]:
        ledger = read_ledger(os.path.join(p["trainer_root"], "ledger.json"))
        # a deliberate stop on record (trainer_restart state=stop) that still holds: not running is no failure
        stopped = stopped_on_purpose(read_state(p["job_state_path"]), props) if p["job_state_path"] else None
        result["health"] = status_health(ledger, result, seconds, time.time(), stopped=stopped)
        # (the environment file is part of the configuration: without O(env_file) it is unknown)
        result["config"] = installed_config(p["trainer_root"], result.get("fragment_path") or unit_path_of(p["unit"]),
                                            p["env_file"])[0] if p["env_file"] else None
        if p["history"] > 0:
            result["history"] = history_rows(ledger, result.get("running_release"), result.get("current_release"),
                                             p["history"], running_config=result["config"])

    if p["job_state_path"]:
        job = read_state(p["job_state_path"])
        result["last_job"] = job_summary(job, job_alive(job))

    nvidia_smi = locate(p["nvidia_smi"], module.get_bin_path)
    if nvidia_smi is None:
        result["gpu_error"] = not_found_message(p["nvidia_smi"])
    else:
        try:
            result.update(gpu_fields(read_gpus(run, nvidia_smi, processes=False)[0]))
        except NvidiaSmiError as e:
            result["gpu_error"] = str(e)
    if p["install"]:
        judge_no_op(module, result, run, systemctl, lock_held=taken is not None)
    module.exit_json(**mask(result, read_secrets(p["env_file"])))


def judge_no_op(module, result, run, systemctl, lock_held):
    """O(install): what it would change (RV(install), compared, nothing written); with O(no_op), why
    the deploy must go on (RV(no_op_reasons)) - none: RV(no_op), the lock released in this call."""
    p = module.params
    try:
        result["install"] = install_all(dict(p["install"], env_content=p["env_content"] or ""), run, systemctl,
                                        check_mode=True, diff=module._diff)
        if result["install"].get("diff"):  # diff mode: the files the deploy installs, the environment masked
            result["diff"] = result["install"].pop("diff")
    except InstallError as e:  # the deploy's install refuses it too, before any write; say it there
        result["install"] = dict(e.result, refused=e.msg)
    if not p["no_op"]:
        return
    # the release the deploy brings is already current (complete by construction): nothing to upload or switch
    result["release_current"] = p["no_op"]["release"] == result.get("current_release")
    reasons = no_op_reasons(result, p["no_op"]["release"], p["no_op"]["force"], result["install"])
    result["no_op_reasons"] = reasons
    result["no_op"] = not reasons and lock_held
    if result["no_op"]:
        freed = release(p["lock"]["path"], p["lock"]["token"])
        result["lock"]["released"] = bool(freed.ok)
        if not freed.ok:
            module.fail_json(msg="the deploy changes nothing, but the lock could not be released: %s" % freed.msg,
                             **result)


def take_lock(module, lk, state_path):
    """Take the deploy lock (O(lock)) -> RV(lock); fail the module when it is not taken. A restart
    job of an earlier (interrupted) play that holds it is waited for (O(lock.job_wait_s)) first."""
    out = acquire_waiting(lk["path"], lk["token"], lk["owner"], lk["stale_s"], lease_s=lk["lease_s"],
                          wait_s=lk["wait_s"])
    attached = None
    job = lock_holder_job(out, read_state(state_path), job_alive) if state_path and not out.ok else None
    if job is not None:
        attached = wait_for_job(state_path, job, lk["job_wait_s"])
        out = acquire_waiting(lk["path"], lk["token"], lk["owner"], lk["stale_s"], lease_s=lk["lease_s"],
                              wait_s=max(lk["wait_s"], 5))
    if not out.ok:
        module.fail_json(**lock_refusal(out))
    return lock_taken(out, attached)


def wait_for_job(state_path, job, wait_s, clock=time.monotonic, sleep=time.sleep):
    """Wait (bounded) until the restart job ``job`` (its state, found running) has ended -> words
    for what it did."""
    # job_alive named at the call: tests swap trainer_status.job_alive
    out = poll_until(lambda: observe_job(state_path, alive=job_alive), job_over(job.get("job_id")), wait_s, 0.5,
                     clock=clock, sleep=sleep, first=(job, True))
    return "waited for %s" % outcome_words(out.snapshot[0])


if __name__ == "__main__":
    main()
