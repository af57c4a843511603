"""The doctor's scripts (playbooks/doctor.yml, roles/trainer/tasks/doctor.yml), made in Python
(plugins/plugin_utils/_doctor.py, unit-tested); the trainer_doctor action judges their answers."""

from ansible_collections.dflash.trainer.plugins.plugin_utils import _doctor


def trainer_doctor_script(where, **kw):
    """The shell script that asks the node (``where`` node: vmid, pct_path, sudo, node_nvidia_smi) or the container
    (``where`` container: trainer_root, python, nvidia_smi)."""
    if where == "node":
        return _doctor.node_script(kw["vmid"], kw.get("pct_path") or "/usr/sbin/pct", bool(kw.get("sudo")),
                                   kw.get("node_nvidia_smi") or "nvidia-smi")
    return _doctor.container_script(kw.get("trainer_root") or "/opt/dflash-trainer",
                                    kw.get("python") or "/usr/bin/python3", kw.get("nvidia_smi") or "nvidia-smi")


class FilterModule:
    def filters(self):
        return {"trainer_doctor_script": trainer_doctor_script}
