# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the collection may write or delete on the target, judged on the target before any change.

The role's variables name files the collection writes as root - the launcher, the environment
file, the unit, the log and its rotations, the deploy lock and its guard, the restart job's state
- and a directory it deletes (the torchinductor cache). Judging their *text* on the controller
(``_validate.py``) is not enough: ``/usr/bin/python3`` or ``/etc/shadow`` are well-formed paths,
and a parent directory may be a symlink. So the first read of the target resolves every path
(``os.path.realpath``: symlinked parents and a symlink at the path itself) and judges what is
there:

* a file the collection writes must be absent or carry its kind's mark - the unit's description,
  the launcher's and the environment file's header line, the launcher's start marker as a log's
  first line, the lock's owner record, the job state's ``job_id``, the metrics file's first line
  ``# dflash.trainer metrics …`` - so it is something this
  collection wrote; anything else is refused, naming the variable and what is there;
* the resolved path must still pass the text rules (``placement_problem``): no system
  configuration directory, no world-writable directory for files opened as root, no dot-directory
  of a home; and no two variables (nor the unit file) may resolve to the same file;
* the cache directory must be absent or look like a torchinductor cache (``cache_problem``: its
  real layout - two-character hash directories, ``locks``, ``precompiled_headers``, ``fxgraph``,
  ...); otherwise the purge is refused, naming what it holds.

``observe`` is the only function here that touches the file system (lstat, realpath, the first
bytes of a file, a directory's names); ``judge`` and the rest are pure and unit-tested.
"""

from __future__ import annotations

import json
import os
import re
import stat

# -- marks ----------------------------------------------------------------------------------------
UNIT_MARK = "managed by dflash.trainer"
LAUNCHER_MARK = "# dflash.trainer: the trainer unit's launcher (written by the collection; do not edit)"
# launchers written before the mark line existed start with this docstring
_LAUNCHER_LEGACY = '"""ExecStart of the dflash trainer unit'
ENV_MARK = "# dflash.trainer: the trainer unit's environment (written by the collection; values are secrets)"
_ENV_LINE_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*="(?:[^"\\]|\\.)*"$')
# an environment file written before the mark line: only KEY="value" lines, with the role's own two
_ENV_LEGACY_KEYS = ("PYTHONUNBUFFERED=", "TORCHINDUCTOR_CACHE_DIR=")
_LOG_MARK_RE = re.compile(r"^==> dflash\.trainer start invocation=\S* release=\S* pid=\S* time=\S*( continued=\S+)? <==")
HEAD_BYTES = 4096
# JSON records are read whole (the job state keeps log tails): up to this much
JSON_BYTES = 4 * 1024 * 1024
_JSON_KINDS = ("state", "log_start")

# -- kinds ------------------------------------------------------------------------------------------
FILE_KINDS = ("launcher", "env", "unit", "log", "log_rotation", "log_start", "lock", "lock_guard", "state", "metrics")
KINDS = FILE_KINDS + ("cache", "root")
_WHAT = {
    "launcher": "the launcher", "env": "the environment file", "unit": "the unit file", "log": "the trainer's log",
    "log_rotation": "a rotation of the trainer's log", "log_start": "the log's start-marker record",
    "lock": "the deploy lock", "lock_guard": "the deploy lock's guard file", "state": "the restart job's state file",
    "cache": "the torchinductor cache", "root": "the release root",
    "metrics": "the trainer's metrics file",
}
# the metrics file's first line (the launcher writes it, roles/trainer/files/dflash-trainer-launch)
METRICS_MARK = "# dflash.trainer metrics"
# files opened by root that another user must not be able to swap for a symlink
STATE_KINDS = ("lock", "lock_guard", "state")

# -- the torchinductor cache's real layout (torch/_inductor: cache_dir() and its callers) -----------
CACHE_DIRS = frozenset(("locks", "precompiled_headers", "fxgraph", "aotautograd", "triton", "cache", "gcc",
                        "torch_cutlass", "unhashed_kernel_inputs", "aoti_eager", "autoheuristic", "kernel",
                        "subgraphs", "cudagraphs"))
CACHE_FILES = frozenset(("memoizer_cache.json", "memoizer_cache.lock"))
_HASH_DIR_RE = re.compile(r"^[a-z0-9_]{2}$")
_CACHE_FILE_RE = re.compile(r"^(tmp[A-Za-z0-9_]+(\.[a-z]+)?|[a-z0-9_]+\.(o|lock|so|py|json))$")

# -- where files of ours may live (the path after resolution) ---------------------------------------
# (prefix, allowed sub-prefixes, why)
_PLACES = (
    ("/etc", ("/etc/dflash-trainer",), "a file there configures the system"),
    ("/usr", ("/usr/local/lib/dflash-trainer", "/usr/local/libexec/dflash-trainer"), "it holds the system's programs"),
    ("/boot", (), "it holds the kernel"),
    ("/bin", (), "it holds the system's programs"),
    ("/sbin", (), "it holds the system's programs"),
    ("/lib", (), "it holds the system's libraries"),
    ("/lib32", (), "it holds the system's libraries"),
    ("/lib64", (), "it holds the system's libraries"),
    ("/libx32", (), "it holds the system's libraries"),
    ("/proc", (), "it is a kernel file system"),
    ("/sys", (), "it is a kernel file system"),
    ("/dev", (), "it is a kernel file system"),
    ("/var", ("/var/log", "/var/lib/dflash-trainer"), "it holds system state (spools, package data)"),
    ("/run", ("/run/dflash-trainer",), "it holds the system's runtime state"),
)
# node_exporter's textfile collector directories (Debian's prometheus-node-exporter; the usual manual
# install): only the metrics file may live there
METRICS_PLACES = ("/var/lib/prometheus/node-exporter", "/var/lib/node_exporter/textfile_collector")
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/shm", "/run/lock")
_HOME_DOT_RE = re.compile(r"^(/root|/home/[^/]+)/\.")
# a cache may live under ~/.cache (TORCHINDUCTOR_CACHE_DIR=/root/.cache/...), not in other dot-directories
_HOME_CACHE_RE = re.compile(r"^(/root|/home/[^/]+)/\.cache/")


def within(path, parent):
    """True when ``path`` is ``parent`` or lies below it (both normalised absolute paths)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def placement_problem(kind, path):
    """Why the (resolved) path ``path`` may not hold a file (or the cache) of kind ``kind``, or None."""
    if kind == "unit":
        return None  # its place is fixed: /etc/systemd/system/<name>.service
    if kind == "cache":
        for prefix in ("/etc", "/usr", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
                       "/sys", "/dev", "/var/lib", "/var/log", "/var/spool", "/run/systemd"):
            if within(path, prefix):
                return "lies in %s, which holds system files" % prefix
        if _HOME_DOT_RE.match(path + "/") and not _HOME_CACHE_RE.match(path + "/") and not path.endswith("/.cache"):
            return "lies in a dot-directory of a home (only ~/.cache/... may hold a cache)"
        return None
    if kind == "root":
        return None
    if kind == "metrics" and any(within(path, a) for a in METRICS_PLACES):
        return None
    for prefix, allowed, why in _PLACES:
        if within(path, prefix) and not any(within(path, a) or path.startswith(a + ".") or path.startswith(a + "-")
                                            for a in allowed):
            where = (" (only under %s)" % " or ".join(allowed)) if allowed else ""
            return "lies in %s: %s%s" % (prefix, why, where)
    for prefix in _WORLD_WRITABLE:
        if within(path, prefix):
            return "lies in %s, which every user of the container can write (a symlink there would make root " \
                   "write a file of that user's choice)" % prefix
    if _HOME_DOT_RE.match(path):
        return "lies in a dot-directory of a home (~/.ssh, ~/.bashrc, ~/.config: a login's own configuration)"
    return None


# -- observing (the only I/O here) ------------------------------------------------------------------

def _kind_of(mode):
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def observe(path, kind, max_names=200):
    """What is at ``path`` (resolved) on this machine, as a plain dict for ``judge``."""
    real = os.path.realpath(path)
    facts = {"path": path, "real": real, "exists": False}
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        pass
    except OSError as exc:
        facts.update(exists=True, type="unreadable", error=exc.strerror or str(exc))
        return facts
    else:
        facts.update(exists=True, type=_kind_of(st.st_mode), size=st.st_size, uid=st.st_uid,
                     mode=stat.S_IMODE(st.st_mode), nlink=st.st_nlink)
        if facts["type"] == "file":
            try:
                fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                try:
                    want = JSON_BYTES if kind in _JSON_KINDS else HEAD_BYTES
                    chunks = []
                    while want > 0:
                        chunk = os.read(fd, min(want, 1024 * 1024))
                        if not chunk:
                            break
                        chunks.append(chunk)
                        want -= len(chunk)
                    facts["head"] = b"".join(chunks).decode("utf-8", "replace")
                finally:
                    os.close(fd)
            except OSError as exc:
                facts["error"] = exc.strerror or str(exc)
        elif facts["type"] == "dir":
            try:
                names = sorted(os.listdir(real))
            except OSError as exc:
                facts["error"] = exc.strerror or str(exc)
                names = []
            facts["count"] = len(names)
            entries = []
            for name in names[:max_names]:
                try:
                    entries.append((name, _kind_of(os.lstat(os.path.join(real, name)).st_mode)))
                except OSError:
                    entries.append((name, "other"))
            facts["entries"] = entries
            if kind == "lock":
                try:
                    with open(os.path.join(real, "owner.json"), "rb") as fh:
                        facts["record"] = fh.read(HEAD_BYTES).decode("utf-8", "replace")
                except OSError:
                    facts["record"] = None
            facts["mount"] = os.path.ismount(real)
    # the nearest existing directory above: who could swap the file for a symlink
    parent = os.path.dirname(real)
    while parent and parent != "/" and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    try:
        pst = os.stat(parent or "/")
        facts.update(parent=parent or "/", parent_uid=pst.st_uid, parent_mode=stat.S_IMODE(pst.st_mode))
    except OSError:
        pass
    return facts


# -- judging (pure) ---------------------------------------------------------------------------------

def is_ours(kind, facts):
    """Whether the existing file or directory described by ``facts`` carries ``kind``'s mark."""
    t = facts.get("type")
    head = facts.get("head") or ""
    if kind == "unit":
        return t == "file" and any(line.startswith("Description=") and UNIT_MARK in line for line in head.splitlines())
    if kind == "launcher":
        lines = head.splitlines()[:3]
        return t == "file" and any(l.startswith(LAUNCHER_MARK) or l.startswith(_LAUNCHER_LEGACY) for l in lines)
    if kind == "env":
        if t != "file":
            return False
        lines = [l for l in head.splitlines() if l.strip()]
        if lines and lines[0] == ENV_MARK:
            return True
        # written before the mark existed: nothing but KEY="value" lines, with the role's own two keys
        return (bool(lines) and facts.get("size", 0) <= HEAD_BYTES and all(_ENV_LINE_RE.match(l) for l in lines)
                and all(any(l.startswith(k) for l in lines) for k in _ENV_LEGACY_KEYS))
    if kind in ("log", "log_rotation"):
        if t != "file":
            return False
        if facts.get("size", 0) == 0:
            return True  # appending to (or renaming over) an empty file loses nothing
        # the launcher's start or continuation marker: the first line, or after a rotation at start
        return any(_LOG_MARK_RE.match(line) for line in head.splitlines())
    if kind == "log_start":
        return t == "file" and _json_has(head, ("invocation",))
    if kind == "state":
        return t == "file" and _json_has(head, ("job_id",))
    if kind == "lock":
        if t != "dir":
            return False
        names = {n for n, _k in facts.get("entries") or []}
        if not names <= {"owner.json", "owner.json.tmp"}:
            return False
        return facts.get("record") is None or _json_has(facts["record"], ("token",))
    if kind == "lock_guard":
        return t == "file" and facts.get("size", 0) == 0  # flock only: never written
    if kind == "metrics":
        return t == "file" and head.startswith(METRICS_MARK)
    if kind == "root":
        names = {n for n, _k in facts.get("entries") or []}
        return t == "dir" and (not names or "releases" in names)
    return False


def _json_has(text, keys):
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and all(k in data for k in keys)


def _describe(facts):
    """What is there, in a few words (never a file's content: it may be a secret)."""
    t = facts.get("type")
    if t == "file":
        return "a file of %d bytes" % facts.get("size", 0)
    if t == "dir":
        return "a directory holding %s" % _names(facts)
    if t == "unreadable":
        return "something unreadable (%s)" % facts.get("error", "?")
    return "a %s" % ("special file (device, socket or FIFO)" if t == "other" else t)


def _names(facts, limit=5):
    entries = facts.get("entries") or []
    if not entries:
        return "nothing"
    names = [n + ("/" if k == "dir" else "") for n, k in entries[:limit]]
    more = facts.get("count", len(entries)) - len(names)
    return ", ".join(names) + (" and %d more" % more if more > 0 else "")


def cache_problem(facts):
    """Why the directory described by ``facts`` does not look like a torchinductor cache, or None."""
    if not facts.get("exists"):
        return None
    if facts.get("type") != "dir":
        return "is %s, not a torchinductor cache directory" % _describe(facts)
    strange = [(n, k) for n, k in facts.get("entries") or [] if not cache_entry_ok(n, k)]
    if strange:
        shown = ", ".join(n + ("/" if k == "dir" else "") for n, k in strange[:5])
        more = len(strange) - 5
        return ("does not look like a torchinductor cache: it holds %s%s, which inductor does not write "
                "(a cache holds two-character hash directories, locks/, precompiled_headers/, fxgraph/, ...)"
                % (shown, " and %d more" % more if more > 0 else ""))
    return None


def cache_entry_ok(name, kind):
    """One top-level entry of a torchinductor cache."""
    if kind == "dir":
        return bool(_HASH_DIR_RE.match(name)) or name in CACHE_DIRS or name.startswith("tmp")
    if kind == "file":
        return name in CACHE_FILES or bool(_CACHE_FILE_RE.match(name))
    return False


def judge(variable, kind, facts):
    """Why the collection may not write (or delete) what ``facts`` describes for ``variable``, or None."""
    real = facts.get("real") or facts.get("path")
    via = "" if real == facts.get("path") else " (it resolves to %s)" % real
    where = placement_problem(kind, real)
    if where:
        return "%s%s %s" % (facts.get("path"), via, where)
    if kind in STATE_KINDS and facts.get("parent_uid") not in (None, 0):
        return "%s%s is in %s, owned by uid %s: state files live in a root-owned directory" % (
            facts.get("path"), via, facts.get("parent"), facts.get("parent_uid"))
    if kind in STATE_KINDS and (facts.get("parent_mode") or 0) & 0o022:
        return "%s%s is in %s (mode %04o), which others can write: state files live in a directory only root " \
               "can write" % (facts.get("path"), via, facts.get("parent"), facts.get("parent_mode"))
    if not facts.get("exists"):
        return None
    if kind == "cache":
        why = cache_problem(facts)
        return None if why is None else "%s%s %s" % (facts.get("path"), via, why)
    if is_ours(kind, facts):
        return None
    if kind == "root":
        return "%s%s exists and is not a release root of dflash.trainer: it holds %s" % (
            facts.get("path"), via, _names(facts))
    return "%s%s exists and was not written by dflash.trainer (%s there is %s, not %s)" % (
        facts.get("path"), via, "what is" if via else "it is", _describe(facts), _WHAT[kind])


def collisions(targets):
    """``targets``: [(variable, kind, facts)] -> problems for two variables resolving to one file,
    or a file of ours inside the cache that the purge deletes."""
    problems = []
    seen = {}
    cache = [(v, f.get("real")) for v, k, f in targets if k == "cache"]
    roots = [(v, f.get("real")) for v, k, f in targets if k == "root"]
    shown = dict((v, f.get("path")) for v, k, f in targets)
    for rvar, rpath in roots:
        for cvar, cpath in cache:
            if rpath and cpath and (within(cpath, rpath) or within(rpath, cpath)):
                problems.append((cvar, "%s resolves to %s, %s the release root %s (%s=%s): the purge would delete "
                                 "releases" % (shown.get(cvar), cpath, "inside" if within(cpath, rpath) else "holding",
                                               rpath, rvar, shown.get(rvar))))
    for variable, kind, facts in targets:
        real = facts.get("real")
        if kind in FILE_KINDS:
            if real in seen and seen[real][0] != variable:
                problems.append((variable, "%s resolves to %s, the same file as %s" % (
                    facts.get("path"), real, seen[real][0])))
            seen.setdefault(real, (variable, kind))
            for rvar, rpath in roots:
                if rpath and real and within(real, rpath):
                    problems.append((variable, "%s resolves to %s, inside the release root %s (%s): releases there "
                                     "are immutable and pruned" % (facts.get("path"), real, rpath, rvar)))
            for cvar, cpath in cache:
                if cpath and within(real, cpath):
                    problems.append((cvar, "%s resolves to %s, which holds %s (%s=%s): the purge would delete it"
                                     % (shown.get(cvar), cpath, _WHAT[kind], variable, facts.get("path"))))
    return problems


def problems(targets):
    """``targets``: [(variable, kind, facts)] -> [(variable, why)] for every refusal."""
    out = []
    for variable, kind, facts in targets:
        why = judge(variable, kind, facts)
        if why:
            out.append((variable, why))
    out.extend(collisions(targets))
    return out


def managed(variables, unit_path=None):
    """The role's variables -> [(variable, kind, path)] of everything a deploy writes or deletes."""
    out = []
    if variables.get("trainer_root"):
        out.append(("trainer_root", "root", variables["trainer_root"]))
    if variables.get("trainer_launcher_path"):
        out.append(("trainer_launcher_path", "launcher", variables["trainer_launcher_path"]))
    if variables.get("trainer_env_file"):
        out.append(("trainer_env_file", "env", variables["trainer_env_file"]))
    if unit_path:
        out.append(("trainer_unit_name", "unit", unit_path))
    log = variables.get("trainer_log_path")
    if log:
        out.append(("trainer_log_path", "log", log))
        out.append(("trainer_log_path", "log_start", log + ".start"))
        try:
            keep = int(variables.get("trainer_log_keep", 3))
        except (TypeError, ValueError):
            keep = 3
        for i in range(1, min(max(keep, 0), 1000) + 1):
            out.append(("trainer_log_path", "log_rotation", "%s.%d" % (log, i)))
    lock = variables.get("trainer_lock_path")
    if lock:
        out.append(("trainer_lock_path", "lock", lock))
        out.append(("trainer_lock_path", "lock_guard", lock + ".guard"))
    if variables.get("trainer_job_state_path"):
        out.append(("trainer_job_state_path", "state", variables["trainer_job_state_path"]))
    if variables.get("trainer_metrics_path"):
        out.append(("trainer_metrics_path", "metrics", variables["trainer_metrics_path"]))
    cache = variables.get("trainer_inductor_cache_dir")
    purge = variables.get("trainer_purge_inductor_cache", True)
    if cache and purge not in (False, "false", "False", "no", "0", 0):
        out.append(("trainer_inductor_cache_dir", "cache", cache))
    return out
