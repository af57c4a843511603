# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The trainer's log file: read THIS start's part of it, not what came before.

What opens, seeks and reads the log (and reads the clock): the launcher's sidecar
(``sidecar_path``, ``read_sidecar``), finding where this start begins in an open file
(``StartLocation``, ``scan_for_start``, ``locate_start``), reading it once (``read_start``, for
status) and following it across polls (``LogFileReader``, the proof's reader). What the lines
say is worked out by the pure ``proof.trainer_log`` (``StartLog``, ``ProgressAnalysis``: plain lines
and JSONL records, as the trainer's progress file is read).
"""

from __future__ import annotations

import codecs
import json
import os
from time import monotonic as _monotonic

from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import is_continuation, parse_marker

# --- reading this start from where it begins (the launcher's sidecar), not from byte 0 -------
#
# The launcher writes ``<log>.start`` (JSON: invocation, offset, dev, inode, ...) after each
# marker that begins this start's part of the current file: the start marker, or a continuation
# marker (``... continued=rotated|reopened|truncated|resumed <==``) when the file no longer holds
# the start marker. Readers seek there; when the sidecar is missing, names another invocation or
# does not match the file, they scan the file backwards for the marker instead.

SIDECAR_SUFFIX = ".start"
SCAN_BLOCK = 1 << 20
READ_CHUNK = 1 << 20
MAX_MARKER_LINE = 4096
LOG_REPLACED = "log was truncated or replaced since this start"


def sidecar_path(log_path):
    return log_path + SIDECAR_SUFFIX


def read_sidecar(log_path):
    """The launcher's record of where this start's marker is, or None (missing, unreadable,
    malformed)."""
    try:
        with open(sidecar_path(log_path), "rb") as f:
            record = json.loads(f.read(MAX_MARKER_LINE).decode("utf-8", "replace"))
    except (IOError, OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("invocation"), str):
        return None
    for key in ("offset", "inode"):
        if not isinstance(record.get(key), int) or isinstance(record.get(key), bool) or record[key] < 0:
            return None
    return record


class StartLocation(object):
    """Where this start's lines begin in an open log.

    offset: the byte to read from; source: ``sidecar`` (the launcher's record matched the
    marker there), ``scan`` (found scanning backwards) or ``end`` (no marker of ours in the file:
    offset is the start of its last, unfinished line, where a marker written later will be);
    problem: ``LOG_REPLACED ...`` when the sidecar names this invocation but the file holds no
    marker of it (truncated, replaced or rotated away without a continuation marker); size and
    inode: the file's, when located.
    """

    def __init__(self, offset, source, size, inode, problem=None):
        self.offset = offset
        self.source = source
        self.size = size
        self.inode = inode
        self.problem = problem

    def __repr__(self):
        return "StartLocation(offset=%d, source=%s, size=%d, problem=%r)" % (
            self.offset, self.source, self.size, self.problem)


def _our_marker(line, invocation_id):
    fields = parse_marker(line.decode("utf-8", "replace"))
    return fields if fields is not None and fields.get("invocation") == invocation_id else None


def scan_for_start(f, size, invocation_id, block=SCAN_BLOCK):
    """Scan ``f`` (binary) backwards from ``size``: (offset of this start's first line or None,
    offset just after the last newline). The first line is our last start marker, else (a file
    that holds only continuations: rotated, reopened) our earliest continuation marker."""
    needle = ("invocation=" + invocation_id).encode("utf-8", "replace")
    earliest_continuation = None
    aligned = None
    hi = size
    while hi > 0:
        lo = max(0, hi - block)
        rlo = max(0, lo - MAX_MARKER_LINE)
        rhi = min(size, hi + MAX_MARKER_LINE)
        f.seek(rlo)
        buf = f.read(rhi - rlo)
        if aligned is None:
            nl = buf.rfind(b"\n", 0, size - rlo)
            aligned = rlo + nl + 1 if nl >= 0 else (0 if rlo == 0 else size)
        end = min(len(buf), hi - rlo - 1 + len(needle))
        while True:
            idx = buf.rfind(needle, lo - rlo, end)
            if idx < 0:
                break
            end = idx + len(needle) - 1
            start = buf.rfind(b"\n", 0, idx) + 1
            stop = buf.find(b"\n", idx)
            if (start == 0 and rlo > 0) or stop < 0:
                continue  # a line longer than a marker, or not finished yet
            fields = _our_marker(buf[start:stop], invocation_id)
            if fields is None:
                continue
            if not is_continuation(fields):
                return rlo + start, aligned
            earliest_continuation = rlo + start
        hi = lo
    return earliest_continuation, (0 if aligned is None else aligned)


def locate_start(f, invocation_id, sidecar=None):
    """Where this start's lines begin in the open binary file ``f`` (a ``StartLocation``): at
    the sidecar's offset when it names this invocation, this inode and a marker of ours is
    there; else found by ``scan_for_start``."""
    st = os.fstat(f.fileno())
    ours = bool(sidecar) and sidecar.get("invocation") == invocation_id
    if ours and sidecar["inode"] == st.st_ino and sidecar.get("dev", st.st_dev) == st.st_dev \
            and sidecar["offset"] < st.st_size:
        f.seek(sidecar["offset"])
        line = f.readline(MAX_MARKER_LINE)
        if line.endswith(b"\n") and _our_marker(line, invocation_id) is not None:
            return StartLocation(sidecar["offset"], "sidecar", st.st_size, st.st_ino)
    offset, aligned = scan_for_start(f, st.st_size, invocation_id)
    if offset is not None:
        return StartLocation(offset, "scan", st.st_size, st.st_ino)
    problem = None
    if ours:
        problem = "%s (the launcher recorded its marker at byte %d; the file has no marker of this start)" % (
            LOG_REPLACED, sidecar["offset"])
    return StartLocation(aligned, "end", st.st_size, st.st_ino, problem)


def _feed(f, follower, limit=None):
    """Feed ``f`` from its position to its end (or ``limit`` bytes) to ``follower``; bytes read."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    n = 0
    while limit is None or n < limit:
        data = f.read(READ_CHUNK if limit is None else min(READ_CHUNK, limit - n))
        if not data:
            break
        n += len(data)
        follower.feed(decoder.decode(data))
    follower.feed(decoder.decode(b"", final=True))
    return n


def read_start(path, invocation_id, new_follower, tail_bytes=None):
    """Read this start's log from ``path`` without reading what came before it.

    ``new_follower()`` makes a ``StartLog`` for ``invocation_id``. With ``tail_bytes``, only the
    marker line and the last ``tail_bytes`` of this start are read (enough for the latest
    progress line); the window grows sixteenfold until it holds a progress line or the whole
    start. Answers (follower, StartLocation) with ``bytes_read`` set on the location.
    """
    sidecar = read_sidecar(path)
    with open(path, "rb") as f:
        loc = locate_start(f, invocation_id, sidecar)
        window = tail_bytes
        read = 0
        while True:
            follower = new_follower()
            f.seek(loc.offset)
            skip = window is not None and loc.size - loc.offset > window + MAX_MARKER_LINE
            if skip:
                first = f.readline(MAX_MARKER_LINE)
                follower.feed(first.decode("utf-8", "replace"))
                f.seek(loc.size - window)
                read += len(first) + len(f.readline(READ_CHUNK))  # the rest of a cut line
            read += _feed(f, follower)
            follower.finish()
            if not skip or follower.marker is None or follower.analysis.progress_line is not None:
                break
            window *= 16
    loc.bytes_read = read
    return follower, loc


class LogFileReader(object):
    """Follow this start's log in a file across polls (the proof's reader).

    The first poll seeks to this start's first line (``locate_start``); later polls read what
    was appended. A file that shrank or was replaced (new inode) is read again from its start
    and the follower told (``StartLog.truncated``): the launcher begins such a file with a
    continuation marker. ``problem(now, grace_s)`` says ``LOG_REPLACED ...`` when, for
    ``grace_s`` seconds, the file has held no marker of this start although it shrank, was
    replaced or vanished after we read it, or the sidecar named this start (``None`` otherwise).
    """

    def __init__(self, path, follower):
        self.path = path
        self.follower = follower
        self.offset = 0
        self.inode = None
        self.location = None
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._problem = None
        self._problem_since = None

    def poll(self, now=None):
        now = _monotonic() if now is None else now
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            if self.inode is not None:
                self._note(now, "%s (%s is gone)" % (LOG_REPLACED, self.path))
            return
        with f:
            st = os.fstat(f.fileno())
            if self.inode is None:
                self.location = locate_start(f, self.follower.invocation_id, read_sidecar(self.path))
                self.offset = self.location.offset
                if self.location.problem:
                    self._note(now, self.location.problem)
            elif st.st_ino != self.inode or st.st_size < self.offset:
                self.offset = 0
                self.decoder.reset()
                self.follower.truncated()
                self._note(now, "%s (%s shrank or is another file)" % (LOG_REPLACED, self.path))
            self.inode = st.st_ino
            f.seek(self.offset)
            while True:
                data = f.read(READ_CHUNK)
                if not data:
                    break
                self.offset += len(data)
                self.follower.feed(self.decoder.decode(data))
        if self.follower.marker is not None:
            self._problem = self._problem_since = None

    def _note(self, now, problem):
        if self.follower.marker is not None:
            return  # we were in this start: lines without a marker still belong to it
        self._problem = problem
        if self._problem_since is None:
            self._problem_since = now

    def problem(self, now, grace_s):
        if self._problem is None or now - self._problem_since < grace_s:
            return None
        return self._problem
