"""One decider for the trainer group: the group play of playbooks/deploy.yml is held to the rule of
decider_rule.py, as the role's task files are (test_one_decider.py, group*.yml included); the group's path
reads in one task file whose leaf tasks only go down."""
import glob
import os

import yaml

from decider_rule import offenders, registered_roots
from role_tasks import tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASKS = os.path.join(ROOT, "roles", "trainer", "tasks")
GROUP_FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(TASKS, "group*.yml")))
DEPLOY = os.path.join(ROOT, "playbooks", "deploy.yml")
LEAF_KEYS = ("block", "ansible.builtin.import_tasks", "ansible.builtin.include_tasks",
             "ansible.builtin.import_role", "ansible.builtin.include_role")


def _load(path):
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh) or []


def group_play():
    """The tasks of playbooks/deploy.yml's play that deploys each trainer group."""
    plays = [p for p in _load(DEPLOY) if "tasks" in p and any(
        (t.get("ansible.builtin.include_role") or {}).get("tasks_from") == "group" for t in p["tasks"])]
    assert len(plays) == 1, plays
    return plays[0]["tasks"]


def test_the_group_play_reads_only_decisions_made_in_python():
    roles = [_load(p) for p in sorted(glob.glob(os.path.join(TASKS, "*.yml")))]
    found = offenders("deploy.yml", group_play(), registered_roots(roles + [group_play()]))
    assert not found, "decisions in YAML (make them fields of the group's plan or verdict):\n" + "\n".join(found)


def leaves(items):
    return [t for t in tasks(items) if not any(k in t for k in LEAF_KEYS)]


def test_the_group_restart_is_one_file_and_few_tasks():
    """The group's path reads in one file (group.yml: the restart job and the rollback job written in it, each
    barrier judged by the task after it); the count only goes down."""
    assert GROUP_FILES == ["group.yml"]
    counted = dict((name, len(leaves(_load(os.path.join(TASKS, name))))) for name in GROUP_FILES)
    assert sum(counted.values()) <= 22, counted
