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
* every directory from ``/`` down to the file (what exists of the resolved path) is owned by root
  and writable by root alone, as sshd's StrictModes wants of ``~/.ssh`` (``chain_problem``): a
  directory another user owns or may write lets that user swap the file - the environment file
  (``LD_PRELOAD=``), the launcher - before root reads or runs it. A sticky world-writable
  directory (``/data/shared``, mode 1777) is accepted only for the files root creates anew with
  ``O_EXCL`` and renames into place (``EXCL_KINDS``: the restart job's state); an existing
  file is adopted only when root owns it and nobody else may write it;
* the environment file and the launcher must not lie on a tmpfs (``/run``: lost at reboot, and
  the enabled unit then fails to start) - read from ``/proc/self/mountinfo`` (``mount_of``);
* the release root must be absent, empty, or carry the collection's own marker file
  (``ROOT_MARK_NAME``, written when a run of this collection first locks the root); a root of an
  older version without it is adopted when everything in it is ours (every ``releases/`` entry a
  release with its ``.dflash-release`` marker, ``ledger.json`` our ledger, ``current`` a symlink
  into ``releases/``); ``releases/``, ``ledger.json``, ``current`` and ``last_good`` are root's;
* a program run as root (``trainer_nvidia_smi``, the pre-flight's and the trainer command's first
  word, the node's python and nvidia-smi) resolves, as the target's PATH lookup does, to a file
  root owns and only root may write, in directories only root may write (sudo's secure_path);
* the cache directory must be absent or look like a torchinductor cache (``cache_problem``: its
  real layout - two-character hash directories, ``locks``, ``precompiled_headers``, ``fxgraph``,
  ...); otherwise the purge is refused, naming what it holds. Purge or not, its whole way is judged
  as a file's (``chain_problem``: no sticky shared directory such as ``/tmp`` either - another user
  could make the directory first and plant compiled code that root loads) and an existing cache must
  be root's and writable by root alone.

``observe`` and ``observe_program`` are the only functions here that touch the file system
(lstat, realpath, the first bytes of a file, a directory's names, /proc/self/mountinfo); ``judge``
and the rest are pure and unit-tested.
"""

from __future__ import annotations

import json
import os
import re
import stat

# the purge's judgement (every entry, at every depth): target.inductor_cache; judge() below uses it
from ansible_collections.dflash.trainer.plugins.module_utils.target.inductor_cache import cache_problem
from ansible_collections.dflash.trainer.plugins.module_utils.target.inductor_cache import observe as observe_cache
from ansible_collections.dflash.trainer.plugins.module_utils.target.marks import MARKER_NAME, ROOT_MARK_NAME
from ansible_collections.dflash.trainer.plugins.module_utils.target.systemd import SYSTEMD_PATH

# -- marks ----------------------------------------------------------------------------------------
UNIT_MARK = "managed by dflash.trainer"
LAUNCHER_MARK = "# dflash.trainer: the trainer unit's launcher (written by the collection; do not edit)"
ENV_MARK = "# dflash.trainer: the trainer unit's environment (written by the collection; values are secrets)"
_LOG_MARK_RE = re.compile(r"^==> dflash\.trainer start invocation=\S* release=\S* pid=\S* time=\S*( continued=\S+)? <==")
HEAD_BYTES = 4096
# JSON records are read whole (the job state keeps log tails): up to this much
JSON_BYTES = 4 * 1024 * 1024
_JSON_KINDS = ("state", "log_start")

# -- kinds ------------------------------------------------------------------------------------------
FILE_KINDS = ("launcher", "env", "unit", "log", "log_rotation", "log_start", "lock", "lock_guard", "state", "metrics")
# a program root runs: its ``path`` is a name (looked up on a PATH) or an absolute path
PROGRAM = "program"
# a directory (or file) a trainer_env search variable makes root's processes load code from
SEARCH = "search"
KINDS = FILE_KINDS + ("cache", "root", PROGRAM, SEARCH)
# trainer_env variables whose value chooses what root's processes (the pre-flight, the launcher, the
# trainer) run or import: each absolute entry must be root's alone, as a program is. Entries split on
# ':' (LD_PRELOAD on spaces too); a relative entry is relative to the release, judged with the root.
SEARCH_VARS = ("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONEXECUTABLE",
               "LD_LIBRARY_PATH", "LD_PRELOAD", "LD_AUDIT", "GCONV_PATH", "BASH_ENV", "ENV", "PERL5LIB", "PERLLIB",
               "RUBYLIB", "NODE_PATH", "TRITON_LIBCUDA_PATH")
_WHAT = {
    "launcher": "the launcher", "env": "the environment file", "unit": "the unit file", "log": "the trainer's log",
    "log_rotation": "a rotation of the trainer's log", "log_start": "the log's start-marker record",
    "lock": "the deploy lock", "lock_guard": "the deploy lock's guard file", "state": "the restart job's state file",
    "cache": "the torchinductor cache", "root": "the release root",
    "metrics": "the trainer's metrics file", PROGRAM: "a program",
}
# the metrics file's first line (the launcher writes it, roles/trainer/files/dflash-trainer-launch)
METRICS_MARK = "# dflash.trainer metrics"
# the files root only ever creates anew (O_EXCL, then a rename into place: target.private_file) and checks
# before it reads them: the only ones a sticky world-writable directory may hold (another user can
# plant nothing root would then open). Not the metrics file: the launcher reads an existing one for
# its mark first, and a FIFO planted there would hang that read.
EXCL_KINDS = ("state",)
# files lost at reboot on a tmpfs, which the enabled unit needs at boot
PERSISTENT_KINDS = ("env", "launcher")
VOLATILE_FS = frozenset(("tmpfs", "ramfs"))
# the release root's own marker file (ROOT_MARK_NAME, written by release.root.mark_root under the root's lock)
# a release's marker
RELEASE_MARK_NAME = MARKER_NAME
# what a release root of this collection holds (release.root, release.states, release.ledger's
# ledger): the names an older root without the marker may hold and still be adopted
_ROOT_NAMES = frozenset(("releases", "current", "last_good", "last_good.config", "ledger.json", "ledger.json.lock",
                         ".lock", "config.key", ROOT_MARK_NAME, "lost+found"))
_ROOT_TMP_PREFIXES = ("current.tmp-", "last_good.tmp-", "last_good.config.tmp", "ledger.json.tmp-", "config.key.tmp-",
                      ".upload-",
                      ROOT_MARK_NAME + ".tmp-")
# the members of a root judged as files root writes there
_ROOT_MEMBERS = ("releases", "ledger.json", "current", "last_good", "config.key", ROOT_MARK_NAME)
_LEDGER_HEAD_RE = re.compile(r'^\{\s*"entries"\s*:\s*\[')
# the directories ansible's get_bin_path adds to PATH (a module's own lookup of nvidia-smi)
SBIN_DIRS = ("/sbin", "/usr/sbin", "/usr/local/sbin")
# a program's name and the PATH it is looked up on, in one ``path`` of managed's list
_SEARCH_SEP = " on PATH="
# root's uid (a knob for the unit tests of a non-root developer only)
_ROOT_UID = 0


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
    if kind in ("root", PROGRAM, SEARCH):
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


def _lstat_facts(path):
    """(type, uid, mode) of what is at ``path`` itself (a symlink is not followed), or None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return _kind_of(st.st_mode), st.st_uid, stat.S_IMODE(st.st_mode)


def _ancestors(real):
    """[(directory, uid, mode)] from ``/`` down to the deepest existing directory above ``real``
    (a resolved absolute path): who could replace, rename or plant what lies below."""
    out = []
    parts = [p for p in os.path.dirname(real).split("/") if p]
    current = "/"
    for i in range(len(parts) + 1):
        if i:
            current = "/" + "/".join(parts[:i])
        try:
            st = os.lstat(current)
        except OSError:
            break
        out.append((current, st.st_uid, stat.S_IMODE(st.st_mode)))
        if not stat.S_ISDIR(st.st_mode):
            break
    return out


# the kernel's own bound on the symlinks one lookup follows (ELOOP past it)
MAX_LINKS = 40


def way_of(path):
    """[(component, uid, mode)] for what a lookup of ``path`` (absolute) passes through before its
    last component, as the kernel walks it: each directory it goes through and each symlink it
    follows - a link inside a link's target too, and the path itself when it is a link - with mode 0
    for a link (whoever owns a link can point it elsewhere later: its owner is judged as a
    directory's). Ends at the first missing component or after MAX_LINKS links. The resolved path's
    own directories are ``_ancestors``'; these are the ones a path as written adds: a directory or link
    of another user's on the way lets that user send root elsewhere."""
    out = []
    todo = [p for p in reversed(path.split("/")) if p and p != "."]
    current, links = "/", 0
    while todo:
        name = todo.pop()
        if name == "..":
            current = os.path.dirname(current)
            continue
        nxt = os.path.join(current, name)
        try:
            st = os.lstat(nxt)
        except OSError:
            return out
        if stat.S_ISLNK(st.st_mode):
            out.append((nxt, st.st_uid, 0))
            links += 1
            try:
                target = os.readlink(nxt)
            except OSError:
                return out
            if links > MAX_LINKS:
                return out
            todo.extend(p for p in reversed(target.split("/")) if p and p != ".")
            if target.startswith("/"):
                current = "/"
            continue
        if not stat.S_ISDIR(st.st_mode):
            return out
        if todo:  # a directory the lookup goes through (not the last component)
            out.append((nxt, st.st_uid, stat.S_IMODE(st.st_mode)))
        current = nxt
    return out


def way_problem(path):
    """Why a file read as proof at ``path`` (absolute) could be swapped or redirected by another user, or
    None: every directory a lookup of it goes through - as written (``way_of``) and resolved - and every
    link it follows must be root's, the directories writable by root alone."""
    return idmap_words(_way_problem(path))


def _way_problem(path):
    way = way_of(path)
    links = links_of(way)
    for component, uid, mode in way + [c for c in _ancestors(os.path.realpath(path)) if c not in way]:
        if component in links:
            if uid != _ROOT_UID:
                return "is reached through %s, a symlink owned by uid %d, who can point it elsewhere" % (
                    component, uid)
            continue
        if uid != _ROOT_UID:
            return "is in %s, owned by uid %d (mode %04o)" % (component, uid, mode)
        if mode & 0o022:
            return "is in %s (mode %04o), which %s can write" % (
                component, mode, "every user" if mode & 0o002 else "its group")
    return None


def links_of(way):
    """The symlinks of a ``way_of`` list."""
    return [c for c, _uid, mode in way if mode == 0 and os.path.islink(c)]


def _deepest_existing(real):
    path = real
    while path != "/" and not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def _unescape_mount(text):
    """A mountinfo field: spaces, tabs, newlines and backslashes come as octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def mount_of(path, mountinfo):
    """(mount point, file system type) of the mount holding ``path`` (an absolute, resolved path)
    according to ``mountinfo`` (the text of /proc/self/mountinfo); None when no line parses. The
    longest mount point above ``path`` wins; of two at the same point, the later (on top)."""
    best = None
    for line in (mountinfo or "").splitlines():
        fields = line.split(" ")
        if len(fields) < 10 or "-" not in fields[6:]:
            continue
        point = _unescape_mount(fields[4])
        fstype = fields[fields.index("-", 6) + 1]
        if within(path, point) and (best is None or len(point) >= len(best[0])):
            best = (point, fstype)
    return best


def _read_mountinfo():
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _head(path, want):
    """The first ``want`` bytes of the regular file at ``path`` (never through a symlink), as text."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        chunks = []
        while want > 0:
            chunk = os.read(fd, min(want, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            want -= len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _observe_root(real, facts, max_names):
    """What a release root holds that judges it: its members, each ``releases/`` entry (a release
    with its marker?) and the head of the ledger."""
    members = {}
    for name in _ROOT_MEMBERS:
        got = _lstat_facts(os.path.join(real, name))
        if got is not None:
            members[name] = got
    facts["members"] = members
    rdir = os.path.join(real, "releases")
    if members.get("releases", ("",))[0] == "dir":
        try:
            names = sorted(os.listdir(rdir))
        except OSError:
            names = []
        facts["releases_count"] = len(names)
        releases = []
        for name in names[:max_names]:
            entry = os.path.join(rdir, name)
            kind = _lstat_facts(entry)
            marked = kind is not None and kind[0] == "dir" and _lstat_facts(
                os.path.join(entry, RELEASE_MARK_NAME)) is not None
            releases.append((name, kind[0] if kind else "other", marked))
        facts["releases"] = releases
    if members.get("ledger.json", ("",))[0] == "file":
        try:
            facts["ledger_head"] = _head(os.path.join(real, "ledger.json"), 64)
        except OSError:
            facts["ledger_head"] = ""


def program_item(name, search=None):
    """The ``path`` of a program in ``managed``'s list: its name or absolute path, with the PATH it
    is looked up on when that is not the module's own (``program_lookup`` reads it back)."""
    return name if search is None or "/" in name else "%s%s%s" % (name, _SEARCH_SEP, search)


def program_lookup(item):
    """``program_item``'s text -> (name, search PATH or None)."""
    name, sep, search = item.partition(_SEARCH_SEP)
    return name, (search if sep else None)


def observe(path, kind, max_names=200):
    """What is at ``path`` (resolved) on this machine, as a plain dict for ``judge``; for a
    PROGRAM, ``path`` is ``program_item``'s text."""
    if kind == PROGRAM:
        return observe_program(*program_lookup(path))
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
                facts["head"] = _head(real, JSON_BYTES if kind in _JSON_KINDS else HEAD_BYTES)
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
            if kind == "cache":
                # judged as the purge judges it: every entry at every depth, not the first names
                whole = observe_cache(real)
                facts["tree"] = whole.get("tree", [])
                if whole.get("error"):
                    facts["error"] = whole["error"]
            if kind == "lock":
                try:
                    with open(os.path.join(real, "owner.json"), "rb") as fh:
                        facts["record"] = fh.read(HEAD_BYTES).decode("utf-8", "replace")
                except OSError:
                    facts["record"] = None
            if kind == "root":
                _observe_root(real, facts, max_names)
            facts["mount"] = os.path.ismount(real)
    # every directory above: who could swap the file, or plant one first
    facts["chain"] = _ancestors(real)
    # and the way as written: a directory or link of another user's there could send root elsewhere later
    way = way_of(path) if path.startswith("/") else []
    facts["links"] = links_of(way)
    facts["chain"] = [c for c in way if c not in facts["chain"]] + facts["chain"]
    facts["parent_exists"] = bool(facts["chain"]) and facts["chain"][-1][0] == os.path.dirname(real)
    if kind in PERSISTENT_KINDS:
        mount = mount_of(_deepest_existing(real), _read_mountinfo())
        if mount is not None:
            facts["mount_point"], facts["fstype"] = mount
    return facts


def search_dirs(search=None, environ=None):
    """The directories a program name is looked up in: ``search`` (a PATH string: the unit's or the
    pre-flight's), else this process's PATH plus the sbin directories, as ansible's get_bin_path
    looks up nvidia-smi for a module."""
    if search is not None:
        return [d for d in search.split(":") if d]
    dirs = [d for d in (environ if environ is not None else os.environ).get("PATH", "").split(":") if d]
    return dirs + [d for d in SBIN_DIRS if d not in dirs]


def observe_program(name, search=None):
    """Where the program ``name`` (a name looked up on ``search_dirs(search)``, or an absolute
    path) resolves on this machine, as a plain dict for ``judge``: the file run and every directory
    above it and above the one the lookup found it in."""
    facts = {"path": name, "exists": False}
    if "/" in name:
        candidates = [name]
    else:
        candidates = [os.path.join(d, name) for d in search_dirs(search) if d.startswith("/")]
    found = next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)
    if found is None:
        facts["real"] = name
        return facts
    real = os.path.realpath(found)
    facts.update(found=found, real=real)
    got = _lstat_facts(real)
    if got is not None:
        facts.update(exists=True, type=got[0], uid=got[1], mode=got[2])
    chain = _ancestors(os.path.join(os.path.realpath(os.path.dirname(found)), "x"))
    seen = set(d for d, _u, _m in chain)
    chain.extend(c for c in _ancestors(real) if c[0] not in seen)
    facts["chain"] = chain
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
        return t == "file" and any(l.startswith(LAUNCHER_MARK) for l in lines)
    if kind == "env":
        if t != "file":
            return False
        lines = [l for l in head.splitlines() if l.strip()]
        return bool(lines) and lines[0] == ENV_MARK
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
        return t == "dir" and root_kind(facts) is not None
    return False


def root_kind(facts):
    """What the existing directory described by ``facts`` (observed as a root) is to this
    collection: "marked" (it carries ROOT_MARK_NAME), "empty" (nothing but lost+found: a fresh
    volume's mount point), "legacy" (no marker, but everything in it is ours: a root an older
    version of the collection made, adopted and then marked) or None (not ours)."""
    names = {n for n, _k in facts.get("entries") or []}
    members = facts.get("members") or {}
    if members.get(ROOT_MARK_NAME, ("",))[0] == "file":
        return "marked"
    if names <= {"lost+found"}:
        return "empty"
    if "releases" not in names or facts.get("count", 0) > len(facts.get("entries") or []):
        return None
    if not all(n in _ROOT_NAMES or n.startswith(_ROOT_TMP_PREFIXES) for n in names):
        return None
    releases = facts.get("releases") or []
    if facts.get("releases_count", 0) > len(releases):
        return None
    if not all(marked or name.startswith(".tmp-") for name, _k, marked in releases):
        return None
    if "ledger.json" in members and not _LEDGER_HEAD_RE.match(facts.get("ledger_head") or ""):
        return None
    if "current" in members and members["current"][0] != "symlink":
        return None
    return "legacy"


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


def _shared_sticky(mode):
    """A sticky directory others may write (/tmp, /data/shared: 1777): each user can add names,
    and remove only their own."""
    return bool(mode & 0o1000) and bool(mode & 0o022)


def chain_problem(kind, facts):
    """Why a directory above the file described by ``facts`` lets another user swap it or plant it
    first, or None: each directory from ``/`` down must be root's and writable by root alone; a
    sticky shared directory is accepted only as the file's own directory, for the kinds root
    creates anew (EXCL_KINDS)."""
    chain = facts.get("chain") or []
    links = facts.get("links") or ()
    for directory, uid, mode in chain:
        if uid != _ROOT_UID and directory in links:
            return "is reached through %s, a symlink owned by uid %d: that user can point it elsewhere before root " \
                   "%s it; every link on the way must be root's" % (directory, uid, _USE.get(kind, "writes"))
        if uid != _ROOT_UID:
            return "is in %s, owned by uid %d (mode %04o): every directory above it must be root's, or that user " \
                   "can replace the file before root %s it" % (directory, uid, mode, _USE.get(kind, "writes"))
        if not mode & 0o022:
            continue
        if _shared_sticky(mode):
            if kind in EXCL_KINDS and facts.get("parent_exists") and chain[-1][0] == directory:
                continue
            return "is in %s (mode %04o), a directory every user can write: another user can put a file or " \
                   "directory of theirs at that name first%s" % (
                       directory, mode, "" if kind in EXCL_KINDS else
                       " (only the restart job's state, which root creates anew, may live directly in such a "
                       "directory)")
        return "is in %s (uid 0, mode %04o), which its group or others can write: every directory above it must " \
               "be writable by root alone" % (directory, mode)
    return None


def _cache_own_problem(facts):
    """The existing cache directory itself: root's, and writable by root alone - another user who
    could write it could plant compiled code there that the trainer loads as root."""
    if not facts.get("exists") or facts.get("uid") is None:
        return None
    if facts.get("uid") != _ROOT_UID:
        return "belongs to uid %s (mode %04o): that user could plant compiled code there that the trainer would " \
               "load as root; remove it (root makes it anew)" % (facts["uid"], facts.get("mode") or 0)
    if facts.get("type") == "dir" and (facts.get("mode") or 0) & 0o022:
        return "has mode %04o: %s can plant compiled code there that the trainer would load as root; make it " \
               "writable by root alone (chmod 0700) or remove it" % (
                   facts["mode"], "every user" if facts["mode"] & 0o002 else "its group")
    return None


# what root does with a file of each kind (for the words of a refusal)
_USE = {"env": "loads", "launcher": "runs", PROGRAM: "runs", "state": "reads", "lock": "takes", "root": "runs from",
        SEARCH: "loads code from", "cache": "loads compiled code from"}


def search_problem(facts):
    """Why a trainer_env search entry (``facts``: ``observe(path, SEARCH)``) lets another user choose
    what root runs or imports, or None: the entry itself (when it exists) and every directory above
    it must be root's and writable by root alone - a sticky shared directory (/tmp) included, where
    another user could create the entry first."""
    path = facts.get("path")
    real = facts.get("real") or path
    via = "" if real == path else " (it resolves to %s)" % real
    tail = ": root's processes (the pre-flight, the launcher, the trainer) would run or import what that user " \
           "puts there; a search entry must be root's alone, in directories only root may write"
    for directory, uid, mode in facts.get("chain") or []:
        if uid != _ROOT_UID:
            return "%s%s is in %s, owned by uid %d (mode %04o)%s" % (path, via, directory, uid, mode, tail)
        if mode & 0o022:
            return "%s%s is in %s (mode %04o), which %s can write%s" % (
                path, via, directory, mode, "every user" if mode & 0o002 else "its group", tail)
    if facts.get("exists"):
        uid, mode = facts.get("uid"), facts.get("mode") or 0
        if uid != _ROOT_UID:
            return "%s%s belongs to uid %s%s" % (path, via, uid, tail)
        if mode & 0o022 and facts.get("type") != "symlink":
            return "%s%s has mode %04o: %s can write it%s" % (
                path, via, mode, "every user" if mode & 0o002 else "its group", tail)
    return None


def search_entries(env):
    """``trainer_env`` -> [(label, absolute entry)] of its search variables (SEARCH_VARS), each
    entry once, in order (label: ``trainer_env.NAME``)."""
    out = []
    if not isinstance(env, dict):
        return out
    for name in SEARCH_VARS:
        value = env.get(name)
        if not isinstance(value, str):
            continue
        parts = value.replace(" ", ":").split(":") if name in ("LD_PRELOAD", "LD_AUDIT") else value.split(":")
        seen = set()
        for part in parts:
            if part.startswith("/") and part not in seen:
                seen.add(part)
                out.append(("trainer_env.%s" % name, part))
    return out


def _own_problem(facts):
    """Why the existing file or directory described by ``facts`` is not root's alone, or None."""
    if facts.get("type") in ("symlink", None):
        return None
    uid, mode = facts.get("uid"), facts.get("mode") or 0
    if uid is not None and uid != _ROOT_UID:
        return "exists and belongs to uid %d: root adopts only its own files" % uid
    if mode & 0o022:
        return "exists with mode %04o: its group or others can change it" % mode
    return None


def _root_members_problem(facts):
    for name in _ROOT_MEMBERS:
        got = (facts.get("members") or {}).get(name)
        if got is None:
            continue
        kind, uid, mode = got
        if uid != _ROOT_UID:
            return "holds %s, which belongs to uid %d: everything in a release root is root's" % (name, uid)
        if kind != "symlink" and mode & 0o022:
            return "holds %s (mode %04o), which its group or others can change" % (name, mode)
    return None


def program_problem(facts, uids=None):
    """Why the program described by ``facts`` (``observe_program``) may not be run as root, or
    None (one that is not found is left to its caller, which says so). ``uids``: the owners
    trusted (default root's alone; the node's read trusts the user it runs as too)."""
    if not facts.get("found"):
        return None
    trusted = (_ROOT_UID,) if uids is None else tuple(uids)
    name, real = facts.get("path"), facts.get("real")
    where = "%s resolves to %s" % (name, real) if real != name else name
    tail = ": a program run as root must be a file root owns and only root may write, in directories only root " \
           "may write (as sudo's secure_path)"
    if facts.get("type") != "file":
        return "%s, which is %s%s" % (where, _describe(facts), tail)
    if facts.get("uid") not in trusted:
        return "%s, which belongs to uid %s%s" % (where, facts.get("uid"), tail)
    if (facts.get("mode") or 0) & 0o022:
        return "%s (mode %04o), which its group or others can change%s" % (where, facts.get("mode"), tail)
    for directory, uid, mode in facts.get("chain") or []:
        if uid not in trusted:
            return "%s, in %s, owned by uid %d (mode %04o)%s" % (where, directory, uid, mode, tail)
        if mode & 0o022:
            return "%s, in %s (mode %04o), which %s can write%s" % (
                where, directory, mode, "every user" if mode & 0o002 else "its group", tail)
    return None


def missing_dir_problem(kind, facts):
    """Why the file described by ``facts`` cannot be written where it is because its directory does not
    exist, or None. Only the metrics file: its directory is node_exporter's textfile collector's, which
    the collection never makes (a missing one means node_exporter is not installed, or the path is
    mistyped) - the launcher would fail to write it at every interval, silently for the deploy."""
    if kind != "metrics" or facts.get("exists") or facts.get("parent_exists") is not False:
        return None
    directory = os.path.dirname(facts.get("real") or facts.get("path") or "")
    return "lies in %s, which does not exist on the target (node_exporter's textfile collector is not installed " \
           "there yet, or the path is mistyped): install node_exporter or create the directory first, or leave " \
           "trainer_metrics_path empty" % directory


# The kernel's overflow uid: what an unprivileged container shows as the owner of a file whose owner on the node
# its id map does not cover (a bind mount of the node's that is not id-mapped) - nobody inside can own such a file.
OVERFLOW_UID = 65534
IDMAP_WORDS = ("; uid 65534 is nobody: in an unprivileged container, the owner shown for a file whose owner on the "
               "node the container's id map does not cover (a bind mount that is not id-mapped) - chown it on the node "
               "to the container's root (uid 100000 with Proxmox's default map), or mount it id-mapped")


def idmap_words(why):
    """``why``, with what uid 65534 means said once when it names that owner (None stays None)."""
    if why and re.search(r"\buid %d\b" % OVERFLOW_UID, why) and IDMAP_WORDS not in why:
        return why + IDMAP_WORDS
    return why


def judge(variable, kind, facts):
    """Why the collection may not write (or delete, or run) what ``facts`` describes for
    ``variable``, or None (an owner of uid 65534 explained as an id map's: ``idmap_words``)."""
    return idmap_words(_judge(variable, kind, facts))


def _judge(variable, kind, facts):
    if kind == PROGRAM:
        return program_problem(facts)
    if kind == SEARCH:
        return search_problem(facts)
    real = facts.get("real") or facts.get("path")
    via = "" if real == facts.get("path") else " (it resolves to %s)" % real
    where = placement_problem(kind, real)
    if where:
        return "%s%s %s" % (facts.get("path"), via, where)
    why = chain_problem(kind, facts) or (_cache_own_problem(facts) if kind == "cache" else None)
    if why:
        return "%s%s %s" % (facts.get("path"), via, why)
    why = missing_dir_problem(kind, facts)
    if why:
        return "%s%s %s" % (facts.get("path"), via, why)
    if kind in PERSISTENT_KINDS and facts.get("fstype") in VOLATILE_FS:
        return "%s%s lies on a %s (%s): it is lost at reboot, and the enabled unit then fails to start; put it on " \
               "a disk (the default: %s)" % (facts.get("path"), via, facts["fstype"], facts.get("mount_point"),
                                             _DEFAULTS[kind])
    if not facts.get("exists"):
        return None
    if kind == "cache":
        why = cache_problem(facts)
        return None if why is None else "%s%s %s" % (facts.get("path"), via, why)
    why = _own_problem(facts)
    if why:
        return "%s%s %s" % (facts.get("path"), via, why)
    if kind == "root":
        if root_kind(facts) is None:
            return "%s%s exists and is not a release root of dflash.trainer (no %s): it holds %s" % (
                facts.get("path"), via, ROOT_MARK_NAME, _root_names(facts))
        why = _root_members_problem(facts)
        return None if why is None else "%s%s %s" % (facts.get("path"), via, why)
    if is_ours(kind, facts):
        return None
    return "%s%s exists and was not written by dflash.trainer (%s there is %s, not %s)" % (
        facts.get("path"), via, "what is" if via else "it is", _describe(facts), _WHAT[kind])


# the role's defaults of the files that must outlive a reboot (roles/trainer/defaults/main.yml)
_DEFAULTS = {"env": "/etc/dflash-trainer/trainer.env", "launcher": "/usr/local/lib/dflash-trainer/launch"}


def _root_names(facts):
    """The names of a refused root, with its releases/ entries that are no release of ours."""
    shown = _names(facts)
    foreign = [n for n, _k, marked in facts.get("releases") or [] if not marked and not n.startswith(".tmp-")]
    if foreign:
        shown += "; releases/ holds %s, which %s no %s" % (", ".join(foreign[:5]), "has" if len(foreign) == 1
                                                           else "have", RELEASE_MARK_NAME)
    return shown


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
    # the cache, purge or not: the trainer writes compiled code there and loads it, as root
    if variables.get("trainer_inductor_cache_dir"):
        out.append(("trainer_inductor_cache_dir", "cache", variables["trainer_inductor_cache_dir"]))
    # the programs root runs: nvidia-smi (the modules' own lookup), the first word of the
    # pre-flight and of the trainer's command (the unit's PATH; a word with a '/' that is not
    # absolute lies in the release, judged with the release root)
    smi = variables.get("trainer_nvidia_smi", "nvidia-smi")
    if isinstance(smi, str) and smi:
        out.append(("trainer_nvidia_smi", PROGRAM, program_item(smi)))
    env = variables.get("trainer_env")
    search = env.get("PATH") if isinstance(env, dict) and isinstance(env.get("PATH"), str) else SYSTEMD_PATH
    for name in ("trainer_preflight_command", "trainer_command"):
        argv = variables.get(name)
        first = argv[0] if isinstance(argv, list) and argv else None
        if isinstance(first, str) and first and ("/" not in first or first.startswith("/")):
            out.append((name, PROGRAM, program_item(first, search)))
    # what the environment makes root's processes run or import (PATH, PYTHONPATH, LD_PRELOAD, ...)
    for label, entry in search_entries(env):
        out.append((label, SEARCH, entry))
    return out
