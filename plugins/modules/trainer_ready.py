#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_ready
short_description: Prove on the target that this start of the trainer is training, or say why not
version_added: "0.1.0"
description:
  - One task that polls on the target every O(interval_s) seconds (no controller-side retries)
    until the running start of the trainer (O(invocation_id)) is proved ready, or fails with the
    reason in words and the tail of this start's log.
  - For playbooks outside the role, for example to prove a start the role did not make (a reboot, a
    C(systemctl restart) of your own) - take O(invocation_id) and O(n_restarts) from
    M(dflash.trainer.trainer_status). The role's restart job proves with the same judge
    (C(module_utils/_readiness.py)) and does not call this module; it needs a unit whose launcher writes
    the start marker (a unit the role installed).
  - >-
    Only lines after the launcher's marker C(==> dflash.trainer start invocation=<ID> ...) with
    O(invocation_id) count ("this start's log"); lines left by earlier runs never match.
    The log is read from this start's marker on (the launcher records its offset in C(<log>.start);
    without it the file is scanned backwards), then incrementally; when it shrinks or is replaced
    (rotation) it is read again from its start, where the launcher writes a continuation marker.
    A log that holds no marker of this start for 5 s after it shrank or was replaced (or whose
    C(<log>.start) names this start) fails the task with C(log was truncated or replaced since this start).
  - >-
    Fails at once when the unit is not active/running (for example
    C(trainer exited with status 1 after 0.6 s: ModuleNotFoundError: No module named 'flash_attn')),
    when it restarted (NRestarts above O(n_restarts) or a new InvocationID), when an error pattern
    appears in this start's log, or when an expected GPU is not reported by nvidia-smi.
  - >-
    Once this start's log shows O(min_steps) increasing step values, the step counter must keep
    rising: a poll more than O(stall_s) seconds after its last rise fails with
    C(no progress for 6.2 s (last step=5)), in the hold window or before it.
  - >-
    A GPU left behind fails at once too: when the trainer has made progress for O(stall_s) seconds
    since its first step and an expected GPU stayed below O(min_mib) all that time, for example
    C(GPU 7 holds 100 MiB while the trainer is at step 40 (below 1024 MiB through 5 s of progress)).
    GPUs that fill before the first step, however late, are left to O(timeout_s).
  - >-
    Ready when, on every poll for O(hold_s) seconds, the unit runs with O(invocation_id), every GPU
    in O(gpus) uses at least O(min_mib) MiB, this start's log has a line matching O(ready_regex) and
    at least O(min_steps) increasing step values, and the trainer kept progressing through that
    window: the step counter rose after the window began and no gap between rises, including the
    one from the last rise to the verdict, exceeded O(stall_s). A rise first seen more than
    O(stall_s) after the previous one, with no poll in between (a late poll), starts the window
    again.
  - >-
    Fails at O(timeout_s) naming what was still missing, for example
    C(not ready after 120 s: GPUs 5, 6, 7 below 1024 MiB (0, 0, 0 MiB)).
  - >-
    The stall window follows the trainer's own cadence: once the step counter has risen a few times,
    a trainer that reports every N seconds may go 3N seconds without a rise (N the low median of its
    recent gaps) when that is longer than O(stall_s); O(stall_s) is the least window, and the failure
    says which window applied. O(hold_s) must be at least O(stall_s) (refused otherwise), preferably
    twice it.
  - >-
    The defaults are the role's (C(trainer_ready_*)), except O(min_steps), which may be V(0) here
    (the role requires at least 1).
options:
  unit:
    description: The trainer's systemd unit.
    type: str
    required: true
  log_path:
    description: The log file the unit's launcher appends to (markers and trainer output).
    type: path
    required: true
  invocation_id:
    description: InvocationID of the activation to judge (RV(dflash.trainer.trainer_status#module:invocation_id)).
    type: str
    required: true
  n_restarts:
    description: NRestarts baseline (RV(dflash.trainer.trainer_status#module:n_restarts) read at the start); a higher value means a restart.
    type: int
    default: 0
  gpus:
    description: GPU indexes that must hold memory. Default is every GPU nvidia-smi reports.
    type: list
    elements: int
  min_mib:
    description: Memory in MiB each GPU in O(gpus) must use.
    type: int
    default: 1024
  error_regexes:
    description: Python regular expressions that fail the task when a line of this start's log matches.
    type: list
    elements: str
    default: ['Traceback \(most recent call last\)', 'CUDA out of memory', 'OutOfMemoryError', 'NCCL error']
  min_steps:
    description:
      - Increasing step values this start's log must show. V(0) turns the step checks off (for a trainer
        that logs no step counter; the role's C(trainer_ready_min_steps) must be at least 1).
    type: int
    default: 2
  hold_s:
    description: Seconds all conditions, and progress, must hold without a break.
    type: float
    default: 10
  stall_s:
    description:
      - Longest gap between two rises of the step counter (and from the last rise to the verdict), at
        least - a trainer that reports less often gets 3 times its own gap between steps. Fail when the
        step counter has not risen for longer than that window; also the progress a GPU below O(min_mib)
        may lag behind before the task fails naming it.
      - Must not be longer than O(hold_s).
    type: float
    default: 5
  timeout_s:
    description: Seconds to wait for readiness before failing (the role's C(trainer_ready_timeout_s)).
    type: float
    default: 900
  interval_s:
    description: Seconds between polls; a dead trainer is noticed within about one interval.
    type: float
    default: 0.5
  tail_lines:
    description: Lines of this start's log returned (and shown in the message) on failure.
    type: int
    default: 20
attributes:
  check_mode:
    support: partial
    description: Skipped in check mode (nothing was started to judge); returns RV(ready=null).
    details: The task is reported as skipped and probes nothing.
  diff_mode:
    support: none
    description: Returns no diff.
extends_documentation_fragment:
  - dflash.trainer.log_patterns
  - dflash.trainer.nvidia_smi
author:
  - dflash.trainer maintainers (@dflash)
"""

EXAMPLES = r"""
- name: Read which start of the trainer runs (after a reboot, or a restart of your own)
  dflash.trainer.trainer_status:
    unit: dflash-trainer
    trainer_root: /opt/dflash-trainer
    log_path: /var/log/dflash-trainer/trainer.log
  register: __trainer_now

- name: Prove this start is training on all 8 GPUs
  dflash.trainer.trainer_ready:
    unit: dflash-trainer.service
    log_path: /var/log/dflash-trainer/trainer.log
    invocation_id: "{{ __trainer_now.invocation_id }}"
    n_restarts: "{{ __trainer_now.n_restarts }}"
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    min_mib: 4096
    timeout_s: 180
  register: __trainer_ready

- name: Record the proof
  ansible.builtin.debug:
    msg: "{{ __trainer_ready.proof.release }} ready in {{ __trainer_ready.proof.seconds_to_ready }} s at {{ __trainer_ready.proof.tok_s }} tok/s"
"""

RETURN = r"""
ready:
  description: V(true) when proved ready; V(null) in check mode. On failure the task fails.
  returned: always
  type: bool
  sample: true
proof:
  description: What was observed when readiness was proved.
  returned: success
  type: dict
  contains:
    release:
      description: Release id from this start's marker line.
      type: str
      sample: 0123456789abcdef
    invocation_id:
      description: The activation judged.
      type: str
      sample: 6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70
    main_pid:
      description: The unit's MainPID.
      type: int
      sample: 4242
    gpus_mib:
      description: Memory used per GPU index.
      type: dict
      sample: {"0": 70000, "1": 70000}
    matched_line:
      description: The last line of this start's log matching O(ready_regex).
      type: str
      sample: "step=12 loss=2.12 tok/s=1012.0 queue_target=4 queue_drafter=4"
    tok_s:
      description: The latest throughput read with O(tokps_regex).
      type: float
      sample: 1012.0
    step:
      description: The latest step value.
      type: int
      sample: 12
    seconds_to_ready:
      description: Seconds from the first poll to the proof.
      type: float
      sample: 11.02
reason:
  description: Why the trainer is not ready, in words.
  returned: failure
  type: str
  sample: "trainer exited with status 1 after 0.6 s: ModuleNotFoundError: No module named 'flash_attn'"
log_tail:
  description: The last O(tail_lines) lines of this start's log.
  returned: failure
  type: list
  elements: str
  sample: ["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'flash_attn'"]
unit:
  description: Unit properties at the failure (ActiveState, SubState, Result, ExecMainCode, ExecMainStatus, ...).
  returned: failure
  type: dict
  sample: {"ActiveState": "failed", "Result": "exit-code", "ExecMainStatus": "1"}
gpus_mib:
  description: Memory used per expected GPU index at the failure.
  returned: failure
  type: dict
  sample: {"0": 0}
missing:
  description: The conditions still missing at the deadline.
  returned: failure at the deadline
  type: list
  elements: str
  sample: ["GPUs 5, 6, 7 below 1024 MiB (0, 0, 0 MiB)"]
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils._cycle import (
    StepFailed,
    compile_regexes,
    expectations,
    prove,
)
from ansible_collections.dflash.trainer.plugins.module_utils._nvidia_smi import require
from ansible_collections.dflash.trainer.plugins.module_utils._readiness import (
    DEFAULT_HOLD_S,
    DEFAULT_STALL_S,
    window_problem,
)
from ansible_collections.dflash.trainer.plugins.module_utils._run import ModuleRunner
from ansible_collections.dflash.trainer.plugins.module_utils._trainer_log import (
    DEFAULT_ERROR_REGEXES,
    DEFAULT_READY_REGEX,
    DEFAULT_STEP_REGEX,
    DEFAULT_TOKPS_REGEX,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", required=True),
            log_path=dict(type="path", required=True),
            invocation_id=dict(type="str", required=True),
            n_restarts=dict(type="int", default=0),
            gpus=dict(type="list", elements="int"),
            min_mib=dict(type="int", default=1024),
            ready_regex=dict(type="str", default=DEFAULT_READY_REGEX),
            step_regex=dict(type="str", default=DEFAULT_STEP_REGEX),
            tokps_regex=dict(type="str", default=DEFAULT_TOKPS_REGEX),
            error_regexes=dict(type="list", elements="str", default=list(DEFAULT_ERROR_REGEXES)),
            min_steps=dict(type="int", default=2),
            hold_s=dict(type="float", default=DEFAULT_HOLD_S),
            stall_s=dict(type="float", default=DEFAULT_STALL_S),
            timeout_s=dict(type="float", default=900.0),
            interval_s=dict(type="float", default=0.5),
            tail_lines=dict(type="int", default=20),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problem = window_problem(p["hold_s"], p["stall_s"])
    if problem:
        module.fail_json(msg=problem)
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, ready=None,
                         msg="check mode: nothing was started, readiness not judged")
    if not p["invocation_id"].strip():
        module.fail_json(msg="invocation_id is empty; pass the invocation_id of the start to judge (trainer_status returns it)")

    try:
        regexes = compile_regexes(p["ready_regex"], p["step_regex"], p["tokps_regex"], p["error_regexes"])
    except StepFailed as exc:
        module.fail_json(msg=exc.msg)
    systemctl = module.get_bin_path("systemctl", required=True)
    nvidia_smi = require(module, p["nvidia_smi"])
    # the poll loop lives in module_utils/_cycle.py (shared with the restart job); every command
    # is bounded (30 s, and the time left until timeout_s): a hung nvidia-smi or systemctl fails
    # the proof saying so instead of blocking the task
    try:
        run = ModuleRunner(module, deadline=time.monotonic() + p["timeout_s"])
        proof = prove(run, systemctl, nvidia_smi, p["unit"], p["log_path"],
                      expectations(p["invocation_id"], p["n_restarts"], p), regexes, interval_s=p["interval_s"])
    except StepFailed as exc:
        module.fail_json(msg=exc.msg, **exc.details)
    msg = proof.pop("msg", "ready")
    module.exit_json(changed=False, ready=True, proof=proof, msg=msg)


if __name__ == "__main__":
    main()
