"""Fixtures for tests that run against the real lab (LXC + /usr/sbin/pct + sshd on loopback).

The lab is brought up (idempotently) once per session with `python3 lab/lab.py up`; tests
never skip when it is missing: a lab test that cannot reach the lab fails.
"""
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB_STATE = os.environ.get("DFLASH_LAB_STATE", "/var/lib/dflash-lab")


class Lab:
    def __init__(self, facts):
        self.facts = facts
        self.host = facts["ssh_host"]
        self.port = facts["ssh_port"]
        self.user = facts["ssh_user"]
        self.key = facts["ssh_private_key"]

    def ssh_argv(self, *extra):
        return ["ssh", "-p", str(self.port), "-i", self.key, "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
                *extra, "%s@%s" % (self.user, self.host)]

    def conn_vars(self, connection="dflash.trainer.pct"):
        """Inventory variables that reach the lab's containers the way inventory/lab.yml does
        (host key checked against the lab's own known_hosts)."""
        return {"ansible_connection": connection, "ansible_host": self.host, "ansible_port": self.port,
                "ansible_user": self.user, "ansible_ssh_private_key_file": self.key,
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_pct_known_hosts_file": self.facts["known_hosts"]}

    def pct(self, *args, **kw):
        """Run `pct ARGS` on the lab host (directly: the lab host is this machine)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        kw.setdefault("check", False)
        return subprocess.run(["pct", *args], **kw)  # pylint: disable=subprocess-run-check  # set above

    def ct(self, vmid, *cmd, **kw):
        """Run CMD inside container VMID through pct exec."""
        return self.pct("exec", str(vmid), "--", *cmd, **kw)


@pytest.fixture(scope="session")
def lab():
    ids = os.environ.get("DFLASH_LAB_IDS", "200 201").split()
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--ids", *ids],
                   check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(LAB_STATE, "lab.json")) as fh:
        return Lab(json.load(fh))


SCRATCH_CT = "212"


@pytest.fixture(scope="session")
def scratch_ct(lab):
    """A lab container of these tests' own (212), so they never disturb container 200."""
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--ids", SCRATCH_CT],
                   check=True, stdout=subprocess.DEVNULL)
    return SCRATCH_CT


# Parallel runs (make test-lab: pytest-xdist, --dist loadfile: each file on one worker, in order, with its
# module fixtures). A test file listed here uses only lab containers of its own and no lab-wide state (the
# allow lists, the node's tenants, a delay for every container, the default containers 200/201, the
# scratch container), so it may run beside any other file. Every other file - a new one too, until it is
# listed - holds the lab's shared-state lock for its whole run, so no two of them ever overlap.
OWN_CONTAINERS = frozenset((
    "test_after_proof_lab.py",
    "test_bad_input.py",
    "test_cache_from_boot_lab.py",
    "test_cli_lab.py",
    "test_container_user_lab.py",
    "test_dist_trainer_lab.py",
    "test_doctor_lab.py",
    "test_environment_lab.py",
    "test_experiment_history_lab.py",
    "test_field_formats_lab.py",
    "test_frozen_first_read_lab.py",
    "test_frozen_lab.py",
    "test_gpu_pairing_lab.py",
    "test_group_hold_lab.py",
    "test_group_lock_lab.py",
    "test_group_lab.py",
    "test_history_plot_lab.py",
    "test_idmap_bind_lab.py",
    "test_installed_lab.py",
    "test_interrupted.py",
    "test_links_lab.py",
    "test_no_op_lab.py",
    "test_node_faults_lab.py",
    "test_one_owner_lab.py",
    "test_playbooks.py",
    "test_preflight.py",
    "test_progress_elsewhere_lab.py",
    "test_progress_file_lab.py",
    "test_progress_words_lab.py",
    "test_proxmox_cgroup_lab.py",
    "test_regex_bound_lab.py",
    "test_release_stream_lab.py",
    "test_round_trips.py",
    "test_secrets_lab.py",
    "test_stop_start_lab.py",
    "test_throughput_lab.py",
    "test_torch_lab.py",
    "test_upload_race_lab.py",
    "test_watch_lab.py",
    "test_whose_gpu_lab.py",
))


def needs_shared_lock(path):
    """Whether the lab test file at ``path`` must run alone among the files that share lab state."""
    return os.path.basename(str(path)) not in OWN_CONTAINERS


# The order of a parallel run (make test-lab). A run lasts as long as its busiest worker: each file's
# seconds in DURATIONS (what a run of the whole suite measured: DFLASH_LAB_DURATIONS=write records them)
# put the longest first, so that no long file starts last; a file not in the table counts as the longest.
# The files that hold the shared-state lock run one after another whatever happens: they are one unit of
# work, on one worker, in a row (SHARED_UNIT), never a worker blocked on the lock while others wait.
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
SHARED_UNIT = "tests/lab: the files that share lab state"


def _load_durations():
    try:
        with open(DURATIONS) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _unit_of(nodeid):
    path = nodeid.split("::", 1)[0]
    return SHARED_UNIT if _is_lab(path) and needs_shared_lock(path) else path


def _is_lab(path):
    return os.path.dirname(os.path.join(ROOT, path)) == os.path.dirname(DURATIONS)


def pytest_collection_modifyitems(items):
    """Longest unit of work first: the order xdist hands them out in (LabScheduling), and a plain run's.
    Tests from elsewhere (a run of tests/) keep their order, before these."""
    seconds = _load_durations()
    longest = max(seconds.values(), default=0.0)
    lab = [item for item in items if _is_lab(item.nodeid.split("::", 1)[0])]
    cost, first = {}, {}
    for index, item in enumerate(lab):
        path = item.nodeid.split("::", 1)[0]
        if path not in first:
            first[path] = index
            unit = _unit_of(path)
            first.setdefault(unit, index)
            cost[unit] = cost.get(unit, 0.0) + seconds.get(os.path.basename(path), longest)
    # stable: a file's tests keep their order, and a unit's files stay together
    lab.sort(key=lambda item: (-cost[_unit_of(item.nodeid)], first[_unit_of(item.nodeid)]))
    items[:] = [item for item in items if not _is_lab(item.nodeid.split("::", 1)[0])] + lab


_LOCK_WAITS = {}  # test file -> seconds its module waited for the shared-state lock (not its own time)
_SPENT = {}  # test file -> seconds of setup, call and teardown (DFLASH_LAB_DURATIONS=write)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    wait = _LOCK_WAITS.pop(str(item.path), None) if call.when == "setup" else None
    if wait is not None:
        outcome.get_result().user_properties.append(("lab_lock_wait_s", wait))


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    if os.environ.get("DFLASH_LAB_DURATIONS") == "write" and _is_lab(path):
        wait = sum(value for name, value in report.user_properties if name == "lab_lock_wait_s")
        base = os.path.basename(path)
        _SPENT[base] = _SPENT.get(base, 0.0) + report.duration - wait


def _write_durations():
    """Each file's seconds from this run, into DURATIONS (merged: files this run left out keep theirs)."""
    seconds = _load_durations()
    seconds.update({base: round(spent, 1) for base, spent in _SPENT.items()})
    with open(DURATIONS, "w") as fh:
        json.dump(dict(sorted(seconds.items())), fh, indent=1)
        fh.write("\n")


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, but the shared-state files are one unit (SHARED_UNIT), handed out in collection order."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # pylint: disable=import-outside-toplevel  # only under xdist

    class LabScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            return _unit_of(nodeid)

    config.option.loadscopereorder = False
    return LabScheduling(config, log)


@pytest.fixture(scope="module", autouse=True)
def _lab_shared_state(request):
    if not needs_shared_lock(request.path):
        yield
        return
    os.makedirs(LAB_STATE, exist_ok=True)
    with open(os.path.join(LAB_STATE, "tests-shared.lock"), "a") as lock:
        start = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, at the module's end
        _LOCK_WAITS[str(request.path)] = time.monotonic() - start
        yield


@pytest.fixture(scope="session", autouse=True)
def _no_stray_plays(tmp_path_factory):
    """A test that kills a play (the controller killed mid-restart) kills its process group; Ansible's task
    workers leave that group (each makes a session of its own), and one that was writing its result then blocks
    for ever on the queue its dead parent no longer reads. At the end of this process's tests, every play still
    running whose command line names this process's temporary directory (the tests' inventories live there) is
    such a stray: killed, so that a run leaves no process behind."""
    yield
    base = str(tmp_path_factory.getbasetemp())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                argv = fh.read().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if any(os.path.basename(a) == "ansible-playbook" for a in argv[:2]) and any(base in a for a in argv):
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass


UP_RECORD = "DFLASH_LAB_UP_RECORD"


def pytest_configure(config):
    """The session's record of the containers it brings up (lab.py up appends to it): set once, by the
    process that runs the session, and inherited by its xdist workers and every lab.py they start."""
    if hasattr(config, "workerinput") or os.environ.get(UP_RECORD):
        return
    os.makedirs(LAB_STATE, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="tests-up-", suffix=".ids", dir=LAB_STATE)
    os.close(fd)
    os.environ[UP_RECORD] = path
    config._dflash_up_record = path  # pylint: disable=protected-access  # ours: removed at the session's end


def pytest_sessionfinish(session):
    """A lab session takes down the containers it brought up (its record), but the Quick start's
    (DFLASH_LAB_IDS, default 200 201): after `make test` only those run. Only the process that ran
    the session does it (not each xdist worker), and only what this session brought up: another
    session's containers are left alone. DFLASH_LAB_KEEP=1 leaves them all up to look into."""
    path = getattr(session.config, "_dflash_up_record", None)
    if path is None:
        return
    if os.environ.get("DFLASH_LAB_DURATIONS") == "write" and _SPENT:
        _write_durations()
    try:
        with open(path) as fh:
            brought = sorted(set(fh.read().split()), key=int)
    finally:
        os.unlink(path)
        os.environ.pop(UP_RECORD, None)
    keep = set(os.environ.get("DFLASH_LAB_IDS", "200 201").split())
    ids = [vmid for vmid in brought if vmid not in keep]
    if not ids or session.config.option.collectonly or os.environ.get("DFLASH_LAB_KEEP") == "1":
        return
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "down", "--ids", *ids],
                   check=True, stdout=subprocess.DEVNULL)
