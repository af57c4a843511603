# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The release ledger's file (``<trainer_root>/ledger.json``): its one owner - the reader, the writer
and the lock of its read-modify-write. What an entry holds and what is judged from the entries is
``proof.throughput``'s (pure); the launcher keeps its own copy of these functions (it runs without the
collection).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os

from ansible_collections.dflash.trainer.plugins.module_utils.target.private_file import replace_private

LEDGER_NAME = "ledger.json"
LEDGER_KEEP = 50


def ledger_path(root):
    """The ledger of the release root ``root``."""
    return os.path.join(root, LEDGER_NAME)


def read_ledger(path):
    """The ledger's entries (oldest first); [] when absent or unreadable."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (IOError, OSError, ValueError):
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


@contextlib.contextmanager
def ledger_lock(path):
    """Hold ``<path>.lock`` (flock) for one read-modify-write of the ledger. The ledger has two
    writers - the restart job (a verdict) and the launcher (a death after the proof, the launcher's
    copy of this function) - and neither may lose the other's entry. The lock file is created 0600,
    never through a symlink."""
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def write_ledger(path, entries):
    """Atomically, fsynced, mode 0600, never through a symlink."""
    replace_private(path, json.dumps({"version": 1, "entries": entries}, sort_keys=True, indent=1), sync=True)


def append_ledger(path, new_entries, keep=LEDGER_KEEP):
    """Append and keep the last ``keep`` entries, under the ledger's lock."""
    with ledger_lock(path):
        entries = (read_ledger(path) + list(new_entries))[-keep:]
        write_ledger(path, entries)
    return entries
