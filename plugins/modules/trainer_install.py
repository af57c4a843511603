#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_install
short_description: Install the trainer's launcher, environment file and systemd unit in one run
description:
  - Writes each file atomically when its content or mode differs (creating its directory), runs
    C(systemctl daemon-reload) when the unit changed, and enables or disables the unit as asked -
    one module run where three copy/template tasks, a directory task and a systemd task cost over a
    dozen remote calls (each a C(pct) call on a Proxmox node).
  - Reports which of the three changed, so the role can decide whether the trainer must restart.
  - The environment file's content is a secret - never printed, diffs show its keys with masked values.
  - Each file must be absent or carry the collection's mark (the unit's description, the launcher's and the
    environment file's header line); anything else at a path - V(/usr/bin/python3), V(/etc/shadow) - is
    refused before any write. The environment file gets the mark as its first line.
author:
  - dflash.trainer maintainers (@dflash)
version_added: 0.1.0
extends_documentation_fragment:
  - dflash.trainer.install_files.files
  - dflash.trainer.group_barrier
options:
  env_content:
    description: The EnvironmentFile (secret).
    type: str
    required: true
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: The environment file's values are masked.
"""

EXAMPLES = r"""
- name: Install the launcher, environment file and unit
  dflash.trainer.trainer_install:
    unit: dflash-trainer
    unit_path: /etc/systemd/system/dflash-trainer.service
    unit_content: "{{ lookup('ansible.builtin.template', 'trainer.service.j2') }}"
    launcher_path: /usr/local/lib/dflash-trainer/launch
    launcher_content: "{{ lookup('ansible.builtin.file', 'dflash-trainer-launch') }}"
    env_path: /etc/dflash-trainer/trainer.env
    env_content: "{{ env | dflash.trainer.systemd_env_file }}"
"""

RETURN = r"""
unit_changed:
  description: Whether the unit file was (or would be) written.
  returned: always
  type: bool
launcher_changed:
  description: Whether the launcher was (or would be) written.
  returned: always
  type: bool
env_changed:
  description: Whether the environment file was (or would be) written.
  returned: always
  type: bool
enabled_changed:
  description: Whether the unit was (or would be) enabled or disabled.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils.target.install import INSTALL_OPTIONS, InstallError, install_all
from ansible_collections.dflash.trainer.plugins.module_utils.target.command import ModuleRunner


def main():
    module = AnsibleModule(argument_spec=dict(INSTALL_OPTIONS, group_barrier=dict(type="dict")), supports_check_mode=True)
    systemctl = module.get_bin_path("systemctl", required=True)
    try:
        result = install_all(module.params, ModuleRunner(module), systemctl, check_mode=module.check_mode,
                             diff=module._diff)
    except InstallError as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
