"""One decider: every decision of a run is made in Python - the plan (plugins/module_utils/plan/decide.py
``make_plan``, made by the first read: trainer_plan) or the outcome a module or action of the collection
computes - and the role's YAML only carries it out.

So a task's ``when:`` (a block's too) is a boolean combination (``not``, ``and``, ``or``, parentheses) of
dotted field reads whose root is a variable registered by a ``dflash.trainer.*`` task of the role (a plan, a
verdict our Python computed), or ``ansible_check_mode``: no filters, no comparisons, no literals, no role
variables, no set_fact'd or vars/main.yml-composed values. ``failed_when`` / ``changed_when``: a literal
true/false, or the same grammar.
"""
import glob
import os

import jinja2
import pytest
import yaml
from jinja2 import nodes
from role_tasks import tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASKS = os.path.join(ROOT, "roles", "trainer", "tasks")
FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(TASKS, "*.yml")))

BUILTIN_ROOTS = frozenset(["ansible_check_mode"])
# Files whose decisions have not moved into Python yet, each with why (strict: a file that passes fails here, so
# the list only shrinks).
NOT_YET = {}
ALLOWED_NODES = (nodes.Not, nodes.And, nodes.Or, nodes.Getattr, nodes.Name)


def _load(name):
    with open(os.path.join(TASKS, name), encoding="utf-8") as f:
        return yaml.safe_load(f) or []


def _action(task):
    """The module or action a task calls (its first key that is a FQCN), or None."""
    for key in task:
        if key.count(".") >= 2:
            return key
    return None


def registered_roots():
    """The variables registered by a dflash.trainer.* task anywhere in the role (group files too: a plan or a
    verdict registered there is one our Python made as well)."""
    roots = set()
    for name in FILES:
        for task in tasks(_load(name)):
            action = _action(task)
            if action and action.startswith("dflash.trainer.") and task.get("register"):
                roots.add(task["register"])
    return roots


def _root(node):
    while isinstance(node, nodes.Getattr):
        node = node.node
    return node


def problems(expr, roots):
    """What is wrong with one condition ``expr`` (a string) -> [words]; [] when it is a boolean combination
    of dotted field reads of ``roots``."""
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
            return
        if isinstance(node, nodes.Name):
            if node.name not in roots:
                found.append("%r is not registered by a dflash.trainer.* task" % node.name)
            return
        if isinstance(node, nodes.Getattr):
            if not isinstance(_root(node), nodes.Name):
                found.append("%s reads a field of something that is not a variable" % type(_root(node)).__name__)
                return
            walk(_root(node))
            return
        for child in node.iter_child_nodes():
            walk(child)

    walk(body[0].nodes[0])
    return found


def condition_problems(value, roots, literal_ok=False):
    """``value``: a when/failed_when/changed_when (a string, a bool or a list of strings: all must hold)."""
    if isinstance(value, bool):
        return [] if literal_ok else ["a literal %r" % value]
    items = value if isinstance(value, list) else [value]
    found = []
    for item in items:
        if isinstance(item, bool):
            found.extend([] if literal_ok else ["a literal %r" % item])
        elif not isinstance(item, str):
            found.append("not a condition: %r" % (item,))
        else:
            found.extend("%s: %s" % (item, p) for p in problems(item, roots))
    return found


def offenders(name, roots):
    """-> ['<file>: <task name>: <key> <problem>', ...] for one task file."""
    out = []
    for task in tasks(_load(name)):
        for key, literal_ok in (("when", False), ("failed_when", True), ("changed_when", True)):
            if key in task:
                out.extend("%s: %r: %s %s" % (name, task.get("name", "?"), key, p)
                           for p in condition_problems(task[key], roots, literal_ok))
    return out


@pytest.mark.parametrize("name", FILES)
def test_every_condition_reads_a_decision_made_in_python(name):
    found = offenders(name, registered_roots() | BUILTIN_ROOTS)
    if name in NOT_YET:
        assert found, "%s reads only decisions made in Python now: take it out of NOT_YET" % name
        pytest.xfail("%s\n%s" % (NOT_YET[name], "\n".join(found)))
    assert not found, "decisions in YAML (make them plan or outcome fields):\n" + "\n".join(found)


@pytest.mark.parametrize("expr, ok", [
    ("__trainer_status_before.plan.upload", True),
    ("not ansible_check_mode and (__trainer_status_before.plan.restart or __trainer_job_watch.ok)", True),
    ("__trainer_plan.upload", False),  # composed in vars/main.yml, not registered
    ("trainer_watch_s | float > 0", False),
    ("trainer_group | length > 0", False),
    ("__trainer_status_before.report | default([]) | length > 0", False),
    ("__trainer_lock_holder == 'play'", False),
    ("__trainer_status_before.job_start is not defined", False),
    ("true", False),
    ("__trainer_status_before['plan'].upload", False),
])
def test_the_grammar(expr, ok):
    roots = {"__trainer_status_before", "__trainer_job_watch"} | BUILTIN_ROOTS
    assert (problems(expr, roots) == []) is ok


def test_literals_only_where_allowed():
    assert condition_problems(False, set(), literal_ok=True) == []
    assert condition_problems(True, set()) != []
