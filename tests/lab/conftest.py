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


@pytest.fixture(scope="module", autouse=True)
def _lab_shared_state(request):
    if not needs_shared_lock(request.path):
        yield
        return
    os.makedirs(LAB_STATE, exist_ok=True)
    with open(os.path.join(LAB_STATE, "tests-shared.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, at the module's end
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
