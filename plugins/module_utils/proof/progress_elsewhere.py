# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the trainer writes its progress when this start's log shows none: the files its processes
hold open for writing (``/proc/<pid>/fd`` of the unit's control group) that grow and whose last
lines look like progress (``proof.trainer_log.looks_like_progress``, or a JSONL record with a "step").

A trainer that logs through a ``logging.FileHandler`` or writes a metrics JSONL file prints next to
nothing on stdout: the proof cannot read its progress, and without this it would wait for its whole
ready timeout before saying "no line matching ...". The restart job's proof looks here after
``LOOK_AFTER_S`` of a log without progress and names the file and the setting that reads it
(``trainer_progress_path``); the Judge fails at ``FAIL_AFTER_S`` saying so, never later.

Only a file the safe judge of progress files accepts counts (``proof.progress_file.trust_problem``: a
regular file root owns and only root may write, in a directory only root may write): another
user's file is never named as the trainer's progress. The files are only read (their last
``TAIL_BYTES``), never written. ``scan`` takes the file system functions it uses, for tests.
"""

from __future__ import annotations

import os
import stat

from ansible_collections.dflash.trainer.plugins.module_utils.plan.fix import extra_vars, fix_line
from ansible_collections.dflash.trainer.plugins.module_utils.proof.progress_file import trust_problem
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import json_record, looks_like_progress

LOOK_AFTER_S = 10.0    # a log without progress this long after the start: look where the trainer writes
LOOK_EVERY_S = 5.0     # then look again this often
FAIL_AFTER_S = 90.0    # a file found and still nothing in the log: the verdict, naming it (within 120 s)
TAIL_BYTES = 16384
MAX_FDS = 4096         # per process: a bounded look
_NOT_FILES = ("/dev/", "/proc/", "/sys/", "/run/systemd/")


def writes(flags_text):
    """Whether /proc/<pid>/fdinfo/<fd>'s text says the descriptor is open for writing (O_WRONLY or
    O_RDWR in its octal ``flags:``)."""
    for line in (flags_text or "").splitlines():
        if line.startswith("flags:"):
            try:
                return int(line.split(":", 1)[1].strip(), 8) & 3 in (1, 2)
            except ValueError:
                return False
    return False


def written_files(pids, listdir=os.listdir, readlink=os.readlink, read=None):
    """The absolute paths the processes ``pids`` hold open for writing (devices, /proc, /sys, pipes,
    sockets and deleted files left out)."""
    read = read or _read_text
    found = set()
    for pid in sorted(pids):
        base = "/proc/%d" % int(pid)
        try:
            fds = listdir(base + "/fd")[:MAX_FDS]
        except OSError:
            continue
        for fd in fds:
            try:
                target = readlink("%s/fd/%s" % (base, fd))
            except OSError:
                continue
            if not target.startswith("/") or target.endswith(" (deleted)") or target.startswith(_NOT_FILES):
                continue
            if writes(read("%s/fdinfo/%s" % (base, fd))):
                found.add(target)
    return found


def _read_text(path):
    try:
        with open(path) as fh:
            return fh.read(4096)
    except (IOError, OSError):
        return ""


def cgroup_pids(control_group, read=None):
    """The pids of the unit's control group (systemctl show's ``ControlGroup``), read from the cgroup
    file system (v2, else the v1 hierarchies); an empty set when none can be read."""
    read = read or _read_text
    if not control_group:
        return set()
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"):
        text = read(os.path.join(base, control_group.lstrip("/"), "cgroup.procs"))
        pids = set(int(x) for x in text.split() if x.isdigit())
        if pids:
            return pids
    return set()


def progress_line(text):
    """The last line of ``text`` (a file's tail) that reads as progress, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and (json_record(line) is not None or looks_like_progress(line)):
            return line[:300]
    return None


class Finder(object):
    """Files of the trainer that show progress. ``exclude``: the paths the proof already reads (the
    log, its rotations and start record). ``found``: (path, its progress line) once a file grew
    between two looks and its tail reads as progress; None until then."""

    def __init__(self, exclude=()):
        self.exclude = set(os.path.realpath(p) for p in exclude if p)
        self.sizes = {}
        self.found = None

    def look(self, pids, listdir=os.listdir, readlink=os.readlink, read=None, stat_path=os.stat, tail=None):
        """One look at what ``pids`` write -> ``found``."""
        tail = tail or _tail
        for path in sorted(written_files(pids, listdir=listdir, readlink=readlink, read=read)):
            if os.path.realpath(path) in self.exclude or any(path.startswith(p + ".") for p in self.exclude):
                continue
            try:
                st = stat_path(path)
                parent = stat_path(os.path.dirname(path) or "/")
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or trust_problem(path, st, parent) is not None:
                continue
            before, self.sizes[path] = self.sizes.get(path), st.st_size
            if before is None or st.st_size <= before:
                continue
            line = progress_line(tail(path))
            if line is not None:
                self.found = (path, line)
                return self.found
        return self.found


def _tail(path):
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            return fh.read(TAIL_BYTES).decode("utf-8", "replace")
    except (IOError, OSError):
        return ""


def elsewhere_words(found):
    """The words that name where the progress is and the setting that reads it."""
    path, line = found
    return ("the trainer writes its progress to %s, not to this start's log (its last line there: %r): prove "
            "from it with:%s" % (path, line, fix_line(extra_vars(("trainer_progress_path", path)))))


def log_shows_progress(log):
    """Whether this start's log (a ProgressAnalysis, or None before the marker) shows anything of progress:
    a step value or a line that looks like progress."""
    if log is None or getattr(log, "marker", None) is None:
        return False
    return getattr(log, "max_step", None) is not None or getattr(log, "progress_like_line", None) is not None
