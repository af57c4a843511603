# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Immutable code releases: the tree scan and the content hash (the release id), and what every
other part shares: the entry kinds, Entry, TreeScan, the errors, the path rules of a release tree.

Pure Python standard library, usable on the controller (action plugin) and on the target
(module, through AnsiballZ). Nothing here talks to Ansible.

The release id is the first 16 hex characters of a sha256 over the sorted tree entries:
``kind NUL relpath NUL mode NUL payload LF`` where kind is ``d`` (directory), ``f`` (regular
file) or ``l`` (symlink), mode is ``st_mode & 0o7777`` in octal (0 for symlinks, whose mode
means nothing and is not kept), payload the file's sha256 (hex) or the symlink's target.
Directories are entries of their own, so an empty directory or a mode change changes the id.
mtimes, owners and the walk order do not count.

The other parts: release.archive (writing archives, the manifest), release.extract (reading
and extracting them), release.prune (which releases to keep), release.diff (what a switch
changes).
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import stat

HASH_VERSION = b"dflash-release-v1\n"
RELEASE_ID_LEN = 16
DEFAULT_EXCLUDES = (".git", "__pycache__", "*.pyc", "checkpoints")
_CHUNK = 1024 * 1024

KIND_DIR = "d"
KIND_FILE = "f"
KIND_SYMLINK = "l"


class ReleaseError(Exception):
    """A tree that cannot become a release, or an archive that must not be extracted."""


class UnsafeArchiveError(ReleaseError):
    """An archive member that would escape the destination or is not a dir/file/symlink."""


class BaseReleaseError(ReleaseError):
    """The base release of a delta lacks a file, or one of its files fails its sha256 check."""


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
    """Result of scan_tree: sorted entries, full digest, release id, file count and bytes; stats:
    relpath -> file_stat_key of each regular file as scanned (empty for a TreeScan built by hand)."""

    __slots__ = ("root", "entries", "digest", "release_id", "file_count", "bytes", "stats")

    def __init__(self, root, entries, digest, stats=None):
        self.root = root
        self.stats = stats or {}
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


def file_stat_key(st):
    """What says a file is still the one that was hashed: (size, mtime_ns, ctime_ns, inode, device).
    A rewrite changes mtime and ctime (ctime cannot be set back), a replacement the inode."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def scan_tree(src, excludes=DEFAULT_EXCLUDES, hasher=None):
    """Walk src (not following symlinks), apply excludes, hash every file: a TreeScan.

    hasher(path, lstat_result) -> sha256 hex replaces file_sha256 (the controller's hash cache,
    _release_cache.HashCache.hasher); it must return the sha256 of the file's content.
    Raises ReleaseError for what cannot be part of a self-contained release: a symlink that is
    absolute or points outside src, a device node / fifo / socket.
    """
    src = os.path.abspath(src)
    if not os.path.isdir(src):
        raise ReleaseError("release source %s is not a directory" % src)
    excludes = tuple(excludes or ())
    entries = []
    stats = {}
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
                digest = hasher(child.path, st) if hasher is not None else file_sha256(child.path)
                stats[rel] = file_stat_key(st)
                entries.append(Entry(rel, KIND_FILE, stat.S_IMODE(st.st_mode), st.st_size, digest))
            else:
                raise ReleaseError(
                    "%s is not a regular file, directory or symlink (device, fifo or socket); "
                    "exclude it from the release" % rel)
    entries.sort(key=lambda x: _sort_key(x.relpath))
    return TreeScan(src, entries, hash_entries(entries), stats)


# ---------------------------------------------------------------------------------------------
# paths of archive members and manifest entries (release.archive.parse_manifest,
# release.extract.check_member)

def check_relpath(name, what="archive member"):
    """A relative path that stays inside its root, normalised ('a//./b' -> 'a/b').

    Raises UnsafeArchiveError for an empty name, NUL, an absolute path or a '..' component."""
    if not name or "\0" in name:
        raise UnsafeArchiveError("%s with an empty or invalid name" % what)
    if name.startswith("/") or os.path.isabs(name):
        raise UnsafeArchiveError("%s %r has an absolute path" % (what, name))
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts:
        raise UnsafeArchiveError("%s %r names the destination itself" % (what, name))
    if ".." in parts:
        raise UnsafeArchiveError("%s %r contains '..'" % (what, name))
    return "/".join(parts)
