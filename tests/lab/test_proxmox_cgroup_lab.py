"""A container in Proxmox VE's cgroup layout (container 540): pve-container configures LXC with
lxc.cgroup.dir.container = lxc/<vmid> and lxc.cgroup.dir.container.inner = ns, so on the node the container's
processes live under /lxc/<vmid>/ns/... (plain LXC, the lab's default: /lxc.payload.<vmid>/...). `lab.py
cgroup-layout proxmox` gives a lab container that layout, made by LXC itself at the container's start.

With it: the node's view (trainer_gpu_host_view) attributes the trainer's GPU memory to the container and its
unit, read from the holders' /proc/<pid>/cgroup on the node; the doctor's cgroup check names the Proxmox path and
passes; and a frozen container (lxc-freeze, as vzdump's suspend mode) is named frozen at that path.

The node's nvidia-smi is the lab's, told by a list of this test's own that 540's GPUs are the node's; the node's
pct is the checkout's lab/pct (pct_path)."""
import glob
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
CT = "540"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 60,
        "trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer"),
        "trainer_gpus": [0, 1], "trainer_gpu_host_view": True,
        # the stand-in trainer on two GPUs: its target model on 0, its drafter on 1
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3", "FAKE_TRAINER_TARGET_GPUS": "0",
                        "FAKE_TRAINER_DRAFTER_GPUS": "1"}}


def lab_py(*args):
    subprocess.run(LAB_PY + list(args), check=True, stdout=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def inv(lab):
    lab_py("up", "--fresh", "--ids", CT)
    lab_py("cgroup-layout", "proxmox", "--ids", CT)
    # the node's nvidia-smi is run only from a directory nobody but root may write (not pytest's /tmp)
    base = pathlib.Path(tempfile.mkdtemp(prefix="dflash-pve-cgroup-", dir=os.path.expanduser("~")))
    path = base / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)}}, "vars": dict(
        lab.conn_vars(), ansible_pct_path=PCT, trainer_node_nvidia_smi=node_smi_of(base, CT))}}))
    yield str(path)
    subprocess.run(["lxc-unfreeze", "-n", CT], check=False)
    shutil.rmtree(str(base))


def run(*argv):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(list(argv), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def doctor(inv_path):
    res = run(sys.executable, "-m", "dflash_trainer", "doctor", "-q", "-i", inv_path, "-l", "ct", "-e",
              "trainer_target_hosts=all")
    lines = [line for line in res.stdout.splitlines() if line.startswith("  ") and not line.startswith("      ")]
    return res, {line[4:17].strip(): line for line in lines}


def test_lxc_puts_the_container_where_proxmox_does(lab, inv):
    pid = subprocess.run(["lxc-info", "-n", CT, "-p", "-H"], capture_output=True, text=True, check=True).stdout.strip()
    rows = pathlib.Path("/proc/%s/cgroup" % pid).read_text().splitlines()
    assert "0::/lxc/%s/ns/init.scope" % CT in rows, rows
    # the container's own view: its cgroup namespace begins at ns, it cannot see lxc/<vmid> above it
    assert lab.ct(CT, "cat", "/proc/1/cgroup").stdout.splitlines()[-1] == "0::/init.scope"


def test_the_node_view_attributes_the_trainers_memory_under_lxc_vmid_ns(lab, inv):
    res = run("ansible-playbook", "-i", inv, "deploy.yml", "-e", json.dumps(dict(FAST, trainer_force_restart=True)))
    out = " ".join((res.stdout + res.stderr).split()).replace("''", "'")
    assert res.returncode == 0, out[-5000:]
    assert "GPU 0: 60000 MiB held by dflash-trainer in CT %s" % CT in out, out[-5000:]
    assert "GPU 1: 30000 MiB held by dflash-trainer in CT %s" % CT in out, out[-5000:]
    # where the node view read it: the trainer's processes in the unit's cgroup under lxc/<vmid>/ns on the node
    unit = ["%s/lxc/%s/ns/system.slice/dflash-trainer.service/cgroup.procs" % (top, CT)
            for top in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")]
    procs = [p for p in unit if os.path.exists(p) and pathlib.Path(p).read_text().split()]
    assert procs, glob.glob("/sys/fs/cgroup/*/lxc/%s/ns/system.slice/*" % CT)


def test_the_doctor_names_the_proxmox_path_and_passes(lab, inv):
    res, checks = doctor(inv)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert "/lxc/%s/ns, Proxmox VE's layout, as the node view reads it; not frozen" % CT in checks["cgroup"], \
        res.stdout


def test_a_frozen_container_is_named_frozen_at_its_proxmox_path(lab, inv):
    subprocess.run(["lxc-freeze", "-n", CT], check=True)
    try:
        res, checks = doctor(inv)
    finally:
        subprocess.run(["lxc-unfreeze", "-n", CT], check=True)
    assert res.returncode == 1 and checks["cgroup"].startswith("  ✗"), res.stdout
    # a hybrid host's v1 freezer (/sys/fs/cgroup/freezer/lxc/540) or a v2 host's cgroup.events (/sys/fs/cgroup/lxc/540)
    assert "container %s is frozen (/sys/fs/cgroup/" % CT in checks["cgroup"], res.stdout
    assert "/lxc/%s" % CT in checks["cgroup"] and "lxc.payload" not in checks["cgroup"], res.stdout
    assert "`lxc-unfreeze -n %s`" % CT in res.stdout
    assert doctor(inv)[0].returncode == 0
