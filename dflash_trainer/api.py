"""Run the collection's playbooks through ansible-runner and return typed per-host results.

    import dflash_trainer
    r = dflash_trainer.deploy(limit="gpu-host", extravars={"trainer_src": "/srv/dflash"})
    if not r.ok:
        for host, h in r.hosts.items():
            print(host, h.failed_task, h.reason, h.rolled_back, h.log_tail)
    print(r.hosts["gpu-host"].proof.tok_s)

Every call runs one playbook from the repository (the collection root) with its ansible.cfg and
its collections/ path, so `dflash.trainer.*` resolves from the checkout. The result is built from
the runner's structured events (see results.py), never from printed text.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Mapping, Optional, Union

from .results import RunResult, build_run_result

__all__ = ["REPO_ROOT", "PLAYBOOKS", "run_playbook", "deploy", "status", "restart", "rollback"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOKS = {
    "deploy": "deploy.yml",
    "status": os.path.join("playbooks", "status.yml"),
    "restart": os.path.join("playbooks", "restart.yml"),
    "rollback": os.path.join("playbooks", "rollback.yml"),
}

Inventory = Union[str, list, dict, None]


def runner_kwargs(playbook: str, *, limit: Optional[str] = None, inventory: Inventory = None,
                  extravars: Optional[Mapping[str, Any]] = None, project_dir: Optional[str] = None,
                  private_data_dir: str, timeout: Optional[int] = None) -> dict:
    """The keyword arguments for ansible_runner.run (pure; unit-tested)."""
    project_dir = os.path.abspath(project_dir or REPO_ROOT)
    if inventory is None:
        inventory = os.path.join(project_dir, "inventory", "lab.yml")
    elif isinstance(inventory, str) and os.path.exists(inventory):
        inventory = os.path.abspath(inventory)
    kwargs = dict(
        private_data_dir=private_data_dir,
        project_dir=project_dir,
        playbook=os.path.join(project_dir, PLAYBOOKS.get(playbook, playbook)),
        inventory=inventory,
        envvars={
            "ANSIBLE_CONFIG": os.path.join(project_dir, "ansible.cfg"),
            "ANSIBLE_COLLECTIONS_PATH": os.path.join(project_dir, "collections"),
        },
        extravars=dict(extravars or {}),
        quiet=True,
    )
    if limit:
        kwargs["limit"] = limit
    if timeout:
        kwargs["timeout"] = int(timeout)
    return kwargs


def run_playbook(playbook: str, *, limit: Optional[str] = None, inventory: Inventory = None,
                 extravars: Optional[Mapping[str, Any]] = None, project_dir: Optional[str] = None,
                 private_data_dir: Optional[str] = None, timeout: Optional[int] = None) -> RunResult:
    """Run PLAYBOOK (a key of PLAYBOOKS or a path relative to project_dir) and build its RunResult.

    private_data_dir: ansible-runner's working directory (artifacts, env); a temporary one,
    removed afterwards, unless given. timeout: seconds for the whole run (runner status
    `timeout`, ok False)."""
    import ansible_runner  # imported here: results.py and the unit tests do not need it

    own_pdd = private_data_dir is None
    pdd = tempfile.mkdtemp(prefix="dflash-runner-") if own_pdd else os.path.abspath(private_data_dir)
    events: list[dict] = []

    def keep(event: dict) -> bool:
        events.append(event)
        return True

    try:
        runner = ansible_runner.run(event_handler=keep, **runner_kwargs(
            playbook, limit=limit, inventory=inventory, extravars=extravars, project_dir=project_dir,
            private_data_dir=pdd, timeout=timeout))
        return build_run_result(events, rc=runner.rc, status=runner.status)
    finally:
        if own_pdd:
            shutil.rmtree(pdd, ignore_errors=True)


def deploy(limit: Optional[str] = None, inventory: Inventory = None, extravars: Optional[Mapping[str, Any]] = None,
           project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
           timeout: Optional[int] = None) -> RunResult:
    """deploy.yml: release + unit + restart-if-changed + proof (+ rollback on a failed proof)."""
    return run_playbook("deploy", limit=limit, inventory=inventory, extravars=extravars, project_dir=project_dir,
                        private_data_dir=private_data_dir, timeout=timeout)


def status(limit: Optional[str] = None, inventory: Inventory = None, extravars: Optional[Mapping[str, Any]] = None,
           project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
           timeout: Optional[int] = None) -> RunResult:
    """playbooks/status.yml: read-only; each host's `status` is a TrainerStatus."""
    return run_playbook("status", limit=limit, inventory=inventory, extravars=extravars, project_dir=project_dir,
                        private_data_dir=private_data_dir, timeout=timeout)


def restart(limit: Optional[str] = None, inventory: Inventory = None, extravars: Optional[Mapping[str, Any]] = None,
            project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
            timeout: Optional[int] = None) -> RunResult:
    """playbooks/restart.yml: restart on the current release and prove it."""
    return run_playbook("restart", limit=limit, inventory=inventory, extravars=extravars, project_dir=project_dir,
                        private_data_dir=private_data_dir, timeout=timeout)


def rollback(release: Optional[str] = None, limit: Optional[str] = None, inventory: Inventory = None,
             extravars: Optional[Mapping[str, Any]] = None, project_dir: Optional[str] = None,
             private_data_dir: Optional[str] = None, timeout: Optional[int] = None) -> RunResult:
    """playbooks/rollback.yml: switch to RELEASE (default: the last good one), restart, prove."""
    extra = dict(extravars or {})
    if release:
        extra["trainer_rollback_release"] = release
    return run_playbook("rollback", limit=limit, inventory=inventory, extravars=extra, project_dir=project_dir,
                        private_data_dir=private_data_dir, timeout=timeout)
