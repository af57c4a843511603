#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_preflight
short_description: Check a release can start while the old trainer still runs
description:
  - Runs before the stop, so that a release that cannot start is refused while the running
    trainer is untouched.
  - The command (O(command)) must exist in the release directory and be executable, with an
    existing C(#!) interpreter, or be found on C(PATH) (and, for an interpreter such as
    C(python3), its script must be in the release).
  - Everything it runs runs in the unit's environment - a transient unit (C(systemd-run)) with the role's
    unit settings (C(User=root), so HOME, USER, LOGNAME and SHELL come from root's passwd entry; the container's
    locale files) and an environment file made of O(environment_json), staged root-only and removed
    afterwards, in the release directory with C(DFLASH_RELEASE) and C(DFLASH_RELEASE_DIR) - so a
    command not on the unit's real C(PATH), or an environment its interpreter cannot start in, is
    refused here.
  - The environment must not hold a directory list (C(PATH), C(LD_LIBRARY_PATH), C(PYTHONPATH), ...)
    with C($) or C(~) in it (systemd expands neither) nor a relative C(PATH) entry.
  - The command's interpreter is started harmlessly in that environment - python with C(-c pass), a
    shell with C(-n) on its script (it reads it and runs nothing).
  - O(preflight_command), when given, runs there too with no GPU (C(CUDA_VISIBLE_DEVICES) empty),
    bounded by O(timeout_s); it must exit 0.
  - No GPU in O(gpus) may hold more than O(max_mib) of memory that is not the running trainer's own
    (any memory at all when the trainer is not running); where nvidia-smi lists no process the
    container can see, memory cannot be attributed and the drain gate after the stop decides.
  - For playbooks outside the role (a check of a release before a change window, another deploy tool); the
    role's restart job runs the same pre-flight (C(module_utils/_preflight_run.py)) in the call that starts
    it (M(dflash.trainer.trainer_restart) O(dflash.trainer.trainer_restart#module:preflight)) and does not call
    this module. The defaults are the role's (C(trainer_preflight_timeout_s), C(trainer_drain_max_mib)).
author:
  - dflash.trainer maintainers (@dflash)
version_added: 0.1.0
extends_documentation_fragment:
  - dflash.trainer.nvidia_smi
  - dflash.trainer.play_lock
options:
  release_dir:
    description: The release directory the trainer would start in.
    type: path
    required: true
  command:
    description: The trainer's command (argv), as in the unit.
    type: list
    elements: str
    required: true
  environment_json:
    description:
      - The unit's environment as one JSON object (values are secrets, never printed). One string
        rather than a dict, so that Ansible's no_log masking hides exactly it, not every short value
        (a value V(1) would otherwise mask every "1" in the output).
    type: str
    default: "{}"
  preflight_command:
    description: A command (argv) that must exit 0 in the release directory, e.g. C([python3, -c, import train]).
    type: list
    elements: str
    default: []
  timeout_s:
    description: Seconds O(preflight_command) may take before it is killed and the pre-flight fails.
    type: float
    default: 60
  unit:
    description: The trainer's unit (to tell its processes from other holders).
    type: str
    required: true
  gpus:
    description: The trainer's GPU indexes; empty skips the GPU check.
    type: list
    elements: int
    default: []
  max_mib:
    description: Memory a GPU may hold (MiB) that is not the trainer's.
    type: int
    default: 1024
  gpu_foreign_mib:
    description: Per GPU index, the MiB other tenants hold (the node's view); allowed on top of O(max_mib).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Pre-flight the new release
  dflash.trainer.trainer_preflight:
    release_dir: /opt/dflash-trainer/releases/dda2287ea665b415
    command: [./run.sh]
    preflight_command: [python3, -c, import train_dflash_pipeline]
    unit: dflash-trainer
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
"""

RETURN = r"""
checks:
  description: What was checked, in words.
  returned: always
  type: list
  elements: str
  sample: ["command ./run.sh is executable", "pre-flight command exited 0 in 1.2 s"]
output:
  description: The last lines of the pre-flight command's output.
  returned: when O(preflight_command) ran
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils._lock import PLAY_LOCK_SPEC, play_lease
from ansible_collections.dflash.trainer.plugins.module_utils._preflight_run import PREFLIGHT_OPTIONS, Refused, run_preflight


def main():
    module = AnsibleModule(argument_spec=dict(PREFLIGHT_OPTIONS, lock=PLAY_LOCK_SPEC), supports_check_mode=True)
    # the play's lease is renewed while the pre-flight runs (it may take longer than the lease)
    # (a lease lost meanwhile is found by the restart job, which then touches nothing)
    # The result is printed after the keeper stopped: it probes the module's output (see play_lease).
    try:
        with play_lease(module.params["lock"]):
            result = run_preflight(module.params, module.get_bin_path)
    except Refused as exc:
        module.fail_json(**exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
