"""Run the collection's playbooks through ansible-runner and return typed per-host results.

    import dflash_trainer
    r = dflash_trainer.deploy(limit="gpu-host", extravars={"trainer_src": "/srv/dflash"})
    if not r.ok:
        for host, h in r.hosts.items():
            print(host, h.failed_task, h.reason, h.rolled_back, h.log_tail)
    print(r.hosts["gpu-host"].proof.tok_s)

Every call runs one playbook of the collection dflash.trainer, as ansible-playbook would:
- the collection: this checkout when the package runs from one (the repository root is the
  collection root), else the collection installed on the configured collections path or on
  sys.path (`ansible-galaxy collection install dflash-trainer-<version>.tar.gz`), so that
  `pip install .` plus an installed collection need nothing from the checkout;
- the working directory (project_dir): the checkout, or the caller's when installed;
- configuration: $ANSIBLE_CONFIG when the caller set it, else the first of ansible.cfg in the
  working directory (the checkout's own), ~/.ansible.cfg, /etc/ansible/ansible.cfg - Ansible's
  search - else Ansible's defaults;
- inventory: the one given (a path, a list of paths, or an inventory dict), else the configured
  one (`inventory =` of that configuration; the checkout's names inventory/lab.yml);
- host key checking: what that configuration (or $ANSIBLE_HOST_KEY_CHECKING) says - on unless
  the caller switched it off. ansible-runner alone would switch it off; it is passed explicitly;
- collections: the path holding the collection that is run first (the checkout's collections/,
  or the installed copy's), so `dflash.trainer.*` resolves to the playbooks' own collection,
  then the configured collection paths.
The result is built from the runner's structured events (see results.py), never from printed text.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any, Mapping, Optional, Tuple, Union

from .programs import program_env, require_program
from .results import RunResult, build_run_result

__all__ = ["REPO_ROOT", "PLAYBOOKS", "collection_root", "find_collection", "run_playbook", "deploy", "status", "restart", "rollback", "history",
           "run_playbook_live", "logs", "follow_logs"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOKS = {
    "deploy": "deploy.yml",
    "status": os.path.join("playbooks", "status.yml"),
    "restart": os.path.join("playbooks", "restart.yml"),
    "rollback": os.path.join("playbooks", "rollback.yml"),
    "history": os.path.join("playbooks", "history.yml"),
    "logs": os.path.join("playbooks", "logs.yml"),
}

Inventory = Union[str, list, dict, None]
COLLECTION = ("dflash", "trainer")


def is_collection_root(path: str) -> bool:
    """PATH holds the collection dflash.trainer with its playbooks (a checkout or an installed copy)."""
    return (os.path.isfile(os.path.join(path, PLAYBOOKS["deploy"])) and os.path.isdir(os.path.join(path, "roles"))
            and any(os.path.isfile(os.path.join(path, meta)) for meta in ("galaxy.yml", "MANIFEST.json")))


def find_collection(paths, sys_path: Optional[list] = None) -> Optional[str]:
    """The root of dflash.trainer as Ansible finds it: the first of the collection PATHS (each
    holding ansible_collections/, or being it), then sys.path (Ansible scans it too) that holds it."""
    for base in list(paths) + list(sys.path if sys_path is None else sys_path):
        base = os.path.abspath(os.path.expanduser(base or "."))
        if os.path.basename(base) != "ansible_collections":
            base = os.path.join(base, "ansible_collections")
        candidate = os.path.join(base, *COLLECTION)
        if is_collection_root(candidate):
            return candidate
    return None


def collection_root(paths, project_dir: Optional[str] = None) -> str:
    """The collection whose playbooks run: PROJECT_DIR (default: this checkout) when it is the
    collection, else the installed one on PATHS / sys.path; FileNotFoundError when there is none."""
    own = os.path.abspath(project_dir or REPO_ROOT)
    if is_collection_root(own):
        return own
    found = find_collection(paths)
    if found is None:
        raise FileNotFoundError(
            "the collection %s is not installed on the collections path (%s) nor on sys.path, and %s is not "
            "its checkout: ansible-galaxy collection install dflash-trainer-<version>.tar.gz"
            % (".".join(COLLECTION), os.pathsep.join(paths), own))
    return found


def find_config_file(directory: str, environ: Mapping[str, str]) -> Optional[str]:
    """The configuration ansible-playbook run in DIRECTORY reads: $ANSIBLE_CONFIG (a file, or a
    directory holding ansible.cfg; FileNotFoundError when missing), else the first existing of
    DIRECTORY/ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg; None: Ansible's defaults."""
    if environ.get("ANSIBLE_CONFIG"):
        config_file = os.path.abspath(os.path.expanduser(environ["ANSIBLE_CONFIG"]))
        if os.path.isdir(config_file):
            config_file = os.path.join(config_file, "ansible.cfg")
        if not os.path.isfile(config_file):
            raise FileNotFoundError("Ansible configuration %s (ANSIBLE_CONFIG) does not exist" % config_file)
        return config_file
    home = environ.get("HOME") or os.path.expanduser("~")
    for candidate in (os.path.join(directory, "ansible.cfg"), os.path.join(home, ".ansible.cfg"),
                      "/etc/ansible/ansible.cfg"):
        if os.path.isfile(candidate):
            return candidate
    return None


def ansible_settings(config_file: Optional[str], environ: Mapping[str, str]) -> Tuple[list, bool]:
    """(collection paths, host key checking) as Ansible reads them from CONFIG_FILE and ENVIRON
    (CONFIG_FILE None: Ansible's defaults)."""
    from ansible.config.manager import ConfigManager  # reads the file; no global Ansible state
    from ansible.module_utils.parsing.convert_bool import boolean

    if config_file is None:
        paths, origin, checking = [], "default", True
    else:
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
    checkout = is_collection_root(os.path.abspath(project_dir or REPO_ROOT))
    # the checkout is the working directory, as before; an installed package works where it is called
    project_dir = os.path.abspath(project_dir or (REPO_ROOT if checkout else os.getcwd()))
    config_file = find_config_file(project_dir, environ)
    paths, host_key_checking = ansible_settings(config_file, environ)
    root = collection_root(paths, project_dir)
    if root == project_dir:  # a checkout: its collections/ links back to it
        ours = os.path.join(project_dir, "collections")
    else:  # installed: the path that holds ansible_collections/dflash/trainer
        ours = os.path.dirname(os.path.dirname(os.path.dirname(root)))
    envvars = {
        "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join([ours] + [p for p in paths if os.path.abspath(p) != ours]),
        "ANSIBLE_HOST_KEY_CHECKING": str(host_key_checking),
    }
    if config_file is not None:
        envvars = {"ANSIBLE_CONFIG": config_file, **envvars}
    kwargs = dict(
        private_data_dir=private_data_dir,
        project_dir=project_dir,
        playbook=os.path.join(root if playbook in PLAYBOOKS else project_dir, PLAYBOOKS.get(playbook, playbook)),
        envvars=envvars,
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
    return run_playbook_live(playbook, limit=limit, inventory=inventory, extravars=extravars,
                             project_dir=project_dir, private_data_dir=private_data_dir, timeout=timeout)


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


# --- runs that show their work (the CLI): live events, --check / --diff, cancel; logs -------------

def run_playbook_live(playbook: str, *, limit: Optional[str] = None, inventory: Inventory = None,
                      extravars: Optional[Mapping[str, Any]] = None, project_dir: Optional[str] = None,
                      private_data_dir: Optional[str] = None, timeout: Optional[int] = None,
                      check: bool = False, diff: bool = False, on_event=None, cancel=None) -> RunResult:
    """run_playbook, plus: on_event(event) called with each runner event as it happens (task
    starts, results, retries), check / diff passed to ansible-playbook (--check, --diff), and
    cancel() polled while the play runs - True stops it (runner status `canceled`)."""
    import ansible_runner

    own_pdd = private_data_dir is None
    pdd = tempfile.mkdtemp(prefix="dflash-runner-") if own_pdd else os.path.abspath(private_data_dir)
    events: list[dict] = []

    def keep(event: dict) -> bool:
        events.append(event)
        if on_event is not None:
            on_event(event)
        return True

    try:
        # ansible-runner would look on PATH only and end with rc 127 and no word of why
        program = require_program("ansible-playbook")
        kwargs = runner_kwargs(playbook, limit=limit, inventory=inventory, extravars=extravars,
                               project_dir=project_dir, private_data_dir=pdd, timeout=timeout)
    except FileNotFoundError as e:  # the program, the configuration or the collection
        if own_pdd:
            shutil.rmtree(pdd, ignore_errors=True)
        return RunResult(ok=False, rc=None, status="failed", reason="the run could not start: %s" % e)
    # the runner starts `ansible-playbook` as found on the PATH it is given: the one found first
    kwargs["envvars"]["PATH"] = program_env(program)["PATH"]
    flags = [flag for flag, on in (("--check", check), ("--diff", diff)) if on]
    if flags:
        kwargs["cmdline"] = " ".join(flags)
    if cancel is not None:
        kwargs["cancel_callback"] = cancel
    try:
        runner = ansible_runner.run(event_handler=keep, **kwargs)
        result = build_run_result(events, rc=runner.rc, status=runner.status)
        if not result.stats and result.reason is None:
            result.reason = no_recap_reason(program, runner.rc, runner.status, _output_tail(runner))
        return result
    finally:
        if own_pdd:
            shutil.rmtree(pdd, ignore_errors=True)
        else:
            # ansible-runner leaves its inputs in env/: extra vars may hold secrets (trainer_env)
            for name in ("extravars", "cmdline"):
                try:
                    os.unlink(os.path.join(pdd, "env", name))
                except OSError:
                    pass


def _output_tail(runner, lines: int = 15) -> list:
    """The last LINES that ansible-playbook printed (the runner's artifacts/<id>/stdout)."""
    try:
        with open(os.path.join(runner.config.artifact_dir, "stdout"), errors="replace") as fh:
            return [line.rstrip("\n") for line in fh.readlines()[-lines:]]
    except (AttributeError, OSError, ValueError):
        return []


def no_recap_reason(program: str, rc: Optional[int], status: Optional[str], output: list) -> str:
    """Why a run without a play recap ended (it never got to a play, or was stopped): the program,
    its exit status and the last lines it printed."""
    words = "%s ended (runner status %s, rc %s) without a play recap" % (program, status, rc)
    text = [line for line in output if line.strip()]
    return words + (":\n" + "\n".join(text) if text else ": it printed nothing")


def logs_extravars(extravars: Optional[Mapping[str, Any]] = None, lines: int = 20, invocation: Optional[str] = None,
                   positions: Optional[Mapping[str, Any]] = None, wait_s: float = 0) -> dict:
    """The extra vars of playbooks/logs.yml: the last LINES of this start's log (or of the start
    INVOCATION); for each host in POSITIONS (host -> a TrainerLog of an earlier read) the lines
    after it instead, waiting up to WAIT_S for some."""
    extra = dict(extravars or {})
    extra["trainer_log_lines"] = int(lines)
    if invocation:
        extra["trainer_log_invocation"] = invocation
    follow = dict((host, dict(offset=p.offset, inode=p.inode, invocation=p.invocation))
                  for host, p in (positions or {}).items() if p is not None and p.inode is not None)
    if follow:
        extra.update(trainer_log_follow=follow, trainer_log_wait_s=wait_s)
    return extra


def logs(limit: Optional[str] = None, inventory: Inventory = None, extravars: Optional[Mapping[str, Any]] = None,
         project_dir: Optional[str] = None, private_data_dir: Optional[str] = None, timeout: Optional[int] = None,
         lines: int = 20, invocation: Optional[str] = None, positions: Optional[Mapping[str, Any]] = None,
         wait_s: float = 0, cancel=None) -> RunResult:
    """playbooks/logs.yml: read-only; each host's `log` (a TrainerLog) holds the last LINES of this
    start's log (or of the start INVOCATION), read from where the start begins; for a host in
    POSITIONS (host -> its TrainerLog of an earlier read) the lines appended since, after waiting
    up to WAIT_S for some."""
    return run_playbook_live("logs", limit=limit, inventory=inventory, project_dir=project_dir,
                             private_data_dir=private_data_dir, timeout=timeout, cancel=cancel,
                             extravars=logs_extravars(extravars, lines, invocation, positions, wait_s))


def follow_logs(on_lines, limit: Optional[str] = None, inventory: Inventory = None,
                extravars: Optional[Mapping[str, Any]] = None, project_dir: Optional[str] = None,
                lines: int = 20, invocation: Optional[str] = None, wait_s: float = 2,
                stop=lambda: False, read=None) -> RunResult:
    """logs -f: the last LINES, then the lines appended since - one playbook run per batch, each a
    long poll of up to WAIT_S on the targets - until stop() is true or a run fails.

    on_lines(host, TrainerLog) gets each batch. A start that ends (the trainer restarted) is
    followed into the next start, unless INVOCATION names the one to read. read: logs() (the unit
    tests replace it). Returns the last run's RunResult."""
    read = logs if read is None else read
    positions: dict = {}
    while True:
        result = read(limit=limit, inventory=inventory, extravars=extravars, project_dir=project_dir, lines=lines,
                      invocation=invocation, positions=positions, wait_s=wait_s, cancel=stop)
        if not result.ok or stop():
            for host, h in result.hosts.items():
                if h.log is not None and h.log.lines and result.ok:
                    on_lines(host, h.log)
            return result
        for host, h in result.hosts.items():
            if h.log is None:
                continue
            on_lines(host, h.log)
            # an ended start: the next read takes the new start's last lines
            positions[host] = None if h.log.ended and not invocation else h.log
