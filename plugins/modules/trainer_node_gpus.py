#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_node_gpus
short_description: Attribute the Proxmox node's GPU memory to containers and units
version_added: "0.1.0"
description:
  - >-
    Runs on the Proxmox B(node), not in the container (the role runs it with the
    C(dflash.trainer.pct) connection's C(ansible_pct_node=true)): C(nvidia-smi) there lists
    every holder under its host PID, and each PID's C(/proc/<pid>/cgroup) names its container
    and the unit inside it (C(/lxc/200/ns/system.slice/dflash-trainer.service) on Proxmox VE).
  - >-
    Reads nothing another tenant can shape as structure: nvidia-smi is asked for
    C(gpu_uuid,pid,used_memory) only (a process name is printed unquoted, and a tenant can name
    its process C(a, x, 1\n<pid>, p)); every row must be exactly a GPU/MIG UUID, a pid and
    C(<n> MiB) or a bracketed error value, or the module fails naming the malformed lines. A
    holder's name is read from the node's C(/proc/<pid>/comm) and shown escaped.
  - Splits each GPU's memory into the trainer's (container O(vmid), unit O(unit)), other holders
    in that container, other tenants (other containers, the node's own processes) and memory no
    listed process accounts for.
  - Read-only. Needs no root on the node (nvidia-smi and C(/proc/<pid>/cgroup) are readable by
    every user), so a careful operator's ssh user can run it without any sudo rule.
  - >-
    Runs only programs of root (or of the user it runs as): the python running it and the
    nvidia-smi it finds must be files that only they may write, in directories only they may
    write (as sudo's secure_path), or it fails naming C(trainer_node_python) or
    C(trainer_node_nvidia_smi) before nvidia-smi runs.
  - >-
    Counts as the trainer only a process in the container's own system unit at its exact place
    (C(/lxc/<vmid>/ns/system.slice/<unit>), C(/lxc.payload.<vmid>/system.slice/<unit>)); a user
    unit of the same name in the container (C(user@1000.service/app.slice/<unit>)) is another
    holder in that container.
options:
  vmid:
    description: The trainer's container id.
    type: int
    required: true
  unit:
    description: The trainer's unit (C(.service) is added when no suffix is given).
    type: str
    required: true
  gpus:
    description:
      - The trainer's GPUs, by the container's index (default every GPU of O(container_gpus), else every GPU
        the node reports).
    type: list
    elements: int
  container_gpus:
    description:
      - The GPUs as nvidia-smi in the container lists them (C(index) and C(uuid) of each; the first read's
        C(gpus)). The node's GPUs are paired with them by UUID and numbered by the container's index, since a
        container given some of the node's GPUs numbers them 0..k-1 while the node numbers them by slot.
        Lines name both (C(GPU 0 (the node's GPU 5))).
      - A container GPU the node does not list fails O(check=preflight) and O(check=proof), and is a warning
        otherwise.
      - Empty, the node's own numbering is taken for the container's.
    type: list
    elements: dict
    default: []
  check:
    description:
      - V(preflight) fails when a process of the trainer's container other than the trainer holds
        more than O(max_mib) on a trainer GPU (the drain gate would fail after the stop).
      - V(proof) fails when the trainer holds less than O(min_mib) on a trainer GPU.
      - V(none) only reports.
    type: str
    choices: [none, preflight, proof]
    default: none
  max_mib:
    description: The drain gate's limit (C(trainer_drain_max_mib)), for O(check=preflight).
    type: int
    default: 1024
  min_mib:
    description: The proof's per-GPU minimum (C(trainer_gpu_min_mib)), for O(check=proof).
    type: int
    default: 1024
  python:
    description:
      - The node's Python the module runs in (the role's C(trainer_node_python)). The action first describes it
        over the task's connection with a raw shell script - no Python; its resolved path, owner and mode and every
        directory above it (plugin_utils/_node_program.py) - and judges the answer; one another user may change is
        refused (the task fails, the module never run in it).
      - Handled by the action plugin; the target never sees it.
    type: str
  view:
    description:
      - The role's node-view options, whole (C(__trainer_node_args)), spread under the task's own options (the
        task's own win) - the role reads the node's view twice with the same options.
      - Handled by the action plugin; the target never sees it.
    type: dict
  must:
    description:
      - V(false) - a node view that cannot be read does not fail the task (its result says why).
      - Handled by the action plugin; the target never sees it.
    type: bool
    default: true
extends_documentation_fragment:
  - dflash.trainer.nvidia_smi
  - dflash.trainer.attributes.read_only
author:
  - dflash.trainer maintainers (@dflash)
"""

EXAMPLES = r"""
- name: Who holds the node's GPUs
  dflash.trainer.trainer_node_gpus:
    vmid: 200
    unit: dflash-trainer
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
  vars:
    ansible_pct_node: true
    ansible_python_interpreter: /usr/bin/python3
  register: __trainer_node_gpus
"""

RETURN = r"""
has_lines:
  description: Whether RV(lines) has a line to show - the action's.
  returned: always
  type: bool
gpus:
  description: >-
    Per GPU, its memory split by holder (see the description); with O(container_gpus), the container's GPUs
    only, C(index) the container's and C(slot) the node's.
  returned: success
  type: list
  elements: dict
  sample: [{"index": 0, "slot": 5, "uuid": "GPU-3c1f...", "used_mib": 50000, "trainer_mib": 30000,
            "same_ct_mib": 0, "foreign_mib": 20000, "unlisted_mib": 0, "holders": [{"pid": 81234, "name": "python3", "mib": 30000, "vmid": 200,
            "unit": "dflash-trainer.service", "kind": "trainer"}]}]
foreign_mib:
  description: Per trainer GPU (the container's index), the MiB other tenants hold (GPUs with none are left out).
  returned: success
  type: dict
  sample: {"7": 20000}
lines:
  description: >-
    One line per trainer GPU, e.g. C(GPU 0 (the node's GPU 5): 30000 MiB held by dflash-trainer in CT 200).
  returned: success
  type: list
  elements: str
"""

import os
import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import observe_program, program_problem
from ansible_collections.dflash.trainer.plugins.module_utils.target.command import ModuleRunner
from ansible_collections.dflash.trainer.plugins.module_utils.target.nvidia_smi import (
    NvidiaSmiError,
    read_node_gpus,
    require,
)
from ansible_collections.dflash.trainer.plugins.module_utils.target.node_gpu import (
    attribute,
    comm_name,
    foreign_by_gpu,
    in_container,
    lines,
    owner,
    preflight_problem,
    proof_problem,
    unpaired_problem,
)


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def read_owners(gpus):
    """({host pid: (vmid, unit)}, {host pid: name}) for every listed process still alive."""
    owners, names = {}, {}
    for gpu in gpus:
        for proc in gpu.get("processes") or []:
            pid = proc.get("pid")
            if pid is None or pid in owners:
                continue
            try:
                owners[pid] = owner(_read("/proc/%d/cgroup" % pid))
            except (OSError, ValueError):
                continue  # exited between the two reads
            try:
                names[pid] = comm_name(_read("/proc/%d/comm" % pid))
            except (OSError, ValueError):
                names[pid] = None
    return owners, names


def program_problems(python, nvidia_smi, uids):
    """Why the node's python running this module (``python``: its path) or the nvidia-smi it is to
    run (``nvidia_smi``: the path found) may not be run here, naming the role's variable; [] when
    both are files of ``uids`` (root, and the user the module runs as) in directories only they
    may write."""
    out = []
    for variable, path in (("trainer_node_python", python), ("trainer_node_nvidia_smi", nvidia_smi)):
        why = program_problem(observe_program(path), uids)
        if why:
            out.append("%s: %s" % (variable, why))
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vmid=dict(type="int", required=True),
            unit=dict(type="str", required=True),
            gpus=dict(type="list", elements="int"),
            container_gpus=dict(type="list", elements="dict", default=[]),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            check=dict(type="str", default="none", choices=["none", "preflight", "proof"]),
            max_mib=dict(type="int", default=1024),
            min_mib=dict(type="int", default=1024),
            python=dict(type="str"),
            view=dict(type="dict"),
            must=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    nvidia_smi = require(module, p["nvidia_smi"])
    refused = program_problems(sys.executable, nvidia_smi, (0, os.geteuid()))
    if refused:
        module.fail_json(msg="refused to read the node's GPUs: %s" % "; ".join(refused), problems=refused)
    try:
        gpus, warnings = read_node_gpus(ModuleRunner(module), nvidia_smi)
    except NvidiaSmiError as e:
        module.fail_json(msg="the node's %s" % e)
    for warning in warnings:
        module.warn("the node's nvidia-smi: " + warning)
    owners, names = read_owners(gpus)
    split = attribute(gpus, owners, p["vmid"], p["unit"], names)
    unpaired = []
    if p["container_gpus"]:
        split, unpaired = in_container(split, p["container_gpus"])
    indexes = p["gpus"] if p["gpus"] else [a["index"] for a in split]
    result = dict(changed=False, gpus=split, foreign_mib={str(k): v for k, v in foreign_by_gpu(split, indexes).items()},
                  lines=lines(split, indexes))
    problem = unpaired_problem(unpaired)
    if problem and p["check"] == "none":
        module.warn(problem)
        problem = None
    if p["check"] == "preflight":
        problem = problem or preflight_problem(split, indexes, p["max_mib"])
        if problem:
            problem = "pre-flight refused the release (the running trainer is untouched): " + problem
    elif p["check"] == "proof":
        problem = problem or proof_problem(split, indexes, p["min_mib"])
    if problem:
        module.fail_json(msg=problem, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
