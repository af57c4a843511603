"""`dflash-trainer doctor` and playbooks/doctor.yml against the lab (container 490; 499 never exists): every line
✓ and exit 0 on a healthy fresh container; each fault the lab can inject named on one ✗ line with its remedy
and a non-zero exit - the container stopped, a Proxmox lock, the container frozen, /dev/nvidia-uvm missing,
nvidia-smi exiting 9, GPUs the node does not list, no such container, the node unreachable (exit 3); GPUs the
container numbers otherwise than the node paired by UUID. Read-only: the container is as it was after each run.

The node's nvidia-smi is the lab's, told by a list of this test's own that 490's GPUs are the node's
(FAKEGPU_NODE_TENANTS_FILE: `lab.py node-gpus`, which other tests set, is left alone).

The node's pct is the checkout's lab/pct (the program lab.py installs as /usr/sbin/pct, through pct_path), so a
lab suite running from another checkout, which reinstalls its own copy, cannot change what these test."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

from labkit import node_smi_of

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB_PY = [sys.executable, os.path.join(ROOT, "lab", "lab.py")]
PCT = os.path.join(ROOT, "lab", "pct")
CT, MISSING = "490", "499"
NAMES = ["ssh", "privilege", "pct", "container", "lock", "cgroup", "pct exec", "systemd", "python", "nvidia-smi",
         "GPU pairing", "device nodes", "free space", "clock"]


def lab_py(*args):
    subprocess.run(LAB_PY + list(args), check=True, stdout=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def node_smi():
    """The node's nvidia-smi, 490's GPUs its own; and one of another node (its GPUs none of 490's)."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="dflash-doctor-", dir=os.path.expanduser("~")))
    ours, other = node_smi_of(base, CT), base / "nvidia-smi-other-node"
    other.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-4000-8000-000000000000)'\n")
    other.chmod(0o755)
    yield {"ours": ours, "other": str(other)}
    shutil.rmtree(str(base))


@pytest.fixture(scope="module")
def inv(lab, node_smi, tmp_path_factory):
    lab_py("up", "--fresh", "--ids", CT)
    path = tmp_path_factory.mktemp("doctor") / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)}}, "vars": dict(
        lab.conn_vars(), ansible_pct_path=PCT, trainer_node_nvidia_smi=node_smi["ours"])}}))
    yield str(path)
    lab_py("lock", "off", "--ids", CT)
    lab_py("dev-nodes", "--ids", CT)
    subprocess.run(["lxc-unfreeze", "-n", CT], check=False)
    lab.ct(CT, "python3", "-m", "fakegpu", "config", "--node-slots", "off")


def doctor(inv_path, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run([sys.executable, "-m", "dflash_trainer", "doctor", "-q", "-i", inv_path, "-l", "ct",
                          "-e", "trainer_target_hosts=all", *extra], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    lines = [line for line in res.stdout.splitlines() if line.startswith("  ") and not line.startswith("      ")]
    return res, {line[4:17].strip(): line for line in lines}


def crosses(checks):
    return {name: line for name, line in checks.items() if line.startswith("  ✗")}


def test_a_healthy_fresh_container_holds_every_assumption(lab, inv):
    res, checks = doctor(inv)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert list(checks) == NAMES and all(line.startswith("  ✓") for line in checks.values()), res.stdout
    assert res.stdout.startswith("ct: every assumption holds")


def test_record_writes_what_the_node_answered_and_it_replays_to_the_printed_lines(lab, inv, tmp_path):
    """doctor --record DIR: one HOST.json (0600) that the collection's judge replays to the lines printed; the
    trainer's environment values never in it."""
    from ansible_collections.dflash.trainer.plugins.plugin_utils import _doctor

    where = tmp_path / "records"
    res, checks = doctor(inv, "--record", str(where), "-e", '{"trainer_env": {"HF_TOKEN": "hf_doctor_secret_1"}}')
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    path = where / "ct.json"
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(where.stat().st_mode & 0o777) == "0o700"
    rec = json.loads(path.read_text())
    assert "hf_doctor_secret_1" not in path.read_text()
    assert str(rec["params"]["vmid"]) == CT and "@@dflash-doctor" in rec["node"]["stdout"] + rec["container"]["stdout"]
    replayed = _doctor.replay(rec)["lines"]
    assert replayed == rec["lines"] and [line[:14].strip("✓✗? ") for line in replayed] == NAMES
    assert [line.strip() for line in checks.values()] == [line.strip() for line in replayed], res.stdout


def test_the_playbook_says_the_same_for_users_without_the_cli(lab, inv):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run(["ansible-playbook", "-i", inv, "playbooks/doctor.yml", "-e", "trainer_target_hosts=all"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0 and "✓ nvidia-smi" in res.stdout and "changed=0" in res.stdout, res.stdout[-3000:]
    lab_py("lock", "backup", "--ids", CT)
    try:
        res = subprocess.run(["ansible-playbook", "-i", inv, "playbooks/doctor.yml", "-e", "trainer_target_hosts=all"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    finally:
        lab_py("lock", "off", "--ids", CT)
    out = " ".join(res.stdout.split())
    assert res.returncode != 0 and "doctor: 1 of 14 assumptions do not hold: ✗ lock" in out, out[-3000:]


def test_a_proxmox_lock_is_one_cross(lab, inv):
    lab_py("lock", "backup", "--ids", CT)
    try:
        res, checks = doctor(inv)
    finally:
        lab_py("lock", "off", "--ids", CT)
    assert res.returncode == 1 and list(crosses(checks)) == ["lock"], res.stdout
    assert "locked by Proxmox (lock: backup)" in checks["lock"]
    assert "remedy: wait for the backup to end, or `pct unlock 490`" in res.stdout


def test_a_missing_nvidia_uvm_is_one_cross(lab, inv):
    lab_py("dev-nodes", "--ids", CT, "--missing", "nvidia-uvm")
    try:
        res, checks = doctor(inv)
    finally:
        lab_py("dev-nodes", "--ids", CT)
    assert res.returncode == 1 and list(crosses(checks)) == ["device nodes"], res.stdout
    assert "/dev/nvidia-uvm is missing in the container" in checks["device nodes"]
    assert "nvidia-modprobe -u -c=0" in res.stdout


def test_nvidia_smi_exit_9_is_named(lab, inv):
    lab.ct(CT, "python3", "-m", "fakegpu", "config", "--exit-code", "9", check=True)
    try:
        res, checks = doctor(inv)
    finally:
        lab.ct(CT, "python3", "-m", "fakegpu", "config", "--exit-code", "off", check=True)
    assert res.returncode == 1 and list(crosses(checks)) == ["nvidia-smi"], res.stdout
    assert "exit 9: driver not loaded" in checks["nvidia-smi"]
    assert "remedy: the NVIDIA driver on the node is not loaded" in res.stdout


def test_no_such_container(lab, inv):
    res, checks = doctor(inv, "-e", "proxmox_vmid=%s" % MISSING)
    assert res.returncode == 1 and list(crosses(checks)) == ["container"], res.stdout
    assert "no container %s on 127.0.0.1" % MISSING in checks["container"]


def test_the_node_unreachable_is_the_first_cross_and_exit_3(lab, inv):
    res, checks = doctor(inv, "-e", "ansible_port=1")
    assert res.returncode == 3 and list(crosses(checks)) == ["ssh"], res.stdout
    assert list(checks)[0] == "ssh" and "unreachable (ssh)" in checks["ssh"]
    res, checks = doctor(inv, "-e", "ansible_pct_known_hosts_file=/dev/null")
    assert res.returncode == 3 and "host key of 127.0.0.1 was not accepted" in checks["ssh"], res.stdout


def test_a_stopped_container_is_one_cross(lab, inv):
    subprocess.run(["lxc-stop", "-n", CT, "-k"], check=True)
    try:
        res, checks = doctor(inv)
    finally:
        lab_py("up", "--ids", CT)
    assert res.returncode == 1 and list(crosses(checks)) == ["container"], res.stdout
    assert "container 490 is not running (status: stopped)" in checks["container"]
    assert "remedy: start it: `pct start 490` on the node" in res.stdout
    assert doctor(inv)[0].returncode == 0  # back, and nothing the doctor did is left behind


def test_a_frozen_container_is_one_cross_and_is_not_entered(lab, inv):
    """A suspend-mode backup freezes the container (lxc-freeze, as vzdump does): pct exec would hang in it, so the
    doctor reads its cgroup on the node, says so, and asks nothing inside."""
    subprocess.run(["lxc-freeze", "-n", CT], check=True)
    try:
        res, checks = doctor(inv)
    finally:
        subprocess.run(["lxc-unfreeze", "-n", CT], check=True)
    assert res.returncode == 1 and list(crosses(checks)) == ["cgroup"], res.stdout
    # the lab host's cgroup layout decides where the freeze shows: a v2 host's cgroup.events, a hybrid's v1 freezer
    assert "container 490 is frozen (/sys/fs/cgroup/" in checks["cgroup"] and "lxc.payload.490" in checks["cgroup"]
    assert "`lxc-unfreeze -n 490`" in res.stdout
    assert "not checked: the container is frozen" in checks["clock"]
    res, checks = doctor(inv)
    assert res.returncode == 0 and "LXC's layout, as the node view reads it; not frozen" in checks["cgroup"], res.stdout


def test_gpus_numbered_otherwise_in_the_container_are_paired_by_uuid(lab, inv, node_smi):
    """490 given the node's GPUs 5 and 3 (fakegpu's node_slots): it numbers them 0 and 1; the node's own
    nvidia-smi lists them at 5 and 3 - paired by UUID. A node whose GPUs are none of the container's: one cross."""
    lab.ct(CT, "python3", "-m", "fakegpu", "config", "--node-slots", "5,3", check=True)
    try:
        res, checks = doctor(inv)
        assert res.returncode == 0, res.stdout + res.stderr[-3000:]
        assert "by UUID: GPU 0 is the node's GPU 5, GPU 1 is the node's GPU 3" in checks["GPU pairing"], res.stdout
        res, checks = doctor(inv, "-e", "trainer_node_nvidia_smi=%s" % node_smi["other"])
    finally:
        lab.ct(CT, "python3", "-m", "fakegpu", "config", "--node-slots", "off", check=True)
    assert res.returncode == 1 and list(crosses(checks)) == ["GPU pairing"], res.stdout
    assert "the node does not list the container's GPU 0 (GPU-" in checks["GPU pairing"]
    res, checks = doctor(inv)
    assert res.returncode == 0 and "the container's 8 GPU(s) are the node's, numbered alike" in checks["GPU pairing"]
