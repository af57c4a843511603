"""Run the collection's playbooks through ansible-runner and return typed per-host results.

    import dflash_trainer
    r = dflash_trainer.deploy(limit="gpu-host", extravars={"trainer_src": "/srv/dflash"})
    if not r.ok:
        for host, h in r.hosts.items():
            print(host, h.failed_task, h.reason, h.rolled_back, h.log_tail)
    print(r.hosts["gpu-host"].proof.tok_s)

Every call runs one playbook from the repository (the collection root), as ansible-playbook run
there would:
- configuration: $ANSIBLE_CONFIG when the caller set it, else the checkout's ansible.cfg;
- inventory: the one given (a path, a list of paths, or an inventory dict), else the configured
  one (`inventory =` of that configuration; the checkout's names inventory/lab.yml);
- host key checking: what that configuration (or $ANSIBLE_HOST_KEY_CHECKING) says - on unless
  the caller switched it off. ansible-runner alone would switch it off; it is passed explicitly;
- collections: the checkout's collections/ first, so `dflash.trainer.*` resolves, then the
  configured collection paths.
The result is built from the runner's structured events (see results.py), never from printed text.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Mapping, Optional, Tuple, Union

from .results import RunResult, build_run_result

__all__ = ["REPO_ROOT", "PLAYBOOKS", "run_playbook", "deploy", "status", "restart", "rollback", "history"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOKS = {
    "deploy": "deploy.yml",
    "status": os.path.join("playbooks", "status.yml"),
    "restart": os.path.join("playbooks", "restart.yml"),
    "rollback": os.path.join("playbooks", "rollback.yml"),
    "history": os.path.join("playbooks", "history.yml"),
}

Inventory = Union[str, list, dict, None]


def ansible_settings(config_file: str, environ: Mapping[str, str]) -> Tuple[list, bool]:
    """(collection paths, host key checking) as Ansible reads them from CONFIG_FILE and ENVIRON."""
    from ansible.config.manager import ConfigManager  # reads the file; no global Ansible state
    from ansible.module_utils.parsing.convert_bool import boolean

    manager = ConfigManager(conf_file=config_file)
    paths, origin = manager.get_config_value_and_origin("COLLECTIONS_PATHS")
    checking = manager.get_config_value("HOST_KEY_CHECKING")
    # the caller's environment wins over the file, as it does for ansible-playbook
    if environ.get("ANSIBLE_COLLECTIONS_PATH"):
        paths = [p for p in environ["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep) if p]
    elif origin == "default":  # Ansible's default, a template on ANSIBLE_HOME
        paths = [os.path.join(environ.get("ANSIBLE_HOME", "~/.ansible"), "collections"),
                 "/usr/share/ansible/collections"]
    if environ.get("ANSIBLE_HOST_KEY_CHECKING"):
        checking = boolean(environ["ANSIBLE_HOST_KEY_CHECKING"], strict=False)
    return [os.path.expanduser(p) for p in paths], bool(checking)


def runner_kwargs(playbook: str, *, limit: Optional[str] = None, inventory: Inventory = None,
                  extravars: Optional[Mapping[str, Any]] = None, project_dir: Optional[str] = None,
                  private_data_dir: str, timeout: Optional[int] = None,
                  environ: Optional[Mapping[str, str]] = None) -> dict:
    """The keyword arguments for ansible_runner.run (pure but for reading the configuration file;
    unit-tested). environ: the caller's environment (default os.environ)."""
    environ = os.environ if environ is None else environ
    project_dir = os.path.abspath(project_dir or REPO_ROOT)
    config_file = os.path.abspath(os.path.expanduser(environ.get("ANSIBLE_CONFIG") or
                                                     os.path.join(project_dir, "ansible.cfg")))
    if os.path.isdir(config_file):
        config_file = os.path.join(config_file, "ansible.cfg")
    if not os.path.isfile(config_file):
        raise FileNotFoundError("Ansible configuration %s (ANSIBLE_CONFIG) does not exist" % config_file)
    paths, host_key_checking = ansible_settings(config_file, environ)
    ours = os.path.join(project_dir, "collections")
    kwargs = dict(
        private_data_dir=private_data_dir,
        project_dir=project_dir,
        playbook=os.path.join(project_dir, PLAYBOOKS.get(playbook, playbook)),
        envvars={
            "ANSIBLE_CONFIG": config_file,
            "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join([ours] + [p for p in paths if p != ours]),
            "ANSIBLE_HOST_KEY_CHECKING": str(host_key_checking),
        },
        extravars=dict(extravars or {}),
        quiet=True,
    )
    if isinstance(inventory, str) and os.path.exists(inventory):
        inventory = os.path.abspath(inventory)
    if inventory is not None:
        kwargs["inventory"] = inventory
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


def history(limit: Optional[str] = None, inventory: Inventory = None, extravars: Optional[Mapping[str, Any]] = None,
            project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
            timeout: Optional[int] = None, count: Optional[int] = None) -> RunResult:
    """playbooks/history.yml: read-only; each host's `status.history` lists the last releases (newest
    first) with their measured tok/s and verdicts."""
    extra = dict(extravars or {})
    if count:
        extra["trainer_history_count"] = int(count)
    return run_playbook("history", limit=limit, inventory=inventory, extravars=extra, project_dir=project_dir,
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
