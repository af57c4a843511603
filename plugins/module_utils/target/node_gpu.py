# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's view of the GPUs: who holds their memory (pure, no I/O).

Inside an LXC container nvidia-smi shows every tenant's memory and no usable process list (the
driver reports host PIDs). On the Proxmox node itself nvidia-smi lists the host PIDs, and each
one's ``/proc/<pid>/cgroup`` names its container and the unit inside it:

* Proxmox VE (pve-container: ``lxc.cgroup.dir.container = lxc/<vmid>``, ``...inner = ns``):
  ``0::/lxc/200/ns/system.slice/dflash-trainer.service``
* plain LXC 5 (the lab): ``0::/lxc.payload.200/system.slice/dflash-trainer.service`` (or
  ``lxc.payload.200-2`` when a cgroup of an earlier start was left behind)
* cgroup v1 lines (``12:pids:/lxc/200/ns/...``) carry the same path; a process of the node
  itself: ``0::/system.slice/foo.service`` or ``/user.slice/.../session-3.scope``.

Only a system unit at its exact place counts as a unit (``owner``): a user of the container may run
a user unit of the trainer's name (``.../user.slice/user-1000.slice/user@1000.service/app.slice/
dflash-trainer.service``), which must never pass for the trainer.

Nothing another tenant controls is read as structure: the node's nvidia-smi is asked for numbers
and UUIDs only (target.nvidia_smi.read_node_gpus), a holder's container comes from the first component
of its cgroup path (the kernel refuses a newline in a cgroup name, so a tenant's own sub-cgroups
cannot add a line), a unit is a name of systemd's alphabet, and a process's name, read from the
node's ``/proc/<pid>/comm``, is only ever shown, escaped (``printable``).

From these, each GPU's memory is split into the trainer's (our container, our unit), other
holders in our container, other tenants (other containers, the node's own processes), and memory
no listed process accounts for.
"""

from __future__ import annotations

import re

# LXC appends "-<n>" when a container's cgroup from an earlier start is still there (lxc.payload.200-2)
_LXC_RE = re.compile(r"^/lxc(?:\.payload)?[./](?P<vmid>\d+)(?:-\d+)?(?:/ns)?(?P<inner>/.*)?$")
# the container's own systemd, as its cgroup root: plain LXC's lxc.payload.<id> (-<n>), Proxmox's
# lxc/<vmid>/ns (lxc.cgroup.dir.container + .inner); only there does its system.slice begin
_CT_ROOT_RE = re.compile(r"^/(?:lxc\.payload\.(?P<payload>\d+)(?:-\d+)?|lxc/(?P<pve>\d+)/ns)(?P<inner>/.*)$")
# a system unit: system.slice, the slices systemd nests it in (system-getty.slice for getty@tty1),
# the unit - and nothing below it. A user's own units live in user.slice/user-<uid>.slice/
# user@<uid>.service/app.slice/..., where a user may name a unit like ours: never a system unit.
_SYSTEM_UNIT_RE = re.compile(r"^/system\.slice(?:/[A-Za-z0-9:_.@\\-]{1,250}\.slice)*/(?P<unit>[^/]+)$")
# systemd's unit-name alphabet (systemd.unit(5)): a tenant's hand-made sub-cgroup named
# "x; 1 MiB held by dflash-trainer in CT 200.service" is no unit
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_.@\\-]{1,250}\.(?:service|scope)$")


def cgroup_path(text):
    """The process's cgroup path from /proc/<pid>/cgroup: the v2 line (``0::``), else the first
    v1 line whose path names a container, else the first v1 line; None when none is readable."""
    first = None
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        if parts[0] == "0" and parts[1] == "":
            return parts[2]
        if first is None or (_LXC_RE.match(parts[2]) and not _LXC_RE.match(first)):
            first = parts[2]
    return first


def system_unit(path):
    """The system unit whose cgroup is exactly ``path`` (relative to a systemd's cgroup root:
    ``/system.slice/dflash-trainer.service``), else None - a user's unit, a session scope, a
    sub-cgroup below a unit, a name outside systemd's alphabet."""
    m = _SYSTEM_UNIT_RE.match(path or "")
    return m.group("unit") if m and _UNIT_RE.match(m.group("unit")) else None


def owner(cgroup_text):
    """(vmid or None for the node itself, system unit or None) of a process, from its cgroup file.

    The container is the first component of the path (``lxc.payload.<id>``, ``lxc/<vmid>``); the
    unit only the container's own system unit at its exact place (``.../lxc.payload.<id>/
    system.slice/<unit>.service``, Proxmox's ``/lxc/<vmid>/ns/system.slice/<unit>.service``), or
    the node's (``/system.slice/<unit>.service``): a unit of the same name that a user of the
    container runs (``user@1000.service/app.slice/dflash-trainer.service``) is no unit here."""
    path = cgroup_path(cgroup_text)
    if path is None:
        return None, None
    m = _LXC_RE.match(path)
    if not m:
        return None, system_unit(path)
    vmid = int(m.group("vmid"))
    root = _CT_ROOT_RE.match(path)
    if root is None or int(root.group("payload") or root.group("pve")) != vmid:
        return vmid, None
    return vmid, system_unit(root.group("inner"))


def printable(text, limit=64):
    """A name for messages: every character that is not printable (a newline, a tab, a lone
    surrogate) or a backslash escaped, at most ``limit`` characters (``...`` marks a cut); None
    stays None. A process names itself: its name is shown, never parsed."""
    if text is None:
        return None
    out = "".join(c if c.isprintable() and c != "\\" else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                  for c in text)
    return out if len(out) <= limit else out[:limit] + "..."


def comm_name(text):
    """The process name from ``/proc/<pid>/comm`` (the kernel ends it with one newline), escaped."""
    if text is None:
        return None
    return printable(text[:-1] if text.endswith("\n") else text)


def unit_name(name):
    """``dflash-trainer`` -> ``dflash-trainer.service`` (units are compared by full name)."""
    return name if "." in name else name + ".service"


def who(holder):
    """"dflash-trainer in CT 200", "pid 812 (python3) in CT 231", "pid 77 (Xorg) on the node"."""
    unit = holder.get("unit")
    proc = "pid %s (%s)" % (holder.get("pid"), holder.get("name") or "?")
    what = unit[:-len(".service")] if unit and unit.endswith(".service") else (unit or proc)
    if unit and unit.endswith(".scope"):
        what = proc  # a session or an attached shell: the process says more than its scope
    if holder.get("vmid") is None:
        return "%s on the node" % what
    return "%s in CT %s" % (what, holder["vmid"])


def attribute(gpus, owners, vmid, unit, names=None):
    """Split each GPU's memory by holder.

    ``gpus``: parsed query-gpu rows with ``processes`` (target.nvidia_smi.read_gpus on the node);
    ``owners``: {host pid: (vmid, unit)} (from each pid's cgroup; a pid missing there is a
    process that exited between the two reads); ``names``: {host pid: name} (comm_name; default: the
    rows' own ``process_name``). Returns [{index, used_mib, total_mib, holders:
    [{pid, name, mib, vmid, unit, kind}], trainer_mib, same_ct_mib, foreign_mib, unlisted_mib}],
    ``kind`` being ``trainer`` (our container and unit), ``same_ct`` (our container, another
    unit) or ``foreign`` (another container, or the node itself).
    """
    unit = unit_name(unit)
    out = []
    for gpu in gpus:
        holders = []
        sums = {"trainer": 0, "same_ct": 0, "foreign": 0}
        for proc in gpu.get("processes") or []:
            pid = proc.get("pid")
            if pid is None or pid not in owners:
                continue
            ct, u = owners[pid]
            kind = "foreign" if ct != vmid else ("trainer" if u == unit else "same_ct")
            mib = proc.get("used_memory_mib") or 0
            name = names.get(pid) if names is not None else printable(proc.get("process_name"))
            holders.append({"pid": pid, "name": name, "mib": mib,
                            "vmid": ct, "unit": u, "kind": kind})
            sums[kind] += mib
        used = gpu.get("memory_used_mib")
        listed = sum(sums.values())
        out.append({
            "index": gpu["index"],
            "uuid": gpu.get("uuid"),
            "used_mib": used,
            "total_mib": gpu.get("memory_total_mib"),
            "holders": holders,
            "trainer_mib": sums["trainer"],
            "same_ct_mib": sums["same_ct"],
            "foreign_mib": sums["foreign"],
            "unlisted_mib": max(0, (used or 0) - listed),
        })
    return out


def in_container(attribution, container_gpus):
    """The node's GPUs numbered as the container numbers them, paired by UUID - the one identity both
    sides share: a container given some of the node's GPUs numbers them 0..k-1, the node by slot.

    ``container_gpus``: [{index, uuid}] as nvidia-smi in the container lists them. Returns
    (the paired GPUs, each entry a copy with ``index`` the container's and ``slot`` the node's, in the
    container's order; the container's GPUs the node does not list, as "GPU 0 (GPU-...)" words)."""
    by_uuid = {a.get("uuid"): a for a in attribution if a.get("uuid")}
    paired, unpaired = [], []
    for gpu in sorted(container_gpus, key=lambda g: g["index"]):
        node = by_uuid.get(gpu.get("uuid"))
        if node is None:
            unpaired.append("GPU %d (%s)" % (gpu["index"], gpu.get("uuid") or "no UUID"))
        else:
            paired.append(dict(node, index=gpu["index"], slot=node["index"]))
    return paired, unpaired


def unpaired_problem(unpaired):
    """Why the node view cannot judge the container's GPUs ``unpaired`` (in_container's words); None when none."""
    if not unpaired:
        return None
    return ("the node's nvidia-smi does not list the container's %s: the node view pairs GPUs by UUID (is "
            "trainer_node_nvidia_smi the node's, and the container on this node?)" % ", ".join(unpaired))


def label(a):
    """"GPU 0", or "GPU 0 (the node's GPU 5)" when the node numbers it otherwise."""
    slot = a.get("slot")
    if slot is None or slot == a["index"]:
        return "GPU %d" % a["index"]
    return "GPU %d (the node's GPU %d)" % (a["index"], slot)


def _select(attribution, indexes):
    return [a for a in attribution if indexes is None or a["index"] in indexes]


def mib_by_index(raw):
    """``{"7": 20000}`` (a module argument: its keys come as strings) -> ``{7: 20000}``."""
    return {int(k): int(v) for k, v in (raw or {}).items()}


def foreign_by_gpu(attribution, indexes=None):
    """{index: MiB other tenants hold} on the selected GPUs (only those with some)."""
    return {a["index"]: a["foreign_mib"] for a in _select(attribution, indexes) if a["foreign_mib"] > 0}


def lines(attribution, indexes=None):
    """"GPU 5: 30000 MiB held by dflash-trainer in CT 200; 20000 MiB by other-tenant in CT 231"."""
    out = []
    for a in _select(attribution, indexes):
        parts = ["%d MiB %s %s" % (h["mib"], "held by" if not i else "by", who(h))
                 for i, h in enumerate(sorted(a["holders"], key=lambda h: (h["kind"] != "trainer", -h["mib"])))]
        if a["unlisted_mib"]:
            parts.append("%d MiB by no process nvidia-smi lists" % a["unlisted_mib"])
        out.append("%s: %s" % (label(a), "; ".join(parts) if parts else "0 MiB, no holder"))
    return out


def preflight_problem(attribution, indexes, max_mib):
    """Before the stop: a trainer GPU on which a process of our own container other than the
    trainer holds more than ``max_mib`` would fail the drain gate after the stop (other
    tenants' memory does not: the drain gate allows it). None when there is none."""
    held = [a for a in _select(attribution, indexes) if a["same_ct_mib"] > max_mib]
    if not held:
        return None
    words = []
    for a in held:
        for h in a["holders"]:
            if h["kind"] == "same_ct":
                words.append("%s: %d MiB held by %s" % (label(a), h["mib"], who(h)))
    return ("memory on the trainer's GPUs that is not the trainer's, in its own container: %s; the drain gate "
            "would fail after the stop" % "; ".join(words))


def proof_problem(attribution, indexes, min_mib):
    """After the proof: a trainer GPU on which the trainer (our container, our unit) holds less
    than ``min_mib`` according to the node contradicts the proof. None when every GPU agrees."""
    short = [a for a in _select(attribution, indexes) if a["trainer_mib"] < min_mib]
    missing = set(indexes or []) - {a["index"] for a in attribution}
    if not short and not missing:
        return None
    words = ["%s: the trainer holds %d MiB" % (label(a), a["trainer_mib"]) for a in short]
    words += ["GPU %d: not on the node" % i for i in sorted(missing)]
    return "the node's nvidia-smi contradicts the proof (below %d MiB): %s" % (min_mib, "; ".join(words))
