"""Stand-in for a DFlash speculative-decoding training pipeline, with injectable faults.

From outside it looks like the real thing: start-up lines, an inductor compile cache, GPU
memory held through fakegpu (5 target GPUs feeding hidden states to 3 drafter GPUs) and one
progress line per step. Configuration: environment ``FAKE_TRAINER_<KNOB>``, overridden by
``fault.env`` (KEY=VALUE lines, keys without the prefix) next to this file. See README.md.
"""
import base64
import hashlib
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PREFIX = "FAKE_TRAINER_"
FAULTS = (
    "none", "import_error", "exit0", "crash_after", "hang_before_alloc", "partial_alloc",
    "late_alloc", "stall", "cuda_oom", "nccl_error", "crash_loop", "ignore_sigterm",
    "leak_child", "slow_start",
)
# knob: (default, type)
KNOBS = {
    "FAULT": ("none", str),
    "TARGET_GPUS": ("0,1,2,3,4", "gpus"),
    "DRAFTER_GPUS": ("5,6,7", "gpus"),
    "TARGET_MIB": (60000, int),
    "DRAFTER_MIB": (30000, int),
    "STARTUP_S": (2.0, float),
    "STEP_INTERVAL_S": (1.0, float),
    "CRASH_AFTER_STEPS": (5, int),
    "CRASH_LOOP_STEPS": (2, int),
    "ALLOC_DELAY_S": (20.0, float),
    "PARTIAL_GPUS": ("0,1,2,3,4", "gpus"),
    "STALL_AFTER_STEPS": (3, int),
    "SLOW_START_S": (600.0, float),
    "ERROR_AFTER_STEPS": (3, int),
    "LEAK_METHOD": ("auto", str),
    "TOKPS": (41250.0, float),
    "LOG_STYLE": ("step", str),
}
# How progress is written (LOG_STYLE), as trainers outside this project write it
LOG_STYLES = ("step", "iter", "k_suffix", "tqdm")
TQDM_TOTAL = 100000


class ConfigError(Exception):
    pass


class Terminated(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# configuration

def read_fault_env(path):
    """KEY=VALUE lines (``#`` comments, optional ``export`` and quotes) -> dict."""
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
        return kind(raw)
    except ValueError:
        raise ConfigError("%s%s=%r is not a valid %s" % (
            PREFIX, key, raw, "GPU list" if kind == "gpus" else kind.__name__)) from None


def load_config(environ=None, fault_env=None):
    environ = os.environ if environ is None else environ
    fault_env = os.path.join(HERE, "fault.env") if fault_env is None else fault_env
    raw = {key: str(spec[0]) for key, spec in KNOBS.items()}
    for key in KNOBS:
        if PREFIX + key in environ:
            raw[key] = environ[PREFIX + key]
    overrides = read_fault_env(fault_env)
    unknown = sorted(set(overrides) - set(KNOBS))
    if unknown:
        raise ConfigError("%s: unknown knob(s) %s; known: %s"
                          % (fault_env, ", ".join(unknown), ", ".join(KNOBS)))
    raw.update(overrides)
    cfg = {key: _convert(key, raw[key], spec[1]) for key, spec in KNOBS.items()}
    cfg["FAULT"] = cfg["FAULT"].strip().lower()
    if cfg["FAULT"] not in FAULTS:
        raise ConfigError("unknown fault mode %r (FAKE_TRAINER_FAULT / fault.env FAULT); known: %s"
                          % (cfg["FAULT"], ", ".join(FAULTS)))
    cfg["LOG_STYLE"] = cfg["LOG_STYLE"].strip().lower()
    if cfg["LOG_STYLE"] not in LOG_STYLES:
        raise ConfigError("unknown log style %r (FAKE_TRAINER_LOG_STYLE / fault.env LOG_STYLE); known: %s"
                          % (cfg["LOG_STYLE"], ", ".join(LOG_STYLES)))
    return cfg


# ---------------------------------------------------------------------------------------------
# signals: handlers only record; the main flow acts at its next checkpoint

_pending = []
_ignore_sigterm = False


def _on_signal(signum, _frame):
    _pending.append(signum)


def checkpoint():
    while _pending:
        signum = _pending.pop(0)
        if signum == signal.SIGTERM and _ignore_sigterm:
            say("ignoring SIGTERM")
            continue
        raise Terminated(signal.Signals(signum).name)


def pause(seconds):
    """Sleep ``seconds`` (may be inf) while staying responsive to signals."""
    deadline = time.monotonic() + seconds
    while True:
        checkpoint()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


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


SELF = os.path.abspath(__file__)
SITE = "/usr/local/lib/python3.11/dist-packages"


# ---------------------------------------------------------------------------------------------
# phases

def startup(cfg, seconds):
    """Loading and compiling: prints start-up lines and fills the inductor cache."""
    phases = [
        "loading target model Qwen/Qwen3-8B (frozen) on gpus %s ..." % _fmt(cfg["TARGET_GPUS"]),
        "loading drafter dflash-b16 (5 layers) on gpus %s ..." % _fmt(cfg["DRAFTER_GPUS"]),
        "loading dataset shards from data/train-*.parquet ...",
        "compiling drafter forward with torch.compile (inductor cache: %s) ..." % cache_dir(),
    ]
    for number, line in enumerate(phases):
        say(line)
        if number == len(phases) - 1:
            write_compile_cache()
        pause(seconds / len(phases))


def cache_dir():
    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if path:
        return path
    try:
        import getpass
        user = getpass.getuser()
    except Exception:  # no passwd entry: torch falls back the same way
        user = str(os.getuid())
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + user)


def write_compile_cache():
    """Files where and as torch's inductor names them (torch/_inductor/codecache.py): a key is a
    letter and 51 base32 characters, its 2nd and 3rd name the two-character directory it lives in."""
    root = cache_dir()
    stamp = hashlib.sha256(b"%d" % os.getpid()).digest()
    b32 = base64.b32encode(stamp).decode("ascii").lower().rstrip("=")
    hexhash = hashlib.sha256(stamp).hexdigest()
    code_key, fx_key, aot_key = "c" + b32[:51], "f" + b32[1:52], "a" + b32[2:53]
    kernel = "triton_poi_fused_add_mul_0"
    files = {
        os.path.join(code_key[1:3], code_key + ".py"): "# generated by fake inductor\n",
        os.path.join("fxgraph", fx_key[1:3], fx_key, hexhash): "fx graph %s\n" % hexhash,
        os.path.join("aotautograd", aot_key, hexhash): "aot %s\n" % hexhash,
        os.path.join("triton", "0", hexhash[:52], kernel + ".source"): "# triton kernel source\n",
        os.path.join("triton", "0", hexhash[:52], kernel + ".cubin"): "\x7fELF fake\n",
        os.path.join("triton", "0", hexhash[:52], "__grp__" + kernel + ".json"): "{}\n",
    }
    for rel, content in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(content)


def _fmt(gpus):
    return ",".join(str(g) for g in gpus) or "-"


def allocate(fakegpu, plan):
    """plan: [(gpu, mib)]; an OOM ends the process like torch would."""
    for gpu, mib in plan:
        try:
            fakegpu.allocate(gpu, mib)
        except fakegpu.OutOfMemory as exc:
            err(traceback_text([
                (SELF, 212, "<module>", "main()"),
                (SELF, 148, "setup", "model.to(device)"),
                (SITE + "/torch/nn/modules/module.py", 1340, "convert",
                 "return t.to(device, dtype if t.is_floating_point() else None, non_blocking)"),
            ], "torch.OutOfMemoryError: %s" % exc))
            sys.exit(1)
    if plan:
        say("cuda: allocated %s" % ", ".join("gpu%d=%dMiB" % p for p in plan))


def plan_for(cfg, gpus):
    target = set(cfg["TARGET_GPUS"])
    return [(g, cfg["TARGET_MIB"] if g in target else cfg["DRAFTER_MIB"]) for g in gpus]


def under_systemd():
    try:
        with open("/proc/1/comm", encoding="utf-8") as fh:
            return fh.read().strip() == "systemd"
    except OSError:
        return False


def leak_child(fakegpu, cfg):
    """Start a drafter worker that escapes our process group (and unit cgroup) and holds
    the drafter GPUs' memory: it survives the trainer's stop."""
    gpus = cfg["DRAFTER_GPUS"]
    if not gpus:
        return
    lib_dir = os.path.dirname(os.path.abspath(fakegpu.__file__))
    env = dict(os.environ)
    env["PYTHONPATH"] = lib_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "fakegpu", "alloc", "--gpu", _fmt(gpus),
           "--mib", str(cfg["DRAFTER_MIB"]), "--hold"]
    method = cfg["LEAK_METHOD"]
    if method == "auto":
        method = "systemd-run" if shutil.which("systemd-run") and under_systemd() else "setsid"
    say("spawning drafter worker for gpus %s" % _fmt(gpus))
    if method == "systemd-run":
        subprocess.Popen(
            ["systemd-run", "--scope", "--quiet", "--unit=dflash-leaked-%d" % os.getpid()] + cmd,
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        return
    # setsid double fork: the worker is re-parented away and has its own session
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execve(cmd[0], cmd, env)
        finally:
            os._exit(127)
    os.waitpid(pid, 0)


# ---------------------------------------------------------------------------------------------
# main

def short(value):
    """41250.3 -> "41.3K" (as the figures of tqdm and most loggers are written)."""
    return "%.1fK" % (value / 1000.0)


def progress(step, rng, tokps=41250.0, style="step", elapsed_s=None):
    """One progress report in ``style``: the text to write, newline included (tqdm: a carriage
    return and the redrawn bar, no newline, as tqdm writes to a file)."""
    loss = 2.1 + 7.9 * math.exp(-step / 40.0) + rng.uniform(-0.05, 0.05)
    toks = tokps * rng.uniform(0.97, 1.03)
    q_target, q_drafter = rng.randint(6, 10), rng.randint(1, 4)
    if style == "iter":
        return "iter %d | %s tok/s | loss %.4f | queue_target=%d queue_drafter=%d\n" % (
            step, short(toks), loss, q_target, q_drafter)
    if style == "k_suffix":
        return "step=%d loss=%.4f %s tok/s queue_target=%d queue_drafter=%d\n" % (
            step, loss, short(toks), q_target, q_drafter)
    if style == "tqdm":
        elapsed = int(elapsed_s if elapsed_s is not None else step)
        return "\rtraining: %3d%%|%s| %d/%d [%02d:%02d<99:59, %.2fit/s, loss=%.4f, tok/s=%s]" % (
            step * 100 // TQDM_TOTAL, " " * 10, step, TQDM_TOTAL, elapsed // 60, elapsed % 60,
            1.0, loss, short(toks))
    return "step=%d loss=%.4f tok/s=%.1f queue_target=%d queue_drafter=%d\n" % (
        step, loss, toks, q_target, q_drafter)


def run(cfg):
    global _ignore_sigterm
    fault = cfg["FAULT"]
    _ignore_sigterm = fault == "ignore_sigterm"
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _on_signal)

    if fault == "exit0":
        say("dflash trainer: nothing to do, exiting")
        return 0
    if fault == "import_error":
        err(traceback_text([
            (SELF, 14, "<module>", "from dflash.model import DFlashDraftModel"),
            (SITE + "/dflash/model.py", 9, "<module>",
             "from flash_attn import flash_attn_func, flash_attn_varlen_func"),
        ], "ModuleNotFoundError: No module named 'flash_attn'"))
        return 1
    try:
        import fakegpu
    except ImportError as exc:
        err("trainer: cannot import fakegpu, the simulated GPU library (%s); install "
            "lab/fakegpu/fakegpu.py into the Python path" % exc)
        return 1

    say("dflash trainer starting: release=%s pid=%d fault=%s target_gpus=%s drafter_gpus=%s"
        % (os.environ.get("DFLASH_RELEASE", "-"), os.getpid(), fault,
           _fmt(cfg["TARGET_GPUS"]), _fmt(cfg["DRAFTER_GPUS"])))
    startup(cfg, cfg["SLOW_START_S"] if fault == "slow_start" else cfg["STARTUP_S"])
    if fault == "hang_before_alloc":
        pause(math.inf)

    all_gpus = cfg["TARGET_GPUS"] + [g for g in cfg["DRAFTER_GPUS"] if g not in cfg["TARGET_GPUS"]]
    allocated = False
    if fault == "partial_alloc":
        allocate(fakegpu, plan_for(cfg, cfg["PARTIAL_GPUS"]))
        allocated = True
    elif fault == "leak_child":
        allocate(fakegpu, plan_for(cfg, cfg["TARGET_GPUS"]))
        leak_child(fakegpu, cfg)
        allocated = True
    elif fault != "late_alloc":
        allocate(fakegpu, plan_for(cfg, all_gpus))
        allocated = True
    say("ready: target=%d drafter=%d gpus" % (len(cfg["TARGET_GPUS"]), len(cfg["DRAFTER_GPUS"])))

    rng = random.Random(os.getpid())
    interval = cfg["STEP_INTERVAL_S"]
    began = next_at = time.monotonic()
    step = 0
    error_said = False
    while True:
        if fault == "crash_after" and step >= cfg["CRASH_AFTER_STEPS"]:
            err(traceback_text([
                (SELF, 212, "<module>", "main()"),
                (SELF, 187, "train_step", "loss.backward()"),
                (SITE + "/torch/_tensor.py", 581, "backward",
                 "torch.autograd.backward("),
            ], "RuntimeError: CUDA error: an illegal memory access was encountered"))
            return 1
        if fault == "crash_loop" and step >= cfg["CRASH_LOOP_STEPS"]:
            err(traceback_text([
                (SELF, 212, "<module>", "main()"),
                (SELF, 171, "next_batch", "batch = next(loader)"),
                (SITE + "/torch/utils/data/dataloader.py", 1480, "_next_data",
                 "return self._process_data(data)"),
            ], "RuntimeError: DataLoader worker (pid(s) %d) exited unexpectedly" % (os.getpid() + 1)))
            return 1
        if fault == "stall" and step >= cfg["STALL_AFTER_STEPS"]:
            pause(math.inf)
        if fault in ("cuda_oom", "nccl_error") and step >= cfg["ERROR_AFTER_STEPS"] and not error_said:
            error_said = True
            if fault == "cuda_oom":
                gpu = (cfg["DRAFTER_GPUS"] or [0])[0]
                err("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                    "GPU %d has a total capacity of 79.65 GiB of which 1.07 GiB is free. "
                    "Of the allocated memory 75.31 GiB is allocated by PyTorch, and 1.88 GiB is "
                    "reserved by PyTorch but unallocated." % gpu)
            else:
                err("torch.distributed.DistBackendError: NCCL error in: "
                    "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda "
                    "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")
        if not allocated and time.monotonic() - began >= cfg["ALLOC_DELAY_S"]:
            allocate(fakegpu, plan_for(cfg, all_gpus))
            allocated = True
        next_at += interval
        pause(next_at - time.monotonic())
        step += 1
        text = progress(step, rng, cfg["TOKPS"], cfg["LOG_STYLE"], time.monotonic() - began)
        stream = sys.stderr if cfg["LOG_STYLE"] == "tqdm" else sys.stdout  # tqdm writes to stderr
        stream.write(text)
        stream.flush()


def main():
    try:
        cfg = load_config()
    except ConfigError as exc:
        err("trainer: %s" % exc)
        return 2
    try:
        return run(cfg)
    except Terminated as exc:
        say("received %s, saving and exiting" % exc)
        return 0


if __name__ == "__main__":
    sys.exit(main())
