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

Delta releases: a release records its manifest (every entry: relpath, kind, mode, size, sha256 or
link target). A delta archive starts with the manifest of the whole new tree (member
``.dflash-manifest.json``), then holds every directory and symlink but only the regular files
whose content the base release lacks; extract_delta materialises the rest from the base release's
files with the same sha256, each verified against it first: by a hard link when the base file
already is what extraction would create (same mode, owner and group, same filesystem), else by a
copy (the ``rsync --link-dest`` pattern; see _materialise for why that is sound and its limit).
"""
from __future__ import annotations

import contextlib
import errno
import fnmatch
import gzip
import hashlib
import io
import json
import os
import re
import stat
import tarfile
from concurrent.futures import ThreadPoolExecutor

HASH_VERSION = b"dflash-release-v1\n"
RELEASE_ID_LEN = 16
DEFAULT_EXCLUDES = (".git", "__pycache__", "*.pyc", "checkpoints")
MARKER_NAME = ".dflash-release"
ARCHIVE_MTIME = 0
_CHUNK = 1024 * 1024
_TAR_BLOCK = 512
_TAR_RECORD = 20 * 512
GZIP_MAGIC = b"\x1f\x8b"
# gzip level of small release archives (those that may travel inline); level 1 costs a fraction
# of level 6's CPU for a slightly bigger archive. Big ones travel as a plain tar (write_archive).
DEFAULT_COMPRESSLEVEL = 1
MANIFEST_MEMBER = ".dflash-manifest.json"
MANIFEST_VERSION = 1
MANIFEST_MAX_BYTES = 64 * 1024 * 1024
# files are linked or copied from the base release by a small thread pool: creating an inode
# costs ~0.5 ms on the lab's overlayfs, and that latency overlaps well (I/O and hashing drop the GIL)
COPY_WORKERS = 16
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

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


class _CountingReader(object):
    """File wrapper that counts what tarfile reads (tarfile pads a short file with NULs)."""

    def __init__(self, f):
        self._f = f
        self.count = 0

    def read(self, size=-1):
        data = self._f.read(size)
        self.count += len(data)
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


def manifest_items(entries):
    """JSON-able manifest of entries: sorted [relpath, kind, mode, size, payload] lists."""
    return [[e.relpath, e.kind, e.mode, e.size, e.payload]
            for e in sorted(entries, key=lambda x: _sort_key(x.relpath))]


def manifest_bytes(entries):
    """The manifest member of a delta archive (deterministic bytes)."""
    doc = {"version": MANIFEST_VERSION, "entries": manifest_items(entries)}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("ascii")


def parse_manifest(items, what="manifest"):
    """Validate manifest items (as from manifest_items) -> sorted Entry list.

    Every path goes through the checks of an archive member (relative, no '..', canonical), every
    parent must be a directory of the manifest, symlinks must stay inside, files carry a sha256.
    Raises UnsafeArchiveError.
    """
    if not isinstance(items, list):
        raise UnsafeArchiveError("%s is not a list of entries" % what)
    by_path = {}
    for item in items:
        if not isinstance(item, list) or len(item) != 5:
            raise UnsafeArchiveError("%s entry %r is not [relpath, kind, mode, size, payload]" % (what, item))
        relpath, kind, mode, size, payload = item
        if not isinstance(relpath, str) or not isinstance(payload, str):
            raise UnsafeArchiveError("%s entry %r: path and payload must be strings" % (what, item))
        if check_relpath(relpath, "%s entry" % what) != relpath:
            raise UnsafeArchiveError("%s entry %r is not a canonical relative path" % (what, relpath))
        for number in (mode, size):
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise UnsafeArchiveError("%s entry %r: mode and size must be integers >= 0" % (what, relpath))
        if mode > 0o7777:
            raise UnsafeArchiveError("%s entry %r: mode %o out of range" % (what, relpath, mode))
        if kind == KIND_FILE:
            if not _SHA256_RE.match(payload):
                raise UnsafeArchiveError("%s entry %r: %r is not a sha256" % (what, relpath, payload))
        elif kind == KIND_SYMLINK:
            if not _link_stays_inside(relpath, payload):
                raise UnsafeArchiveError("%s entry %r is a symlink to %r, outside the destination"
                                         % (what, relpath, payload))
            mode, size = 0, 0
        elif kind == KIND_DIR:
            if payload or size:
                raise UnsafeArchiveError("%s entry %r: a directory has no payload or size" % (what, relpath))
        else:
            raise UnsafeArchiveError("%s entry %r has unknown kind %r" % (what, relpath, kind))
        if relpath in by_path:
            raise UnsafeArchiveError("%s entry %r appears twice" % (what, relpath))
        by_path[relpath] = Entry(relpath, kind, mode, size, payload)
    for relpath in by_path:
        parent = relpath.rpartition("/")[0]
        if parent and (parent not in by_path or by_path[parent].kind != KIND_DIR):
            raise UnsafeArchiveError("%s entry %r lies below %r, which is not a directory of the manifest"
                                     % (what, relpath, parent))
    return sorted(by_path.values(), key=lambda x: _sort_key(x.relpath))


def delta_counts(scan, have):
    """(files sent, files reused) for a delta against a base holding the sha256s in have."""
    have = have or frozenset()
    sent = sum(1 for e in scan.entries if e.kind == KIND_FILE and e.payload not in have)
    return sent, scan.file_count - sent


def archive_estimate(scan, have=None):
    """Upper bound of the bytes of the plain tar build_archive/write_archive would write (payload
    of the files sent, headers and padding), to choose between compressing and streaming."""
    have = frozenset(have or ())
    total = 1024 + 3 * _TAR_BLOCK * len(scan.entries)  # end blocks; header (+ pax header) per entry
    for e in scan.entries:
        if e.kind == KIND_FILE and e.payload not in have:
            total += e.size + _TAR_BLOCK
    if have:
        total += 2 * _TAR_BLOCK + 200 * len(scan.entries)  # the manifest member
    return total + _TAR_RECORD


class _CountingWriter(object):
    """Binary writer that counts what goes through it (tarfile asks for tell())."""

    def __init__(self, out):
        self._out = out
        self.count = 0

    def write(self, data):
        self._out.write(data)
        self.count += len(data)
        return len(data)

    def tell(self):
        return self.count

    def flush(self):
        self._out.flush()


def write_archive(scan, out, have=None, compresslevel=None, check="hash"):
    """Write the deterministic archive of scan's entries to the binary file object out, streaming
    (constant memory; out may be a pipe). Returns (content digest of what was written, bytes
    written to out).

    compresslevel None: a plain tar - what a release that is mostly data which does not compress
    (weights, checkpoints) should travel as: gzip level 1 runs at ~50 MB/s on such data, a tar
    at disk speed. An int: gzip at that level (small archives, which may travel inline).

    Same tree -> same bytes: sorted members, relative names, mtime fixed, uid/gid 0, no owner
    names, gzip header without name or time. The digest differs from scan.digest if the tree
    changed between scan and archive. check="hash": every file sent is hashed as it is read.
    check="stat": a file counts as changed when its stat (file_stat_key, before and after it is
    read) is not the one scan_tree saw, or it gave another number of bytes - what a receiver that
    hashes everything itself (the trainer_release module) needs from the sender: a clear early
    word, without a second sha256 pass over a 1 GiB checkpoint on the controller. A same-size
    rewrite within the clock tick of the scan is only caught by the receiver.

    With have (a collection of sha256 hex strings the target's base release holds), the archive
    is a delta: the first member is MANIFEST_MEMBER (manifest of the whole tree), then every
    directory and symlink, but only the regular files whose sha256 is not in have. Their entries
    count in the returned digest as scanned.
    """
    written = []
    have = frozenset(have) if have is not None else None
    counter = _CountingWriter(out)
    gz = None
    if compresslevel is not None:
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=counter, mtime=0, compresslevel=compresslevel)
    try:
        with tarfile.open(fileobj=gz if gz is not None else counter, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.copybufsize = _CHUNK  # not tarfile's 16 KiB: a 1 GiB file is 1,024 reads, not 65,536
            if have is not None:
                data = manifest_bytes(scan.entries)
                tar.addfile(_tarinfo(MANIFEST_MEMBER, KIND_FILE, 0o644, len(data)), io.BytesIO(data))
            for e in scan.entries:
                path = os.path.join(scan.root, e.relpath)
                if e.kind == KIND_FILE and have is not None and e.payload in have:
                    written.append(e)  # the target copies it from its base release
                elif e.kind == KIND_FILE and check == "stat":
                    with open(path, "rb") as f:
                        before = file_stat_key(os.fstat(f.fileno()))
                        reader = _CountingReader(f)
                        try:
                            tar.addfile(_tarinfo(e.relpath, e.kind, e.mode, e.size), reader)
                        except OSError as err:
                            if reader.count >= e.size or os.fstat(f.fileno()).st_size >= e.size:
                                raise
                            raise ReleaseError("%s shrank from %d bytes while the release archive was built; "
                                               "deploy again" % (e.relpath, e.size))
                        after = file_stat_key(os.fstat(f.fileno()))
                    same = before == after == scan.stats.get(e.relpath) and reader.count == e.size
                    written.append(e if same else Entry(e.relpath, e.kind, e.mode, e.size, "changed"))
                elif e.kind == KIND_FILE:
                    with open(path, "rb") as f:
                        reader = _HashingReader(f)
                        tar.addfile(_tarinfo(e.relpath, e.kind, e.mode, e.size), reader)
                    written.append(Entry(e.relpath, e.kind, e.mode, e.size, reader.sha.hexdigest()))
                else:
                    tar.addfile(_tarinfo(e.relpath, e.kind, e.mode, 0, e.payload))
                    written.append(e)
    finally:
        if gz is not None:
            gz.close()
    counter.flush()
    return hash_entries(written), counter.count


def build_archive(scan, dest_path, compresslevel=DEFAULT_COMPRESSLEVEL, have=None, sync=True):
    """write_archive into the file dest_path (gzip at compresslevel; None: a plain tar), fsync'd
    unless sync is false. Returns the content digest of what was written (see write_archive)."""
    with open(dest_path, "wb") as raw:
        digest = write_archive(scan, raw, have=have, compresslevel=compresslevel)[0]
        raw.flush()
        if sync:
            os.fsync(raw.fileno())
    return digest


class _ForwardReader(object):
    """A pipe as a file that only seeks forward, for tarfile's random-access mode: the extractors
    read every member's header and data in order, so tarfile only ever seeks forward (over
    padding). Its stream mode (``r|``) would do, but copies every byte three times more: 3.9 s of
    CPU per GiB against 1.3 s, sha256 included. A backward seek (a sparse member) raises."""

    def __init__(self, raw):
        self._raw = raw
        self._pos = 0
        self._head = raw.read(2)  # the gzip magic, if any; served first

    @property
    def gzipped(self):
        return self._head == GZIP_MAGIC

    def read(self, size=-1):
        head = self._head
        if head:
            if size is not None and 0 <= size < len(head):
                data, self._head = head[:size], head[size:]
            else:
                self._head = b""
                data = head + self._raw.read(-1 if size is None or size < 0 else size - len(head))
        else:
            data = self._raw.read(size)
        self._pos += len(data)
        return data

    def tell(self):
        return self._pos

    def seekable(self):
        return False

    def seek(self, pos, whence=0):
        if whence == 1:
            pos += self._pos
        elif whence != 0:
            raise io.UnsupportedOperation("a release archive read from a pipe cannot seek from its end")
        if pos < self._pos:
            raise io.UnsupportedOperation("a release archive read from a pipe cannot seek back (%d < %d)"
                                          % (pos, self._pos))
        while self._pos < pos and self.read(min(pos - self._pos, _CHUNK)):
            pass
        return self._pos


@contextlib.contextmanager
def open_archive(archive_path):
    """tarfile of a release archive: gzip-compressed (by its magic) or plain. A fifo (the action
    plugin streaming the archive into the module) is read once, front to back (_ForwardReader;
    a gzip one in tarfile's stream mode), then to its end; a file is opened for random access."""
    if stat.S_ISFIFO(os.stat(archive_path).st_mode):
        with open(archive_path, "rb") as raw:
            reader = _ForwardReader(raw)
            if reader.gzipped:
                tar = tarfile.open(fileobj=reader, mode="r|gz", bufsize=_CHUNK)
            else:
                tar = tarfile.open(fileobj=reader, mode="r:")
            with tar:
                yield tar
            # read to the writer's end (the tar's last record): a writer cut off by our close
            # would fail a transfer that delivered everything
            while raw.read(_CHUNK):
                pass
        return
    with open(archive_path, "rb") as f:
        magic = f.read(2)
    with tarfile.open(archive_path, mode="r:gz" if magic == GZIP_MAGIC else "r:") as tar:
        yield tar


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
# The paths of a delta's manifest pass the same checks (check_relpath, parse_manifest).

def _safe_mode(kind, mode):
    mode &= 0o755  # drops setuid/setgid/sticky and group/other write
    if kind == KIND_FILE:
        mode |= 0o600
    elif kind == KIND_DIR:
        mode |= 0o700
    return mode


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


def check_member(member):
    """Validate one TarInfo; return (relpath, kind). Raises UnsafeArchiveError."""
    name = member.name
    relpath = check_relpath(name)
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


def _create_file(target, relpath):
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(target, flags, 0o600)
    except FileExistsError:
        raise UnsafeArchiveError("archive member %r appears twice" % relpath)
    return os.fdopen(fd, "wb")


def _extract_member(tar, member, dest, dir_modes):
    """Create one checked member below dest; return its Entry (mode as archived)."""
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
        return Entry(relpath, KIND_DIR, mode)
    if kind == KIND_SYMLINK:
        try:
            os.symlink(member.linkname, target)
        except FileExistsError:
            raise UnsafeArchiveError("archive member %r appears twice" % relpath)
        resolved = os.path.realpath(target)
        if not _within(resolved, dest):
            os.unlink(target)
            raise UnsafeArchiveError("archive member %r is a symlink resolving outside the "
                                     "destination" % relpath)
        return Entry(relpath, KIND_SYMLINK, 0, 0, member.linkname)
    src = tar.extractfile(member)
    sha = hashlib.sha256()
    with _create_file(target, relpath) as out:
        while True:
            chunk = src.read(_CHUNK)
            if not chunk:
                break
            sha.update(chunk)
            out.write(chunk)
        out.flush()
        os.fchmod(out.fileno(), _safe_mode(KIND_FILE, mode))
        os.fsync(out.fileno())
    return Entry(relpath, KIND_FILE, mode, member.size, sha.hexdigest())


def _finish(dest, entries, dir_modes):
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


def extract_archive_entries(archive_path, dest):
    """Extract a release archive into dest (an existing, empty directory) safely.

    Returns (content digest, entries): hash_entries over the members as archived, which the
    caller compares with the release id it expected, and the entries (the release's manifest).
    """
    dest = os.path.realpath(dest)
    entries = []
    dir_modes = {}  # applied last, so read-only directories do not block their contents
    with open_archive(archive_path) as tar:
        for member in tar:
            entries.append(_extract_member(tar, member, dest, dir_modes))
    _finish(dest, entries, dir_modes)
    return hash_entries(entries), entries


def extract_archive(archive_path, dest):
    """Extract a release archive into dest (an existing, empty directory) safely.

    Returns the content digest (hash_entries over the members as archived), which the caller
    compares with the release id it expected.
    """
    return extract_archive_entries(archive_path, dest)[0]


def _read_manifest_member(tar):
    first = tar.next()
    if first is None or first.name != MANIFEST_MEMBER or not first.isreg():
        raise UnsafeArchiveError("a delta archive must start with its manifest %s" % MANIFEST_MEMBER)
    if first.size > MANIFEST_MAX_BYTES:
        raise UnsafeArchiveError("manifest of %d bytes is larger than %d" % (first.size, MANIFEST_MAX_BYTES))
    raw = tar.extractfile(first).read()
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError as e:
        raise UnsafeArchiveError("unreadable manifest in the archive: %s" % e)
    if not isinstance(doc, dict) or doc.get("version") != MANIFEST_VERSION:
        raise UnsafeArchiveError("manifest in the archive is not version %d" % MANIFEST_VERSION)
    return first, parse_manifest(doc.get("entries"), "manifest")


def extraction_owner(dest):
    """(uid, gid) a file created below dest by this process gets: the effective uid, and the
    directory's group when it is setgid (BSD semantics, inherited by the subdirectories extraction
    makes), else the effective gid. As root on a plain directory: (0, 0)."""
    st = os.stat(dest)
    gid = st.st_gid if st.st_mode & stat.S_ISGID else os.getegid()
    return os.geteuid(), gid


def _hash_fd(f, out=None):
    """(sha256 hex, size) of what is read from f, copying it to out when given."""
    sha = hashlib.sha256()
    size = 0
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            break
        sha.update(chunk)
        size += len(chunk)
        if out is not None:
            out.write(chunk)
    return sha.hexdigest(), size


def _mismatch(src, entry, got):
    return BaseReleaseError("base release file %s does not match its recorded sha256 %s (got %s); "
                            "not reused for %r" % (src, entry.payload, got, entry.relpath))


def _materialise(src, target, entry, owner):
    """Make target (a new release's file) from src (a base release file with entry's sha256).

    Returns (Entry, linked). The base file is always hashed first; a mismatch raises
    BaseReleaseError, so a tampered base never propagates.

    Hard link (the ``rsync --link-dest`` pattern) when the base file already is exactly what a
    fresh extraction would create: regular file, mode (& 0o7777) == the safe mode of the
    manifest's mode, owner/group == owner (extraction_owner). Sound because releases are
    immutable: only this module writes below releases/ (under its lock), never modifies a file of
    a complete release, and deleting a release only unlinks names, so identical content with an
    identical mode can share one inode. The link needs no fsync of its own (no new data; the
    directories are fsync'd once by _finish). Limit: an in-place edit of a file below releases/
    (by hand, as root) shows in every release sharing that inode - state=query with verify=true
    re-hashes a release against its manifest to catch exactly that.
    Otherwise, or when os.link fails (another filesystem, a link limit, protected_hardlinks):
    a checked copy, created O_EXCL|O_NOFOLLOW, verified while copied, fsync'd.
    """
    try:
        fd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise BaseReleaseError("base release file for %r (%s): %s" % (entry.relpath, src, e.strerror or e))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BaseReleaseError("base release file %s is not a regular file" % src)
        want_mode = _safe_mode(KIND_FILE, entry.mode)
        if stat.S_IMODE(st.st_mode) == want_mode and (st.st_uid, st.st_gid) == tuple(owner):
            digest, size = _hash_fd(f)
            if digest != entry.payload:
                raise _mismatch(src, entry, digest)
            try:
                # linkat without AT_SYMLINK_FOLLOW: links the name itself, never a symlink's target
                os.link(src, target, follow_symlinks=False)
            except FileExistsError:
                raise UnsafeArchiveError("archive member %r appears twice" % entry.relpath)
            except OSError:
                pass  # EXDEV, EMLINK, EPERM...: copy instead
            else:
                lst = os.lstat(target)
                if (lst.st_dev, lst.st_ino) != (st.st_dev, st.st_ino) or stat.S_IMODE(lst.st_mode) != want_mode:
                    # src was replaced (or chmod'ed) between the hash and the link
                    os.unlink(target)
                    raise BaseReleaseError("base release file %s changed while it was reused for %r"
                                           % (src, entry.relpath))
                return Entry(entry.relpath, KIND_FILE, entry.mode, size, digest), True
            f.seek(0)
        with _create_file(target, entry.relpath) as out:
            digest, size = _hash_fd(f, out)
            if digest != entry.payload:
                raise _mismatch(src, entry, digest)
            out.flush()
            os.fchmod(out.fileno(), want_mode)
            os.fsync(out.fileno())
    return Entry(entry.relpath, KIND_FILE, entry.mode, size, digest), False


def _looks_linkable(src, entry, owner):
    """A cheap first guess (lstat) whether _materialise will hard-link src for entry."""
    try:
        st = os.lstat(src)
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == _safe_mode(KIND_FILE, entry.mode)
            and (st.st_uid, st.st_gid) == tuple(owner))


class DeltaResult(tuple):
    """What extract_delta did: (digest, entries, sent, reused) plus .copied and .linked
    (reused == copied + linked)."""

    def __new__(cls, digest, entries, sent, copied, linked):
        self = tuple.__new__(cls, (digest, entries, sent, copied + linked))
        self.copied = copied
        self.linked = linked
        return self

    digest = property(lambda self: self[0])
    entries = property(lambda self: self[1])
    sent = property(lambda self: self[2])
    reused = property(lambda self: self[3])


def extract_delta(archive_path, dest, base_dir, base_manifest, workers=COPY_WORKERS, link=True):
    """Extract a delta archive into dest (existing, empty) and complete it from base_dir.

    base_manifest: the base release's entries (parse_manifest). Every archive member must match
    the archive's manifest; every manifest file missing from the archive comes from the base file
    with the same sha256 (preferring one whose recorded mode gives the same file mode), verified
    against its sha256 first, then hard-linked when it already has the mode and owner extraction
    would give it, else copied (see _materialise; link=False always copies).
    Returns a DeltaResult: (content digest, entries, files extracted, files reused) with .copied
    and .linked. Raises UnsafeArchiveError for an unsafe archive or manifest, BaseReleaseError
    when the base cannot supply a file.
    """
    dest = os.path.realpath(dest)
    base_dir = os.path.realpath(base_dir)
    extracted = []
    dir_modes = {}
    with open_archive(archive_path) as tar:
        first, manifest = _read_manifest_member(tar)
        by_path = dict((e.relpath, e) for e in manifest)
        for member in tar:  # iterating a TarFile starts over at its first member
            if member is first:
                continue
            got = _extract_member(tar, member, dest, dir_modes)
            want = by_path.get(got.relpath)
            if want is None or (want.kind, want.mode, want.payload) != (got.kind, got.mode, got.payload):
                raise UnsafeArchiveError("archive member %r does not match the archive's manifest" % got.relpath)
            extracted.append(got)
    done = set(e.relpath for e in extracted)
    base_files = {}
    base_by_mode = {}
    for e in base_manifest:
        if e.kind == KIND_FILE:
            base_files.setdefault(e.payload, e.relpath)
            base_by_mode.setdefault((e.payload, _safe_mode(KIND_FILE, e.mode)), e.relpath)
    # Directories are checked once each, not once per file (a realpath is an lstat per path
    # component): the base's parent directories must not be symlinks (the file itself is opened
    # O_NOFOLLOW), dest's must resolve inside dest. Nothing else writes below dest meanwhile.
    base_dirs_ok = set()
    dest_dirs_ok = set()
    jobs = []
    for e in manifest:
        if e.relpath in done:
            continue
        if e.kind != KIND_FILE:
            raise UnsafeArchiveError("%r of the manifest is missing from the delta archive" % e.relpath)
        src_rel = base_by_mode.get((e.payload, _safe_mode(KIND_FILE, e.mode))) or base_files.get(e.payload)
        if src_rel is None:
            raise BaseReleaseError("%r (sha256 %s) is neither in the archive nor in the base release"
                                   % (e.relpath, e.payload))
        src = os.path.join(base_dir, src_rel)
        src_parent = os.path.dirname(src)
        if src_parent not in base_dirs_ok:
            if os.path.realpath(src_parent) != src_parent:
                raise BaseReleaseError("base release file %s lies below a symlink" % src)
            base_dirs_ok.add(src_parent)
        parent = e.relpath.rpartition("/")[0]
        if parent in dest_dirs_ok:
            target = os.path.join(dest, e.relpath)
        else:
            target = _ensure_parent(dest, e.relpath, dir_modes)
            if not _within(os.path.realpath(os.path.dirname(target)), dest):
                raise UnsafeArchiveError("manifest entry %r resolves outside the destination" % e.relpath)
            dest_dirs_ok.add(parent)
        jobs.append((src, target, e))
    reused = []
    linked = 0
    if jobs:
        # no owner ever matches (-1, -1): link=False copies everything
        owner = extraction_owner(dest) if link else (-1, -1)
        # Files that look linkable (lstat: mode and owner fit; _materialise checks again on the
        # opened file) are done here, one after the other: a link costs ~0.02 ms and parallel
        # links into one directory only contend on its lock (measured slower with 16 threads).
        # The copies go to the pool, where their create + fsync latency overlaps.
        serial, pooled = [], []
        for job in jobs:
            (serial if _looks_linkable(job[0], job[2], owner) else pooled).append(job)
        for src, target, e in serial:
            entry, was_linked = _materialise(src, target, e, owner)
            reused.append(entry)
            linked += was_linked
        if pooled:
            with ThreadPoolExecutor(max_workers=max(1, min(workers, len(pooled)))) as pool:
                futures = [pool.submit(_materialise, src, target, e, owner) for src, target, e in pooled]
                errors = []
                for future in futures:
                    try:
                        entry, was_linked = future.result()
                    except (ReleaseError, OSError) as exc:
                        errors.append(exc)
                    else:
                        reused.append(entry)
                        linked += was_linked
            if errors:
                raise errors[0]
    entries = extracted + reused
    _finish(dest, entries, dir_modes)
    return DeltaResult(hash_entries(entries), entries, len([e for e in extracted if e.kind == KIND_FILE]),
                       len(reused) - linked, linked)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# pruning

def plan_prune(releases, current, last_good, keep, also=()):
    """Which releases to delete.

    releases: mapping id -> mtime (or iterable of (id, mtime) pairs). Keeps `keep` releases in
    all: `current`, `last_good` and ``also`` (the release current pointed at before - the one
    the trainer runs, and the one a refused pre-flight switches back to) always, then the newest
    others (mtime, ties broken by id) while room is left - so a run of failed releases never
    grows the directory past `keep` (or past those protected ones). Returns ids to delete,
    oldest first.
    """
    if keep < 0:
        raise ValueError("keep must be >= 0, got %r" % (keep,))
    pairs = list(releases.items()) if isinstance(releases, dict) else list(releases)
    newest_first = sorted(pairs, key=lambda p: (p[1], p[0]), reverse=True)
    protected = set(x for x in (current, last_good) + tuple(also or ()) if x)
    room = max(keep - len([p for p in newest_first if p[0] in protected]), 0)
    doomed = [pair[0] for pair in newest_first if pair[0] not in protected][room:]
    doomed.reverse()
    return doomed


def order_newest_first(releases):
    pairs = list(releases.items()) if isinstance(releases, dict) else list(releases)
    return [pair[0] for pair in sorted(pairs, key=lambda p: (p[1], p[0]), reverse=True)]


# ---------------------------------------------------------------------------------------------
# diff (--diff): which files a release adds, removes and modifies

def human_size(n):
    """Bytes as people read them: 512 B, 1.5 KiB, 12.0 MiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return "%d B" % n if unit == "B" else "%.1f %s" % (size, unit)
        size /= 1024.0
    return "%d B" % n  # not reached


def _what(entry):
    if entry.kind == KIND_SYMLINK:
        return "-> %s" % entry.payload
    if entry.kind == KIND_DIR:
        return "directory"
    return human_size(entry.size)


def manifest_changes(before, after):
    """What going from the entries ``before`` (None: no release) to ``after`` changes, sorted by
    path: (sign, relpath, words) with sign ``+`` (added), ``-`` (removed) or ``M`` (content, mode,
    kind or link target changed). Directories added or removed are not listed (their files are);
    a path that turns from or into a directory is."""
    old = dict((e.relpath, e) for e in (before or ()))
    new = dict((e.relpath, e) for e in (after or ()))
    out = []
    for relpath in sorted(set(old) | set(new), key=_sort_key):
        a, b = old.get(relpath), new.get(relpath)
        if a is None:
            if b.kind != KIND_DIR:
                out.append(("+", relpath, "(%s)" % _what(b)))
        elif b is None:
            if a.kind != KIND_DIR:
                out.append(("-", relpath, ""))
        elif a.kind != b.kind:
            out.append(("M", relpath, "(%s, was %s)" % (_what(b), _what(a) if a.kind != KIND_DIR else "a directory")))
        elif a.kind == KIND_FILE and a.payload != b.payload:
            words = "(%s → %s)" % (human_size(a.size), human_size(b.size))
            if a.mode != b.mode:
                words += " mode %04o → %04o" % (a.mode, b.mode)
            out.append(("M", relpath, words))
        elif a.kind == KIND_SYMLINK and a.payload != b.payload:
            out.append(("M", relpath, "(-> %s, was -> %s)" % (b.payload, a.payload)))
        elif a.kind != KIND_SYMLINK and a.mode != b.mode:
            out.append(("M", relpath, "(mode %04o → %04o)" % (a.mode, b.mode)))
    return out


def release_diff(before, after, before_id, after_id):
    """Ansible's diff (``prepared`` text) of a release switch: a header, then ``+ path (size)``,
    ``- path``, ``M path (old → new size)`` per changed file or symlink."""
    changes = manifest_changes(before, after)
    counts = dict((sign, sum(1 for c in changes if c[0] == sign)) for sign in "+-M")
    header = "release %s → %s: %d added, %d removed, %d modified" % (
        before_id or "(none)", after_id, counts["+"], counts["-"], counts["M"])
    if before_id and before is None:
        header += " (release %s records no manifest: every file listed as added)" % before_id
    lines = [header] + [("%s %s %s" % c).rstrip() for c in changes]
    return dict(prepared="\n".join(lines) + "\n")
