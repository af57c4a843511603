"""The role stays small enough to read: one task file per entry point (the ten `tasks_from` names the playbooks
use, and main), and at most 49 leaf tasks in all - a leaf task is one that is not a block, an import or an
include. Restart, rollback, start and stop are one import of main.yml each (the run); the shared flows live in
main.yml, and the decisions in Python (test_one_decider.py)."""
import glob
import os

import yaml

from role_tasks import tasks
from test_argument_specs import entry_points

TASKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "roles", "trainer", "tasks")
MAX_LEAF_TASKS = 49
NOT_LEAF = ("block", "ansible.builtin.import_tasks", "ansible.builtin.include_tasks", "import_tasks", "include_tasks",
            "ansible.builtin.import_role", "ansible.builtin.include_role")
RUNS = ("restart", "rollback", "start", "stop")  # each one import of main.yml, naming itself


def load(name):
    with open(os.path.join(TASKS, name), encoding="utf-8") as fh:
        return yaml.safe_load(fh) or []


def leaf_tasks(items):
    return [t for t in tasks(items) if not any(k in t for k in NOT_LEAF)]


def test_one_task_file_per_entry_point_and_no_other():
    files = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(TASKS, "*.yml")))
    assert files == entry_points(), files


def test_the_role_has_at_most_49_leaf_tasks():
    counted = {os.path.basename(p): len(leaf_tasks(load(os.path.basename(p))))
               for p in glob.glob(os.path.join(TASKS, "*.yml"))}
    assert sum(counted.values()) <= MAX_LEAF_TASKS, counted


def test_restart_rollback_start_and_stop_are_the_run_of_main():
    for name in RUNS:
        items = load(name + ".yml")
        assert len(items) == 1 and items[0].get("ansible.builtin.import_tasks") == "main.yml", name
        assert items[0].get("vars") == {"__trainer_run": name}, name
        assert not leaf_tasks(items), name


def test_the_count_sees_a_leaf_task_added():
    items = load("main.yml")
    block = next(t for t in items if "block" in t)
    before = len(leaf_tasks(items))
    block["block"].append({"name": "x", "ansible.builtin.debug": {"msg": "x"}})
    assert len(leaf_tasks(items)) == before + 1
