#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_doctor
short_description: Judge what the node and the container answered the doctor
description:
  - The doctor (C(playbooks/doctor.yml)) asks the node and the container with two M(ansible.builtin.raw) scripts
    (the C(dflash.trainer.trainer_doctor_script) filter); this action, on the controller, judges their answers
    (or their transport's failure), one check per assumption.
  - With O(node) alone, whether the container is asked at all (RV(enter)) - not when the node was not reached,
    nor when the container is frozen (C(pct exec) would hang in it) - and the controller's clock before it is
    (RV(before)).
  - With O(container) too, the report - every check as one line (C(✓) holds, C(✗) does not, with its remedy,
    C(?) not checked), shown as the task's message. With O(record_dir), the answers are kept as
    C(<record_dir>/<inventory_hostname>.json) (mode 0600) on the controller, a fixture the collection's tests
    replay, the values of O(env) masked. The task fails, with the report's summary, when an assumption does not
    hold.
  - The judgement is C(plugins/plugin_utils/_doctor.py)'s; no remote call.
author:
  - dflash.trainer maintainers (@dflash)
version_added: 0.1.0
options:
  node:
    description: The node's M(ansible.builtin.raw) result (registered with C(ignore_unreachable)).
    type: dict
    required: true
  container:
    description:
      - The container's M(ansible.builtin.raw) result (skipped when it was not asked). Without it, the action judges
        only whether to ask the container.
    type: dict
  before:
    description: The controller's clock before the container was asked (the first call's RV(before)).
    type: float
  vmid:
    description: The container's ID (C(proxmox_vmid)).
    type: str
  host:
    description: The node's address, as the checks name it.
    type: str
  user:
    description: The ssh user on the node.
    type: str
  pct_path:
    description: The path of C(pct) on the node.
    type: str
  sudo:
    description: Whether C(pct) runs under C(sudo -n).
    type: bool
  python:
    description: The container's Python interpreter.
    type: str
  nvidia_smi:
    description: The container's C(nvidia-smi) (C(trainer_nvidia_smi)).
    type: str
  trainer_root:
    description: The release root in the container, whose file system's free space is judged.
    type: str
  node_nvidia_smi:
    description: The node's C(nvidia-smi) (C(trainer_node_nvidia_smi)).
    type: str
  env:
    description: The trainer's environment (C(trainer_env)); its values are masked in the record.
    type: dict
  record_dir:
    description: A directory on the controller for the record (C(trainer_doctor_record_dir)); empty - none written.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Runs the same in check mode (it writes only the record asked for, on the controller).
  diff_mode:
    support: none
    description: Returns no diff.
extends_documentation_fragment:
  - dflash.trainer.attributes
notes:
  - Runs on the controller only (action plugin).
"""

EXAMPLES = r"""
- name: Judge the node's answer
  dflash.trainer.trainer_doctor:
    node: "{{ node_answer }}"
  register: judged_node

- name: Judge both answers
  dflash.trainer.trainer_doctor:
    node: "{{ node_answer }}"
    container: "{{ container_answer }}"
    before: "{{ judged_node.before }}"
    vmid: "{{ proxmox_vmid }}"
"""

RETURN = r"""
enter:
  description: Whether the container is asked - the node was reached and the container is not frozen.
  returned: without O(container)
  type: bool
  sample: true
before:
  description: The controller's clock (seconds since the epoch) when the node's answer was judged.
  returned: without O(container)
  type: float
  sample: 1765146000.5
msg:
  description: The report's lines, one per assumption; when one does not hold, C(doctor:) and the report's summary.
  returned: with O(container)
  type: raw
  sample: ["✓ ssh          root@pve1 reached, host key accepted"]
lines:
  description: The report's lines, when an assumption does not hold (RV(msg) is then the summary).
  returned: with O(container), on failure
  type: list
  elements: str
record:
  description: The path of the record written.
  returned: with O(container) and O(record_dir)
  type: str
  sample: /home/me/records/gpu-node1-trainer.json
ansible_facts:
  description: The report, as C(dflash-trainer doctor) reads it from the task's event.
  returned: with O(container)
  type: dict
  contains:
    __trainer_doctor:
      description: "C({checks: [{name, mark, detail, remedy}], lines, failed, exit_code, summary})."
      type: dict
"""

# No code: the action plugin (plugins/action/trainer_doctor.py) judges on the controller, as ansible.builtin.debug
# does; the judgement lives in plugins/plugin_utils/_doctor.py, never shipped to a target.
