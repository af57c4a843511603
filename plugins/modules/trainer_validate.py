#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_validate
short_description: Refuse bad role inputs before anything on the target changes
description:
  - Checks the role's C(trainer_*) variables (and the host's C(proxmox_vmid)) for values that are
    well typed and still dangerous or meaningless - a cache purge of the release root or of a
    system directory, a unit name with C(/), C(..), C(@) or a C(.service) suffix, paths with
    spaces, quotes, C(;), C($) or newlines, a stall window longer than the hold, regexes that do
    not compile or match every line, an empty command, duplicated GPUs, a release source holding
    sockets, FIFOs, device nodes, symlink loops or symlinks leaving the tree.
  - Fails with every problem at once; each names the variable, the value (never an environment
    value) and what is accepted.
  - The action plugin runs the checks on the controller - no remote call. With O(gpus) and
    O(unit), it also checks what the target's first reads returned (GPUs nvidia-smi lists, their
    memory, a unit of that name this collection did not write).
author:
  - dflash.trainer maintainers (@dflash)
version_added: 0.1.0
options:
  entry:
    description: The role's entry point whose variables are checked.
    type: str
    choices: [main, restart, rollback, status]
    default: main
  run:
    description:
      - The role's entry point whose run this task begins (the role's C(main.yml), which C(restart), C(rollback),
        C(start) and C(stop) import; C(group.yml)) - it sets O(entry) (C(main) for main and group, C(rollback) for
        rollback, C(restart) for the others), takes the argument spec too for C(main) (as O(spec)), and returns what
        the run's first read plans for (RV(intent), RV(installs), RV(enable), RV(upload)).
    type: str
    choices: [main, restart, rollback, start, stop, group]
  variables:
    description:
      - The variables to check. The action plugin fills this from the play's C(trainer_*)
        variables and C(proxmox_vmid), C(ansible_connection); give it only to check other values.
    type: dict
  gpus:
    description: trainer_status's C(gpus) list, to check C(trainer_gpus) and C(trainer_gpu_min_mib) against the target.
    type: list
    elements: dict
  unit:
    description: trainer_status's result, to refuse a unit name that belongs to a unit this collection did not write.
    type: dict
  spec:
    description:
      - Check the role's variables against the role's argument spec for O(entry) (C(meta/argument_specs.yml)) first,
        in this task, as Ansible's own validation task would (the same checks and message) - for a playbook that
        imports the role with C(rolespec_validate=false), so that the run has one check task instead of two.
      - Only in a task of the role (the action plugin reads the role's spec); ignored by the module itself.
    type: bool
    default: false
  lock_token:
    description:
      - The play's deploy lock token, returned as RV(lock_token) - given by a second run of the role in one play
        (the earlier run's RV(lock_token)), so that the play's runs share one token. Without it, a new token.
      - Only the action plugin returns it (not for O(entry=status)); ignored by the module itself.
    type: str
extends_documentation_fragment:
  - dflash.trainer.group_barrier
notes:
  - Runs on the controller only (action plugin); nothing is sent to the target.
"""

EXAMPLES = r"""
- name: Check every input before anything on the target changes
  dflash.trainer.trainer_validate:
    entry: main
"""

RETURN = r"""
problems:
  description: The problems found (empty when the inputs are accepted).
  returned: always
  type: list
  elements: str
  sample: ["trainer_unit_name: ends with .service: give the name without the suffix (x) (got 'x.service'); accepted: ..."]
lock_token:
  description: The token this play takes and renews the deploy lock with - O(lock_token), or 20 new characters of [a-z0-9].
  returned: by the action plugin, unless O(entry=status)
  type: str
  sample: 5qso6ss0kqpib7hh9sp7
lock_owner:
  description: Who holds the lock while this play does, as the lock file and the job's state record it ("$USER on <controller>").
  returned: by the action plugin, unless O(entry=status)
  type: str
  sample: root on controller
source:
  description: The release source's git commit (C(git 4f1c2d9), with C( dirty) for uncommitted changes), or empty.
  returned: by the action plugin, for O(entry=main) when the inputs are accepted
  type: str
  sample: git 4f1c2d9
owned:
  description: What the run writes or deletes on the target, each judged there by the first read before the lock is taken.
  returned: by the action plugin, unless O(entry=status), when the inputs are accepted
  type: list
  elements: dict
  sample: [{"variable": "trainer_root", "kind": "root", "path": "/opt/dflash"}]
in_group:
  description: Whether the host is a member of a trainer group (C(trainer_group) set) - its group's play deploys it,
    status judges its group as a whole.
  returned: by the action plugin, when the inputs were checked
  type: bool
  sample: false
intent:
  description:
    - What the run's first read (M(dflash.trainer.trainer_plan)'s O(dflash.trainer.trainer_plan#module:intent)) plans
      for - C(entry) (deploy for main), a deploy's C(release) (the id trainer_src would become, computed here as the
      lookup dflash.trainer.release_id computes it) and C(force) (trainer_force_restart), a group member's C(hold)
      (its lock kept for the group to decide), a rollback's
      C(rollback_release) (trainer_rollback_release), a stop's C(disable) (trainer_stop_disable).
  returned: by the action plugin, with O(run), when the inputs are accepted
  type: dict
  sample: {"entry": "deploy", "release": "4f1c2d9e0a1b2c3d", "force": false}
installs:
  description: Whether the run's job installs the unit, launcher and environment file (a deploy).
  returned: by the action plugin, with O(run), when the inputs are accepted
  type: bool
  sample: true
upload:
  description: What a deploy sends when its plan uploads (C(src), C(excludes), C(keep) - trainer_src,
    trainer_release_excludes, trainer_release_keep); null for the other entry points.
  returned: by the action plugin, with O(run), when the inputs are accepted
  type: dict
  sample: {"src": "examples/trainer", "excludes": [".git"], "keep": 5}
enable:
  description: Whether the run's job enables a unit a deliberate stop disabled (a start, unless trainer_unit_enabled is false).
  returned: by the action plugin, with O(run), when the inputs are accepted
  type: bool
  sample: false
leave_to_group:
  description: For O(entry=main), a member of a trainer group - the deploy leaves it to its group's play.
  returned: by the action plugin, when the inputs were checked
  type: bool
  sample: false
"""

# No code: the action plugin (plugins/action/trainer_validate.py) runs the checks on the controller, as
# ansible.builtin.debug does; the checks live in plugins/plugin_utils/_validate.py, never shipped to a target.
