# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Immutable code releases: reading an archive (a file, or a fifo read once front to back) and
extracting it safely, full or delta.

Pure Python standard library, usable on the controller (action plugin) and on the target
(module, through AnsiballZ). Nothing here talks to Ansible.

A delta archive (release.archive.write_archive with have) starts with the manifest of the whole
new tree, then holds every directory and symlink but only the regular files whose content the
base release lacks; extract_delta materialises the rest from the base release's
files with the same sha256, each verified against it first: by a hard link when the base file
already is what extraction would create (same mode, owner and group, same filesystem), else by a
copy (the ``rsync --link-dest`` pattern; see _materialise for why that is sound and its limit).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import stat
import tarfile
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.dflash.trainer.plugins.module_utils.target.private_file import fsync_dir
from ansible_collections.dflash.trainer.plugins.module_utils.release.archive import (
    MANIFEST_MEMBER,
    MANIFEST_VERSION,
    parse_manifest,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import (
    KIND_DIR,
    KIND_FILE,
    KIND_SYMLINK,
    _CHUNK,
    BaseReleaseError,
    Entry,
    ReleaseError,
    UnsafeArchiveError,
    _link_stays_inside,
    check_relpath,
    hash_entries,
)

GZIP_MAGIC = b"\x1f\x8b"
MANIFEST_MAX_BYTES = 64 * 1024 * 1024
# files are linked or copied from the base release by a small thread pool: creating an inode
# costs ~0.5 ms on the lab's overlayfs, and that latency overlaps well (I/O and hashing drop the GIL)
COPY_WORKERS = 16


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
