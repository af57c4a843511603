#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_doctor
short_description: Ask the container and judge what it and the node answered the doctor
description:
  - The doctor (C(playbooks/doctor.yml)) asks the node with an M(ansible.builtin.raw) script (the
    C(dflash.trainer.trainer_doctor_script) filter) and gives its result to this action, on the controller, which
    asks the container and judges both answers (or their transport's failure), one check per assumption.
  - The container is asked only when the node's answer allows it - the node was reached and the container is not
    frozen (C(pct exec) would hang in it). Its script is run over the task's own connection (the play host's,
    C(dflash.trainer.pct), C(pct exec) into the container), as M(ansible.builtin.raw) runs its command; a
    connection that fails is judged, not raised - the C(pct exec) check's C(✗), in the connection's words, as a
    raw task's unreachable result. The controller's clock is read around it (the C(clock) check's window).
  - The report - every check as one line (C(✓) holds, C(✗) does not, with its remedy, C(?) not checked) - is
    shown as the task's message. With O(record_dir), the answers are kept as
    C(<record_dir>/<inventory_hostname>.json) (mode 0600) on the controller, a fixture the collection's tests
    replay, the values of O(env) masked. The task fails, with the report's summary, when an assumption does not
    hold.
  - The judgement is C(plugins/plugin_utils/_doctor.py)'s. The one remote call is the container's script; it
    changes nothing.
author:
  - dflash.trainer maintainers (@dflash)
version_added: 0.1.0
options:
  node:
    description:
      - The node's M(ansible.builtin.raw) result (registered with C(ignore_unreachable)), its script the
        C(dflash.trainer.trainer_doctor_script) filter's C(node).
      - Whether the container is asked is judged from it.
    type: dict
    required: true
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
    description: The container's Python interpreter, asked for and judged.
    type: str
    default: /usr/bin/python3
  nvidia_smi:
    description: The container's C(nvidia-smi) (C(trainer_nvidia_smi)), run and judged.
    type: str
    default: nvidia-smi
  trainer_root:
    description: The release root in the container, whose file system's free space is asked for and judged.
    type: str
    default: /opt/dflash-trainer
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
    description: Runs the same in check mode (read-only - it asks the container, and writes only the record asked
      for, on the controller).
  diff_mode:
    support: none
    description: Returns no diff.
extends_documentation_fragment:
  - dflash.trainer.attributes
notes:
  - An action plugin, on the controller; no module is sent - the container's script goes as
    M(ansible.builtin.raw)'s command does.
"""

EXAMPLES = r"""
- name: Ask the node
  ansible.builtin.raw: "{{ 'node' | dflash.trainer.trainer_doctor_script(vmid=proxmox_vmid) }}"
  vars:
    ansible_pct_node: true
  register: node_answer
  ignore_unreachable: true
  failed_when: false
  changed_when: false
  check_mode: false

- name: Ask the container and judge both answers
  dflash.trainer.trainer_doctor:
    node: "{{ node_answer }}"
    vmid: "{{ proxmox_vmid }}"
    trainer_root: /opt/dflash-trainer
"""

RETURN = r"""
msg:
  description: The report's lines, one per assumption; when one does not hold, C(doctor:) and the report's summary.
  returned: always
  type: raw
  sample: ["✓ ssh          root@pve1 reached, host key accepted"]
lines:
  description: The report's lines, when an assumption does not hold (RV(msg) is then the summary).
  returned: on failure
  type: list
  elements: str
record:
  description: The path of the record written.
  returned: with O(record_dir)
  type: str
  sample: /home/me/records/gpu-node1-trainer.json
ansible_facts:
  description: The report, as C(dflash-trainer doctor) reads it from the task's event.
  returned: always
  type: dict
  contains:
    __trainer_doctor:
      description: "C({checks: [{name, mark, detail, remedy}], lines, failed, exit_code, summary})."
      type: dict
"""

# No code: the action plugin (plugins/action/trainer_doctor.py) asks the container as ansible.builtin.raw does and
# judges on the controller; the judgement lives in plugins/plugin_utils/_doctor.py, never shipped to a target.
