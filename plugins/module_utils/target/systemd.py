# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""systemctl: argv builders, ``systemctl show`` parsing and what its properties mean (pure)."""

from __future__ import annotations

import re
import signal

# systemd's default PATH for system units (a unit without Environment=PATH= gets this)
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Properties the trainer modules read. Each activation gets a new InvocationID; NRestarts
# counts automatic restarts; the ExecMain* pair tells how and when the main process ended.
SHOW_PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "MainPID",
    "ExecMainPID",
    "InvocationID",
    "NRestarts",
    "ExecMainCode",
    "ExecMainStatus",
    "ExecMainStartTimestamp",
    "ExecMainStartTimestampMonotonic",
    "ExecMainExitTimestamp",
    "ExecMainExitTimestampMonotonic",
    "ActiveEnterTimestamp",
    "NeedDaemonReload",
    "FragmentPath",
    "UnitFileState",
    "Description",
    "ControlGroup",
)

# Unit properties worth showing a human when a start fails.
FAILURE_PROPERTIES = (
    "ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus", "MainPID",
    "InvocationID", "NRestarts", "ExecMainStartTimestamp", "ExecMainExitTimestamp",
)

# siginfo si_code values systemd reports as ExecMainCode (CLD_* in <signal.h>).
CLD_EXITED = 1
CLD_KILLED = 2
CLD_DUMPED = 3

ACTIVE_STATES = ("active", "activating", "reloading", "deactivating", "refreshing")

# CacheDirectory= (systemd.exec(5)): directories systemd makes below /var/cache for the unit, root's and of
# CacheDirectoryMode=, at every start of it (boot, Restart=, systemctl start); no other user can make them first
CACHE_ROOT = "/var/cache"
_CACHE_NAME_RE = re.compile(r"^[A-Za-z0-9_.+@-]+(/[A-Za-z0-9_.+@-]+)*$")


def cache_directory(path):
    """The unit's CacheDirectory= value for the cache directory ``path``: its place below /var/cache
    (``/var/cache/dflash-trainer/inductor`` -> ``dflash-trainer/inductor``), or "" when ``path`` is not
    strictly below /var/cache or holds a name systemd would read otherwise (a space, a specifier '%', '..');
    such a cache gets no CacheDirectory= (its whole way is judged on the target before any change)."""
    if not isinstance(path, str) or not path.startswith(CACHE_ROOT + "/"):
        return ""
    rel = path[len(CACHE_ROOT) + 1:].rstrip("/")
    if not rel or not _CACHE_NAME_RE.match(rel) or any(p in (".", "..") for p in rel.split("/")):
        return ""
    return rel


def show_argv(unit, properties=SHOW_PROPERTIES, systemctl="systemctl"):
    return [systemctl, "show", unit, "--no-pager", "-p", ",".join(properties)]


def start_argv(unit, systemctl="systemctl"):
    return [systemctl, "start", unit]


def parse_show(lines):
    """Parse ``systemctl show`` output (text or lines) into a dict.

    Same rules as ansible-core's ``parse_systemctl_show``: only ``Exec*`` values that start with
    ``{`` may span lines, until a line that ends with ``}``. Lines end at a newline only
    (systemctl prints values raw: a value holding U+001C or U+2028 must not split into a forged
    property, as ``str.splitlines`` would make it).
    """
    if isinstance(lines, str):
        lines = lines.split("\n")
    parsed = {}
    multival = []
    key = None
    for line in lines:
        if key is None:
            if "=" in line:
                key, value = line.split("=", 1)
                if key.startswith("Exec") and value.lstrip().startswith("{"):
                    if not value.rstrip().endswith("}"):
                        multival.append(value)
                        continue
                parsed[key] = value.strip()
                key = None
        else:
            multival.append(line)
            if line.rstrip().endswith("}"):
                parsed[key] = "\n".join(multival).strip()
                multival = []
                key = None
    return parsed


_INT_RE = re.compile(r"\s*-?[0-9]{1,20}\s*")


def int_prop(props, key, default=0):
    """Integer property; '', '[not set]' and junk (``1_0``, non-ASCII digits, more than 64 bits)
    give ``default``."""
    value = props.get(key, "")
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and _INT_RE.fullmatch(value):
        number = int(value)
    else:
        return default
    return number if -(1 << 63) <= number < (1 << 64) else default


def bool_prop(props, key):
    return props.get(key, "").strip().lower() in ("yes", "true", "1")


def is_running(props):
    return props.get("ActiveState") == "active" and props.get("SubState") == "running"


def is_active(props):
    """Anything but inactive/failed: started, starting, or waiting to auto-restart."""
    return props.get("ActiveState") in ACTIVE_STATES


def needs_daemon_reload(props):
    return bool_prop(props, "NeedDaemonReload")


def is_loaded(props):
    return props.get("LoadState", "loaded") not in ("not-found", "masked", "error", "bad-setting")


def signal_name(number):
    try:
        return signal.Signals(number).name[3:]  # "SIGKILL" -> "KILL"
    except ValueError:
        return str(number)


def exit_description(props):
    """How the main process ended: "exited with status 1", "killed by signal KILL",
    "dumped core (signal SEGV)"; None while it has not ended."""
    code = int_prop(props, "ExecMainCode", 0)
    status = int_prop(props, "ExecMainStatus", 0)
    if code == CLD_EXITED:
        return "exited with status %d" % status
    if code == CLD_KILLED:
        return "killed by signal %s" % signal_name(status)
    if code == CLD_DUMPED:
        return "dumped core (signal %s)" % signal_name(status)
    return None


def runtime_s(props, now_monotonic_s=None):
    """Seconds the main process ran: exit - start from the ``*Monotonic`` (µs) properties.

    While it still runs, ``now_monotonic_s`` (CLOCK_MONOTONIC seconds, what ``time.monotonic()``
    gives on Linux) stands in for the exit. None when unknown.
    """
    start = int_prop(props, "ExecMainStartTimestampMonotonic", 0)
    end = int_prop(props, "ExecMainExitTimestampMonotonic", 0)
    if start <= 0:
        return None
    if end >= start:
        return (end - start) / 1e6
    if now_monotonic_s is not None:
        return max(0.0, now_monotonic_s - start / 1e6)
    return None


def state_words(props):
    return "ActiveState=%s, SubState=%s, Result=%s" % (
        props.get("ActiveState", "?"), props.get("SubState", "?"), props.get("Result", "?"))


def pick(props, keys=FAILURE_PROPERTIES):
    return {k: props[k] for k in keys if k in props}


def start_decision(unit, props, allow_running=False):
    """Decide what the start step (``job.cycle.start``) does with the unit as ``props`` shows it before starting.

    Returns (action, message): ("fail", why), ("keep", why) for an already active unit when
    ``allow_running``, or ("start", None).
    """
    if not is_loaded(props):
        return "fail", "unit %s cannot be started (LoadState=%s)" % (unit, props.get("LoadState"))
    if needs_daemon_reload(props):
        return "fail", "unit %s: unit file changed on disk; daemon-reload first" % unit
    if is_active(props):
        if allow_running:
            return "keep", "unit %s is already %s; left running" % (unit, props.get("ActiveState"))
        return "fail", "unit %s is already %s; stop it first" % (unit, props.get("ActiveState"))
    return "start", None


def restart_baseline(before, after):
    """NRestarts baseline for the readiness judge.

    systemd resets NRestarts on an explicit start: when the counter went down the start reset
    it and the baseline is 0; otherwise it is the value read before the start, so a restart
    that already happened between start and the second read still counts.
    """
    b = int_prop(before, "NRestarts", 0)
    a = int_prop(after, "NRestarts", 0)
    return 0 if a < b else b
