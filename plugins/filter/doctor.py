"""The doctor's node script (roles/trainer/tasks/doctor.yml's raw task), made in Python
(plugins/plugin_utils/_doctor.py, unit-tested); the trainer_doctor action asks the container and judges both answers."""

from ansible_collections.dflash.trainer.plugins.plugin_utils import _doctor


def trainer_doctor_script(where, **kw):
    """The shell script that asks the node (``where`` node: vmid, pct_path, sudo, node_nvidia_smi) or the container
    (``where`` container: trainer_root, python, nvidia_smi)."""
    return _doctor.script(where, **kw)


class FilterModule:
    def filters(self):
        return {"trainer_doctor_script": trainer_doctor_script}
