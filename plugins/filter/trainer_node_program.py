"""The node's Python judged before anything runs it (roles/trainer/tasks/node_gpus.yml): the raw script that
asks the node, and the judgement of its answer, made in Python (plugins/plugin_utils/_node_program.py)."""

from ansible_collections.dflash.trainer.plugins.plugin_utils import _node_program


def trainer_node_program_script(path):
    """The shell script (no Python) that describes ``path`` and the directories above it on the node."""
    return _node_program.script(str(path))


def trainer_node_program_problem(answer, path):
    """Why the node may not run ``path`` (``answer``: the raw task's result or its stdout), or ""."""
    text = answer.get("stdout", "") if isinstance(answer, dict) else str(answer or "")
    return _node_program.problem(text, str(path))


class FilterModule:
    def filters(self):
        return {"trainer_node_program_script": trainer_node_program_script,
                "trainer_node_program_problem": trainer_node_program_problem}
