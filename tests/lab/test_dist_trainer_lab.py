"""The multi-node stand-in (examples/dist_trainer) across two lab containers, 330 and 331, that share
a rendezvous directory through `lab.py group --name t330 --ids 330 331 --fresh`:

- both nodes started: the rendezvous completes, node 0 prints step lines, both nodes hold GPU memory;
- node 0 alone: it waits for node 1 (says so), prints no step line and allocates nothing;
- node 1 stopped while both train: node 0 stops stepping and keeps running with its memory held, and
  does not resume when node 1 comes back (node 1 then waits: a hung node joins no new world);
- two releases never rendezvous.
Each node runs as a transient unit (systemd-run) inside its container, its output in a file there."""
import os
import re
import subprocess
import sys

import pytest

from labkit import holds, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "examples", "dist_trainer")
GROUP = "t330"
CTS = ("330", "331")  # node rank = position
UNIT = "dist-test"
DEST = "/opt/dist"
OUT, ERR = "/run/dist-test.out", "/run/dist-test.err"
RDZV = "/mnt/dflash-rdzv"
INTERVAL = 0.2
# PEER_STALE_S: no test here loses a peer by a stale beat (a stopped node removes its file), so it is wide: at 1 s a
# live peer whose beat a loaded machine held back for a second looked gone and the world hung
KNOBS = {"STARTUP_S": "0.1", "STEP_INTERVAL_S": str(INTERVAL), "BEAT_S": "0.1", "PEER_STALE_S": "10.0",
         "MIB": "30000"}
STEP = re.compile(r"^step=(\d+) loss=\d+\.\d{4} tok/s=\d+\.\d ", re.M)
WINDOW = 10 * INTERVAL  # an absence check: ten steps' time with nothing new


@pytest.fixture(scope="module")
def group(lab):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "group", "--name", GROUP,
                    "--ids", *CTS, "--fresh"], check=True, stdout=subprocess.DEVNULL)
    for ct in CTS:
        for name, mode in (("trainer.py", "0644"), ("run.sh", "0755")):
            with open(os.path.join(SRC, name), "rb") as fh:
                res = lab.ct(ct, "sh", "-c", 'mkdir -p "$1" && cat > "$1/$2" && chmod "$3" "$1/$2"', "sh",
                             DEST, name, mode, input=fh.read(), text=False)
            assert res.returncode == 0, res.stderr
    yield lab
    for ct in CTS:
        stop(lab, ct)


@pytest.fixture
def nodes(group):
    for ct in CTS:
        stop(group, ct)
    yield group
    for ct in CTS:
        stop(group, ct)


def stop(lab, ct):
    lab.ct(ct, "systemctl", "stop", UNIT)
    lab.ct(ct, "systemctl", "reset-failed", UNIT)


def start(lab, rank, release="r1"):
    ct = CTS[rank]
    env = dict(KNOBS, NODE_RANK=str(rank))
    argv = ["systemd-run", "--unit", UNIT, "--collect", "-p", "StandardOutput=truncate:" + OUT,
            "-p", "StandardError=truncate:" + ERR, "--setenv=DFLASH_RELEASE=" + release]
    argv += ["--setenv=DIST_TRAINER_%s=%s" % kv for kv in sorted(env.items())]
    res = lab.ct(ct, *argv, DEST + "/run.sh")
    assert res.returncode == 0, res.stderr


def out(lab, rank, path=OUT):
    return lab.ct(CTS[rank], "cat", path).stdout


def steps(lab, rank):
    return [int(n) for n in STEP.findall(out(lab, rank))]


def active(lab, rank):
    return lab.ct(CTS[rank], "systemctl", "is-active", UNIT).stdout.strip() == "active"


def gpus_mib(lab, rank):
    res = lab.ct(CTS[rank], "nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert res.returncode == 0, res.stderr
    return {int(i): int(m) for i, m in (line.split(",") for line in res.stdout.splitlines() if line.strip())}


def holds_memory(lab, rank):
    used = gpus_mib(lab, rank)
    return len(used) == 8 and all(m >= 30000 for m in used.values())


def test_two_nodes_train_and_hold_memory(nodes):
    start(nodes, 0)
    start(nodes, 1)
    assert wait_for(lambda: len(steps(nodes, 0)) >= 3, timeout=15), (out(nodes, 0), out(nodes, 0, ERR))
    # polled: node 0 may train as soon as node 1 is joinable, before node 1 has said so and allocated
    assert wait_for(lambda: "rendezvous complete: world of 2 nodes, release r1" in out(nodes, 1), timeout=15), \
        out(nodes, 1)
    assert holds_memory(nodes, 0), gpus_mib(nodes, 0)
    assert wait_for(lambda: holds_memory(nodes, 1), timeout=15), gpus_mib(nodes, 1)
    assert not STEP.search(out(nodes, 1)), out(nodes, 1)  # torchrun's other nodes print no progress
    assert wait_for(lambda: max(steps(nodes, 0)) >= 5, timeout=10), steps(nodes, 0)  # it keeps going


def test_node_zero_alone_waits_without_progress(nodes):
    start(nodes, 0)
    assert wait_for(lambda: "rendezvous: waiting for nodes [1] (NNODES=2)" in out(nodes, 0), timeout=15), \
        (out(nodes, 0), out(nodes, 0, ERR))
    assert holds(lambda: not STEP.search(out(nodes, 0)) and active(nodes, 0), WINDOW), out(nodes, 0)
    assert "rendezvous complete" not in out(nodes, 0)
    assert all(m < 1024 for m in gpus_mib(nodes, 0).values()), gpus_mib(nodes, 0)


def test_lost_peer_hangs_node_zero_for_good(nodes):
    start(nodes, 0)
    start(nodes, 1)
    assert wait_for(lambda: len(steps(nodes, 0)) >= 2, timeout=15), (out(nodes, 0), out(nodes, 0, ERR))
    stop(nodes, CTS[1])
    # node 1 left cleanly: its node file is gone and its memory is free
    assert nodes.ct(CTS[1], "test", "-e", RDZV + "/node-1.json").returncode == 1
    assert all(m < 1024 for m in gpus_mib(nodes, 1).values()), gpus_mib(nodes, 1)
    stalled = "NCCL watchdog: waiting for peer node-1 (collective stalled)"
    assert wait_for(lambda: stalled in out(nodes, 0, ERR), timeout=10), (out(nodes, 0), out(nodes, 0, ERR))
    seen = steps(nodes, 0)
    assert holds(lambda: steps(nodes, 0) == seen and active(nodes, 0), WINDOW), (seen, steps(nodes, 0))
    assert holds_memory(nodes, 0), gpus_mib(nodes, 0)
    # node 1 back: node 0's communicator is gone, it stays hung; node 1 waits for a node 0 that can join
    start(nodes, 1)
    assert wait_for(lambda: "rendezvous: waiting for nodes [0] (NNODES=2)" in out(nodes, 1), timeout=15), \
        (out(nodes, 1), out(nodes, 1, ERR))
    assert holds(lambda: steps(nodes, 0) == seen and active(nodes, 0), WINDOW), (seen, steps(nodes, 0))
    assert "rendezvous complete" not in out(nodes, 1), out(nodes, 1)
    assert out(nodes, 0, ERR).count(stalled) == 1, out(nodes, 0, ERR)


def test_two_releases_never_rendezvous(nodes):
    start(nodes, 0, release="r1")
    start(nodes, 1, release="r2")
    for rank, other in ((0, 1), (1, 0)):
        assert wait_for(lambda r=rank, o=other: "rendezvous: waiting for nodes [%d] (NNODES=2)" % o in out(nodes, r),
                        timeout=15), (out(nodes, rank), out(nodes, rank, ERR))
    # both beat (their files are there, each with its own release), and neither trains
    assert wait_for(lambda: nodes.ct(CTS[0], "test", "-e", RDZV + "/node-1.json").returncode == 0, timeout=5)
    assert holds(lambda: not any("rendezvous complete" in out(nodes, r) for r in (0, 1)), WINDOW), \
        (out(nodes, 0), out(nodes, 1))
    assert not STEP.search(out(nodes, 0)), out(nodes, 0)
    assert all(m < 1024 for m in gpus_mib(nodes, 0).values()), gpus_mib(nodes, 0)
