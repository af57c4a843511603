# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The trainer's own progress file (``trainer_progress_path``): read THIS start's part of it.

A trainer that writes its progress to a file of its own (a ``logging.FileHandler``, a JSONL file
of ``{"step": ..., "tok_s": ...}`` records) is proved from that file. The collection only ever
READS it: it is opened read-only, never written, truncated, rotated or deleted.

This start's part: right before the unit is started (in the restart job, on the target)
``progress_start`` records where the file ends - its device, inode, size and a fingerprint of its
last bytes. ``ProgressFileReader`` reads from there; a file that is another one by then (a new
inode: the trainer recreated it), shrank below that offset, or whose bytes before the offset
changed (truncated and written again) is read from its first byte. The reader keeps the file open
between polls, so a file the trainer renames away (its own rotation) is read to its end before
the new one is read from 0.

Its lines are read as the trainer's log is read, by the one reader of both
(``proof.trainer_log.ProgressAnalysis``): a line is a JSONL record when it parses as a JSON object with
a ``"step"`` key (``step``, and ``tok_s`` when present, are taken from it; a record with a readable
``tok_s`` is a throughput line); any other line goes through the usual regexes
(``proof.trainer_log.LogAnalysis``). What this module adds is where this start's part of the file
begins, whose file it is, and the Judge's view that joins it to the launcher's log.

The start marker is not in this file: the launcher writes it to its own log. ``ProgressView``
joins the two for the Judge: the marker (this start's identity), the exit reason and the tail
come from the launcher's log (``StartLog``), progress from the progress file, errors from both.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import stat

from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import idmap_words, way_problem
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import LINE_END, is_reason_line

FINGERPRINT_BYTES = 4096
READ_CHUNK = 1 << 20


# --- whose file it is ---------------------------------------------------------------------------

def trust_problem(path, st, parent_st=None):
    """Why the progress file (``st``: its fstat; ``parent_st``: its directory's stat) cannot prove
    progress, or None. The unit runs the trainer as root, so its own file is root's: a file another
    user owns or may write - or one in a directory another user may write, where it can be swapped -
    would let that user claim steps and tok/s for a trainer that makes none."""
    if not stat.S_ISREG(st.st_mode):
        return "the progress file %s is not a regular file" % path
    if st.st_uid != 0:
        return idmap_words("the progress file %s is owned by uid %d: only a file root owns can prove progress (the "
                           "unit runs the trainer as root)" % (path, st.st_uid))
    if st.st_mode & 0o022:
        return ("the progress file %s (mode %04o) may be written by other users than root: they could claim "
                "progress for the trainer" % (path, stat.S_IMODE(st.st_mode)))
    if parent_st is not None and (parent_st.st_uid != 0 or parent_st.st_mode & 0o022):
        return ("the progress file %s is in %s (uid %d, mode %04o), which other users than root may write: the "
                "file could be swapped; keep it in a directory only root can write" % (
                    path, os.path.dirname(path) or ".", parent_st.st_uid, stat.S_IMODE(parent_st.st_mode)))
    # the way to it as written, not only its resolved directory: a link or directory of another user's
    # on the way lets that user send the proof to a file of their choice later
    why = way_problem(path) if os.path.isabs(path) else None
    if why:
        return ("the progress file %s %s: the file could be swapped; every directory and link on the way to it "
                "must be root's, writable by root alone" % (path, why))
    return None


# --- where this start begins -----------------------------------------------------------------

def _fingerprint(data):
    return hashlib.sha256(data).hexdigest()


def progress_start(path, block=FINGERPRINT_BYTES):
    """Where the progress file ends now (call it right before the unit starts, while the trainer
    is stopped): {exists, dev, inode, size, tail_len, tail_sha256} ({exists: False} when there is
    no file yet; {exists: True, regular: False} for something that is not a regular file).
    Opened read-only and never written."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return {"exists": False}
    except OSError as exc:
        return {"exists": False, "error": "%s" % (exc.strerror or exc)}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return {"exists": True, "regular": False}
        n = min(block, st.st_size)
        data = os.pread(fd, n, st.st_size - n) if n else b""
        return {"exists": True, "regular": True, "dev": st.st_dev, "inode": st.st_ino, "size": st.st_size,
                "tail_len": len(data), "tail_sha256": _fingerprint(data)}
    finally:
        os.close(fd)


class ProgressFileReader(object):
    """Follow THIS start's part of the progress file across polls (read-only).

    ``start``: ``progress_start``'s record (None: read the whole file); ``trust``: judges whose
    file it is (``trust_problem``; a file it refuses is not read). ``poll()`` feeds what was
    appended since the last poll to ``analysis`` (a ``proof.trainer_log.ProgressAnalysis``: the
    trainer's log is read with the same); ``finish()`` takes a last line without a newline. ``source``: where the first read began ("the start offset N",
    "byte 0 (...)"); ``resets``: how often the file was read again from byte 0 since (replaced,
    truncated, rewritten); ``problem``: why the file cannot be read (not a regular file), else
    None. A file that does not exist (yet) is no problem: the trainer may create it later.
    """

    def __init__(self, path, analysis, start=None, trust=None):
        self.path = path
        self.trust = trust_problem if trust is None else trust
        self.analysis = analysis
        self.start = start
        self.offset = 0
        self.source = None
        self.resets = 0
        self.problem = None
        self._f = None
        self._ident = None
        self._last = b""  # the last bytes read, up to FINGERPRINT_BYTES: the file must still hold them
        self._partial = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    # -- reading ---------------------------------------------------------------------------------
    def _open(self):
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        f = os.fdopen(fd, "rb")
        try:
            parent = os.stat(os.path.dirname(self.path) or ".")
        except OSError:
            parent = None
        self.problem = self.trust(self.path, os.fstat(fd), parent)
        if self.problem:
            f.close()
            return None
        return f

    def _holds(self, f, offset, tail_len, digest=None, data=None):
        """The file still holds, right before ``offset``, the bytes we know were there."""
        if offset < tail_len:
            return False
        got = os.pread(f.fileno(), tail_len, offset - tail_len) if tail_len else b""
        return got == data if data is not None else _fingerprint(got) == digest

    def _first(self, f):
        st = os.fstat(f.fileno())
        s = self.start or {}
        if not s.get("exists") or not s.get("regular"):
            return 0, "byte 0 (there was no such file before the start)" if self.start else "byte 0"
        if (s.get("inode"), s.get("dev")) != (st.st_ino, st.st_dev):
            return 0, "byte 0 (the file was replaced since the start)"
        if st.st_size < s["size"]:
            return 0, "byte 0 (the file was truncated since the start)"
        if not self._holds(f, s["size"], s.get("tail_len", 0), digest=s.get("tail_sha256")):
            return 0, "byte 0 (the file was rewritten since the start)"
        return s["size"], "the start offset %d" % s["size"]

    def _drain(self, f):
        f.seek(self.offset)
        while True:
            data = f.read(READ_CHUNK)
            if not data:
                break
            self.offset += len(data)
            self._last = (self._last + data)[-FINGERPRINT_BYTES:]
            self._feed(self._decoder.decode(data))

    def _reset(self):
        self.offset = 0
        self._last = b""
        self._partial = ""
        self._decoder.reset()
        self.resets += 1

    def poll(self):
        """Read what the file gained since the last poll (IOError/OSError raised to the caller)."""
        if self._f is None:
            f = self._open()
            if f is None:
                return self
            if self._ident is None:
                self.offset, self.source = self._first(f)
            elif self._ident_of(f) != self._ident:
                self._finish_line()
                self._reset()  # another file since it was closed: this start goes on in it from byte 0
            self._f, self._ident = f, self._ident_of(f)
        st = os.fstat(self._f.fileno())
        if st.st_size < self.offset or not self._holds(self._f, self.offset, len(self._last), data=self._last):
            self._reset()  # truncated (and maybe written again): this start goes on from byte 0
        # the path may name another file now: read the open one to its end, then the new one from 0
        self._drain(self._f)
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return self  # renamed or deleted by the trainer: keep the open file
        if (now.st_dev, now.st_ino) != self._ident:
            f = self._open()
            if f is None:
                return self
            self._finish_line()
            self._f.close()
            self._f, self._ident = f, self._ident_of(f)
            self._reset()
            self._drain(f)
        return self

    @staticmethod
    def _ident_of(f):
        st = os.fstat(f.fileno())
        return st.st_dev, st.st_ino

    def _feed(self, text):
        if not text:
            return
        lines = LINE_END.split(self._partial + text)
        self._partial = lines.pop()
        for line in lines:
            self.analysis.add(line)

    def _finish_line(self):
        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._feed(tail)
        if self._partial:
            partial, self._partial = self._partial, ""
            self.analysis.add(partial)

    def finish(self):
        """The trainer is gone: a last line without a newline is final (and the file is closed; a
        later ``poll`` opens it again and goes on where this one ended)."""
        self._finish_line()
        return self.close()

    def close(self):
        """Close the file (a later ``poll`` opens it again and goes on where the last one ended)."""
        if self._f is not None:
            self._f.close()
            self._f = None
        return self

    def describe(self):
        """The progress source, for the proof's details."""
        return {"path": self.path, "read_from": self.source, "resets": self.resets,
                "lines": self.analysis.text.line_count + self.analysis.records, "records": self.analysis.records}

    def words(self, n):
        """The progress file's part in a failure message: its last ``n`` lines of this start."""
        lines = list(self.analysis.lines)[-n:] if n > 0 else []
        if self.source is None:
            what = "the progress file %s %s" % (self.path, self.problem or "does not exist")
            return "\n(%s)" % what
        if not lines:
            return "\n(the progress file %s has no lines of this start; read from %s)" % (self.path, self.source)
        return "\nlast %d lines of the progress file %s (read from %s):\n%s" % (
            len(lines), self.path, self.source, "\n".join("    " + line for line in lines))


# --- the Judge's view --------------------------------------------------------------------------

class ProgressView(object):
    """What the Judge reads as "this start's log" when progress comes from the trainer's file.

    ``marker`` (this start's identity: the launcher's start marker of this invocation), ``reason``
    (the launcher's log's last ``...Error: msg`` line, else the progress file's, else the
    launcher's last line) and ``tail`` come from the launcher's log (``follower``: its
    ``StartLog``); ``errors`` from both; everything else - the ready line, steps, tok/s, named
    figures, problems, line_count - from the progress file (``progress``: a
    ``proof.trainer_log.ProgressAnalysis``, as the launcher's log's own analysis is)."""

    def __init__(self, follower, progress):
        self.follower = follower
        self.progress = progress

    @property
    def marker(self):
        return self.follower.marker

    @property
    def errors(self):
        return list(self.follower.analysis.errors) + list(self.progress.errors)

    @property
    def first_error(self):
        errors = self.errors
        return errors[0][1].strip() if errors else None

    @property
    def reason(self):
        ours, theirs = self.follower.analysis.reason, self.progress.reason
        for reason in (ours, theirs):
            if reason and is_reason_line(reason):
                return reason
        return ours or theirs

    def tail(self, n):
        return self.follower.analysis.tail(n)

    def __getattr__(self, name):
        if name in ("follower", "progress"):
            raise AttributeError(name)
        return getattr(self.progress, name)


# --- what the collection writes: never the progress file ------------------------------------

def written_paths(p):
    """[(what, path)] the restart job's parameters name as files the collection writes."""
    out = []
    log = p.get("log_path")
    if log:
        out.append(("the trainer's log (log_path)", log))
        out.append(("the log's start-marker record", log + ".start"))
    for key, what in (("env_file", "the environment file (env_file)"),
                      ("unit_path", "the unit file (unit_path)"), ("launcher_path", "the launcher (launcher_path)"),
                      ("state_path", "the restart job's state (state_path)"),
                      ("lock_path", "the deploy lock (lock_path)")):
        if p.get(key):
            out.append((what, p[key]))
    if p.get("lock_path"):
        out.append(("the deploy lock's guard", p["lock_path"] + ".guard"))
    install = p.get("install") or {}
    for key, what in (("launcher_path", "the launcher"), ("unit_path", "the unit file"),
                      ("env_path", "the environment file")):
        if isinstance(install, dict) and install.get(key):
            out.append((what, install[key]))
    return out


def _is_rotation(real, log_real):
    rest = real[len(log_real) + 1:] if real.startswith(log_real + ".") else ""
    return rest.isdigit()


def collision(p, realpath=os.path.realpath, trust=None):
    """Why the progress file ``p["progress_path"]``, resolved on the target, may not be read as
    the trainer's own (it is, or resolves to, a file the collection writes, a rotation of the log,
    or lies in the release root; or it exists and ``trust`` - ``trust_problem`` - refuses it), or
    None. Judged before anything is stopped."""
    path = p.get("progress_path")
    if not path:
        return None
    real = realpath(path)
    via = "" if real == path else " (it resolves to %s)" % real
    for what, other in written_paths(p):
        other_real = realpath(other)
        if real == other_real:
            return "progress_path %s%s is %s, which the collection writes: name the file the trainer writes" % (
                path, via, what)
    log = p.get("log_path")
    if log and _is_rotation(real, realpath(log)):
        return "progress_path %s%s is a rotation of the trainer's log, which the launcher writes" % (path, via)
    root = p.get("root")
    if root:
        root_real = realpath(root)
        if real == root_real or real.startswith(root_real.rstrip("/") + "/"):
            return ("progress_path %s%s lies in the release root %s (releases there are immutable and pruned): "
                    "let the trainer write its progress outside it" % (path, via, root))
    try:
        st = os.stat(path)
    except OSError:
        return None  # not there (yet): the trainer creates it; judged again when it is read
    try:
        parent = os.stat(os.path.dirname(path) or ".")
    except OSError:
        parent = None
    return (trust or trust_problem)(path, st, parent)
