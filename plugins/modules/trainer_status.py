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
  - It takes no lock and changes nothing; the first read of a locked entry point, which takes the lock and
    makes the run's plan, is M(dflash.trainer.trainer_plan).
options:
  unit:
    description: The trainer's systemd unit.
    type: str
    required: true
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
  check:
    description:
      - Before reading, run the input check of this entry point of the role on the controller, as
        M(dflash.trainer.trainer_validate) runs it - V(status), the check of what status, logs and history read, on
        the play's C(trainer_*) variables, templated. A refused input fails the task with the check's message (RV(input_refused))
        before anything reaches the target; an accepted one returns RV(in_group).
      - Handled by the action plugin; the target never sees it. Omit it (a deploy's watch) - no check.
    type: str
    choices: [status]
  spec:
    description:
      - With O(check), check the role's argument spec for O(check) first (C(meta/argument_specs.yml)), as Ansible's own
        validation task would (the same checks and message) - for a playbook that imports the role with
        C(rolespec_validate=false). Only in a task of the role.
      - Handled by the action plugin; the target never sees it.
    type: bool
    default: false
  show:
    description:
      - Return in RV(lines) what the role's entry point shows of the read - V(log) the start's lines (O(log_lines),
        O(log_offset)) and why the log could not be read, V(history) the release ledger's entries (O(history)) under
        a header, and the drift.
      - Handled by the action plugin; the target never sees it.
    type: str
    choices: [log, history]
  verdict:
    description:
      - Status's verdict on this host, from the reads registered earlier in the play - nothing is read on the target.
        V(read) (the name of the variable this host and every member of its trainer group registered this module's
        read in), V(group) (its trainer group, an inventory group; empty - not a member), V(in_run) (the hosts of this
        run; a member not among them is not judged, nor is its group). The result is RV(ok), RV(failure), RV(lines),
        RV(group_status) (also set as the fact C(__trainer_group_status)) and RV(group_failed); O(unit) names the
        trainer in RV(failure).
      - Handled by the action plugin; the target never sees it.
    type: dict
attributes:
  check_mode:
    support: full
    description: Read-only; runs in check mode.
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
as_expected:
  description: The trainer runs its proved release healthily, or was stopped on purpose (RV(health)) - the action's.
  returned: when RV(health) is read
  type: bool
in_group:
  description: With O(check), whether the host is a member of a trainer group (C(trainer_group) set) - status judges
    its group as a whole (O(verdict)).
  returned: with O(check), when the inputs are accepted
  type: bool
  sample: false
input_refused:
  description: With O(check), the input check refused the inputs - the task failed with its message (C(msg)) before
    anything reached the target.
  returned: with O(check), when the inputs are refused
  type: bool
  sample: true
problems:
  description: With O(check), the problems the input check found, each naming the variable, the value and what is
    accepted.
  returned: with O(check), when the collection's checks refused the inputs
  type: list
  elements: str
lines:
  description: With O(show), the lines the role's entry point shows of the read; with O(verdict), what status shows
    of this host - the unit, the releases (drift), GPU memory, the last restart job, the last progress, the health,
    and for a member of a trainer group the group's words.
  returned: with O(show) or O(verdict)
  type: list
  elements: str
  sample: ["unit dflash-trainer: active/running, pid 4242, up 3600.5 s, restarts 0", "health: running release ..."]
ok:
  description: With O(verdict), the trainer runs its proved release healthily or was stopped on purpose (RV(as_expected)
    of its read), and its trainer group, if any, was not found to be other than one proved job.
  returned: with O(verdict)
  type: bool
failure:
  description: With O(verdict), the message status fails with when not RV(ok) - the host's own (C(<unit> is not
    running its proved release healthily), then its health's words) first, else the group's words; V(null) when
    RV(ok).
  returned: with O(verdict)
  type: str
group_status:
  description: With O(verdict), for a member of a trainer group, whether the group runs as one proved job - V(ok)
    (V(null) when not judged, a member not read in this run), V(words), V(members) (those that do not, or were not
    read); V(null) for a host that is no member.
  returned: with O(verdict)
  type: dict
group_failed:
  description: With O(verdict), the host's group was judged and does not run as one proved job.
  returned: with O(verdict)
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
    - A trainer stopped on purpose (O(dflash.trainer.trainer_restart#module:operation=stop), with O(job_state_path)) and not
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
gpu_node_fault:
  description: V(true) when RV(gpu_error) is the node's fault, never the trainer's (nvidia-smi exit 9, driver not
    loaded, or 15, a GPU fell off the bus).
  returned: when nvidia-smi failed with such a status
  type: bool
  sample: true
device_problems:
  description: The device nodes CUDA needs that the container lacks (C(/dev/nvidiactl), C(/dev/nvidia-uvm), a
    C(/dev/nvidiaN)), each with how to create it on the node; a deploy refuses them before anything changes.
  returned: when nvidia-smi answered and a node is missing or not a character device
  type: list
  elements: str
  sample: ["/dev/nvidia-uvm is missing in the container (CUDA cannot start without it): on the node run ..."]
gpu_warnings:
  description: What nvidia-smi warned about while its output was used (exit 14, a GPU's infoROM corrupted).
  returned: when nvidia-smi warned
  type: list
  elements: str
  sample: ["a GPU's infoROM is corrupted (nvidia-smi exit 14; its output is used): ..."]
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils.target.command import ModuleRunner
from ansible_collections.dflash.trainer.plugins.module_utils.target.secrets import mask, read_secrets
from ansible_collections.dflash.trainer.plugins.module_utils.plan.status import LOG_NEEDS_PATH, wants_log
from ansible_collections.dflash.trainer.plugins.module_utils.plan.status_read import READ_OPTIONS, read_status


def main():
    module = AnsibleModule(
        argument_spec=dict(
            READ_OPTIONS,
            history=dict(type="int", default=0),
            watch_s=dict(type="float", default=0),
            log_lines=dict(type="int", default=0),
            log_invocation=dict(type="str"),
            log_offset=dict(type="int"),
            log_inode=dict(type="int"),
            log_wait_s=dict(type="float", default=0),
            check=dict(type="str", choices=["status"]),
            spec=dict(type="bool", default=False),
            show=dict(type="str", choices=["log", "history"]),
            verdict=dict(type="dict"),
        ),
        required_together=[("log_offset", "log_inode")],
        supports_check_mode=True,
    )
    p = module.params
    if wants_log(p) and not p["log_path"]:
        module.fail_json(msg=LOG_NEEDS_PATH)
    result = read_status(module, p, ModuleRunner(module), module.get_bin_path("systemctl", required=True))
    module.exit_json(**mask(result, read_secrets(p["env_file"])))


if __name__ == "__main__":
    main()
