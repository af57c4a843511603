"""The field's node, in the lab (containers 440-441, and 449 which never exists):

- Proxmox's pct is Perl and a `die` in it exits with the errno of the moment (255 only when it
  is 0): with `lab.py pct-errno N --ids` the lab's pct does the same, and the connection still names
  the container that is missing or stopped, from pct's texts, at any exit status;
- a Proxmox config lock (`lab.py lock backup --ids`) refuses start/stop as Proxmox's check_lock does;
- nvidia-smi exit 15 (a GPU fell off the bus) in the container is the node's fault: refused before
  the stop, the trainer untouched, nothing uploaded; exit 14 (infoROM corrupted) comes with valid
  output: the deploy proceeds and the warning is shown.

The pct calls here run the checkout's lab/pct (the program lab.py installs as /usr/sbin/pct), so a
lab suite running from another checkout, which reinstalls its own copy, cannot change what they test.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB_PY = [sys.executable, os.path.join(ROOT, "lab", "lab.py")]
PCT = os.path.join(ROOT, "lab", "pct")
CT, STOPPED, MISSING = "440", "441", "449"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
        "trainer_target_hosts": "all"}


def lab_py(*args):
    subprocess.run(LAB_PY + list(args), check=True, stdout=subprocess.DEVNULL)


def pct(*args):
    return subprocess.run([PCT, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def cts(lab):
    lab_py("up", "--fresh", "--ids", CT, STOPPED)
    assert pct("stop", STOPPED).returncode == 0
    yield
    lab_py("pct-errno", "off", "--ids", STOPPED, MISSING)
    lab_py("lock", "off", "--ids", STOPPED)


def test_pct_errors_exit_as_perls_die_when_switched_on(cts):
    # the lab's default: 255, as before
    res = pct("exec", STOPPED, "--", "true")
    assert (res.returncode, res.stderr) == (255, "container '%s' not running!\n" % STOPPED)
    lab_py("pct-errno", "5", "--ids", STOPPED, MISSING)
    res = pct("exec", STOPPED, "--", "true")
    assert (res.returncode, res.stderr) == (5, "container '%s' not running!\n" % STOPPED)
    res = pct("push", STOPPED, "/etc/hostname", "/tmp/x")
    assert (res.returncode, res.stderr) == (5, "can only push files to a running CT\n")
    res = pct("status", MISSING)  # the failed open of the config leaves ENOENT
    assert res.returncode == 2 and res.stderr.endswith("lxc/%s.conf' does not exist\n" % MISSING)
    res = pct("exec", CT, "--", "sh", "-c", "exit 7")  # another container: untouched, the command's status
    assert res.returncode == 7
    lab_py("pct-errno", "0", "--ids", STOPPED)  # errno 0: Perl's die exits 255
    assert pct("exec", STOPPED, "--", "true").returncode == 255
    lab_py("pct-errno", "5", "--ids", STOPPED)


def test_a_proxmox_lock_refuses_start_and_shows_in_list(cts):
    lab_py("lock", "backup", "--ids", STOPPED)
    try:
        res = pct("start", STOPPED)
        assert "CT is locked (backup)\n" == res.stderr and res.returncode != 0
        row = [r.split() for r in pct("list").stdout.splitlines() if r.split()[:1] == [STOPPED]]
        assert row == [[STOPPED, "stopped", "backup", "ct" + STOPPED]]
    finally:
        lab_py("lock", "off", "--ids", STOPPED)
    assert "lock" not in pct("list").stdout.split("\n", 1)[1]


def ping(lab, tmp_path, vmid):
    host = dict(lab.conn_vars(), proxmox_vmid=int(vmid), ansible_pct_path=PCT)
    inv = tmp_path / ("inv-%s.json" % vmid)
    inv.write_text(json.dumps({"all": {"hosts": {"ct": host}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(["ansible", "ct", "-i", str(inv), "-m", "ansible.builtin.ping"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_connection_names_pcts_refusal_at_any_exit_status(lab, cts, tmp_path):
    lab_py("pct-errno", "5", "--ids", STOPPED, MISSING)
    res = ping(lab, tmp_path, STOPPED)
    out = res.stdout + res.stderr
    assert res.returncode == 4 and "UNREACHABLE" in out, out[-2000:]
    assert "container %s is not running on 127.0.0.1: container '%s' not running!" % (STOPPED, STOPPED) in out
    res = ping(lab, tmp_path, MISSING)
    out = res.stdout + res.stderr
    assert res.returncode == 4 and "no container %s on 127.0.0.1: Configuration file" % MISSING in out, out[-2000:]
    res = ping(lab, tmp_path, CT)  # a running container through the same pct: fine
    assert res.returncode == 0 and "ping: pong" in res.stdout, res.stdout[-2000:]


# ---- nvidia-smi's exit statuses in the container ---------------------------------------------

def deploy(inv_path, src, **extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    extra = dict(FAST, trainer_src=src, **extra)
    return subprocess.run(["ansible-playbook", "-i", inv_path, "deploy.yml", "-l", "nf", "-e", json.dumps(extra)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def tree(base, name):
    dst = base / name
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), dst)
    (dst / "VERSION").write_text(name + "\n")
    (dst / "fault.env").write_text("STARTUP_S=0.3\n")
    return str(dst)


def trainer(lab):
    out = lab.ct(CT, "systemctl", "show", "dflash-trainer", "-p", "MainPID", "-p", "InvocationID",
                 "-p", "ActiveState").stdout
    cur = lab.ct(CT, "readlink", "/opt/dflash-trainer/current").stdout.strip()
    releases = lab.ct(CT, "ls", "/opt/dflash-trainer/releases").stdout.split()
    return out, cur, releases


@pytest.fixture(scope="module")
def inv(lab, cts, tmp_path_factory):
    base = tmp_path_factory.mktemp("nodefaults")
    path = base / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"nf": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    res = deploy(str(path), tree(base, "good"))
    assert res.returncode == 0, res.stdout[-3000:]
    return str(path), base


def smi_exit(lab, code):
    lab.ct(CT, "python3", "-m", "fakegpu", "config", "--exit-code", code, check=True)


def test_a_gpu_off_the_bus_is_the_nodes_fault_refused_before_the_stop(lab, inv):
    inv_path, base = inv
    before = trainer(lab)
    assert "ActiveState=active" in before[0]
    smi_exit(lab, "15")
    try:
        res = deploy(inv_path, tree(base, "while-gpu-lost"))
    finally:
        smi_exit(lab, "off")
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "exit 15: GPU fell off the bus" in out and "the node's fault, not the trainer's" in out, out[-3000:]
    assert "GPU is lost" in out and "nothing was stopped or changed" in out
    assert "roll" not in out.lower().split("fatal")[-1]  # nothing rolled back: nothing had changed
    assert trainer(lab) == before  # same MainPID, InvocationID, current, and no release uploaded


def test_a_corrupted_inforom_warns_and_the_deploy_proceeds(lab, inv):
    inv_path, base = inv
    before = trainer(lab)
    smi_exit(lab, "14")
    try:
        res = deploy(inv_path, tree(base, "inforom"))
    finally:
        smi_exit(lab, "off")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "[WARNING]" in out and "infoROM is corrupted (nvidia-smi exit 14; its output is used)" in out
    after = trainer(lab)
    assert after[0] != before[0] and "ActiveState=active" in after[0]
    assert after[1] != before[1] and after[1].endswith(next(r for r in after[2] if r not in before[2]))


def test_a_missing_uvm_node_is_refused_before_the_stop_with_the_nodes_remedy(lab, inv):
    """After a node reboot nothing loaded nvidia-uvm: nvidia-smi works in the container, CUDA would
    not. The optional bind leaves an empty file after a container restart; live, the node is gone."""
    inv_path, base = inv
    before = trainer(lab)
    assert "ActiveState=active" in before[0]
    assert lab.ct(CT, "test", "-c", "/dev/nvidia-uvm").returncode == 0
    lab_py("dev-nodes", "--ids", CT, "--missing", "nvidia-uvm")
    try:
        assert lab.ct(CT, "test", "-e", "/dev/nvidia-uvm").returncode == 1
        assert lab.ct(CT, "nvidia-smi", "-L").returncode == 0  # nvidia-smi does not need it
        res = deploy(inv_path, tree(base, "without-uvm"))
    finally:
        lab_py("dev-nodes", "--ids", CT)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "/dev/nvidia-uvm is missing in the container" in out and "nvidia-modprobe -u -c=0" in out, out[-3000:]
    assert trainer(lab) == before
    assert lab.ct(CT, "test", "-c", "/dev/nvidia-uvm").returncode == 0
