"""fakegpu: a simulated multi-GPU host for the dflash.trainer lab (stdlib only).

State lives in ``$FAKEGPU_STATE_DIR`` (default ``/var/lib/fakegpu``):

* ``config.json`` -- ``{"count": 8, "memory_mib": 81559, "name": "NVIDIA H100 80GB HBM3",
  "release_delay_s": 0, "uuid_seed": "lab"}``; a missing file or key means that default.
  ``release_delay_s``: seconds a dead holder's memory stays held after its death is first
  observed; ``null`` or negative: never released (a stuck GPU context).
  ``errors``: ``{"<index>": "[GPU is lost]"}`` makes that GPU's numeric nvidia-smi cells print
  the bracketed text.
* ``alloc/*.json`` -- one record per allocation (written atomically). A record counts while its
  holder lives; the holder is identified by pid *and* process start time
  (``/proc/<pid>/stat`` field 22), so a reused pid never counts as the holder. A record written
  before the container booted (PID 1's start) is dropped at once, whatever the release delay:
  its holder died with the previous boot.
* ``driver_error`` -- if this file exists, nvidia-smi fails like a missing driver (exit 9).
* ``hang`` -- if this file exists, the nvidia-smi program hangs like one stuck in the driver:
  empty or ``forever``: it never answers; a number: it answers after that many seconds (a slow
  tool). While hanging it ignores SIGTERM/SIGINT/SIGHUP (only SIGKILL ends it) and marks itself
  with ``hanging/<pid>`` (removed when it answers), so a test can see it hang and see it gone.

Library: ``allocate(gpu, mib, pid=None)``, ``free(gpu=None, pid=None, everyone=False)``,
``snapshot()``, ``load_config()``, ``write_config(**changes)``; ``OutOfMemory`` /
``InvalidDevice`` (both ``FakeGPUError``, a ``RuntimeError``). ``smi(argv)`` renders the
nvidia-smi stand-in's output and exit status.

CLI: ``python3 -m fakegpu alloc --gpu 0[,1..] --mib N [--pid P] [--hold]`` | ``free`` |
``show [--json]`` | ``config [--count N] [--memory-mib N] [--release-delay S|never]
[--hang forever|SECONDS|off] ...``.
"""
import argparse
import contextlib
import datetime
import fcntl
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid

DEFAULT_STATE_DIR = "/var/lib/fakegpu"
DEFAULTS = {
    "count": 8,
    "memory_mib": 81559,
    "name": "NVIDIA H100 80GB HBM3",
    "release_delay_s": 0,
    "uuid_seed": "lab",
    # How nvidia-smi in the container shows processes, as on a GPU passed through to LXC (the
    # driver reports host PIDs): null - the processes themselves (a bare-metal host);
    # "empty" - none; "host_pids" - every holder under a host PID with a `[Not Found]` name.
    "passthrough": None,
    # Other tenants' memory per GPU ({"3": 20000}): counted in memory.used and against
    # allocations, never in this container's PID namespace.
    "foreign_mib": {},
    # nvidia-smi's exit status (nvidia-smi(1) RETURN VALUE), null: 0. 14 (infoROM corrupted) prints
    # the normal output and exits 14 (a warning); any other code prints that failure's text instead.
    "exit_code": None,
    # The node's GPUs this container was given, by the node's slot, in the container's order
    # ([5, 3]: its GPU 0 is the node's GPU 5, its GPU 1 the node's GPU 3); null: the node's, as
    # numbered there. As on a real node, the container numbers what it sees 0..k-1, and a GPU's
    # UUID and bus id are the node's slot's: the UUID is the only identity both sides share.
    "node_slots": None,
    # how many GPUs the node has when a container was given some of them (node_slots)
    "node_count": 8,
}
PASSTHROUGH_MODES = (None, "empty", "host_pids")
# host PID shown for a holder under "host_pids": beyond any PID of the container (its pid_max
# is the kernel's, 4194304 at most, yet the lab's containers never come near this offset).
HOST_PID_OFFSET = 3000000
FOREIGN_HOST_PID = 2000000  # + GPU index: the other tenant's process on that GPU
NOT_FOUND = "[Not Found]"
DRIVER_ERROR_TEXT = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
# PCI bus numbers of an 8-GPU HGX board; more GPUs get synthetic ones.
_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


# what nvidia-smi prints for each failing exit status (written from nvidia-smi(1) RETURN VALUE and
# the messages users report); 14 is not here: it comes with the normal output
EXIT_TEXTS = {
    2: "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.",
    3: "This operation is not supported on the current device.",
    4: "Insufficient Permissions",
    6: "No devices were found",
    8: "Unable to determine the device handle for GPU 0000:18:00.0: A device's external power cables are "
       "not properly attached.",
    9: DRIVER_ERROR_TEXT,
    12: "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA "
        "Display Driver is properly installed and present in your system.",
    15: "Unable to determine the device handle for GPU 0000:18:00.0: GPU is lost.  Reboot the system to "
        "recover this GPU",
    255: "Unknown Error",
}
EXIT_CODES = (2, 3, 4, 6, 8, 9, 12, 14, 15, 255)


class FakeGPUError(RuntimeError):
    """Base class of the simulated CUDA errors."""


class OutOfMemory(FakeGPUError):
    """Raised by allocate() when the GPU lacks the free memory (like torch.OutOfMemoryError)."""


class InvalidDevice(FakeGPUError):
    """Raised for a GPU index that does not exist."""


# ---------------------------------------------------------------------------------------------
# state and configuration

def state_dir():
    return os.environ.get("FAKEGPU_STATE_DIR") or DEFAULT_STATE_DIR


def _alloc_dir():
    return os.path.join(state_dir(), "alloc")


def config_path():
    return os.path.join(state_dir(), "config.json")


def load_config(path=None):
    """The configuration: config.json merged over DEFAULTS (a missing file means defaults)."""
    path = path or config_path()
    cfg = dict(DEFAULTS)
    cfg["errors"] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        data = {}
    if not isinstance(data, dict):
        raise ValueError("%s: expected a JSON object" % path)
    cfg.update(data)
    cfg["count"] = int(cfg["count"])
    cfg["memory_mib"] = int(cfg["memory_mib"])
    cfg["node_count"] = int(cfg["node_count"])
    cfg["errors"] = {str(k): str(v) for k, v in (cfg.get("errors") or {}).items()}
    cfg["foreign_mib"] = {str(k): int(v) for k, v in (cfg.get("foreign_mib") or {}).items() if int(v) > 0}
    if cfg["passthrough"] in (False, "off", ""):
        cfg["passthrough"] = None
    if cfg.get("exit_code") in (0, "", False):
        cfg["exit_code"] = None
    if cfg["exit_code"] is not None and cfg["exit_code"] not in EXIT_CODES:
        raise ValueError("%s: exit_code must be null or one of %s, not %r" % (path, EXIT_CODES, cfg["exit_code"]))
    slots = cfg.get("node_slots")
    if slots is not None:
        if not isinstance(slots, list) or not slots or len(set(slots)) != len(slots) \
                or not all(isinstance(x, int) and 0 <= x < cfg["node_count"] for x in slots):
            raise ValueError("%s: node_slots must be null or distinct slots below node_count %s, not %r"
                             % (path, cfg["node_count"], slots))
        cfg["count"] = len(slots)
    if cfg["passthrough"] not in PASSTHROUGH_MODES:
        raise ValueError("%s: passthrough must be null, \"empty\" or \"host_pids\", not %r"
                         % (path, cfg["passthrough"]))
    return cfg


def _atomic_write_json(path, data):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def write_config(**changes):
    """Update config.json with ``changes`` (keys of DEFAULTS, or ``errors``); returns it."""
    os.makedirs(state_dir(), exist_ok=True)
    try:
        with open(config_path(), encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        data = {}
    data.update(changes)
    _atomic_write_json(config_path(), data)
    return load_config()


@contextlib.contextmanager
def _locked(write=True):
    """Serialise access to the state dir. Yields False when the state is read-only to us."""
    try:
        os.makedirs(_alloc_dir(), exist_ok=True)
        fh = open(os.path.join(state_dir(), ".lock"), "a+")
    except OSError:
        if write:
            raise
        yield False
        return
    try:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield True
    finally:
        fh.close()


# ---------------------------------------------------------------------------------------------
# process identity

def process_start_time(pid):
    """Start time (clock ticks since boot, /proc/<pid>/stat field 22) of a live process.

    Returns None when the process does not exist or has already exited (zombie): a GPU
    context is torn down when the process exits, not when its parent reaps it.
    """
    try:
        with open("/proc/%d/stat" % int(pid), encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) < 20 or fields[0] in ("Z", "X", "x"):
        return None
    return int(fields[19])


def _process_name(pid):
    try:
        return os.readlink("/proc/%d/exe" % pid)
    except OSError:
        pass
    try:
        with open("/proc/%d/comm" % pid, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return "[Not Found]"


def argv0_name(pid):
    """A process's name as nvidia-smi prints it (argv[0] from /proc/<pid>/cmdline, as NVML reads
    it; the process's comm when argv is empty): raw, whatever the process put there - commas and
    newlines included (the real tool does not quote it). ``[Not Found]`` when unreadable."""
    try:
        with open("/proc/%d/cmdline" % int(pid), "rb") as fh:
            argv0 = fh.read().split(b"\0", 1)[0]
    except (OSError, ValueError):
        return NOT_FOUND
    if argv0:
        return argv0.decode("utf-8", "replace")
    try:
        with open("/proc/%d/comm" % int(pid), encoding="utf-8", errors="replace") as fh:
            comm = fh.read()
    except OSError:
        return NOT_FOUND
    return comm[:-1] if comm.endswith("\n") else comm


def boot_time(init_pid=1):
    """Wall-clock time at which ``init_pid`` (PID 1 of this PID namespace: the container's boot)
    started.

    /proc/uptime and a process's start time both count from the host's boot, so this is exact
    inside a container as well; None when /proc cannot be read.
    """
    start = process_start_time(init_pid)
    try:
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if start is None:
        return None
    return time.time() - uptime + start / os.sysconf("SC_CLK_TCK")


def _from_earlier_boot(record, booted):
    """A record written before this container booted: its holder died with the previous boot,
    and a real driver freed that memory long ago (a container restart is no GPU context)."""
    return booted is not None and float(record.get("created", 0)) < booted - 2.0


def _holder_alive(record):
    return process_start_time(record["pid"]) == record.get("start_time")


# ---------------------------------------------------------------------------------------------
# allocations

def gpu_uuid(index, seed=None):
    if seed is None:
        seed = load_config()["uuid_seed"]
    digest = hashlib.sha256(("%s:%d" % (seed, index)).encode()).digest()
    return "GPU-" + str(uuid.UUID(bytes=digest[:16]))


def pci_bus_id(index):
    bus = _BUSES[index] if index < len(_BUSES) else (0x100 + index * 0x11) & 0xFF
    return "00000000:%02X:00.0" % bus


def _read_records(alloc_dir=None):
    alloc_dir = alloc_dir or _alloc_dir()
    records = []
    try:
        names = sorted(os.listdir(alloc_dir))
    except FileNotFoundError:
        return records
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(alloc_dir, name)
        try:
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        rec["_path"] = path
        records.append(rec)
    return records


def _released(dead_since, now, delay):
    """A dead holder's memory is freed ``delay`` seconds after its death was first seen (never
    when ``delay`` is None or negative: a stuck context)."""
    return delay is not None and delay >= 0 and now - dead_since >= delay


def _live_records(cfg, writable, now=None):
    """Records that still hold memory; updates dead_since / deletes released records."""
    now = time.time() if now is None else now
    delay = cfg.get("release_delay_s")
    booted = boot_time()
    held = []
    for rec in _read_records():
        if _from_earlier_boot(rec, booted):
            if writable:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(rec["_path"])
            continue
        rec["alive"] = _holder_alive(rec)
        if not rec["alive"]:
            if rec.get("dead_since") is None:
                rec["dead_since"] = now
                if writable:
                    _atomic_write_json(rec["_path"], _public(rec))
            if _released(rec["dead_since"], now, delay):
                if writable:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(rec["_path"])
                continue
        held.append(rec)
    return held


def _public(rec):
    return {k: v for k, v in rec.items() if not k.startswith("_") and k != "alive"}


def _used_by_gpu(records):
    used = {}
    for rec in records:
        used[rec["gpu"]] = used.get(rec["gpu"], 0) + int(rec["mib"])
    return used


def allocate(gpu, mib, pid=None):
    """Record ``mib`` MiB on GPU ``gpu`` held by ``pid`` (default: this process).

    Returns the record (dict). Raises OutOfMemory when the GPU lacks the free memory,
    InvalidDevice for a GPU that does not exist, ProcessLookupError for a dead pid.
    """
    gpu, mib = int(gpu), int(mib)
    pid = os.getpid() if pid is None else int(pid)
    if mib < 0:
        raise ValueError("mib must be >= 0")
    cfg = load_config()
    if not 0 <= gpu < cfg["count"]:
        raise InvalidDevice("CUDA error: invalid device ordinal (GPU %d of %d)" % (gpu, cfg["count"]))
    start = process_start_time(pid)
    if start is None:
        raise ProcessLookupError("no such process: %d" % pid)
    with _locked():
        used = _used_by_gpu(_live_records(cfg, True)).get(gpu, 0) + cfg["foreign_mib"].get(str(gpu), 0)
        total = cfg["memory_mib"]
        if used + mib > total:
            raise OutOfMemory(
                "CUDA out of memory. Tried to allocate %.2f GiB. GPU %d has a total capacity of "
                "%.2f GiB of which %.2f GiB is free. Process %d has %.2f GiB memory in use."
                % (mib / 1024, gpu, total / 1024, (total - used) / 1024, pid, used / 1024)
            )
        rec = {
            "gpu": gpu,
            "mib": mib,
            "pid": pid,
            "start_time": start,
            "name": _process_name(pid),
            "created": time.time(),
        }
        name = "%d-%d-%d-%s.json" % (gpu, pid, start, uuid.uuid4().hex[:8])
        _atomic_write_json(os.path.join(_alloc_dir(), name), rec)
    return rec


def free(gpu=None, pid=None, everyone=False):
    """Drop allocations on ``gpu`` (None: all GPUs) held by ``pid`` (None: this process).

    ``everyone=True`` ignores ``pid`` (a GPU reset). Returns the number of MiB released.
    """
    pid = os.getpid() if pid is None else int(pid)
    released = 0
    with _locked():
        for rec in _read_records():
            if gpu is not None and rec["gpu"] != int(gpu):
                continue
            if not everyone and rec["pid"] != pid:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(rec["_path"])
                released += int(rec["mib"])
    return released


def snapshot():
    """Per-GPU state: [{index, uuid, name, used_mib, total_mib, util_pct, error, processes}].

    ``processes`` lists live holders only ([{pid, name, used_mib}]); memory of a dead holder
    still inside its release delay counts in ``used_mib`` with no process listed (as a stuck
    context looks on a real GPU). ``error`` is the injected bracketed value or None.
    ``foreign_mib``: other tenants' memory on this GPU (in ``used_mib``, in no process). This
    is the truth (the host's view); ``container_view`` is what nvidia-smi in the container shows.
    """
    cfg = load_config()
    with _locked(write=False) as writable:
        records = _live_records(cfg, writable)
    holdings = [(r, r["pid"] if r["alive"] else None, r.get("name") or "") for r in records]
    return _gpu_rows(cfg, holdings, foreign=cfg["foreign_mib"], errors=cfg["errors"])


def node_slot(cfg, index):
    """The node's slot of the container's GPU ``index`` (node_slots)."""
    slots = cfg.get("node_slots")
    return slots[index] if slots else index


def _gpu_rows(cfg, holdings, foreign=None, errors=None):
    """Per-GPU rows of ``cfg``'s GPUs from ``holdings`` [(record, pid of its live holder or None
    (memory of a dead holder, no process), the holder's name)], ``foreign`` {"index": MiB} of
    other tenants and ``errors`` {"index": "[bracketed value]"}."""
    foreign, errors = foreign or {}, errors or {}
    gpus = []
    for index in range(cfg["count"]):
        mine = [h for h in holdings if h[0]["gpu"] == index]
        procs = {}
        for rec, pid, name in mine:
            if pid is not None:
                entry = procs.setdefault(pid, {"pid": pid, "name": name, "used_mib": 0})
                entry["used_mib"] += int(rec["mib"])
        extra = foreign.get(str(index), 0)
        gpus.append({
            "index": index,
            "uuid": gpu_uuid(node_slot(cfg, index), cfg["uuid_seed"]),
            "name": cfg["name"],
            "pci_bus_id": pci_bus_id(node_slot(cfg, index)),
            "used_mib": sum(int(rec["mib"]) for rec, _pid, _name in mine) + extra,
            "total_mib": cfg["memory_mib"],
            "util_pct": (100 - index % 4) if procs or extra > 0 else 0,
            "error": errors.get(str(index)),
            "processes": sorted(procs.values(), key=lambda p: p["pid"]),
            "foreign_mib": extra,
        })
    return gpus


def container_view(gpus, passthrough):
    """The GPUs as nvidia-smi inside a container shows them: memory as it is (every tenant's);
    processes as they are (None), none ("empty"), or under host PIDs that do not exist in the
    container, named `[Not Found]`, the other tenants' included ("host_pids")."""
    if passthrough is None:
        return gpus
    view = []
    for g in gpus:
        procs = []
        if passthrough == "host_pids":
            procs = [{"pid": HOST_PID_OFFSET + p["pid"], "name": NOT_FOUND, "used_mib": p["used_mib"]}
                     for p in g["processes"]]
            if g.get("foreign_mib"):
                procs.append({"pid": FOREIGN_HOST_PID + g["index"], "name": NOT_FOUND, "used_mib": g["foreign_mib"]})
        view.append(dict(g, processes=sorted(procs, key=lambda p: p["pid"])))
    return view


# ---------------------------------------------------------------------------------------------
# the node's view: nvidia-smi on the lab host, where the GPUs of several containers meet

# vmids of the lab containers whose simulated GPUs are the node's GPUs (whitespace-separated);
# missing or empty: the node shows no GPU.
NODE_TENANTS_FILE = "/etc/dflash-lab/node-gpus"


def pid_namespace(pid):
    """The PID namespace of ``pid`` (``pid:[4026531836]``), None when it cannot be read."""
    try:
        return os.readlink("/proc/%d/ns/pid" % int(pid))
    except OSError:
        return None


def host_pids(namespace):
    """{pid inside ``namespace``: host pid} for every process of that PID namespace (the last
    field of NSpid in /proc/<pid>/status is the pid as the namespace's own processes see it)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or pid_namespace(name) != namespace:
            continue
        try:
            with open("/proc/%s/status" % name, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if line.startswith("NSpid:"):
                        found[int(line.split()[-1])] = int(name)
                        break
        except (OSError, ValueError, IndexError):
            continue
    return found


def tenant_holdings(state, init_pid, now=None):
    """What one container's allocations hold, seen from the node: [(record, host pid or None)].

    A record counts while its holder lives (its pid inside the container mapped to a host pid
    with the same start time), or after its death within the container's release delay (no
    process then, like a stuck context); records from before the container booted never count.
    Read-only: the container's own nvidia-smi keeps its records.
    """
    now = time.time() if now is None else now
    cfg = load_config(os.path.join(state, "config.json"))
    delay = cfg.get("release_delay_s")
    booted = boot_time(init_pid)
    mapping = host_pids(pid_namespace(init_pid))
    held = []
    for rec in _read_records(os.path.join(state, "alloc")):
        if _from_earlier_boot(rec, booted):
            continue
        host_pid = mapping.get(rec["pid"])
        if host_pid is not None and process_start_time(host_pid) == rec.get("start_time"):
            held.append((rec, host_pid))
            continue
        if _released(rec.get("dead_since") or now, now, delay):
            continue
        held.append((rec, None))
    return held


def node_view(tenants, now=None):
    """The node's GPUs: every tenant's allocations on one set of GPUs (shaped as the first
    tenant's configuration), each live holder under its host PID and the name nvidia-smi prints
    for it (argv0_name: whatever the tenant's process calls itself, unquoted).
    ``tenants``: [(state dir, init pid)]; no tenant: no GPU."""
    if not tenants:
        return []
    cfgs = [load_config(os.path.join(state, "config.json")) for state, _pid in tenants]
    # the node's GPUs: every slot a tenant was given (node_slots), else as many as the tenant sees
    count = max(c["node_count"] if c.get("node_slots") else c["count"] for c in cfgs)
    node = dict(cfgs[0], node_slots=None, count=count)
    holdings = [(dict(rec, gpu=node_slot(cfg, rec["gpu"])), pid, argv0_name(pid) if pid is not None else None)
                for (state, init_pid), cfg in zip(tenants, cfgs)
                for rec, pid in tenant_holdings(state, init_pid, now)
                if rec["gpu"] < cfg["count"]]
    return _gpu_rows(node, holdings)


def lab_tenants(path=NODE_TENANTS_FILE):
    """[(state dir, init pid)] of the running lab containers listed in ``path``."""
    try:
        with open(path, encoding="utf-8") as fh:
            vmids = fh.read().split()
    except FileNotFoundError:
        return []
    tenants = []
    for vmid in vmids:
        res = subprocess.run(["lxc-info", "-n", vmid, "-p", "-H"], capture_output=True, text=True, check=False)
        pid = res.stdout.strip()
        if res.returncode == 0 and pid.isdigit():
            tenants.append(("/proc/%s/root%s" % (pid, DEFAULT_STATE_DIR), int(pid)))
    return tenants


def node_smi_main(argv=None):
    """nvidia-smi on the lab host: the GPUs of the containers in NODE_TENANTS_FILE."""
    tenants = lab_tenants(os.environ.get("FAKEGPU_NODE_TENANTS_FILE") or NODE_TENANTS_FILE)
    rc, text = smi(sys.argv[1:] if argv is None else argv, view=lambda: node_view(tenants))
    sys.stdout.write(text)
    sys.stdout.flush()
    return rc


# ---------------------------------------------------------------------------------------------
# nvidia-smi stand-in

_GPU_FIELDS = {
    # field: (header, unit or None, numeric)
    "index": ("index", None, False),
    "uuid": ("uuid", None, False),
    "gpu_uuid": ("uuid", None, False),
    "name": ("name", None, False),
    "gpu_name": ("name", None, False),
    "pci.bus_id": ("pci.bus_id", None, False),
    "gpu_bus_id": ("pci.bus_id", None, False),
    "count": ("count", None, False),
    "memory.used": ("memory.used", "MiB", True),
    "memory.total": ("memory.total", "MiB", True),
    "memory.free": ("memory.free", "MiB", True),
    "utilization.gpu": ("utilization.gpu", "%", True),
}
_APP_FIELDS = {
    "pid": ("pid", None, False),
    "process_name": ("process_name", None, False),
    "name": ("process_name", None, False),
    "used_memory": ("used_gpu_memory", "MiB", True),
    "used_gpu_memory": ("used_gpu_memory", "MiB", True),
    "gpu_uuid": ("gpu_uuid", None, False),
    "gpu_bus_id": ("gpu_bus_id", None, False),
    "gpu_name": ("gpu_name", None, False),
}
_INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
_HELP = """NVIDIA System Management Interface -- fakegpu stand-in (dflash.trainer lab)

nvidia-smi [OPTION1 [ARG1]] ...

    -h,   --help                Print usage information and exit.
    -L,   --list-gpus           Display a list of GPUs connected to the system.
    -i,   --id=                 Target a specific GPU (index, UUID or PCI bus id; comma list).
    --query-gpu=                Fields: index, uuid, name, pci.bus_id, count, memory.used,
                                memory.total, memory.free, utilization.gpu
    --query-compute-apps=       Fields: pid, process_name (name), used_memory, gpu_uuid,
                                gpu_bus_id, gpu_name
    --format=                   csv[,noheader][,nounits]
"""


def _gpu_value(field, gpu, count):
    if field in ("index",):
        return str(gpu["index"])
    if field in ("uuid", "gpu_uuid"):
        return gpu["uuid"]
    if field in ("name", "gpu_name"):
        return gpu["name"]
    if field in ("pci.bus_id", "gpu_bus_id"):
        return gpu["pci_bus_id"]
    if field == "count":
        return str(count)
    if field == "memory.used":
        return str(gpu["used_mib"])
    if field == "memory.total":
        return str(gpu["total_mib"])
    if field == "memory.free":
        return str(gpu["total_mib"] - gpu["used_mib"])
    if field == "utilization.gpu":
        return str(gpu["util_pct"])
    raise KeyError(field)


def _app_value(field, proc, gpu):
    if field == "pid":
        return str(proc["pid"])
    if field in ("process_name", "name"):
        return proc["name"] or "[Not Found]"
    if field in ("used_memory", "used_gpu_memory"):
        return str(proc["used_mib"])
    if field == "gpu_uuid":
        return gpu["uuid"]
    if field == "gpu_bus_id":
        return gpu["pci_bus_id"]
    if field == "gpu_name":
        return gpu["name"]
    raise KeyError(field)


def _cell(value, unit, numeric, error, nounits):
    if numeric and error:
        return error
    if unit and not nounits:
        return "%s %s" % (value, unit)
    return value


def _csv(fields, table, rows, fmt):
    """rows: list of (values dict, error) -> text."""
    noheader = "noheader" in fmt
    nounits = "nounits" in fmt
    lines = []
    if not noheader:
        heads = []
        for f in fields:
            head, unit = table[f][:2]
            heads.append(head if (unit is None or nounits) else "%s [%s]" % (head, unit))
        lines.append(", ".join(heads))
    for values, error in rows:
        lines.append(", ".join(
            _cell(values[f], table[f][1], table[f][2], error, nounits) for f in fields))
    return "".join(line + "\n" for line in lines)


def _parse_smi_args(argv):
    """-> dict(mode, fields, format, ids) or raises _SmiExit."""
    opts = {"mode": "table", "fields": None, "format": None, "ids": None}
    args = list(argv)
    i = 0

    def value(flag):
        nonlocal i
        arg = args[i]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
        if arg == flag and i + 1 < len(args):
            i += 1
            return args[i]
        raise _SmiExit(2, _INVALID_ARGS + "\n")

    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            raise _SmiExit(0, _HELP)
        if arg in ("-L", "--list-gpus"):
            mode = "list"
        elif arg.startswith("--query-gpu"):
            mode = "gpu"
            opts["fields"] = value("--query-gpu")
        elif arg.startswith("--query-compute-apps"):
            mode = "apps"
            opts["fields"] = value("--query-compute-apps")
        elif arg.startswith("--format"):
            opts["format"] = value("--format")
            mode = None
        elif arg.startswith("--id"):
            opts["ids"] = value("--id")
            mode = None
        elif arg == "-i" or arg.startswith("-i="):
            opts["ids"] = value("-i")
            mode = None
        elif arg.startswith("-i") and len(arg) > 2:
            opts["ids"] = arg[2:]
            mode = None
        else:
            raise _SmiExit(2, _INVALID_ARGS + "\n")
        if mode is not None:
            if opts["mode"] != "table" and opts["mode"] != mode:
                raise _SmiExit(2, _INVALID_ARGS + "\n")
            opts["mode"] = mode
        i += 1
    if opts["mode"] in ("gpu", "apps"):
        if opts["format"] is None:
            raise _SmiExit(2, '"--format" has to be specified with "--query-*". '
                              "Please run 'nvidia-smi -h' for help.\n")
        fmt = [p.strip() for p in opts["format"].split(",") if p.strip()]
        if "csv" not in fmt or any(p not in ("csv", "noheader", "nounits") for p in fmt):
            raise _SmiExit(2, _INVALID_ARGS + "\n")
        opts["format"] = fmt
    elif opts["format"] is not None:
        raise _SmiExit(2, _INVALID_ARGS + "\n")
    return opts


class _SmiExit(Exception):
    def __init__(self, rc, text):
        super().__init__(rc, text)
        self.rc = rc
        self.text = text


def _select(gpus, ids):
    if ids is None:
        return gpus
    chosen = []
    for ident in (p.strip() for p in ids.split(",")):
        match = [g for g in gpus
                 if ident in (str(g["index"]), g["uuid"], g["pci_bus_id"])]
        if not match:
            raise _SmiExit(6, "No devices were found\n")
        chosen.extend(m for m in match if m not in chosen)
    return chosen


def _table(gpus):
    """The human view (not byte-compatible; only the CSV forms are)."""
    def row(text):
        return "|" + text.ljust(89)[:89] + "|"

    border = "+" + "-" * 89 + "+"
    gpu_fmt = " %3s  %-34s | %-16s | %19s | %4s"
    out = [datetime.datetime.now().strftime("%a %b %d %H:%M:%S %Y"), border,
           row(" NVIDIA-SMI 550.54.15 (fakegpu)   Driver Version: 550.54.15   CUDA Version: 12.4"),
           row(gpu_fmt % ("GPU", "Name", "Bus-Id", "Memory-Usage", "Util")),
           row("=" * 89)]
    for g in gpus:
        mem = g["error"] or "%dMiB / %dMiB" % (g["used_mib"], g["total_mib"])
        util = "" if g["error"] else "%d%%" % g["util_pct"]
        out.append(row(gpu_fmt % (g["index"], g["name"][:34], g["pci_bus_id"], mem, util)))
    out += [border, "", border, row(" Processes:"),
            row("  GPU        PID   Process name%s GPU Memory" % (" " * 43)), row("=" * 89)]
    procs = [(g, p) for g in gpus for p in g["processes"]]
    if not procs:
        out.append(row("  No running processes found"))
    for g, p in procs:
        out.append(row("  %3d  %9d   %-54s %8dMiB" % (g["index"], p["pid"], p["name"][-54:], p["used_mib"])))
    out.append(border)
    return "\n".join(out) + "\n"


def smi(argv, view=None):
    """Run the nvidia-smi stand-in on ``argv`` (without the program name) -> (rc, stdout).

    ``view``: a callable returning the GPUs to render (node_view for the node's nvidia-smi);
    default: this container's GPUs as nvidia-smi inside it shows them.
    """
    try:
        opts = _parse_smi_args(argv)
        if view is None:
            if os.path.exists(os.path.join(state_dir(), "driver_error")):
                raise _SmiExit(9, DRIVER_ERROR_TEXT + "\n")
            cfg = load_config()
            if cfg["exit_code"] in EXIT_TEXTS:
                raise _SmiExit(cfg["exit_code"], EXIT_TEXTS[cfg["exit_code"]] + "\n")
            if cfg["exit_code"] == 14:  # infoROM corrupted: the normal answer, then exit 14
                rc, text = smi(argv, view=lambda: container_view(snapshot(), cfg["passthrough"]))
                return (14 if rc == 0 else rc), text
            gpus = container_view(snapshot(), cfg["passthrough"])
        else:
            gpus = view()
        if not gpus:
            raise _SmiExit(6, "No devices were found\n")
        if opts["mode"] == "list":
            return 0, "".join("GPU %d: %s (UUID: %s)\n" % (g["index"], g["name"], g["uuid"])
                              for g in _select(gpus, opts["ids"]))
        if opts["mode"] == "table":
            return 0, _table(_select(gpus, opts["ids"]))
        table = _GPU_FIELDS if opts["mode"] == "gpu" else _APP_FIELDS
        fields = [f.strip() for f in opts["fields"].split(",")]
        for f in fields:
            if f not in table:
                raise _SmiExit(2, 'Field "%s" is not a valid field to query.\n\n' % f)
        selected = _select(gpus, opts["ids"])
        if opts["mode"] == "gpu":
            rows = [({f: _gpu_value(f, g, len(gpus)) for f in fields}, g["error"])
                    for g in selected]
        else:
            rows = [({f: _app_value(f, p, g) for f in fields}, g["error"])
                    for g in selected for p in g["processes"]]
        return 0, _csv(fields, table, rows, opts["format"])
    except _SmiExit as exc:
        return exc.rc, exc.text


def hang_seconds():
    """How long the nvidia-smi program hangs before it answers: None (it does not hang), a
    number of seconds, or ``math.inf`` (never answers). Read from the ``hang`` file."""
    try:
        with open(os.path.join(state_dir(), "hang"), encoding="utf-8") as fh:
            text = fh.read().strip().lower()
    except FileNotFoundError:
        return None
    if text in ("", "forever", "inf"):
        return math.inf
    try:
        return max(0.0, float(text))
    except ValueError:
        return math.inf  # a garbled knob still hangs: the mode was asked for


def _hanging_dir():
    return os.path.join(state_dir(), "hanging")


def hang(seconds):
    """Hang like an nvidia-smi stuck in the driver: deaf to SIGTERM/SIGINT/SIGHUP (a process
    blocked in an ioctl does not run handlers; only SIGKILL gets it), for ``seconds``
    (``math.inf``: forever). ``hanging/<pid>`` marks it while it hangs."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    marker = os.path.join(_hanging_dir(), str(os.getpid()))
    try:
        os.makedirs(_hanging_dir(), exist_ok=True)
        open(marker, "w").close()
    except OSError:  # a read-only state dir (not root): hang unmarked
        pass
    try:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 3600.0))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)


def hanging_pids():
    """Pids marked as hanging (some may be dead already: SIGKILL leaves the marker behind)."""
    try:
        return sorted(int(name) for name in os.listdir(_hanging_dir()) if name.isdigit())
    except FileNotFoundError:
        return []


def smi_main(argv=None):
    seconds = hang_seconds()
    if seconds is not None:
        hang(seconds)
    rc, text = smi(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(text)
    sys.stdout.flush()
    return rc


# ---------------------------------------------------------------------------------------------
# CLI

def _slots_arg(text):
    """--node-slots: "5,3" -> [5, 3]; "off" -> [] (no slots)."""
    if text == "off":
        return []
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("slots are whole numbers, comma-separated, or off: %r" % text)


def _gpu_list(text):
    return [int(p) for p in str(text).split(",") if p.strip()]


def _delay(text):
    if text.lower() in ("never", "null", "none"):
        return None
    value = float(text)
    return None if value < 0 else (int(value) if value.is_integer() else value)


def _hang_arg(text):
    text = text.strip().lower()
    if text in ("forever", "off"):
        return text
    value = float(text)  # argparse turns the ValueError into a usage error
    if value < 0:
        raise ValueError(text)
    return "%g" % value


def _show(as_json):
    gpus = snapshot()
    if as_json:
        return json.dumps(gpus, indent=2) + "\n"
    lines = []
    for g in gpus:
        procs = " ".join("%d:%dMiB" % (p["pid"], p["used_mib"]) for p in g["processes"])
        lines.append("gpu %d %s used=%d/%d MiB util=%d%%%s%s%s" % (
            g["index"], g["uuid"], g["used_mib"], g["total_mib"], g["util_pct"],
            " error=%s" % g["error"] if g["error"] else "", " procs=" + procs if procs else "",
            " foreign=%dMiB" % g["foreign_mib"] if g["foreign_mib"] else ""))
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m fakegpu",
                                     description=__doc__.split("\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_alloc = sub.add_parser("alloc", help="allocate memory (held by --pid, by default the caller)")
    p_alloc.add_argument("--gpu", required=True, help="GPU index or comma list")
    p_alloc.add_argument("--mib", required=True, type=int, help="MiB per GPU")
    p_alloc.add_argument("--pid", type=int, help="holder (default: the parent process)")
    p_alloc.add_argument("--hold", action="store_true",
                         help="this process holds the memory and sleeps until killed")
    p_free = sub.add_parser("free", help="drop allocations (default: all of them)")
    p_free.add_argument("--gpu", type=int)
    p_free.add_argument("--pid", type=int)
    p_show = sub.add_parser("show", help="print the GPUs' state")
    p_show.add_argument("--json", action="store_true")
    p_cfg = sub.add_parser("config", help="update config.json")
    p_cfg.add_argument("--count", type=int)
    p_cfg.add_argument("--memory-mib", type=int)
    p_cfg.add_argument("--name")
    p_cfg.add_argument("--uuid-seed")
    p_cfg.add_argument("--node-slots", type=_slots_arg, metavar="SLOT,SLOT...|off",
                       help="the node's GPUs this container was given, in its order (5,3: its GPU 0 is the node's "
                            "GPU 5); off: the node's, as numbered there")
    p_cfg.add_argument("--release-delay", type=_delay, default=argparse.SUPPRESS,
                       help="seconds, or 'never' / negative for a stuck context")
    p_cfg.add_argument("--error", action="append", default=[], metavar="INDEX=TEXT",
                       help="inject an error value for a GPU, e.g. 0='[GPU is lost]'")
    p_cfg.add_argument("--clear-errors", action="store_true")
    p_cfg.add_argument("--driver-error", choices=("on", "off"),
                       help="make nvidia-smi fail as if the driver were gone")
    p_cfg.add_argument("--hang", type=_hang_arg, metavar="forever|SECONDS|off",
                       help="make nvidia-smi hang (forever, or answer after SECONDS); off: answer")
    p_cfg.add_argument("--passthrough", choices=("off", "empty", "host-pids"),
                       help="nvidia-smi's process view as in an LXC container with GPUs passed through")
    p_cfg.add_argument("--exit-code", choices=("off",) + tuple(str(c) for c in EXIT_CODES),
                       help="nvidia-smi exits with this status (14: with its normal output); off: 0")
    p_cfg.add_argument("--foreign", action="append", default=[], metavar="INDEX=MIB",
                       help="another tenant holds MIB on GPU INDEX (0 removes it)")
    p_cfg.add_argument("--clear-foreign", action="store_true")
    args = parser.parse_args(argv)

    if args.cmd == "alloc":
        pid = os.getpid() if args.hold else (args.pid or os.getppid())
        try:
            for gpu in _gpu_list(args.gpu):
                allocate(gpu, args.mib, pid=pid)
        except FakeGPUError as exc:
            print("fakegpu: %s" % exc, file=sys.stderr, flush=True)
            return 1
        print("fakegpu: %d MiB on gpu %s held by pid %d" % (args.mib, args.gpu, pid), flush=True)
        if args.hold:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            while True:
                signal.pause()
        return 0
    if args.cmd == "free":
        released = free(gpu=args.gpu, pid=args.pid, everyone=args.pid is None)
        print("fakegpu: released %d MiB" % released, flush=True)
        return 0
    if args.cmd == "show":
        sys.stdout.write(_show(args.json))
        return 0
    # config
    changes = {}
    for key in ("count", "memory_mib", "name", "uuid_seed"):
        if getattr(args, key) is not None:
            changes[key] = getattr(args, key)
    if hasattr(args, "release_delay"):
        changes["release_delay_s"] = args.release_delay
    if args.error or args.clear_errors:
        errors = {} if args.clear_errors else dict(load_config()["errors"])
        for item in args.error:
            index, text = item.split("=", 1) if "=" in item else (item, "")
            errors[str(int(index))] = text
        changes["errors"] = errors
    if args.node_slots is not None:
        changes["node_slots"] = args.node_slots or None
    if args.passthrough:
        changes["passthrough"] = None if args.passthrough == "off" else args.passthrough.replace("-", "_")
    if args.exit_code:
        changes["exit_code"] = None if args.exit_code == "off" else int(args.exit_code)
    if args.foreign or args.clear_foreign:
        foreign = {} if args.clear_foreign else dict(load_config()["foreign_mib"])
        for item in args.foreign:
            index, mib = item.split("=", 1)
            foreign[str(int(index))] = int(mib)
        changes["foreign_mib"] = {k: v for k, v in foreign.items() if v > 0}
    cfg = write_config(**changes)
    if args.driver_error == "on":
        open(os.path.join(state_dir(), "driver_error"), "w").close()
    elif args.driver_error == "off":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(state_dir(), "driver_error"))
    if args.hang == "off":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(state_dir(), "hang"))
        for pid in hanging_pids():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(_hanging_dir(), str(pid)))
    elif args.hang is not None:
        with open(os.path.join(state_dir(), "hang"), "w", encoding="utf-8") as fh:
            fh.write(args.hang + "\n")
    print(json.dumps(cfg, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
