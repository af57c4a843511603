#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_drain
short_description: Wait on the target until GPU memory is released
version_added: "0.1.0"
description:
  - Samples C(nvidia-smi --query-gpu) every O(interval_s) seconds on the target, in one task,
    until every selected GPU uses at most O(max_mib) MiB on O(consecutive) samples in a row.
  - Processes killed with the trainer (DataLoader workers, children) keep GPU memory until they
    are gone; a stuck context never gives it back. Use this between stopping and starting.
  - >-
    Fails at O(timeout_s) naming the GPUs still held and the holders nvidia-smi shows, for example
    C(GPU memory still held after 60 s: GPU 5 5000 MiB; holders: pid 1234 python3 (5000 MiB on GPU 5)).
    Inside a container the process list is often empty; memory is judged from the per-GPU figures.
  - For playbooks outside the role (a maintenance window, another GPU job, a driver upgrade); the role's
    restart job drains with the same function (C(module_utils/_cycle.py)) and does not call this module.
options:
  gpus:
    description: GPU indexes to wait for. Default is every GPU nvidia-smi reports.
    type: list
    elements: int
  max_mib:
    description: A GPU counts as drained at or below this many MiB used (the role's C(trainer_drain_max_mib)).
    type: int
    default: 1024
  consecutive:
    description: Number of samples in a row on which every selected GPU must be drained.
    type: int
    default: 2
  interval_s:
    description: Seconds between samples (the role's restart job samples every 0.1 s, while the trainer is stopped).
    type: float
    default: 1.0
  timeout_s:
    description: Seconds to wait before failing (the role's C(trainer_drain_timeout_s)).
    type: float
    default: 60
attributes:
  check_mode:
    details: Waits in check mode too.
extends_documentation_fragment:
  - dflash.trainer.nvidia_smi
  - dflash.trainer.attributes.read_only
author:
  - dflash.trainer maintainers (@dflash)
"""

EXAMPLES = r"""
- name: Wait until all GPUs are free after stopping the trainer
  dflash.trainer.gpu_drain:
    timeout_s: 60

- name: Wait for GPUs 4-7 with a stricter threshold
  dflash.trainer.gpu_drain:
    gpus: [4, 5, 6, 7]
    max_mib: 16
    consecutive: 3
    interval_s: 0.5
"""

RETURN = r"""
samples:
  description: Number of nvidia-smi samples taken.
  returned: always
  type: int
  sample: 3
waited_s:
  description: Seconds waited from the first sample to the last.
  returned: always
  type: float
  sample: 2.004
gpus_mib:
  description: Memory used per selected GPU index on the last sample (null when unreadable).
  returned: always
  type: dict
  sample: {"0": 0, "1": 3}
held:
  description: GPU indexes still above O(max_mib) at the timeout.
  returned: failure
  type: list
  elements: int
  sample: [5, 6]
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils._cycle import StepFailed, drain
from ansible_collections.dflash.trainer.plugins.module_utils._nvidia_smi import require
from ansible_collections.dflash.trainer.plugins.module_utils._run import ModuleRunner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gpus=dict(type="list", elements="int"),
            max_mib=dict(type="int", default=1024),
            consecutive=dict(type="int", default=2),
            interval_s=dict(type="float", default=1.0),
            timeout_s=dict(type="float", default=60.0),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["consecutive"] < 1 or p["interval_s"] < 0 or p["timeout_s"] < 0:
        module.fail_json(msg="consecutive must be >= 1, interval_s and timeout_s >= 0")
    nvidia_smi = require(module, p["nvidia_smi"])
    # the poll loop lives in module_utils/_cycle.py (shared with the restart job); a hung
    # nvidia-smi is killed at 30 s or at the deadline, whichever is first
    run = ModuleRunner(module, deadline=time.monotonic() + p["timeout_s"])
    try:
        details = drain(run, nvidia_smi, gpus=p["gpus"], max_mib=p["max_mib"], consecutive=p["consecutive"],
                        interval_s=p["interval_s"], timeout_s=p["timeout_s"])
    except StepFailed as exc:
        module.fail_json(msg=exc.msg, **exc.details)
    module.exit_json(changed=False, **details)


if __name__ == "__main__":
    main()
