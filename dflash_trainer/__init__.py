"""Python API for the dflash.trainer collection: run its playbooks through ansible-runner and get
typed per-host results (RunResult -> HostResult -> Proof / TrainerStatus) built from the modules'
structured results, not from text.

    import dflash_trainer
    result = dflash_trainer.status(limit="gpu-host")
    result.hosts["gpu-host"].status.running_release
"""
from .api import PLAYBOOKS, REPO_ROOT, deploy, restart, rollback, run_playbook, status
from .results import HostResult, Proof, RunResult, TrainerStatus, build_run_result

__all__ = ["deploy", "status", "restart", "rollback", "run_playbook", "PLAYBOOKS", "REPO_ROOT",
           "RunResult", "HostResult", "Proof", "TrainerStatus", "build_run_result"]
