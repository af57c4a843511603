# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restart job's state file (``trainer_job_state_path``, restart.json): its one owner.

The restart job (``job.steps``) writes its phase and, at the end, its outcome here; every
reader - the job's own watch (``trainer_restart``), the status read and the lock's wait for an
earlier play's job (``trainer_plan``) - reads it through these functions, and every judge of
whether a job ended asks ``job_end``. Small on purpose, with
no import of the cycle: the status read ships this, not the restart's machinery.
"""

from __future__ import annotations

import json
import os

from ansible_collections.dflash.trainer.plugins.module_utils.target.private_file import replace_private


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
    """(The job's state or None, whether it runs): its process looked at before the state judged is read (a job
    that records its outcome and exits in between is never taken for one that died without an outcome)."""
    earlier = read_state(state_path)
    running, state = alive(earlier), read_state(state_path)
    return state, running if (state or {}).get("job_id") == (earlier or {}).get("job_id") else alive(state)


# what one look at the state file says of a job (``job_end``); None: it still runs
ENDED = "ended"                  # done: its outcome is on record
DIED = "died"                    # not done, and its process is gone (a reboot, a kill, the OOM killer)
NOT_ON_RECORD = "not on record"  # no state file, or it holds another job's state
_ON_RECORD = object()  # job_end's job_id when any job on record is meant


def job_end(state, alive, job_id=_ON_RECORD):
    """The one judge of whether a restart job ended, from one look at the state file: ``state`` (its
    content, or None) and ``alive`` (``job_alive(state)``: whether its process still runs) -> ENDED,
    DIED, NOT_ON_RECORD (no state, or ``job_id`` given and the file holds another job's state), or
    None while it runs. Without ``job_id``: whichever job is on record."""
    if state is None or (job_id is not _ON_RECORD and state.get("job_id") != job_id):
        return NOT_ON_RECORD
    if state.get("done"):
        return ENDED
    return None if alive else DIED


def outcome_words(state):
    """One line for a job's state: what it did, or what it was doing."""
    if not state:
        return "no restart job on record"
    job = "restart job %s (%s, started %s)" % (state.get("job_id", "?"), state.get("owner", "?"),
                                               state.get("started_at", "?"))
    end = job_end(state, job_alive(state))
    if end is None:
        return "%s is in phase %s" % (job, state.get("phase", "?"))
    if end == DIED:
        return ("%s was interrupted in phase %s: its process is gone (a reboot, a kill or the OOM killer)"
                % (job, state.get("phase", "?")))
    result = state.get("result") or {}
    return "%s ended: %s" % (job, result.get("outcome") or result.get("msg") or "?")
