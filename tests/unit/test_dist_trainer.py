"""The multi-node stand-in (examples/dist_trainer): its pure parts (knobs and fault.env, presence and
rendezvous judgement, FAULT_NODE), the lab's group mount line, and a few runs of real processes on
this host (two nodes in a temporary rendezvous directory, each with its own simulated GPUs)."""
import importlib.util
import os
import random
import signal
import subprocess
import sys

import pytest
from waiting import poll

from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIST_DIR = os.path.join(ROOT, "examples", "dist_trainer")
LAB_DIR = os.path.join(ROOT, "lab")
FAKEGPU_DIR = os.path.join(LAB_DIR, "fakegpu")


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dt = load("dist_trainer", os.path.join(DIST_DIR, "trainer.py"))


def cfg_of(tmp_path, env=None, fault_env=""):
    path = tmp_path / "fault.env"
    path.write_text(fault_env)
    return dt.load_config(environ=dict({"DIST_TRAINER_NODE_RANK": "0"}, **(env or {})), fault_env=str(path))


# --- knobs -------------------------------------------------------------------------------------

def test_defaults(tmp_path):
    cfg = cfg_of(tmp_path)
    assert cfg["NNODES"] == 2 and cfg["NODE_RANK"] == 0
    assert cfg["RDZV_DIR"] == "/mnt/dflash-rdzv"
    assert cfg["GPUS"] == list(range(8)) and cfg["MIB"] == 30000
    assert (cfg["STARTUP_S"], cfg["STEP_INTERVAL_S"], cfg["BEAT_S"], cfg["PEER_STALE_S"]) == (0.5, 0.5, 0.2, 2.0)
    assert cfg["TOKPS"] == 40000.0 and cfg["NCCL_TIMEOUT_S"] == 0.0
    assert cfg["FAULT"] == "none" and cfg["FAULT_NODE"] is None and cfg["CRASH_AFTER_STEPS"] == 5


def test_node_rank_is_required(tmp_path):
    (tmp_path / "fault.env").write_text("")
    with pytest.raises(dt.ConfigError, match="DIST_TRAINER_NODE_RANK is required"):
        dt.load_config(environ={"DIST_TRAINER_NNODES": "3"}, fault_env=str(tmp_path / "fault.env"))


def test_fault_env_overrides_environment(tmp_path):
    cfg = cfg_of(tmp_path, {"DIST_TRAINER_NNODES": "3", "DIST_TRAINER_FAULT": "exit_at_start",
                            "DIST_TRAINER_GPUS": "0,1"},
                 "# a release that crashes on node 2\nexport FAULT=crash_after_steps\nDIST_TRAINER_FAULT_NODE='2'\n"
                 "CRASH_AFTER_STEPS = 7\nNODE_RANK=1\n")
    assert cfg["NNODES"] == 3 and cfg["GPUS"] == [0, 1]
    assert (cfg["FAULT"], cfg["FAULT_NODE"], cfg["CRASH_AFTER_STEPS"], cfg["NODE_RANK"]) == \
        ("crash_after_steps", 2, 7, 1)


def test_empty_gpu_list_and_fault_node(tmp_path):
    cfg = cfg_of(tmp_path, {"DIST_TRAINER_GPUS": "", "DIST_TRAINER_FAULT_NODE": ""})
    assert cfg["GPUS"] == [] and cfg["FAULT_NODE"] is None


@pytest.mark.parametrize("env,fault_env,words", [
    ({"DIST_TRAINER_NODE_RANK": "2"}, "", "DIST_TRAINER_NODE_RANK=2 is not a rank of NNODES=2"),
    ({"DIST_TRAINER_NODE_RANK": "x"}, "", "DIST_TRAINER_NODE_RANK='x' is not a valid int"),
    ({"DIST_TRAINER_FAULT_NODE": "5"}, "", "DIST_TRAINER_FAULT_NODE=5 is not a rank"),
    ({"DIST_TRAINER_FAULT_NODE": "one"}, "", "DIST_TRAINER_FAULT_NODE='one' is not a valid node rank"),
    ({}, "FAULT=explode\n", "unknown fault mode 'explode'"),
    ({}, "NCCL_DEBUG=INFO\n", "unknown knob(s) NCCL_DEBUG"),
    ({}, "just words\n", "expected KEY=VALUE"),
    ({"DIST_TRAINER_GPUS": "0,a"}, "", "DIST_TRAINER_GPUS='0,a' is not a valid GPU list"),
    ({"DIST_TRAINER_NNODES": "0"}, "", "DIST_TRAINER_NNODES=0: at least 1 node"),
    ({"DIST_TRAINER_PEER_STALE_S": "0.1"}, "", "PEER_STALE_S=0.1 must be longer than DIST_TRAINER_BEAT_S"),
    ({"DIST_TRAINER_BEAT_S": "0"}, "", "DIST_TRAINER_BEAT_S=0.0 must be > 0"),
    ({"DIST_TRAINER_RDZV_DIR": ""}, "", "DIST_TRAINER_RDZV_DIR is empty"),
])
def test_bad_knobs_are_named(tmp_path, env, fault_env, words):
    with pytest.raises(dt.ConfigError) as info:
        cfg_of(tmp_path, env, fault_env)
    assert words in str(info.value)


@pytest.mark.parametrize("fault_node,rank,expected", [
    (None, 0, "crash_after_steps"), (None, 1, "crash_after_steps"),
    (1, 0, "none"), (1, 1, "crash_after_steps"), (0, 0, "crash_after_steps"),
])
def test_fault_node_restricts_the_fault(fault_node, rank, expected):
    cfg = {"FAULT": "crash_after_steps", "FAULT_NODE": fault_node, "NODE_RANK": rank}
    assert dt.fault_here(cfg) == expected


# --- presence and rendezvous -----------------------------------------------------------------

NOW = 1000.0


def rec(pid=10, release="r1", beat=NOW - 0.1, state="waiting", world=None, started=900.0):
    return {"pid": pid, "release": release, "started": started, "beat": beat, "state": state, "world": world}


@pytest.mark.parametrize("record,expected", [
    (None, False),
    (rec(), True),
    (rec(beat=NOW - 1.99), True),
    (rec(beat=NOW - 2.0), False),           # stale: a node that died without removing its file
    (rec(release="r2"), False),             # another release never trains with ours
    (rec(release=""), False),
    (rec(beat="999.9"), False),
    (rec(beat=True), False),
    ({"pid": 1}, False),
    ("garbage", False),
])
def test_presence(record, expected):
    assert dt.present(record, NOW, "r1", 2.0) is expected


def test_joinable():
    me = [1, 20, 950.0]
    assert dt.joinable(rec(), me, NOW, "r1", 2.0)
    assert dt.joinable(rec(state="training", world=[[0, 10, 900.0], me]), me, NOW, "r1", 2.0)
    # a world that has another process as rank 1 (ours before a restart) is not ours to join
    assert not dt.joinable(rec(state="training", world=[[0, 10, 900.0], [1, 19, 940.0]]), me, NOW, "r1", 2.0)
    assert not dt.joinable(rec(state="hung", world=[[0, 10, 900.0], me]), me, NOW, "r1", 2.0)
    assert not dt.joinable(rec(beat=NOW - 5), me, NOW, "r1", 2.0)


def test_missing_for_rendezvous_of_three():
    me = [0, 10, 900.0]
    records = {0: rec(), 1: rec(pid=11), 2: None}
    assert dt.missing_for_rendezvous(records, me, 3, NOW, "r1", 2.0) == [2]
    records[2] = rec(pid=12, release="r2")
    assert dt.missing_for_rendezvous(records, me, 3, NOW, "r1", 2.0) == [2]
    records[2] = rec(pid=12)
    records[1] = rec(pid=11, beat=NOW - 3)
    assert dt.missing_for_rendezvous(records, me, 3, NOW, "r1", 2.0) == [1]
    records[1] = rec(pid=11)
    assert dt.missing_for_rendezvous(records, me, 3, NOW, "r1", 2.0) == []
    assert dt.world_of(records, me, 3) == [me, [1, 11, 900.0], [2, 12, 900.0]]


def test_lost_peers():
    world = [[0, 10, 900.0], [1, 11, 901.0], [2, 12, 902.0]]
    good = {0: rec(pid=10, started=900.0, state="training", world=world),
            1: rec(pid=11, started=901.0, state="training", world=world),
            2: rec(pid=12, started=902.0)}  # still waiting to see the world: not lost
    assert dt.lost_peers(world, good, 0, NOW, "r1", 2.0) == []
    assert dt.lost_peers(world, dict(good) | {1: None}, 0, NOW, "r1", 2.0) == [1]
    assert dt.lost_peers(world, dict(good) | {2: rec(pid=12, started=902.0, beat=NOW - 9)}, 0, NOW, "r1", 2.0) == [2]
    # a restarted node (same rank, another process) is not the peer the world was formed with
    assert dt.lost_peers(world, dict(good) | {1: rec(pid=99, started=990.0)}, 0, NOW, "r1", 2.0) == [1]
    # a peer that hangs stalls the collective here too
    assert dt.lost_peers(world, dict(good) | {2: rec(pid=12, started=902.0, state="hung")}, 1, NOW, "r1", 2.0) == [2]
    # the node's own record is never judged
    assert dt.lost_peers(world, dict(good) | {0: None}, 0, NOW, "r1", 2.0) == []


def test_waiting_lines_are_rate_limited():
    assert dt.should_report(None, None, 0.0, [1])
    assert not dt.should_report(0.0, [1], 4.9, [1])
    assert dt.should_report(0.0, [1], 5.0, [1])
    assert not dt.should_report(0.0, [1, 2], 0.5, [1])
    assert dt.should_report(0.0, [1, 2], 1.0, [1])


def test_read_records_tolerates_torn_and_missing_files(tmp_path):
    (tmp_path / "node-0.json").write_text('{"pid": 3, "beat": 1.0}')
    (tmp_path / "node-1.json").write_text('{"pid": ')
    assert dt.read_records(str(tmp_path), 3) == {0: {"pid": 3, "beat": 1.0}, 1: None, 2: None}


# --- what the collection reads --------------------------------------------------------------

def test_progress_line_is_the_single_host_stand_ins_and_the_collection_reads_it():
    single = load("single_trainer", os.path.join(ROOT, "examples", "trainer", "trainer.py"))
    for step in (1, 2, 50):
        assert dt.progress_line(step, random.Random(7), 40000.0) == \
            single.progress(step, random.Random(7), 40000.0, "step")
    log = tl.LogAnalysis().extend([
        "rendezvous: waiting for nodes [1] (NNODES=2)", "rendezvous complete: world of 2 nodes, release r1",
    ] + [dt.progress_line(n, random.Random(n), 40000.0).rstrip("\n") for n in (1, 2, 3)]
        + ["NCCL watchdog: waiting for peer node-1 (collective stalled)"])
    assert log.steps == [1, 2, 3] and 38000 < log.tok_s < 42000
    assert log.first_error is None  # a hang is a stall (no progress), not an error line


def test_watchdog_timeout_lines():
    lines = dt.watchdog_timeout_lines(8, 12, 30.0, 30.2)
    assert "[Rank 8] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE" in lines[0]
    assert "Timeout(ms)=30000) ran for 30200 milliseconds before timing out." in lines[0]
    assert lines[0].startswith("[rank8]:[E")


# --- lab: the group's mount line --------------------------------------------------------------

def test_group_mount_line_kept_once_beside_torch():
    sys.path.insert(0, LAB_DIR)
    try:
        lab = load("lab_lab", os.path.join(LAB_DIR, "lab.py"))
    finally:
        sys.path.remove(LAB_DIR)
    torch = "lxc.mount.entry = /var/cache/dflash-lab/torch opt/dflash-lab-torch none bind,ro,create=dir 0 0\n"
    line = lab.rdzv_line("g1")
    assert line == ("lxc.mount.entry = %s/g1 mnt/dflash-rdzv none bind,rw,create=dir 0 0\n" % lab.RDZV_DIR)
    once = lab.with_rdzv_line(torch, line)
    assert once == torch + line
    assert lab.with_rdzv_line(once, line) == once  # idempotent
    moved = lab.with_rdzv_line(once, lab.rdzv_line("g2"))  # another group: its line replaces the old one
    assert moved == torch + lab.rdzv_line("g2")
    assert lab.with_rdzv_line(torch.rstrip("\n"), line) == torch + line
    assert lab.GROUP_NAME.match("t330") and not lab.GROUP_NAME.match("../x") and not lab.GROUP_NAME.match("a b")


# --- real processes on this host ------------------------------------------------------------

class Node:
    def __init__(self, tmp_path, rank, release="r1", **knobs):
        self.rank = rank
        self.out = tmp_path / ("n%d.out" % rank)
        self.err = tmp_path / ("n%d.err" % rank)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DIST_TRAINER_")}
        env.update({"FAKEGPU_STATE_DIR": str(tmp_path / ("gpu%d" % rank)), "PYTHONPATH": FAKEGPU_DIR,
                    "DFLASH_RELEASE": release})
        knobs = dict({"NODE_RANK": rank, "RDZV_DIR": tmp_path / "rdzv", "STARTUP_S": 0, "STEP_INTERVAL_S": 0.05,
                      "BEAT_S": 0.05, "PEER_STALE_S": 0.5, "GPUS": "0,1", "MIB": 1000}, **knobs)
        env.update({"DIST_TRAINER_%s" % k: str(v) for k, v in knobs.items()})
        (tmp_path / "rdzv").mkdir(exist_ok=True)
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, os.path.join(DIST_DIR, "trainer.py")], env=env,
                                         stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        self.rdzv_file = tmp_path / "rdzv" / ("node-%d.json" % rank)

    def text(self, err=False):
        return (self.err if err else self.out).read_text()

    def steps(self):
        return [int(line.split()[0][5:]) for line in self.text().splitlines() if line.startswith("step=")]

    def wait(self, words, err=False, timeout=10.0):
        return poll(lambda: words in self.text(err), timeout, what="%r in node %d's output (%r / %r)" % (
            words, self.rank, self.text()[-500:], self.text(True)[-500:]))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)  # a bound, not a speed: a node that ignored SIGTERM would wait for ever


@pytest.fixture
def nodes(tmp_path):
    made = []

    def make(rank, **kw):
        made.append(Node(tmp_path, rank, **kw))
        return made[-1]
    yield make
    for node in made:
        if node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait(5)


def test_no_node_rank_exits_2_naming_the_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIST_TRAINER_")}
    res = subprocess.run([sys.executable, os.path.join(DIST_DIR, "trainer.py")], env=env, capture_output=True,
                         text=True, timeout=30, check=False)
    assert res.returncode == 2 and "DIST_TRAINER_NODE_RANK is required" in res.stderr, res


def test_two_nodes_train_then_sigterm_leaves_cleanly(nodes):
    n0, n1 = nodes(0), nodes(1)
    n0.wait("rendezvous complete: world of 2 nodes, release r1")
    poll(lambda: len(n0.steps()) >= 3, what="3 steps on node 0")
    assert not n1.steps()  # the other nodes print no progress
    assert n1.stop() == 0  # within stop()'s bound: a SIGTERM'd node leaves, it is not killed
    assert not n1.rdzv_file.exists()
    n0.wait("NCCL watchdog: waiting for peer node-1 (collective stalled)", err=True)
    assert n0.proc.poll() is None  # hung, not dead
    assert n0.stop() == 0 and not n0.rdzv_file.exists()


def test_crash_after_steps_on_one_node_hangs_the_other_until_the_watchdog(nodes):
    # node 1 crashes a second after the rendezvous: node 0 (polling every 50 ms) has joined by then
    knobs = {"FAULT": "crash_after_steps", "FAULT_NODE": 1, "CRASH_AFTER_STEPS": 10, "STEP_INTERVAL_S": 0.1,
             "NCCL_TIMEOUT_S": 0.5}
    n0, n1 = nodes(0, **knobs), nodes(1, **knobs)
    assert n1.proc.wait(10) == 1
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in n1.text(True)
    assert n1.text(True).startswith("Traceback (most recent call last):")
    assert not n1.rdzv_file.exists()
    assert n0.proc.wait(10) == 1  # node 0 ran on (FAULT_NODE=1), stalled, and its watchdog took it down
    assert "NCCL watchdog: waiting for peer node-1 (collective stalled)" in n0.text(True)
    assert "[Rank 0] Watchdog caught collective operation timeout" in n0.text(True)
    assert 2 <= len(n0.steps()) <= 15 and "Traceback" not in n0.text(True)


@pytest.mark.parametrize("fault,final", [
    ("exit_at_start", "ImportError: libnccl.so.2: cannot open shared object file"),
    ("crash_before_rdzv", "RendezvousConnectionError: The connection to the C10d store has failed."),
])
def test_start_faults_exit_1_before_the_rendezvous(nodes, fault, final):
    n0 = nodes(0, FAULT=fault)
    assert n0.proc.wait(10) == 1
    assert final in n0.text(True) and "Traceback (most recent call last):" in n0.text(True)
    assert not n0.rdzv_file.exists() and "rendezvous" not in n0.text()


def test_sigterm_while_waiting_leaves_the_rendezvous(nodes):
    n0 = nodes(0)
    n0.wait("rendezvous: waiting for nodes [1] (NNODES=2)")
    poll(n0.rdzv_file.exists, what="node 0's file")
    assert n0.stop() == 0
    assert not n0.rdzv_file.exists() and not n0.steps()
    assert "received SIGTERM" in n0.text()


def test_missing_rendezvous_dir_exits_2_naming_the_knob(nodes, tmp_path):
    n0 = nodes(0, RDZV_DIR=tmp_path / "nowhere")
    assert n0.proc.wait(10) == 2
    assert "DIST_TRAINER_RDZV_DIR=%s is not a directory" % (tmp_path / "nowhere") in n0.text(True)


def test_three_nodes_a_killed_node_stalls_both_others(nodes):
    group = [nodes(rank, NNODES=3) for rank in range(3)]
    for node in group:
        node.wait("rendezvous complete: world of 3 nodes, release r1")
    poll(lambda: len(group[0].steps()) >= 2, what="2 steps on node 0")
    group[2].proc.kill()  # no clean-up: its file stays until its beat goes stale
    group[2].proc.wait(5)
    assert group[2].rdzv_file.exists()
    for node in group[:2]:  # the one that sees node 2 gone first names it; the other may name that one
        node.wait("(collective stalled)", err=True)
        assert node.proc.poll() is None
    assert "waiting for peer node-2" in group[0].text(True) + group[1].text(True)
    seen = group[0].steps()
    poll(lambda: group[1].text(True).count("collective stalled") == 1, what="node 1 stalled once")
    assert group[0].steps() == seen
