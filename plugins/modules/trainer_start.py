#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_start
short_description: Start the trainer's systemd unit and record which activation it is
version_added: "0.1.0"
description:
  - Reads C(systemctl show) before starting (restart counter baseline), runs C(systemctl start),
    and reads C(systemctl show) again. Returns the new activation's RV(invocation_id), RV(main_pid)
    and the RV(n_restarts) baseline that M(dflash.trainer.trainer_ready) needs to tell this start's
    log lines and crashes from earlier ones.
  - A successful C(systemctl start) of a C(Type=simple) unit proves nothing about the trainer;
    follow this module with M(dflash.trainer.trainer_ready).
  - Fails when the unit is already active (unless O(allow_running)), when its unit file changed on
    disk (C(NeedDaemonReload=yes)), or when it cannot be loaded.
options:
  unit:
    description: The systemd unit, for example C(dflash-trainer.service).
    type: str
    required: true
  allow_running:
    description:
      - When V(false), an active unit fails the task (C(unit X is already active; stop it first)).
      - When V(true), an active unit is left as it is and its current activation is returned
        (C(changed=false)).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reports C(changed=true) without starting; the returned values are those read before.
  diff_mode:
    support: none
    description: Returns no diff.
author:
  - dflash.trainer maintainers (@dflash)
"""

EXAMPLES = r"""
- name: Start the trainer
  dflash.trainer.trainer_start:
    unit: dflash-trainer.service
  register: __trainer_start

- name: Prove it is training
  dflash.trainer.trainer_ready:
    unit: dflash-trainer.service
    log_path: /var/log/dflash-trainer/trainer.log
    invocation_id: "{{ __trainer_start.invocation_id }}"
    n_restarts: "{{ __trainer_start.n_restarts }}"
"""

RETURN = r"""
invocation_id:
  description: InvocationID of the activation (empty in check mode for a unit that never ran).
  returned: always
  type: str
  sample: 6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70
main_pid:
  description: MainPID right after the start (0 when the process already ended).
  returned: always
  type: int
  sample: 4242
n_restarts:
  description:
    - NRestarts baseline for M(dflash.trainer.trainer_ready). systemd resets the counter on an explicit
      start; then the baseline is 0, otherwise the value read before the start.
  returned: always
  type: int
  sample: 0
active_state:
  description: ActiveState after the start.
  returned: always
  type: str
  sample: active
sub_state:
  description: SubState after the start.
  returned: always
  type: str
  sample: running
started_at:
  description: ExecMainStartTimestamp after the start.
  returned: always
  type: str
  sample: Mon 2026-11-30 04:05:06 UTC
started:
  description: Whether this task started the unit.
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils._cycle import (
    START_TIMEOUT_S,
    StepFailed,
    activation,
    show,
    start,
)
from ansible_collections.dflash.trainer.plugins.module_utils._run import ModuleRunner
from ansible_collections.dflash.trainer.plugins.module_utils._systemd import int_prop, start_decision


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", required=True),
            allow_running=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    unit = module.params["unit"]
    systemctl = module.get_bin_path("systemctl", required=True)
    # the steps live in module_utils/_cycle.py (shared with the restart job); every command bounded
    try:
        if module.check_mode:
            before = show(ModuleRunner(module), systemctl, unit)
            action, message = start_decision(unit, before, module.params["allow_running"])
            if action == "fail":
                raise StepFailed(message, active_state=before.get("ActiveState"),
                                 invocation_id=before.get("InvocationID", ""))
            kept = action == "keep"
            result = activation(before, int_prop(before, "NRestarts", 0), False,
                                message if kept else "unit %s would be started" % unit)
            module.exit_json(changed=not kept, **result)
        result = start(ModuleRunner(module), systemctl, unit, module.params["allow_running"],
                       start_run=ModuleRunner(module, START_TIMEOUT_S))
    except StepFailed as exc:
        module.fail_json(msg=exc.msg, **exc.details)
    if not result["msg"]:
        result.pop("msg")
    module.exit_json(changed=result["started"], **result)


if __name__ == "__main__":
    main()
