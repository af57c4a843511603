"""Python API for the dflash.trainer collection: run its playbooks through ansible-runner and get
typed per-host results (RunResult -> HostResult -> Proof / TrainerStatus) built from the modules'
structured results, not from text. One function per CLI subcommand, with its options as keyword
arguments (limit first); RunResult.exit_code is the CLI's exit status.

    import dflash_trainer
    result = dflash_trainer.status("gpu-host")
    result.hosts["gpu-host"].status.running_release
    r = dflash_trainer.deploy("gpu-host", src="/srv/dflash", force=True)
    sys.exit(r.exit_code)  # 0 proved, 1 failed (rolled back or not), 2 refused, 3 unreachable, 4 no Ansible

`check_log` here is the function; the module of the same name is sys.modules["dflash_trainer.check_log"].
"""
import importlib as _importlib

# the module check_log first: its import would otherwise set the package's name check_log to it later
_importlib.import_module(__name__ + ".check_log")
from .api import (PLAYBOOKS, REPO_ROOT, check_log, deploy, follow_logs, history, logs, restart, rollback, run_playbook,
                  start, status, stop, watch_status)
from .results import (EXIT_CODES, EXIT_FAILED, EXIT_NO_ANSIBLE, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, HostResult,
                      Proof, RunResult, TrainerLog, TrainerStatus, build_run_result)

__all__ = ["deploy", "restart", "rollback", "status", "history", "logs", "follow_logs", "stop", "start", "check_log",
           "watch_status", "run_playbook", "PLAYBOOKS", "REPO_ROOT", "RunResult", "HostResult", "Proof",
           "TrainerStatus", "TrainerLog", "build_run_result", "EXIT_CODES", "EXIT_OK", "EXIT_FAILED", "EXIT_REFUSED",
           "EXIT_UNREACHABLE", "EXIT_NO_ANSIBLE"]
