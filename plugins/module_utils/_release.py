# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Immutable code releases: tree scan, content hash, deterministic archive, safe extraction,
prune planning.

Pure Python standard library, usable on the controller (action plugin) and on the target
(module, through AnsiballZ). Nothing here talks to Ansible.

The release id is the first 16 hex characters of a sha256 over the sorted tree entries:
``kind NUL relpath NUL mode NUL payload LF`` where kind is ``d`` (directory), ``f`` (regular
file) or ``l`` (symlink), mode is ``st_mode & 0o7777`` in octal (0 for symlinks, whose mode
means nothing and is not kept), payload the file's sha256 (hex) or the symlink's target.
Directories are entries of their own, so an empty directory or a mode change changes the id.
mtimes, owners and the walk order do not count.
"""
from __future__ import annotations

import errno
import fnmatch
import gzip
import hashlib
import os
import stat
import tarfile

HASH_VERSION = b"dflash-release-v1\n"
RELEASE_ID_LEN = 16
DEFAULT_EXCLUDES = (".git", "__pycache__", "*.pyc", "checkpoints")
MARKER_NAME = ".dflash-release"
ARCHIVE_MTIME = 0
_CHUNK = 1024 * 1024

KIND_DIR = "d"
KIND_FILE = "f"
KIND_SYMLINK = "l"


class ReleaseError(Exception):
    """A tree that cannot become a release, or an archive that must not be extracted."""


class UnsafeArchiveError(ReleaseError):
    """An archive member that would escape the destination or is not a dir/file/symlink."""


class Entry(object):
    """One tree entry: relpath (str, '/'-separated), kind, mode (& 0o7777), size, payload."""

    __slots__ = ("relpath", "kind", "mode", "size", "payload")

    def __init__(self, relpath, kind, mode, size=0, payload=""):
        self.relpath = relpath
        self.kind = kind
        self.mode = mode
        self.size = size
        self.payload = payload

    def __repr__(self):
        return "Entry(%r, %r, %o, %d, %r)" % (self.relpath, self.kind, self.mode, self.size, self.payload)

    def __eq__(self, other):
        return isinstance(other, Entry) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def _key(self):
        return (self.relpath, self.kind, self.mode, self.size, self.payload)


class TreeScan(object):
    """Result of scan_tree: sorted entries, full digest, release id, file count and bytes."""

    __slots__ = ("root", "entries", "digest", "release_id", "file_count", "bytes")

    def __init__(self, root, entries, digest):
        self.root = root
        self.entries = entries
        self.digest = digest
        self.release_id = digest[:RELEASE_ID_LEN]
        self.file_count = sum(1 for e in entries if e.kind == KIND_FILE)
        self.bytes = sum(e.size for e in entries if e.kind == KIND_FILE)


# ---------------------------------------------------------------------------------------------
# excludes and hashing

def is_excluded(relpath, patterns):
    """True when any path component, or the whole relative path, matches a pattern (fnmatch)."""
    if not patterns:
        return False
    parts = relpath.split("/")
    for pattern in patterns:
        if fnmatch.fnmatchcase(relpath, pattern):
            return True
        for part in parts:
            if fnmatch.fnmatchcase(part, pattern):
                return True
    return False


def _sort_key(relpath):
    return os.fsencode(relpath)


def _link_stays_inside(relpath, target):
    """A symlink at relpath (relative to the tree root) pointing at target stays in the tree."""
    if not target or target.startswith("/"):
        return False
    parent = os.path.dirname(relpath)
    resolved = os.path.normpath(os.path.join(parent, target))
    return not (resolved == ".." or resolved.startswith("../") or resolved.startswith("/"))


def hash_entries(entries):
    """Full sha256 hex over entries, independent of their order."""
    h = hashlib.sha256(HASH_VERSION)
    for e in sorted(entries, key=lambda x: _sort_key(x.relpath)):
        mode = 0 if e.kind == KIND_SYMLINK else (e.mode & 0o7777)
        h.update(e.kind.encode("ascii"))
        h.update(b"\0")
        h.update(os.fsencode(e.relpath))
        h.update(b"\0")
        h.update(("%o" % mode).encode("ascii"))
        h.update(b"\0")
        h.update(os.fsencode(e.payload))
        h.update(b"\n")
    return h.hexdigest()


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def scan_tree(src, excludes=DEFAULT_EXCLUDES):
    """Walk src (not following symlinks), apply excludes, hash every file: a TreeScan.

    Raises ReleaseError for what cannot be part of a self-contained release: a symlink that is
    absolute or points outside src, a device node / fifo / socket.
    """
    src = os.path.abspath(src)
    if not os.path.isdir(src):
        raise ReleaseError("release source %s is not a directory" % src)
    excludes = tuple(excludes or ())
    entries = []
    stack = [""]
    while stack:
        reldir = stack.pop()
        absdir = os.path.join(src, reldir) if reldir else src
        try:
            with os.scandir(absdir) as it:
                children = sorted(it, key=lambda d: os.fsencode(d.name))
        except OSError as e:
            raise ReleaseError("cannot read directory %s: %s" % (absdir, e.strerror or e))
        for child in children:
            rel = reldir + "/" + child.name if reldir else child.name
            if is_excluded(rel, excludes):
                continue
            st = os.lstat(child.path)
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(child.path)
                if not _link_stays_inside(rel, target):
                    raise ReleaseError(
                        "symlink %s -> %s points outside the release tree; a release must be "
                        "self-contained (exclude it or make it relative)" % (rel, target))
                entries.append(Entry(rel, KIND_SYMLINK, 0, 0, target))
            elif stat.S_ISDIR(st.st_mode):
                entries.append(Entry(rel, KIND_DIR, stat.S_IMODE(st.st_mode)))
                stack.append(rel)
            elif stat.S_ISREG(st.st_mode):
                entries.append(Entry(rel, KIND_FILE, stat.S_IMODE(st.st_mode), st.st_size,
                                     file_sha256(child.path)))
            else:
                raise ReleaseError(
                    "%s is not a regular file, directory or symlink (device, fifo or socket); "
                    "exclude it from the release" % rel)
    entries.sort(key=lambda x: _sort_key(x.relpath))
    return TreeScan(src, entries, hash_entries(entries))


# ---------------------------------------------------------------------------------------------
# archive

class _HashingReader(object):
    """File wrapper that hashes what tarfile reads, so the archive proves its own content."""

    def __init__(self, f):
        self._f = f
        self.sha = hashlib.sha256()

    def read(self, size=-1):
        data = self._f.read(size)
        self.sha.update(data)
        return data


def _tarinfo(name, kind, mode, size=0, linkname=""):
    ti = tarfile.TarInfo(name)
    ti.mtime = ARCHIVE_MTIME
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mode = mode & 0o7777
    if kind == KIND_DIR:
        ti.type = tarfile.DIRTYPE
    elif kind == KIND_SYMLINK:
        ti.type = tarfile.SYMTYPE
        ti.linkname = linkname
        ti.mode = 0o777
    else:
        ti.type = tarfile.REGTYPE
        ti.size = size
    return ti


def build_archive(scan, dest_path, compresslevel=6):
    """Write a deterministic tar.gz of scan's entries to dest_path, streaming (constant memory).

    Same tree -> same bytes: sorted members, relative names, mtime fixed, uid/gid 0, no owner
    names, gzip header without name or time. Returns the content digest of what was written;
    it differs from scan.digest if the tree changed between scan and archive.
    """
    written = []
    with open(dest_path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                           compresslevel=compresslevel) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for e in scan.entries:
                    path = os.path.join(scan.root, e.relpath)
                    if e.kind == KIND_FILE:
                        with open(path, "rb") as f:
                            reader = _HashingReader(f)
                            tar.addfile(_tarinfo(e.relpath, e.kind, e.mode, e.size), reader)
                        written.append(Entry(e.relpath, e.kind, e.mode, e.size,
                                             reader.sha.hexdigest()))
                    else:
                        tar.addfile(_tarinfo(e.relpath, e.kind, e.mode, 0, e.payload))
                        written.append(e)
        raw.flush()
        os.fsync(raw.fileno())
    return hash_entries(written)


# ---------------------------------------------------------------------------------------------
# safe extraction
#
# tarfile's extraction filters (filter='data', tarfile.data_filter) arrived in Python 3.11.4 /
# 3.12; Debian bookworm's python3 is 3.11.2 and lacks them. So this extractor does not use
# tarfile.extract* at all: it implements the 'data' filter's rules itself, on every Python:
#   - only directories, regular files and symlinks; hard links, devices, fifos are refused;
#   - no absolute names, no '..' components, no member below a symlink;
#   - symlink targets relative and resolving inside the destination;
#   - no setuid/setgid/sticky, no group/other write; files always owner rw, dirs owner rwx;
#   - no owner/group/mtime from the archive (files belong to the extracting user, dated now).
# Files are created with O_EXCL|O_NOFOLLOW in a fresh directory and fsync'd.

def _safe_mode(kind, mode):
    mode &= 0o755  # drops setuid/setgid/sticky and group/other write
    if kind == KIND_FILE:
        mode |= 0o600
    elif kind == KIND_DIR:
        mode |= 0o700
    return mode


def check_member(member):
    """Validate one TarInfo; return (relpath, kind). Raises UnsafeArchiveError."""
    name = member.name
    if not name or "\0" in name:
        raise UnsafeArchiveError("archive member with an empty or invalid name")
    if name.startswith("/") or os.path.isabs(name):
        raise UnsafeArchiveError("archive member %r has an absolute path" % name)
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts:
        raise UnsafeArchiveError("archive member %r names the destination itself" % name)
    if ".." in parts:
        raise UnsafeArchiveError("archive member %r contains '..'" % name)
    relpath = "/".join(parts)
    if member.isdir():
        return relpath, KIND_DIR
    if member.isreg():
        return relpath, KIND_FILE
    if member.issym():
        if not _link_stays_inside(relpath, member.linkname):
            raise UnsafeArchiveError("archive member %r is a symlink to %r, outside the destination"
                                     % (name, member.linkname))
        return relpath, KIND_SYMLINK
    if member.islnk():
        raise UnsafeArchiveError("archive member %r is a hard link; not allowed in a release" % name)
    if member.ischr() or member.isblk():
        raise UnsafeArchiveError("archive member %r is a device node; not allowed in a release" % name)
    if member.isfifo():
        raise UnsafeArchiveError("archive member %r is a fifo; not allowed in a release" % name)
    raise UnsafeArchiveError("archive member %r has unsupported type %r" % (name, member.type))


def _within(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def _ensure_parent(dest, relpath, created_dirs):
    """Create missing parent dirs of relpath; refuse any parent that is not a real directory."""
    parts = relpath.split("/")[:-1]
    cur = dest
    for part in parts:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
            os.mkdir(cur, 0o700)
            created_dirs.setdefault(cur, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeArchiveError("archive member %r lies below %s, which is not a directory"
                                     % (relpath, os.path.relpath(cur, dest)))
    return os.path.join(dest, relpath)


def extract_archive(archive_path, dest):
    """Extract a release archive into dest (an existing, empty directory) safely.

    Returns the content digest (hash_entries over the members as archived), which the caller
    compares with the release id it expected.
    """
    dest = os.path.realpath(dest)
    entries = []
    dir_modes = {}  # applied last, so read-only directories do not block their contents
    with tarfile.open(archive_path, mode="r:gz") as tar:
        for member in tar:
            relpath, kind = check_member(member)
            target = _ensure_parent(dest, relpath, dir_modes)
            if not _within(os.path.realpath(os.path.dirname(target)), dest):
                raise UnsafeArchiveError("archive member %r resolves outside the destination" % relpath)
            mode = member.mode & 0o7777
            if kind == KIND_DIR:
                try:
                    os.mkdir(target, 0o700)
                except OSError as e:
                    if e.errno != errno.EEXIST or not os.path.isdir(target) or os.path.islink(target):
                        raise
                dir_modes[target] = _safe_mode(KIND_DIR, mode)
                entries.append(Entry(relpath, KIND_DIR, mode))
            elif kind == KIND_SYMLINK:
                try:
                    os.symlink(member.linkname, target)
                except FileExistsError:
                    raise UnsafeArchiveError("archive member %r appears twice" % relpath)
                resolved = os.path.realpath(target)
                if not _within(resolved, dest):
                    os.unlink(target)
                    raise UnsafeArchiveError("archive member %r is a symlink resolving outside the "
                                             "destination" % relpath)
                entries.append(Entry(relpath, KIND_SYMLINK, 0, 0, member.linkname))
            else:
                src = tar.extractfile(member)
                sha = hashlib.sha256()
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                try:
                    fd = os.open(target, flags, 0o600)
                except FileExistsError:
                    raise UnsafeArchiveError("archive member %r appears twice" % relpath)
                with os.fdopen(fd, "wb") as out:
                    while True:
                        chunk = src.read(_CHUNK)
                        if not chunk:
                            break
                        sha.update(chunk)
                        out.write(chunk)
                    out.flush()
                    os.fchmod(out.fileno(), _safe_mode(KIND_FILE, mode))
                    os.fsync(out.fileno())
                entries.append(Entry(relpath, KIND_FILE, mode, member.size, sha.hexdigest()))
    # A symlink checked at creation can be made to escape by a later member (a link through a
    # directory that only becomes a symlink afterwards); check them all once more at the end.
    for e in entries:
        if e.kind == KIND_SYMLINK and not _within(os.path.realpath(os.path.join(dest, e.relpath)), dest):
            raise UnsafeArchiveError("archive member %r is a symlink resolving outside the destination"
                                     % e.relpath)
    # deepest first, so a parent's mode is set after its children are in place
    for path in sorted(dir_modes, key=lambda p: p.count("/"), reverse=True):
        os.chmod(path, dir_modes[path])
        fsync_dir(path)
    fsync_dir(dest)
    return hash_entries(entries)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# pruning

def plan_prune(releases, current, last_good, keep):
    """Which releases to delete.

    releases: mapping id -> mtime (or iterable of (id, mtime) pairs). Keeps the newest `keep`
    (mtime, ties broken by id), and never deletes `current` or `last_good`. Returns ids to
    delete, oldest first.
    """
    if keep < 0:
        raise ValueError("keep must be >= 0, got %r" % (keep,))
    pairs = list(releases.items()) if isinstance(releases, dict) else list(releases)
    newest_first = sorted(pairs, key=lambda p: (p[1], p[0]), reverse=True)
    protected = set(x for x in (current, last_good) if x)
    doomed = [pair[0] for pair in newest_first[keep:] if pair[0] not in protected]
    doomed.reverse()
    return doomed


def order_newest_first(releases):
    pairs = list(releases.items()) if isinstance(releases, dict) else list(releases)
    return [pair[0] for pair in sorted(pairs, key=lambda p: (p[1], p[0]), reverse=True)]
