# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is the container frozen? Read on the node from its cgroup, where Proxmox VE and plain LXC put it.

A suspend-mode backup (vzdump --mode suspend) freezes a container, as ``lxc-freeze`` does; ``pct`` still says
``status: running`` and ``pct exec`` hangs in it until it thaws. The doctor (its ``cgroup`` check) and the pct
connection (a first read that has not reached the container after a few seconds) ask the node the same way.
"""
from __future__ import annotations

from contextlib import contextmanager

# The container's cgroup on the node, as Proxmox VE writes it (pve-container: lxc.cgroup.dir.container lxc/<vmid>,
# .inner ns) and as plain LXC does (lxc.payload.<vmid>); each one found, in the unified hierarchy (cgroup v2, or a
# hybrid host's /sys/fs/cgroup/unified) and the v1 freezer's: its path, then its cgroup.events or its
# freezer.state - files every user may read (no sudo). "frozen 1" or FROZEN: the container is frozen. Run as
# ``sh -c CGROUP_SCRIPT sh VMID``.
CGROUP_SCRIPT = ('for p in lxc/"$1" lxc/"$1"/ns lxc.payload."$1"; do '
                 'for d in /sys/fs/cgroup/"$p" /sys/fs/cgroup/unified/"$p"; do '
                 '[ -r "$d/cgroup.events" ] && { echo "cgroup $d"; cat "$d/cgroup.events"; }; done; '
                 'f=/sys/fs/cgroup/freezer/"$p"; '
                 '[ -r "$f/freezer.state" ] && { echo "cgroup $f"; echo "freezer.state $(cat "$f/freezer.state")"; }; '
                 'done; true')
FROZEN_ROWS = ("frozen 1", "freezer.state FROZEN", "freezer.state FREEZING")


def cgroup_argv(vmid):
    """The node's command that prints the container's cgroups and their freezer states."""
    return ["sh", "-c", CGROUP_SCRIPT, "sh", str(vmid)]


def cgroups(text):
    """([the container's cgroups found], [those frozen, as "PATH: ROW"]) from CGROUP_SCRIPT's output."""
    found, frozen, current = [], [], None
    for row in (text or "").splitlines():
        if row.startswith("cgroup "):
            current = row[len("cgroup "):]
            found.append(current)
        elif current and row.strip() in FROZEN_ROWS:
            frozen.append("%s: %s" % (current, row.strip()))
    return found, frozen


def remedy(vmid):
    """What to do about a frozen container."""
    return ("a suspend-mode backup (vzdump --mode suspend) thaws it when it ends; if nothing is backing it up, "
            "`pct resume %s` or `lxc-unfreeze -n %s` on the node" % (vmid, vmid))


@contextmanager
def frozen_checked(connection, on=True):
    """While the block runs (a task's first contact with the container), a call of ``connection`` that has not
    reached the container after a few seconds asks the node whether it is frozen, and fails at once naming the
    freeze (dflash.trainer.pct's ``frozen_check``). Another connection, or ``on`` False, is left as it is."""
    checks = bool(on) and hasattr(connection, "frozen_check")
    if checks:
        connection.frozen_check = True
    try:
        yield
    finally:
        if checks:
            connection.frozen_check = False
