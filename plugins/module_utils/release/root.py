# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The release layout on the target: releases/<id>, the ``current`` symlink, ``last_good``.

Reading and switching it, shared by trainer_release (upload, rollback, mark good), the restart
job (trainer_restart), which switches ``current`` back and marks releases good on the target
without the controller, and the status read (``read_release_marks``). The one reader and writer of
``current`` and ``last_good``; small on purpose (what a release's manifest holds is
``release.install``'s), so that the status read ships it.
"""
from __future__ import annotations

import errno
import os
import re
import shutil

from ansible_collections.dflash.trainer.plugins.module_utils.target.marks import MARKER_NAME, ROOT_MARK, ROOT_MARK_NAME
from ansible_collections.dflash.trainer.plugins.module_utils.target.private_file import fsync_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TMP_PREFIX = ".tmp-"
# the release pointers in the root: the symlink to the release that starts, the last proved release's id
CURRENT = "current"
LAST_GOOD = "last_good"


class ReleaseModuleError(Exception):
    def __init__(self, msg, **result):
        super(ReleaseModuleError, self).__init__(msg)
        self.msg = msg
        self.result = result


# ---------------------------------------------------------------------------------------------
# reading the layout

def releases_dir(root):
    return os.path.join(root, "releases")


def release_path(root, rid):
    return os.path.join(releases_dir(root), rid)


def current_path(root):
    return os.path.join(root, CURRENT)


def last_good_path(root):
    return os.path.join(root, LAST_GOOD)


def valid_id(rid):
    """Whether ``rid`` can name a release (``validate_id`` without the error)."""
    return bool(rid and _ID_RE.match(rid))


def validate_id(rid, what="release"):
    if not rid or not _ID_RE.match(rid):
        raise ReleaseModuleError("invalid %s id %r: expected letters, digits, '.', '_' or '-', "
                                 "not starting with '.'" % (what, rid))
    return rid


def is_complete(root, rid):
    """A complete release: a real directory releases/<id> holding the marker file."""
    path = release_path(root, rid)
    return (os.path.isdir(path) and not os.path.islink(path)
            and os.path.isfile(os.path.join(path, MARKER_NAME)))


def list_releases(root):
    """Complete releases: id -> marker mtime. Partial, temporary and foreign entries are ignored."""
    out = {}
    try:
        names = os.listdir(releases_dir(root))
    except OSError as e:
        if e.errno == errno.ENOENT:
            return out
        raise
    for name in names:
        if name.startswith(".") or not _ID_RE.match(name):
            continue
        if is_complete(root, name):
            out[name] = os.stat(os.path.join(release_path(root, name), MARKER_NAME)).st_mtime
    return out


def read_current(root):
    """Id that root/current points at, or None. Fails on a `current` that is not our symlink."""
    path = current_path(root)
    if not os.path.lexists(path):
        return None
    if not os.path.islink(path):
        raise ReleaseModuleError("%s exists and is not a symlink; refusing to manage it" % path)
    target = os.readlink(path)
    if not os.path.isabs(target):
        target = os.path.join(root, target)
    target = os.path.normpath(target)
    if os.path.dirname(target) != os.path.normpath(releases_dir(root)):
        raise ReleaseModuleError("%s points at %s, which is not a release under %s"
                                 % (path, os.readlink(path), releases_dir(root)))
    return os.path.basename(target)


def read_last_good(root):
    path = last_good_path(root)
    try:
        with open(path) as f:
            value = f.read().strip()
    except OSError as e:
        if e.errno == errno.ENOENT:
            return None
        raise
    return value or None


def stale_entries(root):
    """Leftovers of interrupted runs, as paths relative to root."""
    out = []
    rdir = releases_dir(root)
    if os.path.isdir(rdir):
        out.extend("releases/" + n for n in sorted(os.listdir(rdir)) if n.startswith(TMP_PREFIX))
    if os.path.isdir(root):
        out.extend(n for n in sorted(os.listdir(root))
                   if n.startswith(CURRENT + ".tmp-") or n.startswith(LAST_GOOD + ".tmp-"))
    return out


def read_release_marks(root):
    """(target of ``<root>/current`` or None when it is no symlink, text of ``<root>/last_good``
    or None when it is no file) - read as they are, never refused (the status read reports what
    is there; ``plan.status.release_fields`` judges it)."""
    current = current_path(root)
    link = os.readlink(current) if os.path.islink(current) else None
    last_good = last_good_path(root)
    text = None
    if os.path.isfile(last_good):
        with open(last_good) as f:
            text = f.read()
    return link, text


# ---------------------------------------------------------------------------------------------
# writing

def _rand():
    return os.urandom(4).hex()


def remove_path(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def switch_current(root, rid):
    """current -> releases/<rid>, atomically: a new relative symlink renamed over the old one."""
    tmp = os.path.join(root, CURRENT + ".tmp-" + _rand())
    os.symlink(os.path.join("releases", rid), tmp)
    try:
        os.replace(tmp, current_path(root))
    except OSError:
        os.unlink(tmp)
        raise
    fsync_dir(root)


def write_last_good(root, rid):
    tmp = os.path.join(root, LAST_GOOD + ".tmp-" + _rand())
    with open(tmp, "w") as f:
        f.write(rid + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, last_good_path(root))
    fsync_dir(root)


def delete_release(root, rid):
    """Rename out of the releases namespace first, so a half-deleted release never looks complete."""
    aside = os.path.join(releases_dir(root), "%sdelete-%s-%s" % (TMP_PREFIX, rid, _rand()))
    os.rename(release_path(root, rid), aside)
    shutil.rmtree(aside)


def mark_root(root):
    """Put the root's marker file (``target.marks.ROOT_MARK_NAME``) there when it is missing, so the
    next run's check knows the root for ours (a root without it is refused unless it is empty or
    everything in it is ours). True when it was written."""
    path = os.path.join(root, ROOT_MARK_NAME)
    if os.path.lexists(path):
        return False
    tmp = "%s.tmp-%s" % (path, _rand())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(ROOT_MARK + "\n")
    os.replace(tmp, path)
    return True


class _Lock(object):
    """The root's flock (``.lock``); taking it also marks the root as ours (``mark_root``)."""

    def __init__(self, root):
        self.root = root
        self.path = os.path.join(root, ".lock")
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        mark_root(self.root)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        return False
