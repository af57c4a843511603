#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_group
short_description: Decide a trainer group's next step from what every member registered
description:
  - A trainer group (the hosts of one distributed job, C(trainer_group)) runs each phase as one task on every
    member at once. This action, on the controller, judges from what every member registered whether the group
    goes on, and returns the group's plan for the role's tasks to carry out.
  - It fails by itself, with the words, where the group stops - a host astray from its group, a phase one member
    failed (a barrier), a refused plan, a failed restart, a member that did not stay up - so every member stops
    together.
  - The other barriers between the group's phases, the group whole in this run, every member's job proved and the
    group's verdict are judged by the task that follows them (C(group_barrier) of M(dflash.trainer.trainer_validate),
    M(dflash.trainer.trainer_plan), M(dflash.trainer.trainer_install) and M(dflash.trainer.trainer_restart)).
  - The action plugin reads the play's C(hostvars), C(groups) and hosts in the run; no remote call.
author:
  - dflash.trainer maintainers (@dflash)
version_added: 0.1.0
options:
  kind:
    description:
      - V(stray) - a host whose own C(trainer_group) is empty but one of whose inventory groups is a trainer group
        (deployed alone it would restart one rank of the job) is refused; RV(alone) says whether the host is
        deployed outside any group.
      - V(plan) - the barrier over the first read (O(results)), then the group's plan from every member's own; its
        words are this member's first read's report (C(report)) and what the plan says (RV(words)).
      - V(end) - the end of the group's restart - the run fails saying what runs now when the group's verdict
        (C(__trainer_group_done), M(dflash.trainer.trainer_restart)'s with C(group_barrier)) failed it, else the
        barrier over O(results) (the watch after the group's proof, O(health)).
    type: str
    required: true
    choices: [stray, plan, end]
  results:
    description: The variable every member registered for the phase judged (a barrier); none - no barrier.
    type: str
  phase:
    description: The phase judged, in words (the barrier's words name it).
    type: str
  then:
    description: What a failed barrier adds to its words (what was left unchanged).
    type: str
  health:
    description: The phase is trainer_status's watch, which fails a member whose trainer was not healthy.
    type: bool
    default: false
  lock_token:
    description: With O(kind=plan), the play's deploy lock token, the first part of each member's job ids.
    type: str
extends_documentation_fragment:
  - dflash.trainer.attributes.read_only
notes:
  - Runs on the controller (action plugin); the decisions are C(plugins/plugin_utils/_group.py)'s.
"""

EXAMPLES = r"""
- name: Plan the group from every member's plan (the same answer on every member)
  dflash.trainer.trainer_group:
    kind: plan
    results: __trainer_status_before
    phase: the first read
    then: nothing was changed on any member
  register: __trainer_group_plan
"""

RETURN = r"""
alone:
  description: With O(kind=stray), whether the host is deployed outside any trainer group.
  returned: kind is stray
  type: bool
refused:
  description: Why the group may not be deployed; null when it may.
  returned: kind is stray or plan
  type: str
barrier:
  description: The barrier's answer (C(failed), C(words), C(members) - those that failed).
  returned: results is given
  type: dict
restart:
  description: With O(kind=plan), whether the group restarts.
  returned: kind is plan
  type: bool
upload_here:
  description: With O(kind=plan), whether this member lacks the release.
  returned: kind is plan
  type: bool
reasons_here:
  description: With O(kind=plan), this member's reasons for its restart job.
  returned: kind is plan
  type: list
  elements: str
job_ids:
  description: With O(kind=plan), this member's job ids (C(restart), C(rollback)).
  returned: kind is plan
  type: dict
says:
  description: With O(kind=plan), whether RV(words) are to be said (the group left running, or check mode).
  returned: kind is plan
  type: bool
words:
  description: What the plan says.
  returned: kind is plan
  type: str
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec=dict(
            kind=dict(type="str", required=True, choices=["stray", "plan", "end"]),
            results=dict(type="str"),
            phase=dict(type="str"),
            then=dict(type="str"),
            health=dict(type="bool", default=False),
            lock_token=dict(type="str", no_log=False),
        ),
        supports_check_mode=True,
    )
    module.fail_json(msg="trainer_group runs on the controller (its action plugin): it reads every member's results")


if __name__ == "__main__":
    main()
