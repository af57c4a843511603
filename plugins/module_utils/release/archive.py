# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Immutable code releases: the deterministic archive (tar, plain or gzip), the manifest a
release records and a delta archive carries, and the sizes and counts a sender decides by.

Pure Python standard library, usable on the controller (action plugin) and on the target
(module, through AnsiballZ). Nothing here talks to Ansible.

Delta releases: a release records its manifest (every entry: relpath, kind, mode, size, sha256 or
link target). A delta archive starts with the manifest of the whole new tree (member
``.dflash-manifest.json``), then holds every directory and symlink but only the regular files
whose content the base release lacks; release.extract.extract_delta materialises the rest from
the base release's files with the same sha256.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import tarfile

from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import (
    KIND_DIR,
    KIND_FILE,
    KIND_SYMLINK,
    _CHUNK,
    Entry,
    ReleaseError,
    UnsafeArchiveError,
    _link_stays_inside,
    _sort_key,
    check_relpath,
    file_stat_key,
    hash_entries,
)

ARCHIVE_MTIME = 0
_TAR_BLOCK = 512
_TAR_RECORD = 20 * 512
# gzip level of small release archives (those that may travel inline); level 1 costs a fraction
# of level 6's CPU for a slightly bigger archive. Big ones travel as a plain tar (write_archive).
DEFAULT_COMPRESSLEVEL = 1
MANIFEST_MEMBER = ".dflash-manifest.json"
MANIFEST_VERSION = 1
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


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
