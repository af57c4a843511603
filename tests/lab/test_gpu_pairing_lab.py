"""GPUs paired by UUID between the container and the node (container 235).

On a shared node a container is given some of the node's GPUs: it numbers them 0..k-1 while the node numbers
them by slot. Here 235 holds the node's GPUs 5 and 3 (fakegpu's node_slots) as its GPUs 0 and 1, and its trainer
runs on both. The node's view (trainer_gpu_host_view) must judge the node's GPUs 5 and 3 - by the container's
index it would judge the node's GPUs 0 and 1, where the trainer holds nothing, and call a proved trainer's GPUs
empty - and its lines name both numbers. The node's nvidia-smi is the lab's, told by a list of this test's own
that 235's GPUs are the node's (`lab.py node-gpus`, which other tests set, is left alone).

In each of the three ways nvidia-smi inside a container lists processes, as drivers do under LXC: the
processes themselves, none, or host PIDs it cannot see (`[Not Found]`) - the proof then counts each GPU's memory
less what it held before the start, and says so."""
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
LAB = os.path.join(ROOT, "lab", "lab.py")
CT = "235"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 60,
        "trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer"),
        "trainer_gpus": [0, 1], "trainer_gpu_host_view": True,
        # the stand-in trainer on the container's two GPUs: its target model on 0, its drafter on 1
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3", "FAKE_TRAINER_TARGET_GPUS": "0",
                        "FAKE_TRAINER_DRAFTER_GPUS": "1"}}


@pytest.fixture(scope="module")
def paired(lab):
    subprocess.run([sys.executable, LAB, "up", "--fresh", "--ids", CT], check=True, stdout=subprocess.DEVNULL)
    assert lab.ct(CT, "python3", "-m", "fakegpu", "config", "--node-slots", "5,3").returncode == 0
    # the node's nvidia-smi is run only from a directory nobody but root may write (not pytest's /tmp)
    base = pathlib.Path(tempfile.mkdtemp(prefix="dflash-pairing-", dir=os.path.expanduser("~")))
    smi = node_smi_of(base, CT)
    inv = base / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)}}, "vars": dict(
        lab.conn_vars(), trainer_node_nvidia_smi=str(smi))}}))
    yield str(inv)
    shutil.rmtree(str(base))


@pytest.mark.parametrize("listing,counted", [
    ("off", "memory held by the processes of"),
    ("empty", "the container's nvidia-smi lists no processes"),
    ("host-pids", "lists processes this container cannot attribute"),
])
def test_the_node_view_judges_the_containers_gpus_by_uuid_and_names_both_numbers(lab, paired, listing, counted):
    assert lab.ct(CT, "python3", "-m", "fakegpu", "config", "--passthrough", listing).returncode == 0
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    try:
        res = subprocess.run(["ansible-playbook", "-i", paired, "deploy.yml", "-e",
                              json.dumps(dict(FAST, trainer_force_restart=True))],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    finally:
        lab.ct(CT, "python3", "-m", "fakegpu", "config", "--passthrough", "off")
    # the callback wraps long messages, and quotes them in YAML ('the node''s')
    out = " ".join((res.stdout + res.stderr).split()).replace("''", "'")
    assert res.returncode == 0, out[-5000:]
    assert counted in out, out[-5000:]
    assert "GPU 0 (the node's GPU 5): 60000 MiB held by dflash-trainer in CT %s" % CT in out, out[-5000:]
    assert "GPU 1 (the node's GPU 3): 30000 MiB held by dflash-trainer in CT %s" % CT in out, out[-5000:]
    # the container sees its two GPUs only, the node lists the trainer's memory at slots 5 and 3
    assert lab.ct(CT, "nvidia-smi", "-L").stdout.count("GPU ") == 2
    node = subprocess.run([json.loads(pathlib.Path(paired).read_text())["all"]["vars"]["trainer_node_nvidia_smi"],
                           "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    used = {int(i): int(m) for i, m in (row.split(", ") for row in node.splitlines())}
    assert used[5] == 60000 and used[3] == 30000 and used[0] == used[1] == 0, node
