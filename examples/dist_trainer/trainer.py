"""Stand-in for one node of a torchrun multi-node job (NCCL), with injectable faults.

Each node (one container) runs one copy with its own NODE_RANK. The nodes rendezvous through a
shared directory (RDZV_DIR, which the lab bind-mounts into each container: lab containers have
no network): each writes ``node-<rank>.json`` and refreshes it every BEAT_S. Once every node is
there (fresh beat, same release) they form a world, allocate GPU memory through fakegpu and
train; node 0 prints one progress line per step. When a peer of the world goes away the others
stop making progress and hang, alive and holding their memory, as ranks blocked in an NCCL
collective do, and never recover. Configuration: environment ``DIST_TRAINER_<KNOB>``, overridden
by ``fault.env`` (KEY=VALUE lines, keys without the prefix) next to this file. See README.md.

Stdlib only; runs with the container's /usr/bin/python3 (3.11).
"""
import atexit
import json
import math
import os
import random
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SELF = os.path.abspath(__file__)
SITE = "/usr/local/lib/python3.11/dist-packages"
PREFIX = "DIST_TRAINER_"
FAULTS = ("none", "crash_before_rdzv", "crash_after_steps", "exit_at_start")
REQUIRED = object()
# knob: (default, type); REQUIRED: no default
KNOBS = {
    "NNODES": (2, int),
    "NODE_RANK": (REQUIRED, int),
    "RDZV_DIR": ("/mnt/dflash-rdzv", str),
    "GPUS": ("0,1,2,3,4,5,6,7", "gpus"),
    "MIB": (30000, int),
    "STARTUP_S": (0.5, float),
    "STEP_INTERVAL_S": (0.5, float),
    "TOKPS": (40000.0, float),
    "BEAT_S": (0.2, float),
    "PEER_STALE_S": (2.0, float),
    "NCCL_TIMEOUT_S": (0.0, float),
    "FAULT": ("none", str),
    "FAULT_NODE": ("", "rank"),
    "CRASH_AFTER_STEPS": (5, int),
}
# node file states
WAITING, TRAINING, HUNG = "waiting", "training", "hung"
POLL_S = 0.05
WAIT_REPORT_S = 5.0  # a waiting line at most this often while the missing set stays the same
WAIT_REPORT_MIN_S = 1.0  # ... and at most this often when it changes


class ConfigError(Exception):
    pass


class Terminated(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# configuration (pure)

def read_fault_env(path):
    """KEY=VALUE lines (``#`` comments, optional ``export``, quotes, the prefix) -> dict."""
    values = {}
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return values
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError("%s:%d: expected KEY=VALUE, got %r" % (path, number, line))
        key, value = key.strip(), value.strip()
        if key.startswith(PREFIX):
            key = key[len(PREFIX):]
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def _convert(key, raw, kind):
    try:
        if kind == "gpus":
            return [int(p) for p in raw.split(",") if p.strip()]
        if kind == "rank":
            return int(raw) if raw.strip() else None
        return kind(raw)
    except ValueError:
        what = {"gpus": "GPU list", "rank": "node rank (or empty: every node)"}.get(kind) or kind.__name__
        raise ConfigError("%s%s=%r is not a valid %s" % (PREFIX, key, raw, what)) from None


def load_config(environ=None, fault_env=None):
    """The knobs: defaults < environment DIST_TRAINER_<KNOB> < fault.env; ConfigError names the knob."""
    environ = os.environ if environ is None else environ
    fault_env = os.path.join(HERE, "fault.env") if fault_env is None else fault_env
    raw = {key: spec[0] if spec[0] is REQUIRED else str(spec[0]) for key, spec in KNOBS.items()}
    for key in KNOBS:
        if PREFIX + key in environ:
            raw[key] = environ[PREFIX + key]
    overrides = read_fault_env(fault_env)
    unknown = sorted(set(overrides) - set(KNOBS))
    if unknown:
        raise ConfigError("%s: unknown knob(s) %s; known: %s"
                          % (fault_env, ", ".join(unknown), ", ".join(KNOBS)))
    raw.update(overrides)
    missing = [key for key in KNOBS if raw[key] is REQUIRED]
    if missing:
        raise ConfigError("%s is required (this node's rank, 0 .. NNODES-1); not set"
                          % " and ".join(PREFIX + key for key in missing))
    cfg = {key: _convert(key, raw[key], spec[1]) for key, spec in KNOBS.items()}
    cfg["FAULT"] = cfg["FAULT"].strip().lower()
    if cfg["FAULT"] not in FAULTS:
        raise ConfigError("unknown fault mode %r (%sFAULT / fault.env FAULT); known: %s"
                          % (cfg["FAULT"], PREFIX, ", ".join(FAULTS)))
    if cfg["NNODES"] < 1:
        raise ConfigError("%sNNODES=%d: at least 1 node" % (PREFIX, cfg["NNODES"]))
    for key in ("NODE_RANK", "FAULT_NODE"):
        if cfg[key] is not None and not 0 <= cfg[key] < cfg["NNODES"]:
            raise ConfigError("%s%s=%d is not a rank of NNODES=%d (0 .. %d)"
                              % (PREFIX, key, cfg[key], cfg["NNODES"], cfg["NNODES"] - 1))
    for key in ("BEAT_S", "PEER_STALE_S", "STEP_INTERVAL_S"):
        if cfg[key] <= 0:
            raise ConfigError("%s%s=%s must be > 0" % (PREFIX, key, cfg[key]))
    if cfg["PEER_STALE_S"] <= cfg["BEAT_S"]:
        raise ConfigError("%sPEER_STALE_S=%s must be longer than %sBEAT_S=%s (else live peers look gone)"
                          % (PREFIX, cfg["PEER_STALE_S"], PREFIX, cfg["BEAT_S"]))
    if not cfg["RDZV_DIR"]:
        raise ConfigError("%sRDZV_DIR is empty" % PREFIX)
    return cfg


def fault_here(cfg):
    """The fault mode that applies to this node: FAULT_NODE (when set) restricts it to that rank."""
    if cfg["FAULT_NODE"] is not None and cfg["FAULT_NODE"] != cfg["NODE_RANK"]:
        return "none"
    return cfg["FAULT"]


# ---------------------------------------------------------------------------------------------
# rendezvous and presence (pure: records are the parsed node files, None when missing)

def node_path(rdzv_dir, rank):
    return os.path.join(rdzv_dir, "node-%d.json" % rank)


def ident(record):
    """What names one process of a node: its pid and start time (a restart is another process)."""
    return [record.get("pid"), record.get("started")]


def present(record, now, release, stale_s):
    """A peer is present when its file exists, its beat is fresher than stale_s and it runs the
    same release (two releases never train together)."""
    if not isinstance(record, dict):
        return False
    beat = record.get("beat")
    if not isinstance(beat, (int, float)) or isinstance(beat, bool):
        return False
    return now - beat < stale_s and record.get("release") == release


def joinable(record, me, now, release, stale_s):
    """A present peer that can still form a world with me (``me`` = [rank, pid, started]): one
    that waits, or one that already formed a world that has me in it. A peer that trains in
    another world or hangs never joins a new one (its communicator is gone)."""
    if not present(record, now, release, stale_s):
        return False
    state = record.get("state", WAITING)
    if state == WAITING:
        return True
    return state == TRAINING and list(me) in (record.get("world") or [])


def missing_for_rendezvous(records, me, nnodes, now, release, stale_s):
    """Ranks (sorted) that keep the rendezvous from completing; [] = complete."""
    return [r for r in range(nnodes) if r != me[0] and not joinable(records.get(r), me, now, release, stale_s)]


def world_of(records, me, nnodes):
    """The world as this node forms it: [[rank, pid, started]] for every rank."""
    return [list(me) if r == me[0] else [r] + ident(records[r]) for r in range(nnodes)]


def lost_peers(world, records, rank, now, release, stale_s):
    """Ranks of the world that are gone for a training node: absent (file gone, stale beat, other
    release), replaced by another process (a restarted node is not the peer we formed the world
    with), or hung themselves (a collective stalled elsewhere stalls here too)."""
    lost = []
    for peer_rank, pid, started in world:
        if peer_rank == rank:
            continue
        record = records.get(peer_rank)
        if (not present(record, now, release, stale_s) or ident(record) != [pid, started]
                or record.get("state") == HUNG):
            lost.append(peer_rank)
    return lost


def should_report(last_at, last_missing, now, missing):
    """Whether to print a waiting line now: the first one at once, then when the missing set
    changes (at most every WAIT_REPORT_MIN_S), else every WAIT_REPORT_S."""
    if last_at is None:
        return True
    since = now - last_at
    if missing != last_missing:
        return since >= WAIT_REPORT_MIN_S
    return since >= WAIT_REPORT_S


def read_records(rdzv_dir, nnodes):
    """{rank: parsed node file or None}; a file being replaced or torn reads as None."""
    records = {}
    for rank in range(nnodes):
        try:
            with open(node_path(rdzv_dir, rank), encoding="utf-8") as fh:
                records[rank] = json.load(fh)
        except (OSError, ValueError):
            records[rank] = None
    return records


# ---------------------------------------------------------------------------------------------
# output

def say(text):
    print(text, flush=True)


def err(text):
    print(text, file=sys.stderr, flush=True)


def traceback_text(frames, final):
    """A real-looking Python traceback: frames = [(file, line, func, source)]."""
    lines = ["Traceback (most recent call last):"]
    for path, line, func, source in frames:
        lines.append('  File "%s", line %d, in %s' % (path, line, func))
        lines.append("    " + source)
    lines.append(final)
    return "\n".join(lines)


def progress_line(step, rng, tokps):
    """The single-host stand-in's progress line (examples/trainer, LOG_STYLE=step), newline included."""
    loss = 2.1 + 7.9 * math.exp(-step / 40.0) + rng.uniform(-0.05, 0.05)
    toks = tokps * rng.uniform(0.97, 1.03)
    return "step=%d loss=%.4f tok/s=%.1f queue_target=%d queue_drafter=%d\n" % (
        step, loss, toks, rng.randint(6, 10), rng.randint(1, 4))


def watchdog_timeout_lines(global_rank, seq, timeout_s, ran_s, now=None):
    """What PyTorch's ProcessGroupNCCL watchdog prints before it takes the process down."""
    stamp = time.strftime("E%m%d %H:%M:%S", time.localtime(now))
    head = "[rank%d]:[%s.%06d %d ProcessGroupNCCL.cpp:632]" % (global_rank, stamp, 0, os.getpid())
    return [
        "%s [Rank %d] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=%d, OpType=ALLREDUCE, "
        "NumelIn=1048576, NumelOut=1048576, Timeout(ms)=%d) ran for %d milliseconds before timing out."
        % (head, global_rank, seq, int(timeout_s * 1000), int(ran_s * 1000)),
        "%s [Rank %d] To avoid data inconsistency, we are taking the entire process down." % (head, global_rank),
    ]


# ---------------------------------------------------------------------------------------------
# the node file: written atomically, refreshed by a thread

class NodeFile:
    def __init__(self, cfg, release, started):
        self.path = node_path(cfg["RDZV_DIR"], cfg["NODE_RANK"])
        self.tmp = "%s.%d.tmp" % (self.path, os.getpid())
        self.record = {"rank": cfg["NODE_RANK"], "pid": os.getpid(), "release": release,
                       "started": started, "beat": time.time(), "state": WAITING, "world": None}
        self.beat_s = cfg["BEAT_S"]
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = None
        self.removed = False

    def write(self, **changes):
        with self.lock:
            if self.removed:
                return
            self.record.update(changes)
            self.record["beat"] = time.time()
            with open(self.tmp, "w", encoding="utf-8") as fh:
                json.dump(self.record, fh)
            os.replace(self.tmp, self.path)

    def _beat(self):
        while not self.stop.wait(self.beat_s):
            try:
                self.write()
            except OSError as exc:  # the directory went away: peers will see us stale
                err("rendezvous: cannot refresh %s: %s" % (self.path, exc))
                self.stop.wait(1.0)

    def start(self):
        self.write()
        self.thread = threading.Thread(target=self._beat, name="beat", daemon=True)
        self.thread.start()

    def remove(self):
        """Stop beating and remove our file (only if it is still ours)."""
        self.stop.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(1.0)
        with self.lock:
            if self.removed:
                return
            self.removed = True
            for path in (self.tmp, self.path):
                try:
                    if path == self.path:
                        with open(path, encoding="utf-8") as fh:
                            if json.load(fh).get("pid") != os.getpid():
                                continue
                    os.unlink(path)
                except (OSError, ValueError):
                    pass


# ---------------------------------------------------------------------------------------------
# main

def _on_signal(signum, _frame):
    raise Terminated(signal.Signals(signum).name)


def crash(final, frames):
    err(traceback_text(frames, final))
    return 1


def run(cfg, clock=time.time):
    fault = fault_here(cfg)
    rank, nnodes = cfg["NODE_RANK"], cfg["NNODES"]
    release = os.environ.get("DFLASH_RELEASE", "")
    started = clock()
    if fault == "exit_at_start":
        return crash("ImportError: libnccl.so.2: cannot open shared object file: No such file or directory", [
            (SELF, 12, "<module>", "import torch.distributed as dist"),
            (SITE + "/torch/__init__.py", 290, "<module>", "from torch._C import *  # noqa: F403"),
        ])
    try:
        import fakegpu
    except ImportError as exc:
        err("dist trainer: cannot import fakegpu, the simulated GPU library (%s); install "
            "lab/fakegpu/fakegpu.py into the Python path" % exc)
        return 1
    say("dist trainer starting: node_rank=%d nnodes=%d release=%s pid=%d gpus=%s fault=%s"
        % (rank, nnodes, release or "-", os.getpid(), ",".join(map(str, cfg["GPUS"])) or "-", fault))
    deadline = time.monotonic() + cfg["STARTUP_S"]
    say("loading model shards and dataset ...")
    while time.monotonic() < deadline:
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    if fault == "crash_before_rdzv":
        return crash("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: "
                     "The connection to the C10d store has failed. See inner exception for details.", [
                         (SELF, 40, "<module>", "main()"),
                         (SELF, 31, "main", 'dist.init_process_group("nccl")'),
                         (SITE + "/torch/distributed/elastic/rendezvous/dynamic_rendezvous.py", 1155,
                          "next_rendezvous", "self._op_executor.run(join_op, deadline, self._get_deadline)"),
                     ])
    if not os.path.isdir(cfg["RDZV_DIR"]):
        err("dist trainer: %sRDZV_DIR=%s is not a directory (the rendezvous directory every node shares; "
            "the lab mounts it with `lab.py group`)" % (PREFIX, cfg["RDZV_DIR"]))
        return 2

    node = NodeFile(cfg, release, started)
    atexit.register(node.remove)
    try:
        node.start()
        return train(cfg, node, fakegpu, fault)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the clean-up short
            signal.signal(signum, signal.SIG_IGN)
        node.remove()
        try:
            fakegpu.free()
        except Exception:  # pylint: disable=broad-except  # best effort: our death frees it anyway
            pass


def train(cfg, node, fakegpu, fault):
    rank, nnodes, stale = cfg["NODE_RANK"], cfg["NNODES"], cfg["PEER_STALE_S"]
    release = node.record["release"]
    me = [rank, node.record["pid"], node.record["started"]]
    last_at, last_missing = None, None
    while True:
        records = read_records(cfg["RDZV_DIR"], nnodes)
        now = time.time()
        missing = missing_for_rendezvous(records, me, nnodes, now, release, stale)
        if not missing:
            break
        if should_report(last_at, last_missing, time.monotonic(), missing):
            say("rendezvous: waiting for nodes %s (NNODES=%d)" % (missing, nnodes))
            last_at, last_missing = time.monotonic(), missing
        time.sleep(POLL_S)
    world = world_of(records, me, nnodes)
    node.write(state=TRAINING, world=world)
    say("rendezvous complete: world of %d nodes, release %s" % (nnodes, release or "-"))

    plan = [(gpu, cfg["MIB"]) for gpu in cfg["GPUS"]]
    for gpu, mib in plan:
        try:
            fakegpu.allocate(gpu, mib)
        except fakegpu.OutOfMemory as exc:
            return crash("torch.OutOfMemoryError: %s" % exc, [
                (SELF, 40, "<module>", "main()"),
                (SELF, 35, "main", "model.to(device)"),
            ])
    if plan:
        say("cuda: allocated %s" % ", ".join("gpu%d=%dMiB" % p for p in plan))

    rng = random.Random(os.getpid())
    interval = cfg["STEP_INTERVAL_S"]
    next_at = time.monotonic()
    step = 0
    while True:
        if fault == "crash_after_steps" and step >= cfg["CRASH_AFTER_STEPS"]:
            return crash("RuntimeError: CUDA error: an illegal memory access was encountered", [
                (SELF, 40, "<module>", "main()"),
                (SELF, 37, "train_step", "loss.backward()"),
                (SITE + "/torch/_tensor.py", 581, "backward", "torch.autograd.backward("),
            ])
        next_at += interval
        while True:  # the step's collective: it completes only while every peer of the world is there
            lost = lost_peers(world, read_records(cfg["RDZV_DIR"], nnodes), rank, time.time(), release, stale)
            if lost:
                return hang(cfg, node, lost, step)
            left = next_at - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(POLL_S, left))
        step += 1
        if rank == 0:
            sys.stdout.write(progress_line(step, rng, cfg["TOKPS"]))
            sys.stdout.flush()


def hang(cfg, node, lost, step):
    """Blocked in a collective that will never complete: alive, memory held, no progress, even if
    the peer comes back; NCCL_TIMEOUT_S > 0: the watchdog takes the process down after that long."""
    node.write(state=HUNG)
    err("NCCL watchdog: waiting for peer node-%d (collective stalled)" % lost[0])
    began = time.monotonic()
    timeout = cfg["NCCL_TIMEOUT_S"]
    while timeout <= 0 or time.monotonic() - began < timeout:
        time.sleep(0.2)
    global_rank = cfg["NODE_RANK"] * max(1, len(cfg["GPUS"]))
    for line in watchdog_timeout_lines(global_rank, step + 1, timeout, time.monotonic() - began):
        err(line)
    return 1


def main():
    try:
        cfg = load_config()
    except ConfigError as exc:
        err("dist trainer: %s" % exc)
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _on_signal)
    try:
        return run(cfg)
    except Terminated as exc:
        say("received %s, leaving the rendezvous and exiting" % exc)
        return 0


if __name__ == "__main__":
    sys.exit(main())
