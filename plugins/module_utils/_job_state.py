# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restart job's state file (``trainer_job_state_path``, restart.json): its one owner.

The restart job (``_restart_steps``) writes its phase and, at the end, its outcome here; every
reader - the job's own watch (``trainer_restart``), the status read and the lock's wait for an
earlier play's job (``trainer_status``) - reads it through these functions. Small on purpose, with
no import of the cycle: the status read ships this, not the restart's machinery.
"""

from __future__ import annotations

import json
import os

from ansible_collections.dflash.trainer.plugins.module_utils._private_file import replace_private

STATE_VERSION = 1


def read_state(path):
    """The job state file as a dict, or None (absent, unreadable, or a symlink: never followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as fh:
            data = json.load(fh)
    except (IOError, OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_state(path, data):
    """Atomically (tmp + rename): a reader sees the old or the new state, never half of one.
    Mode 0600 in a directory only root can write (0700 when made here); the temporary file is
    created exclusively and never through a symlink."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o700)
    replace_private(path, json.dumps(data, sort_keys=True, default=str))


def pid_start(pid):
    """The process's start time in clock ticks (to tell a reused pid), or None."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (IOError, OSError, IndexError):
        return None


def job_alive(state, pid_alive=None):
    """Whether the job that wrote ``state`` still runs (its pid lives and is still the job)."""
    if not state or state.get("done"):
        return False
    pid = state.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if pid_alive is not None:
        return pid_alive(pid)
    start_ticks = pid_start(pid)
    if start_ticks is None:
        return False
    return str(state.get("pid_start", start_ticks)) == start_ticks


def observe_job(state_path, alive=job_alive):
    """One look at the restart job for a waiter: (its state or None, whether it still runs)."""
    state = read_state(state_path)
    return state, alive(state)


def outcome_words(state):
    """One line for a job's state: what it did, or what it was doing."""
    if not state:
        return "no restart job on record"
    job = "restart job %s (%s, started %s)" % (state.get("job_id", "?"), state.get("owner", "?"),
                                               state.get("started_at", "?"))
    if not state.get("done"):
        if job_alive(state):
            return "%s is in phase %s" % (job, state.get("phase", "?"))
        return ("%s was interrupted in phase %s: its process is gone (a reboot, a kill or the OOM killer)"
                % (job, state.get("phase", "?")))
    result = state.get("result") or {}
    return "%s ended: %s" % (job, result.get("outcome") or result.get("msg") or "?")
