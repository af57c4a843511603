# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The O(group_barrier) option of the tasks of a trainer group that follow a barrier (trainer_validate,
trainer_plan, trainer_install, trainer_restart): judged by their action plugins before anything else
(plugins/plugin_utils/_group.py)."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  group_barrier:
    description:
      - A trainer group's member (the controller's own option, never sent to the target). Before the task does
        anything, what every member of the group registered is judged, on the controller - every member judges the
        same results, so all go on or none does. A judgement that stops the group fails the task on every member,
        with its words, even where the task ignores its own failures (C(ignore_errors)); nothing was done.
      - C(whole) (true) - every member is in this run and names the group as its C(trainer_group).
      - C(results) (a registered variable), C(phase), C(then), C(health) - the barrier after the previous phase;
        every member passed it (C(phase) names it in the words, C(then) says what was left unchanged, C(health) -
        the phase is a watch that fails a member whose trainer was not healthy). C(holder) - who holds the deploy
        lock as this task begins, said as the failed task's C(lock_holder) (nothing was done).
      - C(jobs) (true) - then whether every member's job proved it (its watch's outcome, else the call that
        started it); the task is skipped when not.
      - C(verdict) (V(restart) or V(rollback)) - the group's verdict on that job (every member's job proved, and
        every member still so at the group's check) and what follows it - C(ok), C(words), C(members), C(good),
        C(report), C(rollback), C(stop), C(fail), C(failure), C(watch), C(restart), C(said) in the task's result;
        the task runs only when it says good (skipped otherwise), and a proved group says so (C(said)).
    type: dict
"""
