"""One way to write the collection's private state files: the restart job's state, the deploy
lock's record and the release ledger (and ``fsync_dir``: a rename made durable).

Atomically (a temporary file renamed over the target: a reader sees the old or the new content,
never half of one), mode 0600, and never through a symlink: the temporary file's name is
predictable, so a leftover (a killed writer with the same pid) or a planted link is removed and
the file is created with O_EXCL | O_NOFOLLOW.
"""

from __future__ import annotations

import os


def write_private(tmp, text, sync=False):
    """Create ``tmp`` anew (a leftover or a planted link removed first; O_EXCL | O_NOFOLLOW, mode
    0600) holding ``text`` (str); ``sync``: fsync it (what must survive a power loss)."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())


def replace_private(path, text, tmp=None, sync=False):
    """Replace ``path`` with ``text`` (str). ``tmp``: the temporary file (default
    ``<path>.tmp-<pid>``); ``sync``: fsync before the rename (what must survive a power loss)."""
    tmp = tmp or "%s.tmp-%d" % (path, os.getpid())
    write_private(tmp, text, sync=sync)
    os.replace(tmp, path)


def fsync_dir(path):
    """fsync the directory ``path``: a rename or a new entry in it survives a power loss."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
