# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia-smi: argv builders and parsers for its CSV output (pure, no I/O).

Formats follow the real tool (see FIELD-NOTES "nvidia-smi's real CSV format"):
cells separated by ", ", headers and units present unless ``noheader``/``nounits``,
error values bracketed inside numeric columns (``[N/A]``), ``--query-compute-apps`` with no
process prints the header alone (nothing with ``noheader``).

Inside a container the per-GPU memory is right but the process list may be empty or show host
PIDs (whose names this namespace cannot see): judge memory from ``--query-gpu``, use processes only
to name holders.
"""

from __future__ import annotations

import os
import re
import stat

GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")

# The node's process query (trainer_node_gpus): no free text. nvidia-smi prints a process name
# unquoted and every tenant of the node chooses its own (commas, newlines and all), so a name
# column lets another container forge rows ("a, x, 1\n<our pid>, p" makes its memory ours) or
# break every read (a bare newline). Asked for numbers and UUIDs only, nvidia-smi prints nothing a
# tenant controls; names come from the node's /proc/<pid>/comm. With ``--format=csv`` (header and
# units) the header says which columns came back and in which order.
NODE_APP_FIELDS = ("gpu_uuid", "pid", "used_memory")
NODE_APP_HEADER = ("gpu_uuid", "pid", "used_gpu_memory [MiB]")

# Bracketed values nvidia-smi prints in place of a number or a name.
ERROR_VALUES = frozenset((
    "[N/A]",
    "[Not Supported]",
    "[Insufficient Permissions]",
    "[Unknown Error]",
    "[GPU is lost]",
    "[GPU requires reset]",
    "[Not Found]",
))

# nvidia-smi(1) "RETURN VALUE".
EXIT_CODES = {
    0: "ok",
    2: "invalid argument",
    3: "not supported",
    4: "no permission",
    6: "not found",
    8: "external power cables not attached",
    9: "driver not loaded",
    12: "NVML not found",
    14: "infoROM corrupted",
    15: "GPU fell off the bus",
    255: "other error",
}

# Statuses that come with valid output and only warn (nvidia-smi(1): "the infoROM is corrupted"):
# the output is used, the words are shown.
WARNING_CODES = {
    14: "a GPU's infoROM is corrupted (nvidia-smi exit 14; its output is used): the GPU works, but have "
        "its infoROM looked at on the node (`nvidia-smi -q` there shows the InfoROM section)",
}

# Statuses that are the node's fault, never the trainer's: nothing a deploy does inside the container
# fixes them, so they refuse before anything changes, and a release is never blamed for them.
NODE_FAULTS = {
    9: "the NVIDIA driver on the node is not loaded or does not answer: load it there (`nvidia-smi` on "
       "the node must work) and make the container's driver user-space the node's version",
    15: "a GPU fell off the bus: the node needs that GPU reset or the node rebooted (the node's `dmesg` "
        "names it, Xid 79)",
}

# Texts that mean "no usable GPU", whatever the exit status says.
FAILURE_TEXTS = (
    "No devices were found",
    "Failed to initialize NVML",
    "NVIDIA-SMI has failed",
    "Unable to determine the device handle",
)

# Every field we query is a count, MiB or %: no sign, and no more digits than a 64-bit value has.
_NUMBER_RE = re.compile(r"^(\d{1,20}(?:\.\d{1,20})?)(?:\s*(?:MiB|%|W|MHz|C|KiB|GiB))?$")
# One greedy ".*" (not "\s+(.*?)\s+"): the lazy form backtracks cubically on a long blank line.
_LIST_GPU_RE = re.compile(r"^GPU\s+(?P<index>\d+):(?P<name>\s.*)\s\(UUID:\s*(?P<uuid>[^()]+)\)\s*$")
_LIST_MIG_RE = re.compile(
    r"^\s+MIG\s+(?P<profile>\S+)\s+Device\s+(?P<device>\d+):\s+\(UUID:\s*(?P<uuid>[^)]+)\)\s*$"
)


class NvidiaSmiError(ValueError):
    """Output that cannot be what nvidia-smi prints for the query we made, or a failed nvidia-smi.
    ``rc``: its exit status when it failed; ``node_fault``: the status is the node's fault (NODE_FAULTS)."""

    def __init__(self, msg, rc=None):
        super().__init__(msg)
        self.rc = rc
        self.node_fault = rc in NODE_FAULTS


# ---------------------------------------------------------------------------------------------
# argv

def query_gpu_argv(nvidia_smi="nvidia-smi", fields=GPU_FIELDS):
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]


def query_node_apps_argv(nvidia_smi="nvidia-smi"):
    """The node's process query: header and units kept (parse_node_apps checks both)."""
    return [nvidia_smi, "--query-compute-apps=" + ",".join(NODE_APP_FIELDS), "--format=csv"]


def list_argv(nvidia_smi="nvidia-smi"):
    return [nvidia_smi, "-L"]


# ---------------------------------------------------------------------------------------------
# errors

def exit_meaning(rc):
    """Words for an nvidia-smi exit status."""
    return EXIT_CODES.get(rc, "unknown exit status")


def failure_message(rc, stdout="", stderr=""):
    """Return "nvidia-smi failed (exit 9: driver not loaded): <output>", or None when fine.

    A zero exit with a known failure text ("No devices were found", "Failed to initialize
    NVML: ...") is a failure too. A warning status (WARNING_CODES: 14) with output is no failure
    (warning_message says it); one without output is. A node's fault (NODE_FAULTS: 9, 15) says so
    and what to do on the node.
    """
    output = " ".join(part.strip() for part in (stderr or "", stdout or "") if part and part.strip())
    output = re.sub(r"\s*\n\s*", " ", output)
    if rc == 0 or (rc in WARNING_CODES and (stdout or "").strip()):
        for text in FAILURE_TEXTS:
            if text in (stdout or "") or text in (stderr or ""):
                return "nvidia-smi failed (exit %d): %s" % (rc, output)
        return None
    msg = "nvidia-smi failed (exit %d: %s): %s" % (rc, exit_meaning(rc), output or "(no output)")
    if rc in NODE_FAULTS:
        msg += " - the node's fault, not the trainer's: " + NODE_FAULTS[rc]
    return msg


def warning_message(rc, stdout=""):
    """Words for a status that only warns (WARNING_CODES) and came with output, else None."""
    if rc in WARNING_CODES and (stdout or "").strip():
        return WARNING_CODES[rc]
    return None


def _check(rc, out, err):
    """failure_message raised as NvidiaSmiError (with rc), else the warning (or None)."""
    msg = failure_message(rc, out, err)
    if msg:
        raise NvidiaSmiError(msg, rc=rc)
    return warning_message(rc, out)


# ---------------------------------------------------------------------------------------------
# cells

def is_error_value(cell):
    return cell.startswith("[") and cell.endswith("]")


def _split(line, nfields):
    """Split one CSV row into ``nfields`` stripped cells. nvidia-smi does not quote: a row with
    another number of cells raises (nothing is folded back into a column)."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != nfields:
        raise NvidiaSmiError("nvidia-smi output: expected %d fields, got %d: %r" % (nfields, len(cells), line))
    return cells


def _header_key(cell):
    return re.sub(r"\[[^\[\]]*\]$", "", cell.strip()).strip()  # "memory.used [MiB]" -> "memory.used"


def _looks_like_header(cells, fields):
    keys = [_header_key(c) for c in cells]
    return keys[0] == fields[0] or sorted(keys) == sorted(fields)


def parse_number(cell):
    """Return (value, error) for a numeric cell: ``"130013 MiB"`` -> (130013, None),
    ``"[N/A]"`` -> (None, "[N/A]"). Raises NvidiaSmiError for anything else."""
    cell = cell.strip()
    if is_error_value(cell):
        return None, cell
    m = _NUMBER_RE.match(cell)
    if not m:
        raise NvidiaSmiError("nvidia-smi output: not a number: %r" % cell)
    text = m.group(1)
    return (float(text) if "." in text else int(text)), None


def parse_text(cell):
    cell = cell.strip()
    if is_error_value(cell):
        return None, cell
    return cell, None


def _rows(text, fields):
    """Yield dicts field -> raw cell, skipping blank lines and header lines (column order is
    taken from a header when one is present; a header of other fields raises)."""
    order = list(fields)
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line == "No running processes found":
            continue
        cells = _split(line, len(order))
        if _looks_like_header(cells, fields):
            keys = [_header_key(c) for c in cells]
            if sorted(keys) != sorted(fields):
                raise NvidiaSmiError("nvidia-smi output: header %r does not match the query (%s)" % (
                    line, ", ".join(fields)))
            order = keys
            continue
        yield dict(zip(order, cells))


# ---------------------------------------------------------------------------------------------
# parsers

def parse_query_gpu(text):
    """Parse ``--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu`` output.

    Returns a list of dicts: index, uuid, name, memory_used_mib, memory_total_mib,
    utilization_gpu_pct, errors (["memory.used: [N/A]", ...]). Error values become None.
    Raises NvidiaSmiError for output without GPU rows (nvidia-smi reports "No devices were
    found" instead), an index that is not a whole number, or an index listed twice.
    """
    gpus = []
    # An extra cell raises (_split): it must not shift memory.total into memory.used.
    for row in _rows(text, GPU_FIELDS):
        errors = []

        def num(field):
            value, err = parse_number(row[field])
            if err:
                errors.append("%s: %s" % (field, err))
            return value

        def txt(field):
            value, err = parse_text(row[field])
            if err:
                errors.append("%s: %s" % (field, err))
            return value

        index = num("index")
        gpu = {
            "index": index,
            "uuid": txt("uuid"),
            "name": txt("name"),
            "memory_used_mib": num("memory.used"),
            "memory_total_mib": num("memory.total"),
            "utilization_gpu_pct": num("utilization.gpu"),
            "errors": errors,
        }
        if index is None:
            raise NvidiaSmiError("nvidia-smi output: GPU row without an index: %r" % row)
        if not isinstance(index, int):
            raise NvidiaSmiError("nvidia-smi output: GPU index is not a whole number: %r" % row)
        if any(g["index"] == index for g in gpus):
            raise NvidiaSmiError("nvidia-smi output: GPU %d listed twice" % index)
        gpus.append(gpu)
    if not gpus:
        raise NvidiaSmiError("nvidia-smi output: no GPU rows in %r" % (text or "")[:200])
    return gpus


# The shapes of the node query's cells: nothing else is a row.
_NODE_UUID_RE = re.compile(r"^(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]{0,127}$")
_NODE_PID_RE = re.compile(r"^[0-9]{1,10}$")
_NODE_MIB_RE = re.compile(r"^([0-9]{1,20}) MiB$")
_NODE_ERROR_RE = re.compile(r"^\[[A-Za-z][A-Za-z /]{0,63}\]$")


def _node_row(cells):
    """One row's cells -> (app, None) or (None, why it is not a row)."""
    if len(cells) != len(NODE_APP_FIELDS):
        return None, "%d fields, not %d" % (len(cells), len(NODE_APP_FIELDS))
    uuid, pid, used = cells
    if not _NODE_UUID_RE.match(uuid):
        return None, "gpu_uuid is not a GPU-/MIG- UUID"
    if not _NODE_PID_RE.match(pid):
        return None, "pid is not a number"
    m = _NODE_MIB_RE.match(used)
    if m:
        return {"gpu_uuid": uuid, "pid": int(pid), "used_memory_mib": int(m.group(1)), "errors": []}, None
    if _NODE_ERROR_RE.match(used):
        return {"gpu_uuid": uuid, "pid": int(pid), "used_memory_mib": None,
                "errors": ["used_memory: %s" % used]}, None
    return None, "used_gpu_memory is neither \"<n> MiB\" nor a bracketed error value"


def parse_node_apps(text):
    """Parse the node's ``--query-compute-apps=gpu_uuid,pid,used_memory --format=csv`` output.

    Returns (apps, malformed): apps [{gpu_uuid, pid, used_memory_mib, errors}] (an error value
    such as ``[N/A]`` in used_gpu_memory: None, with the error named); malformed ["line 3:
    '...' (why)"] for every line that is not exactly such a row. The first line must be exactly
    the header ``gpu_uuid, pid, used_gpu_memory [MiB]`` (nvidia-smi prints it even with no
    process). Nothing is guessed: a line with another number of fields, a pid that is not
    digits, a UUID that is not ``GPU-``/``MIG-``, memory that is not ``<n> MiB`` is malformed,
    never folded, split or skipped; without the header first, every line is. Lines are split at "\\n" only; blank lines carry nothing.
    """
    apps, malformed = [], []
    header = None  # True: the header came first; False: it did not (no line is read as a row then)
    for number, raw in enumerate((text or "").split("\n"), 1):
        if not raw.strip():
            continue
        cells = [c.strip() for c in raw.split(",")]
        if header is None:
            header = tuple(cells) == NODE_APP_HEADER
            if header:
                continue
            malformed.append("line %d: %r (not the header %r)" % (number, raw[:200], ", ".join(NODE_APP_HEADER)))
            continue
        if not header:
            malformed.append("line %d: %r (no header before it)" % (number, raw[:200]))
            continue
        app, why = _node_row(cells)
        if app is None:
            malformed.append("line %d: %r (%s)" % (number, raw[:200], why))
        else:
            apps.append(app)
    if header is None:
        malformed.append("no header (nvidia-smi prints %r even when no process runs)" % ", ".join(NODE_APP_HEADER))
    return apps, malformed


def malformed_message(malformed):
    """"nvidia-smi --query-compute-apps printed 2 malformed lines (expected ...): line 2: ...; ..."."""
    shown = "; ".join(malformed[:3]) + ("; and %d more" % (len(malformed) - 3) if len(malformed) > 3 else "")
    return ("nvidia-smi --query-compute-apps printed %d malformed line%s (expected \"%s\" rows); not read as "
            "rows: %s" % (len(malformed), "" if len(malformed) == 1 else "s", ", ".join(NODE_APP_HEADER), shown))


def parse_list(text):
    """Parse ``nvidia-smi -L``: [{index, name, uuid, mig: [{profile, device, uuid}]}]."""
    gpus = []
    for raw in (text or "").splitlines():
        if not raw.strip():
            continue
        m = _LIST_GPU_RE.match(raw.rstrip())
        if m:
            gpus.append({"index": int(m.group("index")), "name": m.group("name").strip(),
                         "uuid": m.group("uuid").strip(), "mig": []})
            continue
        m = _LIST_MIG_RE.match(raw.rstrip())
        if m and gpus:
            gpus[-1]["mig"].append({"profile": m.group("profile"), "device": int(m.group("device")),
                                    "uuid": m.group("uuid").strip()})
            continue
        raise NvidiaSmiError("unexpected line in nvidia-smi -L output: %r" % raw)
    return gpus


def join_processes(gpus, apps):
    """Attach compute apps to GPUs by uuid: each GPU gets ``processes`` [{pid, process_name,
    used_memory_mib}]. Returns new GPU dicts; apps on an unknown uuid are dropped."""
    by_uuid = {}
    for app in apps:
        by_uuid.setdefault(app.get("gpu_uuid"), []).append({
            "pid": app["pid"],
            "process_name": app["process_name"],
            "used_memory_mib": app["used_memory_mib"],
        })
    joined = []
    for gpu in gpus:
        g = dict(gpu)
        g["processes"] = by_uuid.get(gpu.get("uuid"), []) if gpu.get("uuid") else []
        joined.append(g)
    return joined


def memory_by_index(gpus):
    """{index: memory_used_mib or None}."""
    return {g["index"]: g["memory_used_mib"] for g in gpus}


def index_ranges(indexes):
    """[0, 1, 2, 5] -> "0-2, 5" (for messages)."""
    out = []
    idx = sorted(set(indexes))
    i = 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        out.append(str(idx[i]) if i == j else "%d-%d" % (idx[i], idx[j]))
        i = j + 1
    return ", ".join(out)


# ---------------------------------------------------------------------------------------------
# one read (the command runner is injected: AnsibleModule.run_command in modules)

def locate(name, get_bin_path):
    """Path of the nvidia-smi to run, or None. ``name`` with a "/" is taken as a path."""
    import os
    if os.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return get_bin_path(name)


def not_found_message(name):
    return "nvidia-smi not found: %s (no NVIDIA driver/utilities on this host?)" % name


def require(module, name):
    """Path of the nvidia-smi to run, or fail the module saying it is missing."""
    path = locate(name, module.get_bin_path)
    if path is None:
        module.fail_json(msg=not_found_message(name))
    return path


def _run_smi(run, argv):
    """run(argv), a hang (CommandTimeout from a bounded runner) turned into NvidiaSmiError."""
    from ansible_collections.dflash.trainer.plugins.module_utils.target.command import CommandTimeout
    try:
        return run(argv)
    except CommandTimeout as e:
        raise NvidiaSmiError(str(e))


def read_gpus(run, nvidia_smi="nvidia-smi", processes=True, name_of=None):
    """One ``--query-gpu`` (+ one ``--query-compute-apps``) call through ``run(argv) -> (rc,
    out, err)``. Returns (gpus with ``processes``, warnings). Raises NvidiaSmiError with the
    failure message when the GPU query fails or hangs ("nvidia-smi did not answer within 30 s",
    when ``run`` is bounded: ``target.command.Runner``); a failed process query is only a warning (the
    memory figures are what counts).

    The process query asks for UUIDs, PIDs and MiB only (query_node_apps_argv): nvidia-smi prints
    process names unquoted, so a process named ``a, x, 1\n<pid>, p`` could forge a row. Names come
    from ``name_of(pid)`` (default: this machine's ``/proc/<pid>/comm``; None where the pid is not
    visible, as for the host PIDs the driver reports inside a container)."""
    rc, out, err = _run_smi(run, query_gpu_argv(nvidia_smi))
    warning = _check(rc, out, err)
    gpus = parse_query_gpu(out)
    warnings = [warning] if warning else []
    apps = []
    if processes:
        try:
            rc, out, err = _run_smi(run, query_node_apps_argv(nvidia_smi))
            msg = failure_message(rc, out, err) if rc not in WARNING_CODES else None
        except NvidiaSmiError as e:  # it hung: the memory figures we have still count
            msg = str(e)
        if msg:
            warnings.append("process list unavailable: " + msg)
        else:
            apps, malformed = parse_node_apps(out)
            if malformed:
                warnings.append("process list unreadable: %s" % malformed_message(malformed))
                apps = []
            for a in apps:
                a["process_name"] = (name_of or proc_comm)(a["pid"])
    return join_processes(gpus, apps), warnings


def proc_comm(pid):
    """The process's name from /proc/<pid>/comm on this machine, or None."""
    try:
        with open("/proc/%d/comm" % int(pid), "rb") as fh:
            return fh.read(64).decode("utf-8", "replace").rstrip("\n") or None
    except (IOError, OSError, ValueError):
        return None


def read_node_gpus(run, nvidia_smi="nvidia-smi"):
    """The node's read (trainer_node_gpus): ``--query-gpu`` as read_gpus, then the process query
    without names (query_node_apps_argv). Returns (gpus with ``processes`` [{pid, process_name:
    None, used_memory_mib}], warnings). On the node the process list is what counts, so a
    failed, hung or malformed process query raises NvidiaSmiError (never an empty list); rows
    on a GPU the GPU query did not list are dropped with a warning (their memory stays
    unattributed, never the trainer's)."""
    rc, out, err = _run_smi(run, query_gpu_argv(nvidia_smi))
    warning = _check(rc, out, err)
    gpus = parse_query_gpu(out)
    rc, out, err = _run_smi(run, query_node_apps_argv(nvidia_smi))
    if rc not in WARNING_CODES:  # a warning status: the GPU query already said it; the output counts
        _check(rc, out, err)
    apps, malformed = parse_node_apps(out)
    if malformed:
        raise NvidiaSmiError(malformed_message(malformed))
    known = {g.get("uuid") for g in gpus if g.get("uuid")}
    warnings = [warning] if warning else []
    warnings += ["process list: pid %d holds %s MiB on %s, a GPU --query-gpu did not list (not attributed)" % (
        a["pid"], a["used_memory_mib"], a["gpu_uuid"]) for a in apps if a["gpu_uuid"] not in known]
    for a in apps:
        a["process_name"] = None  # never asked: the node's /proc names the process
    return join_processes(gpus, apps), warnings


# ---------------------------------------------------------------------------------------------
# the device nodes CUDA opens in the container
# The device nodes the CUDA runtime opens inside the container (pure judge + one small read).
#
# On a Proxmox node the container sees the GPUs through bind-mounted ``/dev/nvidia*`` nodes
# (``lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file``). nvidia-smi
# needs only ``/dev/nvidiactl`` and ``/dev/nvidiaN``; every CUDA process also needs
# ``/dev/nvidia-uvm``, which exists on the node only once something loaded the UVM module (a CUDA
# process there, or ``nvidia-modprobe -u -c=0``). After a node reboot nvidia-smi works in the
# container while every CUDA start fails - and an ``optional`` bind of a missing node leaves an
# empty regular file in its place. So each node must be a character device, judged before the stop.
# ``/dev/nvidia-uvm-tools`` is used by profilers only (CUPTI, Nsight): missing, it is a warning.


DEVICE_NODES = ("nvidiactl", "nvidia-uvm")
DEVICE_NODES_OPTIONAL = ("nvidia-uvm-tools",)
_GPU_NODE = re.compile(r"^nvidia(\d+)$")

UVM_REMEDY = ("on the node run `nvidia-modprobe -u -c=0` (loads nvidia-uvm and creates /dev/nvidia-uvm and "
              "/dev/nvidia-uvm-tools; make it survive reboots, e.g. a systemd unit there), then restart the "
              "container (`pct reboot VMID`) so its bind mounts pick the nodes up")
BIND_REMEDY = ("bind-mount it from the node in the container's config (/etc/pve/lxc/VMID.conf: `lxc.mount.entry: "
               "/dev/{name} dev/{name} none bind,optional,create=file` and `lxc.cgroup2.devices.allow: c MAJOR:* rwm`)"
               " and restart the container")


def read_nodes(dev="/dev"):
    """{name: kind} for the nvidia* entries of ``dev``: "chr" (a character device), "empty" (an empty
    regular file: an optional bind of a node the node lacked), or "other"."""
    out = {}
    try:
        names = os.listdir(dev)
    except OSError:
        return out
    for name in names:
        if not name.startswith("nvidia"):
            continue
        try:
            st = os.stat(os.path.join(dev, name))
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            out[name] = "chr"
        elif stat.S_ISREG(st.st_mode) and st.st_size == 0:
            out[name] = "empty"
        else:
            out[name] = "other"
    return out


def _remedy(name):
    return UVM_REMEDY if name.startswith("nvidia-uvm") else BIND_REMEDY.format(name=name)


def _state(kind):
    return "missing" if kind is None else ("an empty file, not a device" if kind == "empty" else "not a device")


def node_problems(nodes):
    """(problems, warnings): words for each required node that is not a character device (missing, or
    left as an empty file), with how to create it on the node; the same for optional ones as warnings."""
    problems = ["/dev/%s is %s in the container (CUDA cannot start without it): %s" % (
        name, _state(nodes.get(name)), _remedy(name)) for name in DEVICE_NODES if nodes.get(name) != "chr"]
    if not any(_GPU_NODE.match(n) and k == "chr" for n, k in nodes.items()):
        problems.append("no /dev/nvidiaN GPU node in the container (CUDA sees no GPU): " +
                        BIND_REMEDY.format(name="nvidia0"))
    warnings = ["/dev/%s is %s in the container (profilers need it; training does not): %s" % (
        name, _state(nodes.get(name)), _remedy(name)) for name in DEVICE_NODES_OPTIONAL if nodes.get(name) != "chr"]
    return problems, warnings
