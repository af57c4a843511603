"""The one-decider rule, for the tests that hold the role's task files and the group play to it: a task's
``when:`` (a block's too) is a boolean combination (``not``, ``and``, ``or``, parentheses) of dotted field
reads whose root is a variable registered by a ``dflash.trainer.*`` task (a plan, a verdict our Python
computed), or ``ansible_check_mode``: no filters, no comparisons, no literals, no role variables, no
set_fact'd or vars/main.yml-composed values. ``failed_when`` / ``changed_when``: a literal true/false, or the
same grammar."""
import jinja2
from jinja2 import nodes

from role_tasks import tasks

BUILTIN_ROOTS = frozenset(["ansible_check_mode"])
ALLOWED_NODES = (nodes.Not, nodes.And, nodes.Or, nodes.Getattr, nodes.Name)


def _action(task):
    """The module or action a task calls (its first key that is a FQCN), or None."""
    return next((key for key in task if isinstance(key, str) and key.count(".") >= 2), None)


def registered_roots(task_lists):
    """The variables registered by a dflash.trainer.* task in any of ``task_lists``, and the builtin roots."""
    roots = set()
    for items in task_lists:
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
        elif isinstance(node, nodes.Name):
            if node.name not in roots:
                found.append("%r is not registered by a dflash.trainer.* task" % node.name)
        elif isinstance(node, nodes.Getattr):
            if isinstance(_root(node), nodes.Name):
                walk(_root(node))
            else:
                found.append("%s reads a field of something that is not a variable" % type(_root(node)).__name__)
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
    """-> ['<name>: <task name>: <key> <problem>', ...] for one task list."""
    out = []
    for task in tasks(items):
        for key, literal_ok in (("when", False), ("failed_when", True), ("changed_when", True)):
            if key in task:
                out.extend("%s: %r: %s %s" % (name, task.get("name", "?"), key, p)
                           for p in condition_problems(task[key], roots, literal_ok))
    return out
