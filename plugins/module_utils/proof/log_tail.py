# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The last lines of one start's log, and the lines appended since an offset (``logs -n`` and
``logs -f``).

Reads from where the start begins (the launcher's sidecar ``<log>.start``, else a backward scan;
see ``proof.log_file.locate_start``), never from byte 0, and at most ``max_bytes`` per call: the
last lines come from a window at the end of the file. A follower passes back the ``offset`` and
``inode`` it was given; a log rotated meanwhile (another inode) is finished in ``<log>.1`` when that
is the file it was reading, then read from this start's continuation marker in the new file. Only
complete lines are returned; the offset stops after the last newline.
"""

from __future__ import annotations

import collections
import os

from ansible_collections.dflash.trainer.plugins.module_utils.proof.log_file import locate_start, read_sidecar
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import parse_marker

DEFAULT_MAX_BYTES = 1 << 20


class LogChunk(object):
    """What one read found: lines (this start's, in order), offset and inode to follow from,
    invocation and release of the start, ended (a later start began after it in the file),
    found (the file holds a marker of this start), problem (why nothing could be read)."""

    def __init__(self, invocation, lines=None, offset=0, inode=None, ended=False, found=False,
                 release=None, problem=None):
        self.invocation = invocation
        self.lines = lines or []
        self.offset = offset
        self.inode = inode
        self.ended = ended
        self.found = found
        self.release = release
        self.problem = problem

    def as_dict(self):
        return dict(invocation=self.invocation, release=self.release, lines=list(self.lines),
                    offset=self.offset, inode=self.inode, ended=self.ended, found=self.found,
                    problem=self.problem)


def split_lines(data, invocation_id):
    """(lines of this start, bytes consumed, ended) of ``data`` (bytes that begin at a line start).

    Only complete lines are taken; a marker of another invocation ends the start (it is not
    consumed, so a follower keeps seeing the end). Continuation markers of ours are kept: they
    say where the log went on (rotated, reopened, resumed)."""
    lines = []
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return lines, pos, False
        text = data[pos:nl].decode("utf-8", "replace").rstrip("\r")
        marker = parse_marker(text)
        if marker is not None and marker.get("invocation") != invocation_id:
            return lines, pos, True
        lines.append(text)
        pos = nl + 1


def _read_from(f, offset, invocation_id, max_bytes):
    f.seek(offset)
    data = f.read(max_bytes)
    lines, used, ended = split_lines(data, invocation_id)
    return lines, offset + used, ended


def _tail(f, body, size, invocation_id, n, max_bytes):
    """The last ``n`` lines of the start whose first line (after its marker) is at ``body``:
    from a window of ``max_bytes`` at the end; when that window holds a later start (this one
    ended before it) the start is read forward from its beginning instead."""
    if size - body > max_bytes:
        f.seek(size - max_bytes)
        data = f.read(max_bytes)
        cut = data.find(b"\n") + 1  # the window begins inside a line
        lines, used, ended = split_lines(data[cut:], invocation_id)
        if not ended:
            return lines[-n:] if n > 0 else [], size - max_bytes + cut + used, False
    kept = collections.deque(maxlen=max(n, 0))
    offset = body
    while True:
        lines, offset_after, ended = _read_from(f, offset, invocation_id, max_bytes)
        kept.extend(lines)
        if ended or offset_after == offset or offset_after >= size:
            return list(kept), offset_after, ended
        offset = offset_after


def read_log_lines(path, invocation_id, lines=20, offset=None, inode=None, max_bytes=DEFAULT_MAX_BYTES):
    """A ``LogChunk`` of this start's log at ``path``.

    Without ``offset``: its last ``lines`` lines (the marker excluded). With ``offset`` and
    ``inode`` (from an earlier chunk): the complete lines appended since, at most ``max_bytes``."""
    chunk = LogChunk(invocation_id, offset=offset or 0, inode=inode)
    if offset is not None and inode is not None:
        old = _rotated_copy(path, inode)
        if old is not None:  # the file we followed became <log>.1: finish it first
            with old:
                st = os.fstat(old.fileno())
                if offset <= st.st_size:
                    got, _end, ended = _read_from(old, offset, invocation_id, max_bytes)
                    chunk.lines.extend(got)
                    chunk.found = True
                    if ended:
                        chunk.ended = True
                        return chunk
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        chunk.problem = "no log at %s" % path
        return chunk
    with f:
        st = os.fstat(f.fileno())
        following = offset is not None and inode == st.st_ino and offset <= st.st_size
        if following:
            got, chunk.offset, chunk.ended = _read_from(f, offset, invocation_id, max_bytes)
            chunk.lines.extend(got)
            chunk.inode, chunk.found = st.st_ino, True
            return chunk
        loc = locate_start(f, invocation_id, read_sidecar(path))
        chunk.inode = st.st_ino
        if loc.source == "end":
            chunk.offset = loc.offset
            chunk.problem = loc.problem or "no start of invocation %s in %s" % (invocation_id, path)
            return chunk
        f.seek(loc.offset)
        marker = parse_marker(f.readline().decode("utf-8", "replace")) or {}
        chunk.release, chunk.found = marker.get("release"), True
        if offset is None:
            got, chunk.offset, chunk.ended = _tail(f, f.tell(), st.st_size, invocation_id, lines, max_bytes)
        else:  # rotated, replaced or truncated since the last read: this start goes on from its marker
            got, chunk.offset, chunk.ended = _read_from(f, loc.offset, invocation_id, max_bytes)
        chunk.lines.extend(got)
        return chunk


def _rotated_copy(path, inode):
    """``<path>.1`` opened, when it is the file with ``inode`` (the one being followed), else None."""
    try:
        f = open(path + ".1", "rb")
    except OSError:
        return None
    if os.fstat(f.fileno()).st_ino != inode:
        f.close()
        return None
    return f


def default_invocation(unit_invocation, path):
    """The start whose log is meant when none is named: the unit's current invocation, else the
    last one the launcher recorded (a stopped unit has no InvocationID)."""
    if unit_invocation:
        return unit_invocation
    sidecar = read_sidecar(path)
    return sidecar["invocation"] if sidecar else None
