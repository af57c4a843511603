"""The node's Python judged before anything runs it (roles/trainer/tasks/node_gpus.yml): the raw script that
asks the node (its answer is judged in Python: plugins/plugin_utils/_node_program.py)."""

from ansible_collections.dflash.trainer.plugins.plugin_utils import _node_program


def trainer_node_program_script(path):
    """The shell script (no Python) that describes ``path`` and the directories above it on the node."""
    return _node_program.script(str(path))


class FilterModule:
    def filters(self):
        return {"trainer_node_program_script": trainer_node_program_script}
