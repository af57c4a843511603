"""The doctor's scripts and judgement (playbooks/doctor.yml, roles/trainer/tasks/doctor.yml), made in Python
(plugins/plugin_utils/_doctor.py, unit-tested) so that the play only asks and shows."""

from ansible_collections.dflash.trainer.plugins.module_utils.target.secrets import secret_values
from ansible_collections.dflash.trainer.plugins.plugin_utils import _doctor


def trainer_doctor_script(where, **kw):
    """The shell script that asks the node (``where`` node: vmid, pct_path, sudo, node_nvidia_smi) or the container
    (``where`` container: trainer_root, python, nvidia_smi)."""
    if where == "node":
        return _doctor.node_script(kw["vmid"], kw.get("pct_path") or "/usr/sbin/pct", bool(kw.get("sudo")),
                                   kw.get("node_nvidia_smi") or "nvidia-smi")
    return _doctor.container_script(kw.get("trainer_root") or "/opt/dflash-trainer",
                                    kw.get("python") or "/usr/bin/python3", kw.get("nvidia_smi") or "nvidia-smi")


def trainer_doctor_report(node, ct, before=None, after=None, env=None, record=False, **kw):
    """The checks of the node's and the container's raw answers, the values of ``env`` (trainer_env) masked:
    {checks, lines, failed, exit_code, summary}, and with ``record`` the answers kept for `doctor --record`
    (a fixture plugins/plugin_utils/_doctor.replay judges again)."""
    kw["sudo"] = bool(kw.get("sudo"))
    out, kept = _doctor.judged(node, ct, before, after, secrets=secret_values(env or {}), **kw)
    if record:
        out["record"] = kept
    return out


def trainer_doctor_enter(node):
    """Whether the container is asked (pct exec) after the node's answer: not when the node was not reached, nor
    when the container is frozen (pct exec would hang in it)."""
    return _doctor.enter(node)


class FilterModule:
    def filters(self):
        return {"trainer_doctor_script": trainer_doctor_script, "trainer_doctor_report": trainer_doctor_report,
                "trainer_doctor_enter": trainer_doctor_enter}
