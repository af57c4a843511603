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
- the working directory (project_dir): the checkout when the caller works inside it (the current
  directory is the checkout or below it), else the caller's current directory - an editable install
  called from elsewhere still runs the checkout's playbooks, with the caller's configuration;
- configuration: $ANSIBLE_CONFIG when the caller set it, else the first of ansible.cfg in the
  working directory (the checkout's own only when working inside it), ~/.ansible.cfg,
  /etc/ansible/ansible.cfg - Ansible's search - else Ansible's defaults;
- inventory: the one given (a path, a list of paths, or an inventory dict), else $ANSIBLE_INVENTORY,
  else the configured one (`inventory =` of that configuration; the checkout's names the lab's
  inventory/lab.yml, so the lab is the default only inside the checkout), else Ansible's default
  (/etc/ansible/hosts). RunResult.inventory and inventory_from say which was read;
- host key checking: what that configuration (or $ANSIBLE_HOST_KEY_CHECKING) says - on unless
  the caller switched it off. ansible-runner alone would switch it off; it is passed explicitly;
- collections: the path holding the collection that is run first (the checkout's collections/,
  or the installed copy's), so `dflash.trainer.*` resolves to the playbooks' own collection,
  then the configured collection paths.
The result is built from the runner's structured events (see results.py), never from printed text.
"""
from __future__ import annotations

import importlib
import os
import shutil
import stat
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Optional, Tuple, Union

from .programs import program_env, require_program
from .results import RunResult, TrainerStatus, build_run_result

__all__ = ["REPO_ROOT", "PLAYBOOKS", "collection_root", "find_collection", "run_playbook", "deploy", "status", "restart",
           "rollback", "history", "run_playbook_live", "logs", "follow_logs", "stop", "start", "doctor", "check_log",
           "watch_status", "status_key", "used_inventory", "in_checkout"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOKS = {
    "deploy": "deploy.yml",
    "status": os.path.join("playbooks", "status.yml"),
    "restart": os.path.join("playbooks", "restart.yml"),
    "rollback": os.path.join("playbooks", "rollback.yml"),
    "history": os.path.join("playbooks", "history.yml"),
    "logs": os.path.join("playbooks", "logs.yml"),
    "stop": os.path.join("playbooks", "stop.yml"),
    "start": os.path.join("playbooks", "start.yml"),
    "doctor": os.path.join("playbooks", "doctor.yml"),
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
    here = [] if ignored_config_file(directory) else [os.path.join(directory, "ansible.cfg")]
    for candidate in here + [os.path.join(home, ".ansible.cfg"), "/etc/ansible/ansible.cfg"]:
        if os.path.isfile(candidate):
            return candidate
    return None


def ignored_config_file(directory: str) -> Optional[str]:
    """DIRECTORY/ansible.cfg when it exists in a directory every user may write: Ansible itself
    never reads it (it warns "Ansible is being run in a world writable directory"), and neither do
    we - another user's file there could name an inventory script that runs as the operator."""
    candidate = os.path.join(directory, "ansible.cfg")
    try:
        writable = bool(os.stat(directory).st_mode & stat.S_IWOTH)
    except OSError:
        return None
    return candidate if writable and os.path.lexists(candidate) else None


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


def in_checkout(cwd: Optional[str] = None) -> bool:
    """The package runs from a checkout of the collection and the caller works inside it (CWD,
    default the current directory, is the checkout or below it)."""
    root = os.path.realpath(REPO_ROOT)
    if not is_collection_root(root):
        return False
    cwd = os.path.realpath(cwd or os.getcwd())
    return cwd == root or cwd.startswith(root + os.sep)


def used_inventory(inventory: Inventory, config_file: Optional[str], environ: Mapping[str, str]) -> Tuple[list, str]:
    """(the inventory sources ansible-playbook reads, where they come from): the one given (-i), else
    $ANSIBLE_INVENTORY, else the configuration's `inventory`, else Ansible's default."""
    if isinstance(inventory, dict):
        return ["(an inventory given as a dict)"], "given"
    if inventory:
        return (list(inventory) if isinstance(inventory, (list, tuple)) else [inventory]), "given (-i)"
    if environ.get("ANSIBLE_INVENTORY"):
        return [p for p in environ["ANSIBLE_INVENTORY"].split(",") if p], "ANSIBLE_INVENTORY"
    if config_file is not None:
        from ansible.config.manager import ConfigManager
        value, origin = ConfigManager(conf_file=config_file).get_config_value_and_origin("DEFAULT_HOST_LIST")
        if origin != "default":
            return [str(v) for v in value or []], "inventory = in %s" % config_file
    return ["/etc/ansible/hosts"], "Ansible's default (no -i, no ANSIBLE_INVENTORY, no inventory = in %s)" % (
        config_file or "any ansible.cfg")


def runner_kwargs(playbook: str, *, limit: Optional[str] = None, inventory: Inventory = None,
                  extravars: Optional[Mapping[str, Any]] = None, project_dir: Optional[str] = None,
                  private_data_dir: str, timeout: Optional[int] = None,
                  environ: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None) -> dict:
    """The keyword arguments for ansible_runner.run (pure but for reading the configuration file;
    unit-tested). environ: the caller's environment (default os.environ); cwd: the caller's
    directory (default the current one)."""
    environ = os.environ if environ is None else environ
    # the checkout is the working directory when the caller works inside it; else the caller's directory,
    # so that the checkout's ansible.cfg (and its lab inventory) is never read behind their back
    if project_dir is None:
        project_dir = REPO_ROOT if in_checkout(cwd) else (cwd or os.getcwd())
    project_dir = os.path.abspath(project_dir)
    config_file = find_config_file(project_dir, environ)
    paths, host_key_checking = ansible_settings(config_file, environ)
    if not is_collection_root(project_dir) and is_collection_root(REPO_ROOT):
        root = os.path.abspath(REPO_ROOT)  # an editable install called from elsewhere: its own checkout
    else:
        root = collection_root(paths, project_dir)
    if is_collection_root(root) and os.path.isdir(os.path.join(root, "collections")):
        ours = os.path.join(root, "collections")  # a checkout: its collections/ links back to it
    else:  # installed: the path that holds ansible_collections/dflash/trainer
        ours = os.path.dirname(os.path.dirname(os.path.dirname(root)))
    envvars = {
        "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join([ours] + [p for p in paths if os.path.abspath(p) != ours]),
        "ANSIBLE_HOST_KEY_CHECKING": str(host_key_checking),
    }
    if config_file is not None:
        envvars = {"ANSIBLE_CONFIG": config_file, **envvars}
    path = os.path.join(root if playbook in PLAYBOOKS else project_dir, PLAYBOOKS.get(playbook, playbook))
    if playbook in PLAYBOOKS and not os.path.isfile(path):
        raise FileNotFoundError("the playbook %s is not in the collection at %s (an older collection?)"
                                % (PLAYBOOKS.get(playbook, playbook), root))
    kwargs = dict(
        private_data_dir=private_data_dir,
        project_dir=project_dir,
        playbook=path,
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


# The subcommands, one function each, with the CLI's options as keyword arguments (limit first).
# Every one also takes: extravars (-e), inventory (-i), timeout (--timeout), project_dir,
# private_data_dir, on_event (called with each runner event: the CLI's progress lines) and cancel
# (polled; True stops the play). Each returns a RunResult; RunResult.exit_code is the CLI's exit status.

def _extra(extravars: Optional[Mapping[str, Any]], **named) -> dict:
    """EXTRAVARS with the named options on top (those that are None are left out)."""
    extra = dict(extravars or {})
    extra.update((k, v) for k, v in named.items() if v is not None)
    return extra


def deploy(limit: Optional[str] = None, *, src: Optional[str] = None, force: bool = False, check: bool = False,
           diff: bool = False, extravars: Optional[Mapping[str, Any]] = None, inventory: Inventory = None,
           timeout: Optional[int] = None, project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
           on_event=None, cancel=None) -> RunResult:
    """deploy.yml: release + unit + restart-if-changed + proof (+ rollback on a failed proof).
    src: trainer_src (made absolute); force: trainer_force_restart=true (restart even when nothing
    changed); check / diff: ansible-playbook --check / --diff."""
    extra = _extra(extravars, trainer_src=os.path.abspath(os.path.expanduser(src)) if src else None,
                   trainer_force_restart=True if force else None)
    return run_playbook_live("deploy", limit=limit, inventory=inventory, extravars=extra, project_dir=project_dir,
                             private_data_dir=private_data_dir, timeout=timeout, check=check, diff=diff,
                             on_event=on_event, cancel=cancel)


def restart(limit: Optional[str] = None, *, check: bool = False, diff: bool = False,
            extravars: Optional[Mapping[str, Any]] = None, inventory: Inventory = None, timeout: Optional[int] = None,
            project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
            on_event=None, cancel=None) -> RunResult:
    """playbooks/restart.yml: restart on the current release and prove it."""
    return run_playbook_live("restart", limit=limit, inventory=inventory, extravars=extravars, project_dir=project_dir,
                             private_data_dir=private_data_dir, timeout=timeout, check=check, diff=diff,
                             on_event=on_event, cancel=cancel)


def rollback(limit: Optional[str] = None, *, to: Optional[str] = None, check: bool = False, diff: bool = False,
             extravars: Optional[Mapping[str, Any]] = None, inventory: Inventory = None, timeout: Optional[int] = None,
             project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
             on_event=None, cancel=None, release: Optional[str] = None) -> RunResult:
    """playbooks/rollback.yml: switch to the release TO (trainer_rollback_release; default: the
    last good one), restart, prove. release: the earlier name of TO (keyword only)."""
    if to and release and to != release:
        raise ValueError("rollback: to=%r and release=%r name two releases; give one" % (to, release))
    extra = _extra(extravars, trainer_rollback_release=to or release or None)
    return run_playbook_live("rollback", limit=limit, inventory=inventory, extravars=extra, project_dir=project_dir,
                             private_data_dir=private_data_dir, timeout=timeout, check=check, diff=diff,
                             on_event=on_event, cancel=cancel)


def status(limit: Optional[str] = None, *, extravars: Optional[Mapping[str, Any]] = None, inventory: Inventory = None,
           timeout: Optional[int] = None, project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
           on_event=None, cancel=None) -> RunResult:
    """playbooks/status.yml: read-only; each host's `status` is a TrainerStatus. Not ok (exit code 1)
    while a trainer does not run its proved release healthily."""
    return run_playbook_live("status", limit=limit, inventory=inventory, extravars=extravars, project_dir=project_dir,
                             private_data_dir=private_data_dir, timeout=timeout, on_event=on_event, cancel=cancel)


def doctor(limit: Optional[str] = None, *, extravars: Optional[Mapping[str, Any]] = None, inventory: Inventory = None,
           timeout: Optional[int] = None, project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
           on_event=None, cancel=None) -> RunResult:
    """playbooks/doctor.yml: read-only; every assumption about the node and the container, one check each
    (each host's report is the `__trainer_doctor` fact of its events: dflash_trainer.doctor reads it)."""
    return run_playbook_live("doctor", limit=limit, inventory=inventory, extravars=extravars, project_dir=project_dir,
                             private_data_dir=private_data_dir, timeout=timeout, on_event=on_event, cancel=cancel)


def history(limit: Optional[str] = None, *, count: Optional[int] = None,
            extravars: Optional[Mapping[str, Any]] = None, inventory: Inventory = None, timeout: Optional[int] = None,
            project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
            on_event=None, cancel=None) -> RunResult:
    """playbooks/history.yml: read-only; each host's `status.history` lists the last COUNT releases
    (newest first) with their measured tok/s and verdicts."""
    extra = _extra(extravars, trainer_history_count=int(count) if count else None)
    return run_playbook_live("history", limit=limit, inventory=inventory, extravars=extra, project_dir=project_dir,
                             private_data_dir=private_data_dir, timeout=timeout, on_event=on_event, cancel=cancel)


def stop(limit: Optional[str] = None, *, disable: bool = False, check: bool = False, diff: bool = False,
         extravars: Optional[Mapping[str, Any]] = None, inventory: Inventory = None, timeout: Optional[int] = None,
         project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
         on_event=None, cancel=None) -> RunResult:
    """playbooks/stop.yml: stop the trainer on purpose, under the deploy lock (the role's stop entry
    point); disable: trainer_stop_disable=true, the unit also disabled (it stays stopped across a
    reboot of the container; start() brings it back)."""
    extravars = _extra(extravars, trainer_stop_disable=True if disable else None)
    return run_playbook_live("stop", limit=limit, inventory=inventory, extravars=extravars, project_dir=project_dir,
                             private_data_dir=private_data_dir, timeout=timeout, check=check, diff=diff,
                             on_event=on_event, cancel=cancel)


def start(limit: Optional[str] = None, *, check: bool = False, diff: bool = False,
          extravars: Optional[Mapping[str, Any]] = None, inventory: Inventory = None, timeout: Optional[int] = None,
          project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
          on_event=None, cancel=None) -> RunResult:
    """playbooks/start.yml: start the stopped trainer on its current release and prove it, under
    the deploy lock (the role's start entry point)."""
    return run_playbook_live("start", limit=limit, inventory=inventory, extravars=extravars, project_dir=project_dir,
                             private_data_dir=private_data_dir, timeout=timeout, check=check, diff=diff,
                             on_event=on_event, cancel=cancel)


def check_log(file: str, *, extravars: Optional[Mapping[str, Any]] = None, start: Optional[str] = None,
              line_interval_s: Optional[float] = None, clock: str = "auto", at_end: str = "hang",
              exit_status: int = 1):
    """check-log, offline: replay the captured log FILE ('-': standard input) through the readiness
    proof's log judge with the role defaults and EXTRAVARS. Returns the Replay (`ok`, `state`,
    `as_dict()`; `exit_code`: 0 the proof would pass, 1 it would fail); raises the module's BadInput
    (exit code 2) for input it cannot judge. The module itself is dflash_trainer.check_log in
    sys.modules (this function takes its name in the package)."""
    replay = importlib.import_module(__package__ + ".check_log")
    kwargs = dict(clock=clock, at_end=at_end, exit_status=exit_status,
                  line_interval_s=replay.DEFAULT_LINE_INTERVAL_S if line_interval_s is None else line_interval_s)
    result, _defaults = replay.check_file(file, dict(extravars or {}), start=start, **kwargs)
    return result


def status_key(s: Optional[TrainerStatus], ok: bool) -> tuple:
    """What `status --watch` compares between two reads: the unit, the releases, the health, the
    restart count and the last job - not tok/s or uptime, which change on every read."""
    if s is None:
        return (ok,)
    health = s.health or {}
    job = s.last_job or {}
    return (ok, s.active_state, s.sub_state, s.main_pid, s.n_restarts, s.running_release, s.current_release,
            s.last_good, s.drift, health.get("ok"), health.get("words"), job.get("words"))


def watch_status(on_change: Callable[[str, Any, RunResult], None], limit: Optional[str] = None, *,
                 interval_s: float = 10, stop: Callable[[], bool] = lambda: False, read=None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 **kwargs) -> RunResult:
    """status --watch: read the status (one playbook run per read) every INTERVAL_S seconds until
    stop() is true; on_change(host, HostResult, RunResult) is called for each host whose status_key
    changed since the read before (every host on the first read, and a host that vanished: None).
    read: status() (the unit tests replace it); kwargs go to it. Returns the last read's RunResult."""
    read = status if read is None else read
    seen: dict = {}
    result = None
    while True:
        began = clock()
        result = read(limit=limit, cancel=stop, **kwargs)
        if stop() and result.status == "canceled":
            return result  # a read cut short says nothing new
        now = dict((host, (status_key(h.status, h.ok), h.exit_code)) for host, h in result.hosts.items())
        if not result.hosts:
            now = {"": (("run", result.exit_code, result.reason),)}
        for host, key in now.items():
            if seen.get(host) != key:
                on_change(host, result.hosts.get(host), result)
        for host in set(seen) - set(now):
            on_change(host, None, result)
        seen = now
        while not stop() and clock() - began < interval_s:
            sleep(min(0.2, max(0.0, interval_s - (clock() - began))))
        if stop():
            return result


# --- runs that show their work (the CLI): live events, --check / --diff, cancel; logs -------------

def run_playbook_live(playbook: str, *, limit: Optional[str] = None, inventory: Inventory = None,
                      extravars: Optional[Mapping[str, Any]] = None, project_dir: Optional[str] = None,
                      private_data_dir: Optional[str] = None, timeout: Optional[int] = None,
                      check: bool = False, diff: bool = False, on_event=None, cancel=None) -> RunResult:
    """run_playbook, plus: on_event(event) called with each runner event as it happens (task
    starts, results, retries), check / diff passed to ansible-playbook (--check, --diff), and
    cancel() polled while the play runs - True stops it (runner status `canceled`)."""
    began = time.monotonic()
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
        import ansible_runner
    except (FileNotFoundError, ImportError) as e:  # the program, the configuration, the collection, the runner
        if own_pdd:
            shutil.rmtree(pdd, ignore_errors=True)
        return RunResult(ok=False, rc=None, status="failed", reason="the run could not start: %s" % e,
                         started=False, playbook=playbook)
    sources, origin = used_inventory(inventory, kwargs["envvars"].get("ANSIBLE_CONFIG"), os.environ)
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
        result.playbook, result.inventory, result.inventory_from = playbook, sources, origin
        result.config = kwargs["envvars"].get("ANSIBLE_CONFIG")
        result.config_ignored = ignored_config_file(kwargs["project_dir"])
        result.elapsed_s = round(time.monotonic() - began, 1)
        if not result.stats and result.reason is None:
            output = _output_tail(runner)
            result.reason = no_recap_reason(program, runner.rc, runner.status, output)
            result.refused = refused_before_play(runner.rc, output)
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


NO_HOSTS = "leaves us with no hosts to target"  # ansible-playbook's own error for a limit matching nothing


def refused_before_play(rc: Optional[int], output: list) -> bool:
    """ansible-playbook refused the run before any play: its rc says it refused its input (4 a
    parser error, 5 bad options), or - ansible-playbook has no code or event of its own for it (rc 1,
    like any error) - it said its host pattern and --limit leave no host to target."""
    return rc in (4, 5) or any(NO_HOSTS in line for line in output)


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


def logs(limit: Optional[str] = None, *, lines: int = 20, invocation: Optional[str] = None,
         extravars: Optional[Mapping[str, Any]] = None, inventory: Inventory = None, timeout: Optional[int] = None,
         project_dir: Optional[str] = None, private_data_dir: Optional[str] = None,
         positions: Optional[Mapping[str, Any]] = None, wait_s: float = 0, on_event=None, cancel=None) -> RunResult:
    """playbooks/logs.yml: read-only; each host's `log` (a TrainerLog) holds the last LINES of this
    start's log (or of the start INVOCATION), read from where the start begins; for a host in
    POSITIONS (host -> its TrainerLog of an earlier read) the lines appended since, after waiting
    up to WAIT_S for some."""
    return run_playbook_live("logs", limit=limit, inventory=inventory, project_dir=project_dir,
                             private_data_dir=private_data_dir, timeout=timeout, cancel=cancel, on_event=on_event,
                             extravars=logs_extravars(extravars, lines, invocation, positions, wait_s))


FOLLOW_WAIT_S = 10  # logs -f: how long one read waits on the targets for a new line
FOLLOW_EVERY_S = 3  # logs -f: at most one read (one ansible-playbook) per this many seconds


def follow_logs(on_lines, limit: Optional[str] = None, *, inventory: Inventory = None,
                extravars: Optional[Mapping[str, Any]] = None, project_dir: Optional[str] = None,
                lines: int = 20, invocation: Optional[str] = None, wait_s: float = FOLLOW_WAIT_S,
                every_s: float = FOLLOW_EVERY_S, stop=lambda: False, read=None,
                sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> RunResult:
    """logs -f: the last LINES, then the lines appended since, until stop() is true or a run fails.

    Each read is one playbook run (ansible-playbook cannot stream a module's output): a long poll
    that returns as soon as a host has new lines, or after WAIT_S with none; and a read begins at
    most every EVERY_S seconds, so a trainer that prints all the time costs one ansible-playbook per
    EVERY_S (its lines come in batches), a quiet one one per WAIT_S.

    on_lines(host, TrainerLog) gets each batch. A start that ends (the trainer restarted) is
    followed into the next start, unless INVOCATION names the one to read. read: logs() (the unit
    tests replace it, and sleep and clock). Returns the last run's RunResult."""
    read = logs if read is None else read
    positions: dict = {}
    began = None
    result: Optional[RunResult] = None  # set by the first read (pacing begins only after it)
    while True:
        if began is not None:  # pace the reads
            while not stop() and clock() - began < every_s:
                sleep(min(0.2, max(0.0, every_s - (clock() - began))))
            if stop():
                return result
        began = clock()
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
