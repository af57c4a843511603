"""One decider: every decision of a run is made in Python - the plan (plugins/module_utils/plan/decide.py
``make_plan``, made by the first read: trainer_plan), the group's plan and verdicts (the trainer_group action)
or the outcome a module or action of the collection computes - and the role's YAML only carries it out.
Every task file of the role (the group's too) is held to the rule of decider_rule.py."""
import glob
import os

import pytest
import yaml

from decider_rule import BUILTIN_ROOTS, condition_problems, offenders, problems, registered_roots

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASKS = os.path.join(ROOT, "roles", "trainer", "tasks")
FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(TASKS, "*.yml")))


def _load(name):
    with open(os.path.join(TASKS, name), encoding="utf-8") as f:
        return yaml.safe_load(f) or []


@pytest.mark.parametrize("name", FILES)
def test_every_condition_reads_a_decision_made_in_python(name):
    found = offenders(name, _load(name), registered_roots(_load(n) for n in FILES))
    assert not found, "decisions in YAML (make them plan or outcome fields):\n" + "\n".join(found)


@pytest.mark.parametrize("expr, ok", [
    ("__trainer_status_before.plan.upload", True),
    ("not ansible_check_mode and (__trainer_status_before.plan.restart or __trainer_job_watch.ok)", True),
    ("__trainer_group_plan.restart and not ansible_check_mode", True),
    ("not (__trainer_group_done.ok or __trainer_group_done.stop)", True),
    ("__trainer_plan.upload", False),  # composed in vars/main.yml, not registered
    ("trainer_watch_s | float > 0", False),
    ("trainer_group | length > 0", False),
    ("__trainer_status_before.report | default([]) | length > 0", False),
    ("__trainer_lock_holder == 'play'", False),
    ("__trainer_status_before.job_start is not defined", False),
    ("__trainer_group_plan.refused is not none", False),
    ("(__trainer_group_done | default({})).ok | default(false)", False),
    ("(groups[trainer_group] | dflash.trainer.trainer_group('verdict', hostvars, '__x')).ok", False),
    ("true", False),
    ("__trainer_status_before['plan'].upload", False),
    ("__trainer_group_plan['restart']", False),
])
def test_the_grammar(expr, ok):
    roots = {"__trainer_status_before", "__trainer_job_watch", "__trainer_group_plan",
             "__trainer_group_done"} | BUILTIN_ROOTS
    assert (problems(expr, roots) == []) is ok


def test_literals_only_where_allowed():
    assert condition_problems(False, set(), literal_ok=True) == []
    assert condition_problems(True, set()) != []
    assert condition_problems([True], set()) != []
