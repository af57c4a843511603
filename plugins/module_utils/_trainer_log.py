# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The trainer's log: find THIS start's lines and read progress and errors from them (pure).

The unit's launcher appends one marker line per activation:
``==> dflash.trainer start invocation=<ID> release=<REL> pid=<PID> time=<ISO> <==``.
"This start's log" is the lines after the last marker carrying our invocation id, up to the
next marker. Lines from earlier starts never count (``wait_for`` matched a stale line).

Functions of text and lines only (no files, no clocks): the start marker (``parse_marker``,
``marker_line``, ``continuation_line``, ``is_continuation``), reason lines, ``tail``, step
values, ``LogAnalysis`` / ``analyze`` / ``this_start`` and ``StartLog``, which follows text fed
to it. Reading the log file (the launcher's sidecar, seeking to this start, following the file
across polls) is in ``_log_file``.
"""

from __future__ import annotations

import collections
import re

from ansible_collections.dflash.trainer.plugins.module_utils._throughput import FIGURE, figure_group, read_figure

# The default regexes begin with a look at the first character (fast over text that has no
# figure) and avoid two quantifiers over the same characters side by side ("\s*[=:]?\s*"):
# on a long run of blanks they backtrack quadratically (tests/unit/test_fuzz_trainer_log.py).
# Greedy ".*": the lazy "(.*?)\s*<==" backtracks quadratically on a long line of blanks.
MARKER_RE = re.compile(r"^==> dflash\.trainer start (?P<fields>.*)<==\s*$")

# The unit of throughput as people write it: tok/s, toks/s, tokens/s, token/s, tok/sec,
# tokens per second (not tok/s/gpu, not ktok/s).
_TOKPS_UNIT = r"(?<![A-Za-z])tok(?:en)?s?(?:/s(?:ec)?|\s+per\s+sec(?:ond)?)"
# A line with a throughput figure (tok/s, tokens/s, tok/sec, tokens per second; not tokens/sample).
DEFAULT_READY_REGEX = r"tok(?:en)?s?/s(?:ec)?\b|tokens? per sec"
# The progress counter, in the trainers' words (the first group that takes part is the value):
#   step 5, Step: 5, global_step=5, global step 5, iter 5, iteration 5, batch 5, it=5, step [5/100]
#   [5/100]                        (Epoch 1 [5/100])
#   5/100 [00:01<...  and  5it [00:01, ...   (tqdm; its "\r" updates are lines, see StartLog)
# not: it/s, steps/s, step_time=, batch_size, 12.4K tok/s, dates (2024/01/05), times (00:01).
# Verbose regexes ("(?x)": blanks between the parts are ignored) so that YAML can fold them.
DEFAULT_STEP_REGEX = " ".join((
    r"(?x)(?=[gGsSiIbB\[\d])(?:",  # each form's first character: the engine skips other places fast
    r"(?<![A-Za-z_])(?i:global[_ ]step|step|iteration|iter|batch)(?:[ \t]*[=:#])?[ \t]*(?:\[[ \t]*)?",
    r"(\d{1,3}(?:,\d{3})+|\d+)(?!\w|[.,]\d)",
    r"|(?<![A-Za-z_])it[ \t]*[=:][ \t]*(\d+)(?!\w|[.,]\d)",
    r"|\[\s*(\d+)\s*/\s*\d+\s*\]",
    r"|(?<![\w./:])(\d+)(?:/\d+|it)\s+\[\d+:\d)",
))
# The throughput figure, after the unit (tok/s=12.4K, tokens/s: 12,400) or before it (12.4K tok/s,
# throughput 1.2e4 tok/s); a number followed by the unit and then "=" belongs to what comes
# before it (step=3 tok/s=41250.3 is 41250.3, not 3).
_TOKPS_FIGURE = "(" + FIGURE + r")(?!\w|\.\d)"
DEFAULT_TOKPS_REGEX = " ".join((
    r"(?x)(?=[t\d])(?:",
    _TOKPS_UNIT + r"(?![\w/])(?:\s*[=:])?\s*",
    _TOKPS_FIGURE,
    r"|(?<![\w.,])" + _TOKPS_FIGURE,
    r"\s*" + _TOKPS_UNIT + r"(?![\w/])(?!(?:\s*[=:])?\s*\d))",
))
DEFAULT_ERROR_REGEXES = (
    r"Traceback \(most recent call last\)",
    r"CUDA out of memory",
    r"NCCL error",
    r"OutOfMemoryError",
)

# The exception's name, then (``_REASON_MSG_RE``, from where the name ends) ": <message>". One
# regex for both backtracks quadratically on a long line such as "a.Error.Error.Error...".
REASON_RE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?(?:[\w.]+\.)?\w*(?:Error|Exception)\b")
_REASON_MSG_RE = re.compile(r".*?:\s*\S")

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


def continuation_line(invocation, release, pid, time, why):
    """The marker the launcher writes when this start's log goes on in another (or a truncated)
    file: the start marker's fields plus ``continued=<why>``."""
    return "==> dflash.trainer start invocation=%s release=%s pid=%s time=%s continued=%s <==" % (
        invocation, release, pid, time, why)


def is_continuation(marker):
    """True for the fields of a continuation marker (see ``continuation_line``)."""
    return bool(marker and marker.get("continued"))


def is_reason_line(line):
    """``SomethingError: msg`` / ``pkg.SomethingException: msg``."""
    m = REASON_RE.match(line)
    return bool(m and _REASON_MSG_RE.match(line, m.end()))


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


MAX_VALUES = 100000
MAX_PROBLEMS = 5
# "5/100" right after a step value: the counter's total (a tqdm bar, "[5/100]", "step 5/100")
_TOTAL_RE = re.compile(r"[ \t]*/[ \t]*(\d+)")


def _bounded_append(values, value):
    values.append(value)
    if len(values) > MAX_VALUES:
        del values[:len(values) - MAX_VALUES]


def step_value(match):
    """(step, total or None, None) for a step regex match, or (None, None, words) when the value
    it captured is not a whole number (see ``_throughput.read_figure``)."""
    value, problem = read_figure(match)
    if problem is None and not float(value).is_integer():
        problem = "%r is not a whole number" % match.group(figure_group(match))
    if problem is not None:
        return None, None, problem
    total = _TOTAL_RE.match(match.string, match.end(figure_group(match)))
    return int(value), int(total.group(1)) if total else None, None


class LogAnalysis(object):
    """What one start's lines show, built line by line.

    ready_line: the last line matching the ready pattern; steps: distinct increasing progress
    values (each greater than every one before); last_step: the latest step value as written;
    went_back: (from, to) when the latest step value read is below the one before it and no new
    high came since (the trainer restarted inside; another counter with the same words); tok_s:
    the latest readable tok/s; tokps_values / extra_values: every figure read (None for one that
    could not be read); problems: the first ``MAX_PROBLEMS`` figures or steps that could not be
    read, in words; errors: (pattern, line) hits; reason: see ``reason_line``; tail(n).

    A counter with a total ("5/100": tqdm, "[5/100]") that starts again after reaching its total
    (the next epoch's bar) goes on counting: its progress value is the total so far plus the step.
    A value with another total than the first one read (an evaluation bar between training
    bars) is another counter and does not count as progress.
    """

    def __init__(self, ready_regex=DEFAULT_READY_REGEX, step_regex=DEFAULT_STEP_REGEX,
                 tokps_regex=DEFAULT_TOKPS_REGEX, error_regexes=DEFAULT_ERROR_REGEXES,
                 keep_lines=DEFAULT_KEEP_LINES, marker=None, extra_regexes=None):
        self.ready_re = _compile(ready_regex)
        # every tok/s value and every value of the user's named figures, in order (bounded):
        # the measurement of a release reads them
        self.tokps_values = []
        self.extra_res = dict((name, _compile(rx)) for name, rx in (extra_regexes or {}).items())
        self.extra_values = dict((name, []) for name in self.extra_res)
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
        self.went_back = None
        self.tok_s = None
        self.progress_line = None
        self.problems = []
        self.errors = []
        self._last_reason = None
        self._last_nonempty = None
        self._total = None        # the total of the counter that counts as progress (None: none)
        self._offset = 0          # totals of the bars completed before the current one
        self._last_value = None   # the last progress value (offset + step)

    def _problem(self, what, words, line):
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append("%s: %s in line %r" % (what, words, line[:200]))

    def _step(self, step, total):
        """Take a step value; False when it belongs to another counter."""
        if self.steps and total != self._total:
            return False  # another counter (an evaluation bar beside the training bar)
        if not self.steps:
            self._total = total
        last = self.last_step
        if last is not None and step < last and total is not None and last >= total:
            self._offset += total  # the bar was complete: the next one (epoch) begins
        value = self._offset + step
        if self._last_value is not None and value < self._last_value and self.went_back is None:
            self.went_back = (last, step)  # the first drop since the last high names it
        if not self.steps or value > self.steps[-1]:
            _bounded_append(self.steps, value)
            self.went_back = None
        self._last_value = value
        self.last_step = step
        return True

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
            step, total, problem = step_value(m)
            if problem is not None:
                self._problem("step", problem, line)
            elif self._step(step, total):
                self.progress_line = line
        m = self.tokps_re.search(line)
        if m:
            value, problem = read_figure(m)
            if problem is not None:
                self._problem("tok/s", problem, line)
            else:
                self.tok_s = value
            _bounded_append(self.tokps_values, value)
            self.progress_line = line
        for name, rx in self.extra_res.items():
            m = rx.search(line)
            if m:
                value, problem = read_figure(m)
                if problem is not None:
                    self._problem(name, problem, line)
                _bounded_append(self.extra_values[name], value)
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


# "\r\n", "\n", or a lone "\r" (tqdm's redraw); a "\r" at the very end may be half of a "\r\n"
LINE_END = re.compile(r"\r\n|\n|\r(?!\Z)")


class StartLog(object):
    """Follow a log incrementally and keep the analysis of one invocation's start.

    ``feed(chunk)`` takes text as read from the file (partial last lines are kept until their
    end arrives). A line ends at "\n", "\r\n" or a lone "\r": tqdm redraws its bar after "\r"
    without a newline, and each redraw is a line (a "\r" at the end of a chunk waits for the next
    one, which may begin with its "\n"). A marker with our invocation resets the analysis (the last such marker
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
        lines = LINE_END.split(data)
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
                if is_continuation(marker) and self.in_start:
                    return  # the same start goes on (rotated, reopened, resumed, truncated)
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
