# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The trainer's log: find THIS start's lines and read progress and errors from them (pure).

The unit's launcher appends one marker line per activation:
``==> dflash.trainer start invocation=<ID> release=<REL> pid=<PID> time=<ISO> <==``.
"This start's log" is the lines after the last marker carrying our invocation id, up to the
next marker. Lines from earlier starts never count (``wait_for`` matched a stale line).

A trainer writes its progress in one of two formats, and every source of this start's lines
is read for both by one reader, ``ProgressAnalysis``: the trainer's log (``StartLog``: its
stdout and stderr, as the launcher writes them) and the trainer's own progress file
(``proof.progress_file.ProgressFileReader``, ``trainer_progress_path``). A line that parses as a JSON
object with a ``"step"`` key is a JSONL record (``json_record``: ``{"step": 5, "tok_s": 21500.0}``;
its ``step``, ``tok_s`` and named figures are read from its keys); every other line is plain text,
read by the user's regexes (``LogAnalysis``: ready, step, tok/s, named figures, errors). A source
without records reads exactly as ``LogAnalysis`` reads it.

Functions of text and lines only (no files, no clocks; the one exception: the time bound of
each line's searches, ``LineBound``, below): the start marker (``parse_marker``,
``marker_line``, ``continuation_line``, ``is_continuation``), reason lines, ``tail``, step
values, ``LogAnalysis`` / ``analyze`` (plain lines), ``json_record`` / ``record_number`` /
``ProgressAnalysis`` (both formats), ``this_start`` and ``StartLog``, which follows text fed to
it. Reading the log file (the launcher's sidecar, seeking to this start, following the file
across polls) is in ``proof.log_file``; reading the progress file is in ``proof.progress_file``.
"""

from __future__ import annotations

import collections
import json
import math
import re
import signal
import threading
import time

from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import (
    FIGURE,
    figure_group,
    parse_figure,
    read_figure,
)

# The default regexes begin with a look at the first character (fast over text that has no
# figure) and avoid two quantifiers over the same characters side by side ("\s*[=:]?\s*"):
# on a long run of blanks they backtrack quadratically (tests/unit/test_fuzz_trainer_log.py).
# Greedy ".*": the lazy "(.*?)\s*<==" backtracks quadratically on a long line of blanks.
MARKER_RE = re.compile(r"^==> dflash\.trainer start (?P<fields>.*)<==\s*$")

# The unit of throughput as people write it: tok/s, toks/s, tokens/s, token/s, tok/sec,
# tokens per second (not tok/s/gpu, not ktok/s).
_TOKPS_UNIT = r"(?<![A-Za-z])tok(?:en)?s?(?:/s(?:ec)?|\s+per\s+sec(?:ond)?)"
# A line with a throughput figure (tok/s, tokens/s, tok/sec, tokens per second; not tokens/sample).
# With this default (and only with it) a line that carries the training counter also counts as a
# ready line while no line of this start matched it: most trainers print no tok/s (Megatron-LM,
# DeepSpeed, nanoGPT, HF Trainer) or name it otherwise (TorchTitan's "tps:"); see LogAnalysis.
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
# The throughput figure, after the unit (tok/s=12.4K, tokens/s: 12,400, TorchTitan's tps: 12,345)
# or before it (12.4K tok/s, throughput 1.2e4 tok/s); a number followed by the unit and then "="
# belongs to what comes before it (step=3 tok/s=41250.3 is 41250.3, not 3).
_TOKPS_FIGURE = "(" + FIGURE + r")(?!\w|\.\d)"
DEFAULT_TOKPS_REGEX = " ".join((
    r"(?x)(?=[t\d])(?:",
    _TOKPS_UNIT + r"(?![\w/])(?:\s*[=:])?\s*",
    _TOKPS_FIGURE,
    r"|(?<![A-Za-z_])tps(?:[ \t]*[=:])?[ \t]*",
    _TOKPS_FIGURE,
    r"|(?<![\w.,])" + _TOKPS_FIGURE,
    r"\s*" + _TOKPS_UNIT + r"(?![\w/])(?!(?:\s*[=:])?\s*\d))",
))
DEFAULT_ERROR_REGEXES = (
    r"Traceback \(most recent call last\)",
    r"CUDA out of memory",
    r"OutOfMemoryError",
    r"NCCL error",
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


# -- how long the user's regexes may search one line -----------------------------------------------
# The controller refuses, before any change, a regex that is slow on adversarial lines
# (``_validate.slow_regexes``), but no set of test lines is every line a trainer prints: a
# regex that backtracks without end on a real line would hold the restart job in "proving" at
# 100 % CPU past its own deadline (and, holding the interpreter, keep the lease's renewals from
# running). So every line's searches run under a time bound: a one-shot ``ITIMER_REAL`` whose
# ``SIGALRM`` interrupts the match (CPython's regex engine checks for signals while it
# backtracks) and ends the reading as ``RegexTimeout``, naming the regex and the line.
#
# The bound of a line is ``line_s``, cut to what is left before ``deadline`` (the proof's own,
# when the caller gives one; at least ``BOUND_MIN_S``). It applies in the main thread of a process
# with ``setitimer`` (the restart job, check-log); elsewhere the searches run unbounded, as
# before. A timer another part of the process armed is put back when the line is done.

# one line, every regex together (the controller allows 0.5 s for one regex on one adversarial line)
BOUND_LINE_S = 2.0
# the least time a line is given once the deadline is near or past (a line read then still counts)
BOUND_MIN_S = 0.05


class RegexTimeout(Exception):
    """A regex ran past the bound of one line: ``label`` (the role variable), ``pattern``,
    ``line_no`` (of this start), ``line`` (the text searched), ``bound_s``, ``deadline`` (True:
    the proof's deadline came first)."""

    def __init__(self, label, pattern, bound_s, deadline=False, line_no=None, line=None):
        self.label, self.pattern, self.bound_s, self.deadline = label, pattern, bound_s, deadline
        self.line_no, self.line = line_no, line
        super(RegexTimeout, self).__init__(self.words())

    def at(self, line_no, line):
        self.line_no, self.line = line_no, line
        self.args = (self.words(),)
        return self

    def words(self):
        where = "line %s of this start" % self.line_no if self.line_no is not None else "a line"
        shown = ""
        if self.line is not None:
            shown = " (%d characters: %r%s)" % (len(self.line), self.line[:80], "..." if len(self.line) > 80 else "")
        if self.deadline:
            return ("the proof's deadline came while %s %r was still searching %s%s: the log could not be read "
                    "in time" % (self.label, self.pattern, where, shown))
        return ("%s %r did not finish searching %s within %s s%s: the regex backtracks without end on it; "
                "use one that reads this line in linear time (check-log shows the line)"
                % (self.label, self.pattern, where, _fmt_bound(self.bound_s), shown))


def _fmt_bound(seconds):
    return ("%.2f" % seconds).rstrip("0").rstrip(".")


class _Expired(BaseException):
    """Raised by the alarm inside the bounded searches (a BaseException: no ``except Exception``
    in between swallows it)."""


def _bound_usable():
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


class LineBound(object):
    """``with bound.line(where):`` - the searches inside run at most ``budget()`` seconds; past
    it RegexTimeout for ``where()`` -> (label, pattern) of the search that was running.
    ``deadline``: a monotonic time (or None), may be moved while reading (a proof that measures on)."""

    def __init__(self, line_s=BOUND_LINE_S, deadline=None, clock=time.monotonic):
        self.line_s, self.deadline, self.clock = line_s, deadline, clock
        self._armed = False

    def budget(self):
        """-> (seconds, True when the deadline cut them)."""
        if self.deadline is None:
            return self.line_s, False
        left = self.deadline - self.clock()
        if left >= self.line_s:
            return self.line_s, False
        return max(BOUND_MIN_S, left), True

    def _expire(self, _signum, _frame):
        if self._armed:
            self._armed = False
            raise _Expired()

    def line(self, where):
        return _Bounded(self, where)


class _Bounded(object):
    def __init__(self, bound, where):
        self.bound, self.where = bound, where
        self.on = _bound_usable()
        self.budget = None
        self.previous = None

    def __enter__(self):
        if not self.on:
            return self
        self.budget, self.cut = self.bound.budget()
        self.handler = signal.signal(signal.SIGALRM, self.bound._expire)
        self.began = time.monotonic()
        self.bound._armed = True
        self.previous = signal.setitimer(signal.ITIMER_REAL, self.budget)
        return self

    def __exit__(self, kind, exc, _tb):
        if not self.on:
            return False
        self.bound._armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.handler)
        left, interval = self.previous
        if left or interval:  # someone else's timer: put back what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(1e-6, left - (time.monotonic() - self.began)), interval)
        if kind is _Expired:
            label, pattern = self.where()
            raise RegexTimeout(label, pattern, self.budget, deadline=self.cut) from None
        return False


MAX_VALUES = 100000
# how much of a line the regexes read (the launcher's metrics read as much)
MATCH_CHARS = 4096
MAX_PROBLEMS = 5
MAX_SERIES = 16
# "5/100" right after a step value: the counter's total (a tqdm bar, "[5/100]", "step 5/100")
_TOTAL_RE = re.compile(r"[ \t]*/[ \t]*(\d+)")

# Terminal escape sequences: CSI ("\x1b[31m", tqdm's "\x1b[A"), OSC ("\x1b]0;title\x07"; one
# without its end runs to the next escape or the line's end), and the two-character ones. Each
# part is linear (no two quantifiers over the same characters side by side).
ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\^_`-~]?)"
                     r"|\x9b[0-?]*[ -/]*[@-~]?")

# Words that name a counter beside the training: a loading, download, map, tokenizing, evaluation,
# validation, sanity-check, test, prediction or checkpoint-saving bar or line. A counter named so
# ("Loading checkpoint shards: 2/5 [", "Validation DataLoader 0: 4/10 [", "validate step: 2",
# "validation loss at iteration 100") is never the one the proof follows. A word counts when it
# begins with one of these stems ("Loading", "Downloading" and "evaluation" do; "latest" does not).
ASIDE_STEMS = ("load", "download", "fetch", "map", "shard", "checkpoint", "sav", "eval", "valid",
               "sanity", "test", "predict", "infer", "tokeniz", "preprocess", "filter", "generat",
               "convert", "compil", "extract", "upload", "split", "resolv")
_WORD_RE = re.compile(r"[A-Za-z]+")
# a word beginning with a stem (is_aside_word), and such a word anywhere in a text (names_aside): the
# stems are letters, so a stem not preceded by a letter begins a word of _WORD_RE
_ASIDE_RE = re.compile("(?:%s)" % "|".join(ASIDE_STEMS), re.I | re.A)
_ASIDE_IN_RE = re.compile("(?<![A-Za-z])(?:%s)" % "|".join(ASIDE_STEMS), re.I | re.A)
_PREFIX_CHARS = 120   # how far before a counter its name (a tqdm description) is looked for
_STEP_FORM_WORDS = 3  # the words right before "step N" that can name it aside ("validate step: 2")

# A line that LOOKS like training progress: one of these words with a number right beside it
# ("loss 2.31", "'loss': 1.23", "step:  2", "iteration        2/", "5.00it/s", "12.4K tok/s"), whatever
# the configured regexes read from it (the Judge's early word names it). A number elsewhere in the
# line does not count: Megatron's "[before the start of training step] datetime: 2026-12-01 …" is
# not progress, and the early word must never fire on it.
_PROGRESS_WORD = (r"(?<![a-z])(?:loss|lr|learning[ _]rate|grad[ _]?norm|tok(?:en)?s?/s(?:ec)?|tokens?"
                  r"|tps|it/s|s/it|samples?(?:/s(?:ec)?)?|iter(?:ation)?s?|steps?|global[ _]step|epochs?|ppl"
                  r"|mfu|tflops|flops)(?![a-z])")
PROGRESS_LIKE_RE = re.compile(
    r"(?i)(?=[lgtisepmf])" + _PROGRESS_WORD + r"['\"]?[ \t]{0,16}[:=#]?[ \t]{0,16}\[?[ \t]{0,4}[-+]?\.?\d"
    r"|(?<![\w.])\d[\d.,]{0,20}[kKMG]?[ \t]?" + _PROGRESS_WORD)
_DIGIT_RE = re.compile(r"\d")


def strip_ansi(line):
    """``line`` without terminal escape sequences (colours, cursor moves, titles)."""
    if "\x1b" not in line and "\x9b" not in line:
        return line
    return ANSI_RE.sub("", line)


def is_aside_word(word):
    return _ASIDE_RE.match(word) is not None


def names_aside(text):
    """True when a word of ``text`` (a run of ASCII letters) begins with an aside stem: one regex
    search, not a test of each word (a status reads hundreds of lines)."""
    return _ASIDE_IN_RE.search(text) is not None


def _bounded_append(values, value):
    values.append(value)
    if len(values) > MAX_VALUES:
        del values[:len(values) - MAX_VALUES]


def step_value(match):
    """(step, total or None, None) for a step regex match, or (None, None, words) when the value
    it captured is not a whole number (see ``proof.throughput.read_figure``)."""
    value, problem = read_figure(match)
    if problem is None and not float(value).is_integer():
        problem = "%r is not a whole number" % match.group(figure_group(match))
    if problem is not None:
        return None, None, problem
    total = _TOTAL_RE.match(match.string, match.end(figure_group(match)))
    return int(value), int(total.group(1)) if total else None, None


def counter_identity(match, total):
    """(words, total, aside) of the counter a step regex match read: its words are those of the
    match before the figure ("step", "global_step", "iteration"), or, when the match has none (a
    tqdm bar, "[5/100]"), the words of the line before it (the bar's description, numbers left
    out: "Epoch 0" and "Epoch 1" are one counter). ``aside``: the counter is named as a loading,
    evaluation ... counter (see ``ASIDE_STEMS``)."""
    line = match.string
    start = match.start()
    own = _WORD_RE.findall(line[start:match.start(figure_group(match))])
    before = _WORD_RE.findall(line[max(0, start - _PREFIX_CHARS):start])
    if own:
        words = tuple(w.lower() for w in own)
        aside = any(is_aside_word(w) for w in own + before[-_STEP_FORM_WORDS:])
    else:
        words = tuple(w.lower() for w in before[-8:])
        aside = names_aside(line[max(0, start - _PREFIX_CHARS):start])
    return words, total, aside


def looks_like_progress(line):
    """True for a line with a progress word (loss, lr, grad_norm, tok/s, tps, it/s, samples,
    iteration, step, epoch ...) and a number, that does not name a loading or evaluation counter."""
    if not _DIGIT_RE.search(line) or not PROGRESS_LIKE_RE.search(line):
        return False
    return not names_aside(line[:_PREFIX_CHARS])


class _Series(object):
    """One counter's values (see ``counter_identity``): its own epochs (a bar that starts again
    after reaching its total goes on from the total so far), its high, how many times it rose."""

    def __init__(self, key, seen_at):
        self.key = key
        self.total = key[1]
        self.aside = key[2]
        self.throughput = False   # a line of this counter carried a throughput figure
        self.offset = 0
        self.last_step = None
        self.value = None
        self.high = None
        self.rises = 0
        self.first_at = seen_at
        self.last_at = seen_at

    def take(self, step, seen_at):
        if (self.last_step is not None and step < self.last_step and self.total is not None
                and self.last_step >= self.total):
            self.offset += self.total  # the bar was complete: the next one (epoch) begins
        self.value = self.offset + step
        if self.high is None or self.value > self.high:
            self.high = self.value
            self.rises += 1
        self.last_step = step
        self.last_at = seen_at
        return self.value

    @property
    def finished(self):
        """A bar at its total (it may still start again: the next epoch)."""
        return self.total is not None and self.last_step is not None and self.last_step >= self.total


def _follows_better(new, old):
    """True when counter ``new`` (which just rose) is the training counter rather than ``old``,
    the one followed so far: a counter that carries throughput beats one that does not; then a
    counter without a total (step/iteration lines) beats a bar that ran to its total; then a
    counter that rose more often beats a counter without a total that has not moved since it
    began (nanoGPT's "step 0: train loss" before its "iter N" lines)."""
    if new.aside:
        return False
    if old.aside:
        return True
    if new.throughput != old.throughput:
        return new.throughput
    if old.finished and new.total is None and new.rises >= 1 and new.first_at > old.last_at - 1:
        return True
    return old.total is None and old.last_at < new.first_at and new.rises > old.rises


class LogAnalysis(object):
    """What one start's lines show, built line by line. Terminal escape sequences are taken out
    of every line before anything reads it (and in what the tail shows).

    ready_line: the last line matching the ready pattern (with the DEFAULT ready pattern, while no
    line matched it, also a line of the training counter: see below); steps: distinct increasing
    progress values of the training counter (each greater than every one before); last_step: its
    latest step value as written; went_back: (from, to) when the latest step value read is below
    the one before it and no new high came since (the trainer restarted inside); tok_s: the latest
    readable tok/s; tokps_values / extra_values: every figure read (None for one that could not be
    read); problems: the first ``MAX_PROBLEMS`` figures or steps that could not be read, in words;
    errors: (pattern, line) hits; reason: see ``reason_line``; tail(n); progress_like_line /
    progress_like_at: the first line that looks like training progress (see
    ``looks_like_progress``) and ``line_count`` then, whatever the regexes read from it (None until
    one came); last_progress_like_line: the latest such line.

    The training counter. Each step value read belongs to a counter named by its words and total
    (``counter_identity``): a loading bar, an evaluation bar and the training bar are three
    counters. The analysis follows one: the first one read that is not named as a loading or
    evaluation counter, replaced by a counter that rises and is the training counter rather than it
    (``_follows_better``: it carries throughput; or it has no total while the one followed ran to its
    total and stopped). When the followed counter changes, the new one's values continue above the
    highest value so far (its next rise is progress; the switch itself is not). A counter with a
    total that starts again after reaching its total (the next epoch's bar) goes on counting: its
    progress value is the total so far plus the step. Another counter (an evaluation bar between
    training bars) does not count as progress.
    """

    def __init__(self, ready_regex=DEFAULT_READY_REGEX, step_regex=DEFAULT_STEP_REGEX,
                 tokps_regex=DEFAULT_TOKPS_REGEX, error_regexes=DEFAULT_ERROR_REGEXES,
                 keep_lines=DEFAULT_KEEP_LINES, marker=None, extra_regexes=None, bound=None):
        # how long the user's regexes may search one line (LineBound; a shared one carries the proof's deadline)
        self.bound = bound if bound is not None else LineBound()
        self._at = None  # (variable, pattern) of the search running
        self.ready_re = _compile(ready_regex)
        # the default ready pattern also takes a line of the training counter (see the class doc)
        self.counter_ready = self.ready_re.pattern == DEFAULT_READY_REGEX
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
        self.ready_matched = False  # a line matched the ready pattern itself
        self.steps = []
        self.last_step = None
        self.went_back = None
        self.tok_s = None
        self.progress_line = None
        self.progress_like_line = None
        self.progress_like_at = None
        self.last_progress_like_line = None
        self.problems = []
        self.errors = []
        self._last_reason = None
        self._last_nonempty = None
        self._last_nonempty_at = None  # line_count of that line
        self._series = collections.OrderedDict()  # identity -> _Series, least recently seen first
        self._followed = None     # the _Series the proof follows (None: none yet)
        self._base = 0            # added to the followed counter's values (see the class doc)
        self._last_value = None   # the last progress value presented

    def _problem(self, what, words, line):
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append("%s: %s in line %r" % (what, words, line[:200]))

    @property
    def counter(self):
        """(words, total) of the counter followed, or None."""
        return None if self._followed is None else self._followed.key[:2]

    def _series_for(self, key):
        series = self._series.get(key)
        if series is None:
            series = _Series(key, self.line_count)
            self._series[key] = series
            if len(self._series) > MAX_SERIES:
                for old in list(self._series):
                    if self._series[old] is not self._followed:
                        del self._series[old]
                        break
        else:
            self._series.move_to_end(key)
        return series

    def _step(self, match, step, total, throughput):
        """Take a step value; True when it belongs to the counter followed."""
        series = self._series_for(counter_identity(match, total))
        if throughput:
            series.throughput = True
        value = series.take(step, self.line_count)
        if series is not self._followed:
            if series.aside or (self._followed is not None and not _follows_better(series, self._followed)):
                return False
            # follow this counter from here: it continues at the highest value so far
            self._followed = series
            self._base = max(0, self.steps[-1] - value) if self.steps else 0
            self._last_value = None
            self.went_back = None
        value += self._base
        if self._last_value is not None and value < self._last_value and self.went_back is None:
            self.went_back = (self.last_step, step)  # the first drop since the last high names it
        if not self.steps or value > self.steps[-1]:
            _bounded_append(self.steps, value)
            self.went_back = None
        self._last_value = value
        self.last_step = step
        return True

    def _search(self, label, rx, line):
        self._at = (label, rx.pattern)
        return rx.search(line)

    def add(self, line):
        """Read one line. RegexTimeout (see ``LineBound``) when the user's regexes ran past the
        line's bound: the reading ends there, naming the regex and the line."""
        line = strip_ansi(line.rstrip("\r\n"))
        self.lines.append(line)
        self.line_count += 1
        # the user's regexes see at most MATCH_CHARS of a line (as the launcher's metrics do): a
        # regex slow on long input costs a bounded time per line (the controller refuses the
        # catastrophic ones it can find before any change: _validate), and the searches of one
        # line run under a time bound (the ones it cannot find)
        line = line[:MATCH_CHARS]
        if line.strip():
            self._last_nonempty = line.strip()
            self._last_nonempty_at = self.line_count
        if is_reason_line(line):
            self._last_reason = line.strip()
        try:
            with self.bound.line(lambda: self._at):
                self._read(line)
        except RegexTimeout as exc:
            raise exc.at(self.line_count, line)
        if looks_like_progress(line):
            if self.progress_like_line is None:
                self.progress_like_line = line
                self.progress_like_at = self.line_count
            self.last_progress_like_line = line

    def _read(self, line):
        ready = False
        if self._search("trainer_ready_regex", self.ready_re, line):
            ready = self.ready_matched = True
        tokps = self._search("trainer_tokps_regex", self.tokps_re, line)
        m = self._search("trainer_step_regex", self.step_re, line)
        if m:
            step, total, problem = step_value(m)
            if problem is not None:
                self._problem("step", problem, line)
            elif self._step(m, step, total, tokps is not None):
                self.progress_line = line
                if self.counter_ready and not self.ready_matched:
                    ready = True
        if ready:
            self.ready_line = line
            self.ready_count += 1
        if tokps:
            value, problem = read_figure(tokps)
            if problem is not None:
                self._problem("tok/s", problem, line)
            else:
                self.tok_s = value
            _bounded_append(self.tokps_values, value)
            self.progress_line = line
        for name, rx in self.extra_res.items():
            m = self._search("trainer_measure_regexes[%r]" % (name,), rx, line)
            if m:
                value, problem = read_figure(m)
                if problem is not None:
                    self._problem(name, problem, line)
                _bounded_append(self.extra_values[name], value)
        for i, rx in enumerate(self.error_res):
            if self._search("trainer_error_regexes[%d]" % i, rx, line):
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


# --- JSONL records: the other way a trainer writes its progress ----------------------------------
# A line of any source (the trainer's log, its progress file) is a JSONL record when it parses as a
# JSON object with a "step" key ({"step": 5, "tok_s": 21500.0, "loss": 2.1}); ProgressAnalysis reads
# both kinds of line, wherever they come from.

# a line longer than this is not a JSONL record worth parsing
MAX_RECORD = 64 * 1024
# how a record is read once rendered as "step=N tok/s=X name=V" (see ProgressAnalysis)
RECORD_READY_RE = r"^step=\d+ tok/s="
RECORD_STEP_RE = r"^step=(\d+)"


def _record_figure_re(name):
    return r" " + re.escape(name) + r"=(" + FIGURE + r")(?!\S)"


def json_record(line):
    """The JSON object a JSONL progress line holds (a dict with a "step" key), else None."""
    text = line.strip()
    if not text.startswith("{") or len(text) > MAX_RECORD:
        return None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):  # not JSON; nested deeper than the parser goes ("[[[[...")
        return None
    return record if isinstance(record, dict) and "step" in record else None


def _shown(value):
    """A record's value in words (a long one cut)."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def record_number(value, whole=False):
    """(number, None) for a record's value (a JSON number, or a figure as text: "12.4K"), or
    (None, words) when it is not a readable, finite, non-negative number."""
    if isinstance(value, bool) or value is None:
        return None, "%s is not a number" % _shown(value)
    if isinstance(value, str):
        try:
            value = parse_figure(value.strip())
        except ValueError:
            return None, "%s is not a number" % _shown(value)
    try:
        finite = isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:  # a whole number too large for a float
        finite = False
    if not finite or value < 0:
        return None, "%s is not a finite number >= 0" % _shown(value)
    if whole:
        if not float(value).is_integer():
            return None, "%s is not a whole number" % _shown(value)
        return int(value), None
    return value, None


class ProgressAnalysis(object):
    """What one source's lines of this start show, whichever way the trainer writes its progress:
    the one reader of the trainer's log (``StartLog``) and of its own progress file
    (``proof.progress_file.ProgressFileReader``). A line is a JSONL record when it parses as a JSON
    object with a ``"step"`` key (``json_record``), else a plain line.

    Plain lines go to a ``LogAnalysis`` with the user's regexes (``text``); each record is rendered
    as ``step=N tok/s=X name=V`` of its readable values (``step``, ``tok_s``, and the keys named in
    ``extra_regexes``; an unreadable value is a problem) and read by a ``LogAnalysis`` of fixed
    patterns (``record_log``): a record with a readable tok/s is a throughput line.

    Progress - steps, tok/s, named figures, ``line_count``, ``ready_count`` and whatever else the
    Judge reads - comes from the records once the source has one, else from the plain lines: a
    source without records reads exactly as ``LogAnalysis`` reads it. ``ready_line``,
    ``progress_line`` and the progress-like lines are shown as the source has them (a record's own
    text, not its rendering). ``lines`` / ``tail`` (the plain lines as ``LogAnalysis`` keeps them
    and the records as written, in order), ``errors`` (the error patterns over every line, a
    record's text too, in order), ``reason`` and ``problems`` cover both; ``records`` counts the
    records; ``marker``: the start marker's fields (``StartLog``; None for a progress file, whose
    start the launcher's log names).
    """

    def __init__(self, ready_regex=DEFAULT_READY_REGEX, step_regex=DEFAULT_STEP_REGEX,
                 tokps_regex=DEFAULT_TOKPS_REGEX, error_regexes=DEFAULT_ERROR_REGEXES,
                 keep_lines=DEFAULT_KEEP_LINES, marker=None, extra_regexes=None, bound=None):
        extra_regexes = extra_regexes or {}
        self.bound = bound if bound is not None else LineBound()
        self.marker = marker
        self.text = LogAnalysis(ready_regex=ready_regex, step_regex=step_regex, tokps_regex=tokps_regex,
                                error_regexes=error_regexes, keep_lines=keep_lines, marker=marker,
                                extra_regexes=extra_regexes, bound=self.bound)
        self.record_log = LogAnalysis(
            ready_regex=RECORD_READY_RE, step_regex=RECORD_STEP_RE, tokps_regex=_record_figure_re("tok/s"),
            error_regexes=(), keep_lines=1,
            extra_regexes=dict((name, _record_figure_re(name)) for name in extra_regexes))
        self.extra_names = list(extra_regexes)
        self.error_res = self.text.error_res
        # one tail for both kinds of line: the plain lines' analysis keeps it, the records join it
        self.lines = self.text.lines
        self.records = 0
        self._ready_raw = None
        self._progress_raw = None
        self._like_first_raw = None
        self._like_last_raw = None
        self._record_line = None   # the last record (as the reason reads a line)
        self._record_after = None  # how many plain lines came before it

    @property
    def source(self):
        """The analysis progress comes from."""
        return self.record_log if self.records else self.text

    def add(self, line):
        """Read one line (RegexTimeout as ``LogAnalysis.add``)."""
        record = json_record(line)
        if record is None:
            self.text.add(line)
            return self
        text = line.rstrip("\r\n")
        self.records += 1
        self.lines.append(text)
        self._record_line = text[:MATCH_CHARS].strip()
        self._record_after = self.text.line_count
        log = self.record_log
        before = (log.ready_count, log.progress_line, log.progress_like_line, log.last_progress_like_line)
        log.add(self._render(record, text))
        if log.ready_count != before[0]:
            self._ready_raw = text
        if log.progress_line is not None and (log.progress_line is not before[1] or self._progress_raw is None):
            self._progress_raw = text
        if log.progress_like_line is not None and before[2] is None:
            self._like_first_raw = text
        if log.last_progress_like_line is not None and log.last_progress_like_line is not before[3]:
            self._like_last_raw = text
        # the error patterns read the record's text as they read a plain line: its first MATCH_CHARS
        # characters, under the line's time bound (LineBound); a hit joins the plain lines' errors
        at = [None]
        try:
            with self.bound.line(lambda: at[0]):
                for i, rx in enumerate(self.error_res):
                    at[0] = ("trainer_error_regexes[%d]" % i, rx.pattern)
                    if rx.search(text[:MATCH_CHARS]):
                        self.text.errors.append((rx.pattern, text))
                        break
        except RegexTimeout as exc:
            raise exc.at(self.text.line_count + self.records, text)
        return self

    def extend(self, lines):
        for line in lines:
            self.add(line)
        return self

    def _render(self, record, text):
        """``step=N tok/s=X name=V`` of a record's readable values (an unreadable one is a problem)."""
        parts = []
        step, problem = record_number(record.get("step"), whole=True)
        if problem is not None:
            self.text._problem("step", problem, text)
            parts.append("step=?")
        else:
            parts.append("step=%d" % step)
        for key, name in [("tok_s", "tok/s")] + [(n, n) for n in self.extra_names]:
            if record.get(key) is None:
                continue
            value, problem = record_number(record[key])
            if problem is not None:
                self.text._problem(name, problem, text)
            else:
                parts.append("%s=%r" % (name, value))
        return " ".join(parts)

    # -- what the Judge reads ------------------------------------------------------------------
    @property
    def ready_line(self):
        return self._ready_raw if self.records else self.text.ready_line

    @property
    def progress_line(self):
        return self._progress_raw if self.records else self.text.progress_line

    @property
    def progress_like_line(self):
        return self._like_first_raw if self.records else self.text.progress_like_line

    @property
    def last_progress_like_line(self):
        return self._like_last_raw if self.records else self.text.last_progress_like_line

    @property
    def errors(self):
        return self.text.errors

    @property
    def first_error(self):
        return self.text.first_error

    @property
    def problems(self):
        if not self.record_log.problems:
            return self.text.problems
        return (list(self.text.problems) + list(self.record_log.problems))[:MAX_PROBLEMS]

    @property
    def reason(self):
        """The last ``...Error: msg`` line (never a record), else the last non-empty line."""
        text = self.text
        if not self.records or text._last_reason:
            return text.reason
        if text._last_nonempty_at is not None and text._last_nonempty_at > self._record_after:
            return text._last_nonempty
        return self._record_line

    def tail(self, n):
        return tail(self.lines, n)

    def __getattr__(self, name):
        if name in ("text", "record_log", "records"):
            raise AttributeError(name)
        return getattr(self.source, name)


def this_start(text, invocation_id):
    """(marker fields or None, [lines]) of the start with ``invocation_id`` in ``text``."""
    follower = StartLog(invocation_id, keep_lines=None)
    follower.feed(text)
    follower.finish()
    return follower.marker, list(follower.analysis.lines) if follower.marker else []


def analyze(lines, **kwargs):
    """``lines`` read as plain lines by the regexes alone (``LogAnalysis``; ``ProgressAnalysis``
    reads JSONL records too)."""
    return LogAnalysis(**kwargs).extend(lines)


# "\r\n", "\n", or a lone "\r" (tqdm's redraw); a "\r" at the very end may be half of a "\r\n"
LINE_END = re.compile(r"\r\n|\n|\r(?!\Z)")


class StartLog(object):
    """Follow a log incrementally and keep the analysis of one invocation's start.

    ``feed(chunk)`` takes text as read from the file (partial last lines are kept until their
    end arrives). A line ends at "\n", "\r\n" or a lone "\r": tqdm redraws its bar after "\r"
    without a newline, and each redraw is a line (a "\r" at the end of a chunk waits for the next
    one, which may begin with its "\n"). A marker with our invocation resets the analysis (the last such marker
    wins; ``analysis`` is a ``ProgressAnalysis`` carrying the marker's fields as ``marker``: the
    plain lines and the JSONL records of this start are read as a progress file's are); any other
    marker ends our start. ``truncated()`` is for a log that shrank or was
    replaced: the pending partial line is dropped and reading goes on from the file's start;
    lines without a marker still belong to our start if we were in it.
    """

    def __init__(self, invocation_id, **analysis_kwargs):
        self.invocation_id = invocation_id
        self._kwargs = analysis_kwargs
        self.marker = None
        self.in_start = False
        self.ended = False
        self.analysis = ProgressAnalysis(**analysis_kwargs)
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
                self.analysis = ProgressAnalysis(marker=marker, **self._kwargs)
            elif self.in_start:
                self.in_start = False
                self.ended = True
            return
        if self.in_start:
            self.analysis.add(line)
