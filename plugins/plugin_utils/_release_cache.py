# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's cache of file hashes for release scans (used by the trainer_release action).

A release id is a sha256 over the contents of every file of the tree, so a deploy of a tree with a
1 GiB checkpoint would read and hash that GiB on every run, no-op or not. The cache keeps each
file's sha256 under its absolute path together with what its inode said when it was hashed:
size, mtime_ns, ctime_ns, inode number and device. A file is hashed again when any of them
differs: a rewrite of the same size in place changes mtime and ctime, a replacement by rename
changes the inode, and ctime cannot be set back by touch/utime (it is the kernel's clock at the
last change of data or metadata).

Racily clean files (git's word): the kernel stamps mtime/ctime from a coarse clock (a jiffy, or
a second on some filesystems), so a file written again within the same tick as the hash keeps the
same key. A hash is therefore stored only for a file whose mtime and ctime are at least
RACY_NS older than the moment its hashing began; younger files are hashed again next time (and
cached then, once old enough). The target checks the content of every file it receives against
the release id anyway: a stale cache entry could never install wrong content, only fail a deploy.

One cache file per source tree (the sha256 of its absolute path names it) under
$XDG_CACHE_HOME/dflash-trainer/release-hashes (~/.cache/... by default), holding exactly the files
of that tree's last scan; written atomically (temp file + rename), so concurrent forks deploying
the same tree only overwrite each other with valid entries. A cache that cannot be read or written
is ignored: the scan hashes as if there were none. Cache files not used for PRUNE_AFTER_S (the
temporary trees of tests, a checkout moved away) are removed by the next save that writes.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time

from ansible.errors import AnsibleError

from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import file_sha256, scan_tree

CACHE_VERSION = 1
RACY_NS = 3 * 10 ** 9
# cache files of trees not deployed for this long are removed (by a save that writes); a deploy
# that only reads its cache refreshes the file's mtime once a day
PRUNE_AFTER_S = 30 * 86400
TOUCH_AFTER_S = 86400
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def default_cache_dir(environ=None):
    """$XDG_CACHE_HOME/dflash-trainer/release-hashes, else ~/.cache/dflash-trainer/release-hashes."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dflash-trainer", "release-hashes")


def cache_path(src, cache_dir=None):
    """The cache file of the tree at src (absolute path)."""
    name = hashlib.sha256(os.fsencode(os.path.abspath(src))).hexdigest()[:32] + ".json"
    return os.path.join(cache_dir or default_cache_dir(), name)


def stat_key(st):
    """What a cached hash is valid for: [size, mtime_ns, ctime_ns, inode, device]."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


class HashCache(object):
    """sha256 of files by absolute path, valid while stat_key says the file is unchanged.

    ``hasher`` is what scan_tree takes. ``hashed`` / ``hashed_bytes`` count the files read in
    this run, ``hits`` those answered from the cache; ``error`` the last reason the cache file
    could not be read or written (None when it could)."""

    def __init__(self, path, now_ns=None, racy_ns=RACY_NS, hash_file=file_sha256):
        self.path = path
        self._now_ns = now_ns or time.time_ns
        self._racy_ns = racy_ns
        self._hash_file = hash_file
        self._old = {}
        self._new = {}
        self.hits = 0
        self.hashed = 0
        self.hashed_bytes = 0
        self.error = None

    @classmethod
    def for_tree(cls, src, cache_dir=None, **kwargs):
        cache = cls(cache_path(src, cache_dir), **kwargs)
        cache.load()
        return cache

    def load(self):
        """Read the cache file; a missing, unreadable or foreign one counts as empty."""
        self._old = {}
        try:
            with open(self.path, "rb") as fh:
                doc = json.loads(fh.read().decode("utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            self.error = "cannot read %s: %s" % (self.path, e)
            return
        files = doc.get("files") if isinstance(doc, dict) and doc.get("version") == CACHE_VERSION else None
        if not isinstance(files, dict):
            self.error = "%s is not a version %d hash cache; ignored" % (self.path, CACHE_VERSION)
            return
        for path, rec in files.items():
            if (isinstance(rec, list) and len(rec) == 6 and isinstance(rec[5], str) and _SHA256_RE.match(rec[5])
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in rec[:5])):
                self._old[path] = rec

    def lookup(self, path, st):
        """The cached sha256 of path if stat_key(st) is what it was hashed with, else None."""
        rec = self._old.get(os.path.abspath(path))
        if rec is not None and rec[:5] == stat_key(st):
            return rec[5]
        return None

    def hasher(self, path, st):
        """sha256 hex of the file at path, whose lstat is st: from the cache when its key matches,
        else read (and remembered when the file is old enough, see RACY_NS)."""
        path = os.path.abspath(path)
        key = stat_key(st)
        cached = self.lookup(path, st)
        if cached is not None:
            self.hits += 1
            self._new[path] = key + [cached]
            return cached
        started = self._now_ns()
        digest = self._hash_file(path)
        self.hashed += 1
        self.hashed_bytes += st.st_size
        try:
            after = stat_key(os.lstat(path))
        except OSError:
            after = None
        # cache only what did not change while it was read and is older than the clock's tick
        if after == key and max(st.st_mtime_ns, st.st_ctime_ns) <= started - self._racy_ns:
            self._new[path] = key + [digest]
        return digest

    def save(self):
        """Write this run's entries (only the files scanned now) atomically; nothing when they
        are what the file already holds. Returns True when the file was written."""
        if self._new == self._old:
            self._touch()
            return False
        directory = os.path.dirname(self.path)
        tmp = None
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".hashes-", suffix=".tmp", dir=directory)
            with os.fdopen(fd, "w") as fh:
                json.dump({"version": CACHE_VERSION, "files": self._new}, fh, sort_keys=True, separators=(",", ":"))
            os.replace(tmp, self.path)
            tmp = None
        except OSError as e:
            self.error = "cannot write %s: %s" % (self.path, e)
            return False
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        self._old = dict(self._new)
        self._prune(directory)
        return True

    def _now_s(self):
        return self._now_ns() / 1e9

    def _touch(self):
        """Keep an unchanged cache file from looking unused (see PRUNE_AFTER_S)."""
        try:
            if self._now_s() - os.stat(self.path).st_mtime > TOUCH_AFTER_S:
                os.utime(self.path)
        except OSError:
            pass

    def _prune(self, directory):
        """Remove the cache files of other trees not used for PRUNE_AFTER_S."""
        limit = self._now_s() - PRUNE_AFTER_S
        try:
            names = os.listdir(directory)
        except OSError:
            return
        for name in names:
            path = os.path.join(directory, name)
            if not name.endswith(".json") or path == self.path:
                continue
            try:
                if os.lstat(path).st_mtime < limit:
                    os.unlink(path)
            except OSError:
                pass


def resolve_src(src, find_needle):
    """The absolute directory a release is built from: SRC (text; ~ expanded), or, relative, found by FIND_NEEDLE
    (an action's ``_find_needle``: the role's files/, the playbook directory) -> its path; AnsibleError when it is
    not a directory on the controller."""
    src = os.path.expanduser(src)
    if os.path.isabs(src):
        path = src
    else:
        try:
            path = find_needle("files", src)
        except AnsibleError:  # Ansible's "could not find", in our words
            raise AnsibleError("src %s does not exist on the controller (searched the role's files/ and the playbook "
                               "directory)" % src) from None
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise AnsibleError("src %s does not exist on the controller" % path)
    if not os.path.isdir(path):
        raise AnsibleError("src %s is not a directory; a release is built from a directory" % path)
    return path


def scan_cached(path, excludes):
    """scan_tree of the directory PATH (absolute) with the controller's hash cache, the cache saved after -> (the
    scan, the cache: its counts and error). ReleaseError or OSError when the tree cannot be a release. The one scan
    of a release source: trainer_release's action, the release_id lookup and the run's input check use it."""
    cache = HashCache.for_tree(path)
    scan = scan_tree(path, excludes, hasher=cache.hasher)
    cache.save()
    return scan, cache
