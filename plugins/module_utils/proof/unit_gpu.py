# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whose GPU memory: the memory the proof counts as the trainer's is the memory its unit's processes hold.

nvidia-smi's ``--query-compute-apps=gpu_uuid,pid,used_memory`` (``target.nvidia_smi.read_gpus`` with
processes) lists each process holding memory on each GPU. A process is the trainer's when its control
group (``/proc/<pid>/cgroup``) is the unit's ``ControlGroup`` or lies below it - the launcher, the
trainer and every worker it starts (KillMode=control-group keeps them there). Memory another process
allocates - on the trainer's GPUs or on others, before or after the start - is never counted: a trainer
that holds GPUs 0-4 is not proved on 0-7 because a stranger allocated on 5-7.

Where the container's nvidia-smi cannot say whose memory it is - it lists no process (a GPU passed
through to LXC often shows none), lists processes under PIDs this container cannot see (host PIDs), or
gives no per-process figure - the proof falls back to each GPU's reading less what it held before the
start (``job.cycle.ours``: the drain's last sample), and says so in its words (``rule``).

``unit_memory`` is pure (``cgroup_of`` is injected); ``cgroup_of`` reads /proc.
"""

from __future__ import annotations

BY_PROCESS = "process"
BY_BASELINE = "baseline"


def cgroup_path(text):
    """The control group path in a ``/proc/<pid>/cgroup`` text: the unified hierarchy's (``0::PATH``),
    else systemd's named v1 hierarchy (``N:name=systemd:PATH``), or None."""
    v1 = None
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            return parts[2]
        if parts[1] == "name=systemd":
            v1 = parts[2]
    return v1


def cgroup_of(pid):
    """The control group of process ``pid`` as this machine sees it, or None where the pid is not
    visible here (gone, or a host PID the driver reports inside a container)."""
    try:
        with open("/proc/%d/cgroup" % int(pid), "rb") as fh:
            return cgroup_path(fh.read(65536).decode("utf-8", "replace"))
    except (IOError, OSError, ValueError, TypeError):
        return None


def in_group(path, control_group):
    """``path`` is the unit's control group or lies below it."""
    return bool(path) and bool(control_group) and (path == control_group or path.startswith(
        control_group.rstrip("/") + "/"))


def unit_memory(gpus, control_group, cgroup_of=cgroup_of, warnings=()):
    """-> (mib, rule): ``mib`` {index: MiB the unit's processes hold} with ``rule`` BY_PROCESS, or None
    with ``rule`` BY_BASELINE when nvidia-smi's process list cannot say whose memory is whose (the caller
    then counts each GPU's reading less its baseline). ``gpus``: ``read_gpus``' GPUs with ``processes``
    [{pid, used_memory_mib}]; ``warnings``: its warnings (a process list that could not be read)."""
    if warnings:
        return None, BY_BASELINE
    procs = [(g["index"], p) for g in gpus for p in g.get("processes") or []]
    if not procs or not control_group:
        return None, BY_BASELINE
    groups = {}
    for _index, p in procs:
        if p.get("pid") is None or p.get("used_memory_mib") is None:
            return None, BY_BASELINE
        if p["pid"] not in groups:
            groups[p["pid"]] = cgroup_of(p["pid"])
        if groups[p["pid"]] is None:  # a PID this container cannot see: whose it is is unknown
            return None, BY_BASELINE
    mib = {g["index"]: (0 if g.get("memory_used_mib") is not None else None) for g in gpus}
    for index, p in procs:
        if in_group(groups[p["pid"]], control_group) and mib.get(index) is not None:
            mib[index] += int(p["used_memory_mib"])
    return mib, BY_PROCESS


def rule_words(rule, gpus=None, control_group=None):
    """The proof's words for how it counted the trainer's memory."""
    if rule == BY_PROCESS:
        return "memory held by the processes of %s (nvidia-smi's processes, by control group)" % (
            control_group or "the unit")
    procs = sum(len(g.get("processes") or []) for g in gpus or [])
    why = ("the container's nvidia-smi lists no processes" if not procs else
           "the container's nvidia-smi lists processes this container cannot attribute (PIDs it cannot see, or no "
           "memory per process)")
    return "%s (as through LXC passthrough): each GPU's memory less what it held before the start; memory " \
           "another process allocates after the start cannot be told from the trainer's (the node's view, " \
           "trainer_gpu_host_view, names every holder)" % why
