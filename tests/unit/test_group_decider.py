"""One decider for the trainer group: every group decision is made in Python - the group's plan and verdicts
(plugins/plugin_utils/_group.py, returned by the dflash.trainer.trainer_group action) or the result a module or
action of the collection computes - and the group's YAML (roles/trainer/tasks/group*.yml and the group play of
playbooks/deploy.yml) only carries it out.

So a task's ``when:`` (a block's too) is a boolean combination (``not``, ``and``, ``or``, parentheses) of
dotted field reads whose root is a variable registered by a ``dflash.trainer.*`` task, or
``ansible_check_mode``: no filters, no comparisons, no literals, no role variables, no filter calls.
``failed_when`` / ``changed_when``: a literal true/false, or the same grammar."""
import glob
import os

import jinja2
import pytest
import yaml
from jinja2 import nodes

from role_tasks import tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASKS = os.path.join(ROOT, "roles", "trainer", "tasks")
GROUP_FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(TASKS, "group*.yml")))
DEPLOY = os.path.join(ROOT, "playbooks", "deploy.yml")
BUILTIN_ROOTS = frozenset(["ansible_check_mode"])
ALLOWED_NODES = (nodes.Not, nodes.And, nodes.Or, nodes.Getattr, nodes.Name)
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


def sources():
    """(name, task list) of every file the rule covers."""
    return [(name, _load(os.path.join(TASKS, name))) for name in GROUP_FILES] + [("deploy.yml", group_play())]


def _action(task):
    return next((key for key in task if isinstance(key, str) and key.count(".") >= 2), None)


def registered_roots():
    """The variables registered by a dflash.trainer.* task of the role or of the group play."""
    roots = set()
    files = [_load(p) for p in sorted(glob.glob(os.path.join(TASKS, "*.yml")))] + [group_play()]
    for items in files:
        for task in tasks(items):
            action = _action(task)
            if action and action.startswith("dflash.trainer.") and task.get("register"):
                roots.add(task["register"])
    return roots | BUILTIN_ROOTS


def _root(node):
    while isinstance(node, nodes.Getattr):
        node = node.node
    return node


def problems(expr, roots):
    """What is wrong with one condition ``expr`` -> [words]; [] when it is a boolean combination of dotted field
    reads of ``roots``."""
    try:
        body = jinja2.Environment().parse("{{ " + expr + " }}").body
    except jinja2.TemplateSyntaxError as exc:
        return ["not an expression (%s)" % exc]
    if len(body) != 1 or not isinstance(body[0], nodes.Output) or len(body[0].nodes) != 1:
        return ["not one expression"]
    found = []

    def walk(node):
        if not isinstance(node, ALLOWED_NODES):
            found.append("%s is not allowed (only not/and/or of dotted field reads)" % type(node).__name__)
        elif isinstance(node, nodes.Name):
            if node.name not in roots:
                found.append("%r is not registered by a dflash.trainer.* task" % node.name)
        elif isinstance(node, nodes.Getattr):
            walk(_root(node))
        else:
            for child in node.iter_child_nodes():
                walk(child)

    walk(body[0].nodes[0])
    return found


def condition_problems(value, roots, literal_ok=False):
    """``value``: a when/failed_when/changed_when (a string, a bool or a list of them: all must hold)."""
    found = []
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, bool):
            found.extend([] if literal_ok else ["a literal %r" % item])
        elif not isinstance(item, str):
            found.append("not a condition: %r" % (item,))
        else:
            found.extend("%s: %s" % (item, p) for p in problems(item, roots))
    return found


def offenders(name, items, roots):
    out = []
    for task in tasks(items):
        for key, literal_ok in (("when", False), ("failed_when", True), ("changed_when", True)):
            if key in task:
                out.extend("%s: %r: %s %s" % (name, task.get("name", "?"), key, p)
                           for p in condition_problems(task[key], roots, literal_ok))
    return out


@pytest.mark.parametrize("name, items", sources(), ids=[n for n, _i in sources()])
def test_every_group_condition_reads_a_decision_made_in_python(name, items):
    found = offenders(name, items, registered_roots())
    assert not found, "decisions in YAML (make them fields of the group's plan or verdict):\n" + "\n".join(found)


@pytest.mark.parametrize("expr, ok", [
    ("__trainer_group_plan.restart and not ansible_check_mode", True),
    ("not (__trainer_group_done.ok or __trainer_group_done.stop)", True),
    ("__trainer_group_plan.refused is not none", False),
    ("trainer_watch_s | float > 0", False),
    ("trainer_group | length > 0", False),
    ("(__trainer_group_done | default({})).ok | default(false)", False),
    ("(groups[trainer_group] | dflash.trainer.trainer_group('verdict', hostvars, '__x')).ok", False),
    ("__trainer_group_plan['restart']", False),
    ("__trainer_plan.upload", False),  # composed in vars/main.yml, not registered
    ("true", False),
])
def test_the_grammar(expr, ok):
    roots = {"__trainer_group_plan", "__trainer_group_done"} | BUILTIN_ROOTS
    assert (problems(expr, roots) == []) is ok


def test_literals_only_where_allowed():
    assert condition_problems(False, set(), literal_ok=True) == []
    assert condition_problems(True, set()) != []


def leaves(items):
    return [t for t in tasks(items) if not any(k in t for k in LEAF_KEYS)]


def test_the_group_restart_is_two_files_and_few_tasks():
    """The group's path reads in one file (group.yml) and the job it runs twice (group_job.yml: restart,
    rollback); the counts only go down."""
    assert GROUP_FILES == ["group.yml", "group_job.yml"]
    counted = dict((name, len(leaves(items))) for name, items in sources() if name != "deploy.yml")
    assert sum(counted.values()) <= 22, counted
