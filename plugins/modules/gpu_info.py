#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_info
short_description: Read per-GPU memory, utilization and compute processes with nvidia-smi
version_added: "0.1.0"
description:
  - Runs C(nvidia-smi --query-gpu) once and C(nvidia-smi --query-compute-apps) once on the target
    and returns one record per GPU with its compute processes joined by GPU UUID.
  - Error values nvidia-smi prints in place of a number (V([N/A]), V([Insufficient Permissions]), ...)
    become V(null) and are listed in the GPU's RV(gpus[].errors).
  - Inside a container the per-GPU memory is right but the process list may be empty or show host
    PIDs with names V([Not Found]); judge memory from RV(gpus[].memory_used_mib).
  - For playbooks outside the role (an inventory of a GPU host, a check before other GPU work); the
    role reads GPUs with M(dflash.trainer.trainer_status) and does not call this module.
  - >-
    Fails with the nvidia-smi exit status in words when the GPU query fails, for example
    C(nvidia-smi failed (exit 9: driver not loaded): ...). A failed process query is only a warning.
options:
  gpus:
    description:
      - Only report the GPUs with these indexes. Default is every GPU nvidia-smi reports.
      - An index nvidia-smi does not report fails the task.
    type: list
    elements: int
extends_documentation_fragment:
  - dflash.trainer.nvidia_smi
  - dflash.trainer.attributes.read_only
author:
  - dflash.trainer maintainers (@dflash)
"""

EXAMPLES = r"""
- name: Read all GPUs
  dflash.trainer.gpu_info:
  register: __trainer_gpus

- name: Read GPUs 0-3 with a non-standard nvidia-smi
  dflash.trainer.gpu_info:
    nvidia_smi: /usr/local/bin/nvidia-smi
    gpus: [0, 1, 2, 3]
  register: __trainer_gpus

- name: Show who holds GPU memory
  ansible.builtin.debug:
    msg: "GPU {{ item.index }}: {{ item.memory_used_mib }} MiB, {{ item.processes | length }} processes"
  loop: "{{ __trainer_gpus.gpus }}"
"""

RETURN = r"""
gpus:
  description: One record per (selected) GPU, in index order.
  returned: success
  type: list
  elements: dict
  contains:
    index:
      description: GPU index.
      type: int
      sample: 0
    uuid:
      description: GPU UUID.
      type: str
      sample: GPU-3f1a2b00-1c2d-4e5f-8a9b-c0ffee000000
    name:
      description: Product name.
      type: str
      sample: NVIDIA H200
    memory_used_mib:
      description: Memory used in MiB; null when nvidia-smi printed an error value.
      type: int
      sample: 130013
    memory_total_mib:
      description: Total memory in MiB.
      type: int
      sample: 143771
    utilization_gpu_pct:
      description: GPU utilization in percent; null when not available.
      type: int
      sample: 100
    errors:
      description: "Fields that held an error value, as C(field: [value])."
      type: list
      elements: str
      sample: ["utilization.gpu: [N/A]"]
    processes:
      description: Compute processes on this GPU (may be empty inside a container).
      type: list
      elements: dict
      sample: [{"pid": 1234, "process_name": "python3", "used_memory_mib": 130004}]
gpu_count:
  description: Number of GPUs returned.
  returned: success
  type: int
  sample: 8
total_used_mib:
  description: Sum of RV(gpus[].memory_used_mib) over the returned GPUs (unreadable values count 0).
  returned: success
  type: int
  sample: 650065
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils._run import ModuleRunner
from ansible_collections.dflash.trainer.plugins.module_utils._nvidia_smi import (
    NvidiaSmiError,
    index_ranges,
    read_gpus,
    require,
    select,
    summarize,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            gpus=dict(type="list", elements="int"),
        ),
        supports_check_mode=True,
    )
    nvidia_smi = require(module, module.params["nvidia_smi"])
    try:
        gpus, warnings = read_gpus(ModuleRunner(module), nvidia_smi)  # each call bounded: 30 s
    except NvidiaSmiError as e:
        module.fail_json(msg=str(e))
    for warning in warnings:
        module.warn(warning)
    selected, missing = select(gpus, module.params["gpus"])
    if missing:
        module.fail_json(msg="GPU %s not reported by nvidia-smi (it reports %s)" % (
            ", ".join(str(i) for i in missing), index_ranges(g["index"] for g in gpus) or "none"),
            gpus=gpus)
    module.exit_json(changed=False, gpus=selected, **summarize(selected))


if __name__ == "__main__":
    main()
