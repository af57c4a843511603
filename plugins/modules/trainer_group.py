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
    goes on, and returns the group's plan or verdict for the role's tasks to carry out.
  - It fails by itself, with the words, where the group stops - a member outside this run, a phase one member
    failed (a barrier), a refused plan - so every member stops together.
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
      - V(whole) - every member of the group is in this run (and names the group); refused otherwise.
      - V(barrier) - every member passed the phase it registered as O(results).
      - V(plan) - the barrier over the first read (O(results)), then the group's plan from every member's own.
      - V(jobs) - the barrier over the lock taken back after the members' jobs (O(results)), then each member's
        job outcome and whether every member's job proved it (RV(check)).
      - V(verdict) - whether the group's O(job) was proved (every member's job and check), and what follows.
    type: str
    required: true
    choices: [stray, whole, barrier, plan, jobs, verdict]
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
  job:
    description: With O(kind=verdict), the job judged.
    type: str
    choices: [restart, rollback]
    default: restart
  lock_token:
    description: With O(kind=plan), the play's deploy lock token, the first part of each member's job ids.
    type: str
extends_documentation_fragment:
  - dflash.trainer.attributes.read_only
notes:
  - Runs on the controller (action plugin); the decisions are C(plugins/plugin_utils/_group.py)'s.
"""

EXAMPLES = r"""
- name: Barrier - every member has the release
  dflash.trainer.trainer_group:
    kind: barrier
    results: __trainer_release
    phase: the upload
    then: nothing was stopped on any member
"""

RETURN = r"""
alone:
  description: With O(kind=stray), whether the host is deployed outside any trainer group.
  returned: kind is stray
  type: bool
refused:
  description: Why the group may not be deployed; null when it may.
  returned: kind is stray, whole or plan
  type: str
barrier:
  description: The barrier's answer (C(failed), C(words), C(members) - those that failed).
  returned: results is given
  type: dict
restart:
  description: With O(kind=plan), whether the group restarts; with O(kind=verdict), the restart's verdict.
  returned: kind is plan or verdict
  type: raw
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
  description: What the plan or verdict says.
  returned: kind is plan or verdict
  type: str
check:
  description: With O(kind=jobs), whether every member's job proved it (every member is then checked again).
  returned: kind is jobs
  type: bool
outcome:
  description: With O(kind=jobs), this member's job outcome (its watch's, else the call that started it).
  returned: kind is jobs
  type: dict
ok:
  description: With O(kind=verdict), whether every member's job was proved.
  returned: kind is verdict
  type: bool
good:
  description: With O(kind=verdict), whether what every member's job proved is marked good.
  returned: kind is verdict
  type: bool
fail:
  description: With O(kind=verdict), whether the run fails, saying RV(failure).
  returned: kind is verdict
  type: bool
failure:
  description: With O(kind=verdict), what a failed group restart ends with, in words (what runs now).
  returned: kind is verdict
  type: str
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec=dict(
            kind=dict(type="str", required=True, choices=["stray", "whole", "barrier", "plan", "jobs", "verdict"]),
            results=dict(type="str"),
            phase=dict(type="str"),
            then=dict(type="str"),
            health=dict(type="bool", default=False),
            job=dict(type="str", default="restart", choices=["restart", "rollback"]),
            lock_token=dict(type="str", no_log=False),
        ),
        supports_check_mode=True,
    )
    module.fail_json(msg="trainer_group runs on the controller (its action plugin): it reads every member's results")


if __name__ == "__main__":
    main()
