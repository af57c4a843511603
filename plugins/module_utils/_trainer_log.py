# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The trainer's log: find THIS start's lines and read progress and errors from them (pure).

The unit's launcher appends one marker line per activation:
``==> dflash.trainer start invocation=<ID> release=<REL> pid=<PID> time=<ISO> <==``.
"This start's log" is the lines after the last marker carrying our invocation id, up to the
next marker. Lines from earlier starts never count (``wait_for`` matched a stale line).
"""

from __future__ import annotations

import collections
import re

MARKER_RE = re.compile(r"^==> dflash\.trainer start (?P<fields>.*?)\s*<==\s*$")

DEFAULT_READY_REGEX = r"tok/s"
DEFAULT_STEP_REGEX = r"\bstep[=: ]\s*(\d+)"
DEFAULT_TOKPS_REGEX = r"tok/s[=: ]\s*([0-9.]+)"
DEFAULT_ERROR_REGEXES = (
    r"Traceback \(most recent call last\)",
    r"CUDA out of memory",
    r"NCCL error",
    r"OutOfMemoryError",
)

REASON_RE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?(?:[\w.]+\.)?\w*(?:Error|Exception)\b.*?:\s*\S")

DEFAULT_KEEP_LINES = 1000


def parse_marker(line):
    """Marker fields {invocation, release, pid, time} (as strings), or None for other lines."""
    m = MARKER_RE.match(line.rstrip("\r\n"))
    if not m:
        return None
    fields = {}
    for token in m.group("fields").split():
        if "=" in token:
            key, value = token.split("=", 1)
            fields[key] = value
    if "invocation" not in fields:
        return None
    return fields


def marker_line(invocation, release, pid, time):
    return "==> dflash.trainer start invocation=%s release=%s pid=%s time=%s <==" % (
        invocation, release, pid, time)


def is_reason_line(line):
    """``SomethingError: msg`` / ``pkg.SomethingException: msg``."""
    return bool(REASON_RE.match(line))


def reason_line(lines):
    """The last ``...Error: msg`` / ``...Exception: msg`` line, else the last non-empty line."""
    last = None
    for line in reversed(lines):
        if is_reason_line(line):
            return line.strip()
        if last is None and line.strip():
            last = line.strip()
    return last


def tail(lines, n):
    lines = list(lines)
    if n <= 0:
        return []
    return lines[-n:]


def _compile(regex):
    return regex if hasattr(regex, "search") else re.compile(regex)


def _first_group(match):
    return match.group(1) if match.re.groups else match.group(0)


class LogAnalysis(object):
    """What one start's lines show, built line by line.

    ready_line: the last line matching the ready pattern; steps: distinct increasing step
    values (each greater than every one before); last_step: the latest step value; tok_s: the
    latest tok/s; errors: (pattern, line) hits; reason: see ``reason_line``; tail(n).
    """

    def __init__(self, ready_regex=DEFAULT_READY_REGEX, step_regex=DEFAULT_STEP_REGEX,
                 tokps_regex=DEFAULT_TOKPS_REGEX, error_regexes=DEFAULT_ERROR_REGEXES,
                 keep_lines=DEFAULT_KEEP_LINES, marker=None):
        self.ready_re = _compile(ready_regex)
        self.step_re = _compile(step_regex)
        self.tokps_re = _compile(tokps_regex)
        self.error_res = [_compile(r) for r in error_regexes]
        self.marker = marker
        self.lines = collections.deque(maxlen=keep_lines)
        self.line_count = 0
        self.ready_line = None
        self.ready_count = 0
        self.steps = []
        self.last_step = None
        self.tok_s = None
        self.progress_line = None
        self.errors = []
        self._last_reason = None
        self._last_nonempty = None

    def add(self, line):
        line = line.rstrip("\r\n")
        self.lines.append(line)
        self.line_count += 1
        if line.strip():
            self._last_nonempty = line.strip()
        if is_reason_line(line):
            self._last_reason = line.strip()
        if self.ready_re.search(line):
            self.ready_line = line
            self.ready_count += 1
        m = self.step_re.search(line)
        if m:
            try:
                step = int(_first_group(m))
            except ValueError:
                step = None
            if step is not None:
                if not self.steps or step > self.steps[-1]:
                    self.steps.append(step)
                self.last_step = step
                self.progress_line = line
        m = self.tokps_re.search(line)
        if m:
            try:
                self.tok_s = float(_first_group(m))
            except ValueError:
                pass
            self.progress_line = line
        for rx in self.error_res:
            if rx.search(line):
                self.errors.append((rx.pattern, line))
                break

    def extend(self, lines):
        for line in lines:
            self.add(line)
        return self

    @property
    def n_steps(self):
        return len(self.steps)

    @property
    def max_step(self):
        return self.steps[-1] if self.steps else None

    @property
    def first_error(self):
        return self.errors[0][1].strip() if self.errors else None

    @property
    def reason(self):
        return self._last_reason or self._last_nonempty

    def tail(self, n):
        return tail(self.lines, n)


def this_start(text, invocation_id):
    """(marker fields or None, [lines]) of the start with ``invocation_id`` in ``text``."""
    follower = StartLog(invocation_id, keep_lines=None)
    follower.feed(text)
    follower.finish()
    return follower.marker, list(follower.analysis.lines) if follower.marker else []


def analyze(lines, **kwargs):
    return LogAnalysis(**kwargs).extend(lines)


class StartLog(object):
    """Follow a log incrementally and keep the analysis of one invocation's start.

    ``feed(chunk)`` takes text as read from the file (partial last lines are kept until their
    newline arrives). A marker with our invocation resets the analysis (the last such marker
    wins); any other marker ends our start. ``truncated()`` is for a log that shrank or was
    replaced: the pending partial line is dropped and reading goes on from the file's start;
    lines without a marker still belong to our start if we were in it.
    """

    def __init__(self, invocation_id, **analysis_kwargs):
        self.invocation_id = invocation_id
        self._kwargs = analysis_kwargs
        self.marker = None
        self.in_start = False
        self.ended = False
        self.analysis = LogAnalysis(**analysis_kwargs)
        self._partial = ""

    def feed(self, chunk):
        if not chunk:
            return self
        data = self._partial + chunk
        lines = data.split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)
        return self

    def finish(self):
        """Take a trailing line that has no newline (yet)."""
        if self._partial:
            partial, self._partial = self._partial, ""
            self._line(partial)
        return self

    def truncated(self):
        self._partial = ""
        return self

    def _line(self, line):
        marker = parse_marker(line)
        if marker is not None:
            if marker.get("invocation") == self.invocation_id:
                self.marker = marker
                self.in_start = True
                self.ended = False
                self.analysis = LogAnalysis(marker=marker, **self._kwargs)
            elif self.in_start:
                self.in_start = False
                self.ended = True
            return
        if self.in_start:
            self.analysis.add(line)
