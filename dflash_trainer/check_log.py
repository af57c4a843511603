"""dflash-trainer check-log: replay a captured log through the readiness proof's judge, offline.

The proof (the restart job on the target) polls the unit, the GPUs and this start's log and hands
each poll to ``proof.readiness.Judge``; the log is read by ``proof.trainer_log.StartLog``. Here the same two
are fed from a file, with the variables a deploy would use (the role defaults of the collection
that the CLI runs, read at run time, plus ``-e``), so that the regexes and windows can be fitted
to a trainer in seconds, without a deploy:

- the clock is simulated: each line arrives ``line_interval_s`` after the one before it, or at
  the time its own timestamp says (ISO dates, TorchTitan's asctime, Megatron's ``[date]``, the
  journal's prefixes); the judge polls every ``trainer_ready_interval_s`` as the proof does;
- the unit and the GPUs are synthetic and healthy (unit active/running, one invocation id, no
  restart; every GPU of ``trainer_gpus`` at ``trainer_gpu_min_mib``): only the log decides;
- a log without a dflash start marker (a capture usually has none) is all this start's: the
  marker is synthesised before its first line; a log with markers (a copy of the trainer's log
  file) is judged for its last start, or the one named;
- after the last line the trainer goes on printing nothing (``at_end="hang"``) or exits
  (``at_end="exit"``).

The result (``Replay``) holds what was read from each line (step and its total, tok/s, a match of
the ready regex, an error pattern hit, a reason line), the verdict the proof would reach and at
which line, and which variable to change. Nothing here runs Ansible or touches a target.
"""
from __future__ import annotations

import calendar
import collections
import difflib
import importlib
import math
import os
import re
import shlex
import stat
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from . import api

DEFAULT_LINE_INTERVAL_S = 0.5   # as often as the proof polls by default: each poll sees one new line
CHECK_INVOCATION = "0" * 24 + "c4ec4109"  # the synthesised start's invocation id (32 hex digits)
MAIN_PID = 4242
ERROR_EXIT_GRACE_S = 1.0  # the proof's wait for a process that logged an error to exit (job.cycle)

# the options of the proof's run besides the judge's settings (the collection's
# proof.readiness.PROOF_SETTINGS, see proof_variables) and the role variables the role passes them
RUN_VARIABLES = (
    ("gpus", "trainer_gpus"),
    ("measure_s", "trainer_measure_s"),
    ("measure_regexes", "trainer_measure_regexes"),
)


def proof_variables(coll) -> tuple:
    """((option, role variable), ...) check-log reads: every setting of the collection's judge (its one
    table, proof.readiness.PROOF_SETTINGS), then RUN_VARIABLES."""
    return tuple((name, var) for name, (var, _kind, _default) in coll.readiness.PROOF_SETTINGS.items()) + RUN_VARIABLES


class BadInput(Exception):
    """Input check-log cannot judge (a file, a variable, an option); exit status 2."""


# --- the collection: where its defaults and its judge are ----------------------------------------

@dataclass
class Collection:
    root: str
    trainer_log: Any
    readiness: Any
    validate: Any
    throughput: Any
    systemd: Any
    target_checks: Any


def collection_root(environ=None) -> str:
    """The collection the CLI runs: this checkout, else the installed one (as api finds it)."""
    if api.is_collection_root(os.path.abspath(api.REPO_ROOT)):
        return os.path.abspath(api.REPO_ROOT)
    environ = os.environ if environ is None else environ
    paths, _checking = api.ansible_settings(api.find_config_file(os.getcwd(), environ), environ)
    return api.collection_root(paths, api.REPO_ROOT)


def load_collection(root: Optional[str] = None) -> Collection:
    """Import the proof's log reader and judge from the collection at ROOT (as Ansible would load
    them: ``ansible_collections.dflash.trainer.plugins``)."""
    try:
        root = os.path.abspath(root or collection_root())
    except FileNotFoundError as e:
        raise BadInput(str(e)) from None
    parts = os.path.normpath(root).split(os.sep)
    if parts[-3:] == ["ansible_collections", "dflash", "trainer"]:
        base = os.sep.join(parts[:-3]) or os.sep
    else:  # a checkout: its collections/ links back to it
        base = os.path.join(root, "collections")
    if base not in sys.path:
        sys.path.insert(0, base)
    prefix = "ansible_collections.dflash.trainer.plugins."
    mods = [importlib.import_module(prefix + name)
            for name in ("module_utils.proof.trainer_log", "module_utils.proof.readiness", "plugin_utils._validate",
                         "module_utils.proof.throughput", "module_utils.target.systemd", "module_utils.plan.target_checks")]
    return Collection(root, *mods)


def role_defaults(root: str) -> dict:
    import yaml
    path = os.path.join(root, "roles", "trainer", "defaults", "main.yml")
    with open(path) as fh:
        return yaml.safe_load(fh) or {}


def proof_settings(coll: Collection, extravars: dict) -> tuple[dict, dict, list]:
    """(the proof's options, the role variables they came from, notes) from the role defaults and
    EXTRAVARS (-e); BadInput naming the variable when the deploy would refuse one."""
    defaults = role_defaults(coll.root)
    notes = []
    proof = [var for _opt, var in proof_variables(coll)]
    for name in sorted(k for k in extravars if k.startswith("trainer_") and k not in defaults):
        close = difflib.get_close_matches(name, proof, n=1, cutoff=0.85)
        if close:  # a typo of a variable that decides the verdict must not pass unnoticed
            raise BadInput("-e %s: the role has no such variable (did you mean %s?)" % (name, close[0]))
    variables = dict((var, extravars.get(var, defaults.get(var))) for var in proof)
    ignored = sorted(k for k in extravars if k not in proof)
    if ignored:
        notes.append("not used by check-log (only the proof's log variables are): %s" % ", ".join(ignored))
    return settings(coll, variables) + (notes,)


def settings(coll: Collection, variables: dict) -> tuple[dict, dict]:
    """(the proof's options, VARIABLES) for the role VARIABLES of the proof; BadInput as the deploy refuses."""
    problems = coll.validate.check(variables, "restart")
    if problems:
        raise BadInput("the deploy would refuse these variables (%d problem%s):\n%s" % (
            len(problems), "" if len(problems) == 1 else "s", "\n".join("- %s" % p for p in problems)))
    judged = dict((name, variables[var]) for name, (var, _kind, _default) in coll.readiness.PROOF_SETTINGS.items())
    try:
        opts = coll.readiness.proof_options(judged)
    except ValueError as e:
        raise BadInput(str(e)) from None
    opts["gpus"] = coll.target_checks.gpu_indexes(variables["trainer_gpus"])
    measure_s = variables["trainer_measure_s"]
    opts["measure_s"] = float(measure_s) if measure_s not in (None, "", 0, "0") else None
    opts["measure_regexes"] = dict(variables["trainer_measure_regexes"] or {})
    return opts, variables


# --- the captured log: lines and their clock ------------------------------------------------------

_MONTHS = dict((m, i + 1) for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()))
_ISO = r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(?:Z|[+-]\d\d:?\d\d)?"
_SYSLOG = r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?"
_MONO = r"\[\s*(\d+\.\d+)\]"
ISO_RE = re.compile(_ISO)
SYSLOG_RE = re.compile(r"(?<![A-Za-z])" + _SYSLOG)
# journalctl's prefixes: -o short / short-precise / short-iso / short-iso-precise / short-monotonic,
# then "HOST IDENT[PID]: "
JOURNAL_RE = re.compile(r"^(?:%s|%s|%s) \S+ [^\s\[\]:]+(?:\[\d+\])?: ?" % (_SYSLOG, _ISO, _MONO))
JOURNAL_META_RE = re.compile(r"^-- (?:No entries|Boot |Logs begin|Journal begins|Reboot).*")
TIMESTAMP_SEARCH_CHARS = 80


def _seconds(y, mo, d, h, mi, s, frac) -> float:
    return calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) + (float("0." + frac) if frac else 0.0)


def timestamp(text: str) -> Optional[float]:
    """Seconds (of an arbitrary epoch) from a date-time near the start of TEXT: ISO 8601 (also
    with a space and a comma: Python logging's asctime), or the syslog form (no year); None when
    there is none."""
    head = text[:TIMESTAMP_SEARCH_CHARS]
    found = []
    m = ISO_RE.search(head)
    if m:
        g = m.groups()
        found.append((m.start(), _seconds(int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]), int(g[5]), g[6])))
    m = SYSLOG_RE.search(head)
    if m:
        g = m.groups()
        found.append((m.start(), _seconds(2000, _MONTHS[g[0]], int(g[1]), int(g[2]), int(g[3]), int(g[4]), g[5])))
    if not found:
        return None
    try:
        return min(found)[1]
    except (OverflowError, ValueError):
        return None


def journal_prefix(text: str) -> tuple[str, Optional[float], bool]:
    """(the line without journalctl's prefix, the prefix's time or None, whether it had one)."""
    m = JOURNAL_RE.match(text)
    if not m:
        return text, None, False
    prefix = m.group(0)
    mono = re.match(_MONO, prefix)
    t = float(mono.group(1)) if mono else timestamp(prefix)
    return text[m.end():], t, True


def split_lines(text: str, line_end) -> list[tuple[str, int]]:
    """[(line, file line number)] as StartLog reads TEXT: "\\n", "\\r\\n" and a lone "\\r" (tqdm's
    redraw) end a line; a last line without an end counts too (the file is complete)."""
    out = []
    file_line = 1
    pos = 0
    for m in line_end.finditer(text):
        out.append((text[pos:m.start()], file_line))
        if m.group(0) != "\r":
            file_line += 1
        pos = m.end()
    rest = text[pos:].rstrip("\r")
    if rest:
        out.append((rest, file_line))
    return out


# The most of a log check-log reads: a replay of a log this large already takes minutes, and a
# larger one is cut by the user (`tail -c 256M`), never read until memory runs out.
MAX_LOG_BYTES = 256 * 1024 * 1024
READ_CHUNK = 1024 * 1024


def _read_bounded(fh, path: str) -> bytes:
    chunks, size = [], 0
    while True:
        chunk = fh.read(READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_LOG_BYTES:
            raise BadInput("%s is larger than %d MiB: give check-log its last part (tail -c %dM %s > part.log)"
                           % (path, MAX_LOG_BYTES >> 20, MAX_LOG_BYTES >> 20, path))
        chunks.append(chunk)


def read_text(path: str) -> str:
    """The log at PATH ('-': standard input) as text: a regular file (never a FIFO or a device,
    which could block or never end: opened without blocking, then refused), read in bounded
    chunks up to MAX_LOG_BYTES."""
    try:
        if path == "-":
            data = _read_bounded(sys.stdin.buffer, "standard input")
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise BadInput("%s is not a regular file (a FIFO, device or directory): check-log reads a "
                               "log file, or standard input with '-'" % path)
            with os.fdopen(fd, "rb") as fh:
                data = _read_bounded(fh, path)
    except OSError as e:
        raise BadInput("cannot read the log %s: %s" % (path, e.strerror or e)) from None
    if b"\0" in data[:65536]:
        raise BadInput("%s is not a text log (it holds NUL bytes)" % path)
    return data.decode("utf-8", errors="replace")


_RANK_PREFIX = re.compile(r"^\s*(?:\[(?:rank|default)\d*\]:?\s?)")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def bursts(texts: list) -> list:
    """For each line, the index of the first line of the burst it arrives with (its own index for
    most): a Python traceback - "Traceback (most recent call last):" through its exception line,
    chained tracebacks included, with or without torchrun's "[rankN]:" prefix - is printed at once."""
    out = list(range(len(texts)))
    i = 0
    while i < len(texts):
        body = _RANK_PREFIX.sub("", texts[i], count=1)
        if not body.startswith("Traceback (most recent call last)"):
            i += 1
            continue
        first, j = i, i + 1
        while j < len(texts):
            body = _RANK_PREFIX.sub("", texts[j], count=1)
            out[j] = first
            if body[:1].isspace() or body.startswith(("Traceback (most recent call last)",) + _CHAINED) \
                    or not body.strip():
                j += 1
                continue
            break  # the exception line ends it
        i = j + 1
    return out


def clock_times(stamps: list, interval: float, mode: str, groups: Optional[list] = None) -> tuple[list, str]:
    """Arrival times of the start's lines (seconds after the start) and the clock used.

    interval: line i arrives at (i + 1) * interval. timestamps: from the lines' own times, relative
    to the first stamped line (which arrives at its place in the interval clock); a line without
    one arrives between its stamped neighbours (evenly), after the last one at the interval; time
    never goes back. auto: timestamps when at least half of the lines have one."""
    n = len(stamps)
    have = [i for i, s in enumerate(stamps) if s is not None]
    use = mode == "timestamps" or (mode == "auto" and n and len(have) * 2 >= n and len(have) >= 2)
    if mode == "timestamps" and not have:
        raise BadInput("--clock timestamps: no line of this start carries a date-time")
    if not use:
        times, slot = [], 0
        for i in range(n):
            if groups is None or groups[i] == i:
                slot += 1  # a new arrival; a burst's lines come with its first
            times.append(slot * interval)
        return times, "interval"
    times = [None] * n
    first = have[0]
    base = (first + 1) * interval
    last_t = 0.0
    for i in range(first):
        times[i] = (i + 1) * interval
    for i in have:
        last_t = max(last_t, base + stamps[i] - stamps[first])
        times[i] = last_t
    for a, b in zip(have, have[1:]):  # lines between two stamped ones: evenly in between
        for k in range(a + 1, b):
            times[k] = times[a] + (times[b] - times[a]) * (k - a) / (b - a)
    for i in range(have[-1] + 1, n):
        times[i] = times[have[-1]] + (i - have[-1]) * interval
    return times, "timestamps"


# --- what each line shows -------------------------------------------------------------------------

# words around a number that look like progress (only for hints: the verdict is the Judge's)
PROGRESS_WORDS = re.compile(r"(?i)(?<![A-Za-z])(tps|tok(?:en)?s?(?:/s)?|throughput|samples?/s|it/s|s/it|"
                            r"global_step|step|iteration|iter|epoch|batch|loss|lr|learning_rate)(?![A-Za-z])")
_READY_CANDIDATES = ("tps", "tokens", "tok/s", "throughput", "samples/s", "it/s", "s/it", "loss", "iteration",
                     "iter", "step", "global_step", "epoch")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class LineReading:
    n: int                      # the line as the proof reads it (a "\r" redraw is a line), from 1
    file_line: int              # the newline-ended line of the file it is in, from 1
    text: str
    t: Optional[float] = None   # arrival in the replay (s after the start); None: not this start's
    ours: bool = False          # a line of the judged start
    marker: bool = False        # a dflash start marker
    step: Optional[int] = None
    total: Optional[int] = None
    step_counted: bool = False  # a new high of the progress counter
    step_note: Optional[str] = None
    tok_s: Optional[float] = None
    figure_problem: Optional[str] = None
    ready: bool = False         # matches trainer_ready_regex
    error: Optional[str] = None  # the trainer_error_regexes pattern it hit
    reason: bool = False        # an "...Error: message" line
    progress_like: bool = False  # looks like progress and none of the regexes read it (a hint)
    after_verdict: bool = False

    def words(self) -> str:
        if self.marker:
            return "start marker"
        if not self.ours:
            return "(not this start's)"
        parts = []
        if self.step is not None:
            parts.append("step %s%s%s" % (self.step, "/%s" % self.total if self.total is not None else "",
                                          "" if self.step_counted else " (%s)" % (self.step_note or "not counted")))
        if self.tok_s is not None:
            parts.append("tok/s %s" % _fmt_num(self.tok_s))
        if self.figure_problem:
            parts.append("unreadable: %s" % self.figure_problem)
        if self.ready:
            parts.append("ready-line")
        if self.error:
            parts.append("ERROR")
        elif self.reason:
            parts.append("reason")
        if self.progress_like:
            parts.append("progress-like?")
        return " · ".join(parts) or "-"

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _fmt_num(value) -> str:
    return ("%d" % value) if float(value).is_integer() else ("%.1f" % value)


def _fmt_s(value) -> str:
    if value is None:
        return "?"
    return ("%d" % value) if float(value).is_integer() else ("%.1f" % value)


def shown(text: str, width: int = 0) -> str:
    """TEXT with control characters (ANSI colour codes included) written as \\xNN."""
    out = "".join(c if 32 <= ord(c) != 127 else "\\x%02x" % ord(c) for c in text)
    if width and len(out) > width:
        out = out[:width - 1] + "…"
    return out


class _Unbounded(object):
    """A collection whose log reader has no ``LineBound``: its lines are searched without a time bound."""

    def line(self, _where):
        import contextlib
        return contextlib.nullcontext()


class LineReader(object):
    """What one line showed the proof's log reader: the change it made to the analysis (a new
    step high, a tok/s figure, a ready line, an error), plus the step value the step regex reads
    from the line (the reader may take it for another counter than the one it follows)."""

    def __init__(self, coll: Collection, opts: dict):
        self.T = coll.trainer_log
        self.step_re = re.compile(opts["step_regex"])
        self.bound = self.T.LineBound() if hasattr(self.T, "LineBound") else _Unbounded()
        self.strip = getattr(self.T, "strip_ansi", lambda line: line)
        self.looks = getattr(self.T, "looks_like_progress", None)
        # a JSONL record ({"step": N, ...}) is read by its keys, not by the regexes (a collection that has it)
        self.record = getattr(self.T, "json_record", None)

    @staticmethod
    def state(a) -> tuple:
        return (a.n_steps, getattr(a, "ready_count", 0), len(getattr(a, "tokps_values", [])),
                len(getattr(a, "errors", [])), len(getattr(a, "problems", [])))

    def read(self, r: LineReading, a, before: Optional[tuple]) -> None:
        after = self.state(a)
        before = before if before is not None else after
        text = self.strip(r.text)
        r.step_counted = after[0] > before[0]
        # as the proof's reader searches a line: its first MATCH_CHARS characters, under the line's time bound
        with self.bound.line(lambda: ("trainer_step_regex", self.step_re.pattern)):
            m = self.step_re.search(text[:getattr(self.T, "MATCH_CHARS", len(text))])
        if m:
            step, total, problem = self.T.step_value(m)
            if problem is None:
                r.step, r.total = step, total
                if not r.step_counted:
                    counter = getattr(a, "counter", None)
                    r.step_note = ("not above the highest step" if a.last_step == step and counter is not None
                                   else "another counter; the proof follows %s" % (
                                       " ".join(counter[0]) + ("/%s" % counter[1] if counter[1] else "")
                                       if counter else "none yet") if counter is not None or a.n_steps
                                   else "not counted")
        record = self.record(r.text) if self.record is not None else None
        if record is not None:
            step, problem = self.T.record_number(record.get("step"), whole=True)
            r.step, r.total = (step, None) if problem is None else (None, None)
            r.step_note = None if r.step_counted or r.step is None else "not above the highest step"
        if after[2] > before[2]:
            value = a.tokps_values[-1]
            if value is not None:
                r.tok_s = value
        if after[4] > before[4]:
            r.figure_problem = a.problems[-1].split(" in line ")[0]
        r.ready = after[1] > before[1]
        if after[3] > before[3]:
            r.error = a.errors[-1][0]
        r.reason = bool(self.T.is_reason_line(text))
        if not (r.ready or r.step is not None or r.tok_s is not None):
            r.progress_like = bool(self.looks(text)) if self.looks else bool(
                re.search(r"\d", text) and PROGRESS_WORDS.search(text))


# --- the replay -----------------------------------------------------------------------------------

READY, FAILED, NEVER_READY = "ready", "failed", "never ready"


@dataclass
class Replay:
    source: str
    opts: dict
    variables: dict
    lines: list
    clock: str
    line_interval_s: float
    at_end: str
    start_words: str
    invocation: str
    state: str = NEVER_READY
    reason: str = ""
    at_line: Optional[int] = None     # the last line read when the verdict came
    at_t: Optional[float] = None
    details: dict = field(default_factory=dict)
    error_line: Optional[int] = None
    last_line: Optional[int] = None   # the start's last line, and when it arrived
    last_t: Optional[float] = None
    polls: int = 0
    measured: Optional[dict] = None
    exited: bool = False              # the synthetic unit had exited when the verdict came
    went_back: Any = None             # the log reader's (from, to) when the step went back
    advice: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    journal: bool = False
    redraws: int = 0

    @property
    def ok(self) -> bool:
        return self.state == READY

    @property
    def exit_code(self) -> int:
        """check-log's exit status: 0 the proof would pass, 1 it would fail (2, bad input, is BadInput)."""
        return 0 if self.ok else 1

    def as_dict(self) -> dict:
        return dict(
            source=self.source, ok=self.ok, clock=self.clock, line_interval_s=self.line_interval_s, at_end=self.at_end,
            start=self.start_words, invocation=self.invocation, variables=self.variables,
            verdict=dict(state=self.state, reason=self.reason, line=self.at_line, t=self.at_t,
                         error_line=self.error_line, details=self.details),
            last_line=self.last_line, last_t=self.last_t, polls=self.polls, measured=self.measured,
            exited=self.exited, went_back=list(self.went_back) if self.went_back else None,
            advice=self.advice, notes=self.notes, journal_prefixes=self.journal, redraws=self.redraws,
            lines=[r.as_dict() for r in self.lines])


def _unit(invocation: str, exited_at: Optional[float], exit_status: int, systemd) -> dict:
    props = {"ActiveState": "active", "SubState": "running", "InvocationID": invocation, "NRestarts": "0",
             "MainPID": str(MAIN_PID), "Result": "success", "ExecMainStartTimestampMonotonic": "1000000",
             "ExecMainCode": "0", "ExecMainStatus": "0"}
    if exited_at is not None:
        props.update(ActiveState="inactive" if exit_status == 0 else "failed",
                     SubState="dead" if exit_status == 0 else "failed", MainPID="0",
                     Result="success" if exit_status == 0 else "exit-code",
                     ExecMainCode=str(getattr(systemd, "CLD_EXITED", 1)), ExecMainStatus=str(exit_status),
                     ExecMainExitTimestampMonotonic=str(int(1000000 + exited_at * 1e6)))
    return props


def _choose_start(coll, texts, start):
    """(invocation, index of its marker or None to synthesise one, words)."""
    markers = []
    for i, text in enumerate(texts):
        fields = coll.trainer_log.parse_marker(text)
        if fields is not None and not coll.trainer_log.is_continuation(fields):
            markers.append((i, fields))
    if start:
        chosen = [(i, f) for i, f in markers if f.get("invocation") == start]
        if not chosen:
            raise BadInput("--start %s: no start marker with that invocation in the log (it has %s)" % (
                start, ", ".join(f["invocation"] for _i, f in markers) or "none"))
        i, f = chosen[-1]
        return start, i, "the start %s (release %s, marker at line %d)" % (start, f.get("release"), i + 1)
    if not markers:
        return CHECK_INVOCATION, None, ("no dflash start marker in the log: every line is this start's "
                                        "(a marker was synthesised before line 1)")
    i, f = markers[-1]
    words = "the last start in the log: %s (release %s, marker at line %d)" % (f["invocation"], f.get("release"), i + 1)
    if len(markers) > 1:
        words += "; %d starts in all, --start INVOCATION picks another" % len(markers)
    return f["invocation"], i, words


def replay(coll: Collection, text: str, opts: dict, variables: Optional[dict] = None, source: str = "log",
           line_interval_s: float = DEFAULT_LINE_INTERVAL_S, clock: str = "auto", at_end: str = "hang",
           exit_status: int = 1, start: Optional[str] = None, what_if: bool = True) -> Replay:
    """Feed TEXT (a captured log) to StartLog and the Judge on a simulated clock; see the module."""
    if line_interval_s <= 0 or not math.isfinite(line_interval_s):
        raise BadInput("--line-interval-s: expected a number of seconds above 0, got %r" % line_interval_s)
    T, R = coll.trainer_log, coll.readiness
    raw = split_lines(text, T.LINE_END)
    readings, stamps, journal = [], [], False
    for n, (line, file_line) in enumerate(raw, 1):
        body, t, had = journal_prefix(line)
        journal = journal or had
        if had and JOURNAL_META_RE.match(body):
            continue
        readings.append(LineReading(n=n, file_line=file_line, text=body))
        stamps.append(t if t is not None else timestamp(body))
    invocation, marker_at, start_words = _choose_start(coll, [r.text for r in readings], start)
    first = 0 if marker_at is None else marker_at + 1
    ours_end = len(readings)
    for j in range(first, len(readings)):  # another start's marker ends ours
        fields = T.parse_marker(readings[j].text)
        if fields is not None and fields.get("invocation") != invocation:
            ours_end = j
            break
    ours = readings[first:ours_end]
    groups = bursts([r.text for r in readings[first:ours_end]])
    times, used_clock = clock_times(stamps[first:ours_end], line_interval_s, clock, groups)
    for r, t in zip(ours, times):
        r.t, r.ours = t, True
    for r in readings:
        r.marker = T.parse_marker(r.text) is not None

    expect = R.expectations(invocation, 0, opts, gpus=opts["gpus"])
    try:
        judge = R.Judge(expect, start=0.0)
    except ValueError as e:
        raise BadInput(str(e)) from None
    follower = T.StartLog(invocation, ready_regex=opts["ready_regex"], step_regex=opts["step_regex"],
                          tokps_regex=opts["tokps_regex"], error_regexes=opts["error_regexes"],
                          extra_regexes=opts.get("measure_regexes") or None)
    if marker_at is None:
        follower.feed(T.marker_line(invocation, "captured-log", MAIN_PID, "1970-01-01T00:00:00+00:00") + "\n")
    reader = LineReader(coll, opts)
    result = Replay(source=source, opts=opts, variables=dict(variables or {}), lines=readings, clock=used_clock,
                    line_interval_s=line_interval_s, at_end=at_end, start_words=start_words, invocation=invocation,
                    journal=journal, redraws=sum(1 for a, b in zip(raw, raw[1:]) if a[1] == b[1]))
    if ours:
        result.last_line, result.last_t = ours[-1].n, ours[-1].t
    end_t = ours[-1].t if ours else 0.0
    gpus_mib = dict((i, opts["min_mib"]) for i in opts["gpus"])

    pending = collections.deque(range(len(readings)))
    # when each line reaches the log: before our start at once, ours on the clock, after it never
    arrive = [0.0] * first + times + [math.inf] * (len(readings) - ours_end)

    feeding = [None]  # the line being read

    def feed_one(i, after=False):
        r = feeding[0] = readings[i]
        analysis = follower.analysis
        before = reader.state(analysis) if follower.in_start else None
        follower.feed(r.text + "\n")
        if r.ours and not r.marker and follower.in_start:
            reader.read(r, follower.analysis, before if follower.analysis is analysis else None)
        r.after_verdict = after

    last_fed = [None]

    def feed_until(now):
        while pending and arrive[pending[0]] <= now + 1e-9:
            i = pending.popleft()
            feed_one(i)
            if readings[i].ours:
                last_fed[0] = readings[i]

    extra_s = max(0.0, (opts.get("measure_s") or 0) - opts["hold_s"])
    interval = opts["interval_s"]
    now, k, ready_at, until, verdict = 0.0, 0, None, None, None
    regex_timeout = getattr(T, "RegexTimeout", None)  # (a collection before the bound has none)
    caught = (regex_timeout,) if regex_timeout is not None else ()
    timed_out = None  # the user's regex that ran past a line's bound (the proof stops reading there)
    try:
        while True:
            feed_until(now)
            exited = at_end == "exit" and not any(arrive[i] < math.inf for i in pending) and now >= end_t
            if exited:
                follower.finish()
            snap = R.Snapshot(now=now, unit=_unit(invocation, end_t if exited else None, exit_status, coll.systemd),
                              gpus_mib=gpus_mib, log=follower.analysis)
            verdict = judge.observe(snap)
            result.polls += 1
            if verdict.state == R.READY and ready_at is None:
                ready_at, until = (now, last_fed[0], verdict), now + extra_s
            if verdict.state == R.FAILED and getattr(follower.analysis, "errors", None) and not exited:
                # as the proof does: an error's verdict is taken again once the process had a moment to
                # exit, so that it carries the reason line printed after the error
                now += ERROR_EXIT_GRACE_S
                feed_until(now)
                exited = at_end == "exit" and not any(arrive[i] < math.inf for i in pending) and now >= end_t
                if exited:
                    follower.finish()
                verdict = judge.observe(R.Snapshot(
                    now=now, unit=_unit(invocation, end_t if exited else None, exit_status, coll.systemd),
                    gpus_mib=gpus_mib, log=follower.analysis))
                result.polls += 1
            if verdict.state == R.FAILED or (ready_at is not None and now >= until):
                break
            k += 1
            nxt = k * interval
            if ready_at is None:
                deadline = judge.deadline
                quiet = not any(arrive[i] < math.inf for i in pending)
                if quiet and at_end == "hang" and nxt > end_t + opts["hold_s"] + opts["stall_s"] + 2 * interval:
                    nxt = max(nxt, deadline)  # nothing can change any more but the deadline
                nxt = min(nxt, deadline)
                if nxt <= now:
                    break  # the judge did not decide at its deadline: never loop
            now = nxt
            k = max(k, int(now / interval))

    except caught as exc:
        timed_out = exc

    at = last_fed[0]
    result.exited = exited
    result.went_back = getattr(follower.analysis, "went_back", None)
    if timed_out is not None:
        at = feeding[0]
        result.state, result.reason = FAILED, "the proof stopped reading the log: %s" % timed_out
        result.details = dict(regex=timed_out.label, pattern=timed_out.pattern)
        for i in pending:  # the rest of the log is not read: the same regex would search it
            readings[i].after_verdict = True
        pending.clear()
    elif verdict.state == R.FAILED:
        missing = (verdict.details or {}).get("missing")
        result.state = NEVER_READY if missing is not None and ready_at is None else FAILED
        result.reason = verdict.reason
        if ready_at is not None:
            result.reason = "after it was proved ready, during the throughput measurement: " + verdict.reason
        result.details = dict(verdict.details or {})
    elif ready_at is not None:
        now_ready, at, v = ready_at
        result.state, result.reason, result.details = READY, v.reason, dict(v.details or {})
    else:
        result.state, result.reason = NEVER_READY, verdict.reason
    # a verdict after READY (the measurement's) keeps the line and time of READY
    result.at_line = at.n if at is not None else None
    result.at_t = ready_at[0] if ready_at is not None and result.state == READY else now
    if ready_at is not None:  # tok/s over the last window, as the proof measures it (at its end)
        window = float(opts.get("measure_s") or opts["hold_s"])
        tok = [r.tok_s for r in ours if r.t is not None and now - window <= r.t <= now and r.tok_s is not None]
        result.measured = coll.throughput.summarize(tok, window)
    errors = [r for r in ours if r.error and r.t is not None and r.t <= now + 1e-9]
    result.error_line = errors[0].n if errors else None
    # the rest of the log: read for the user (the proof has stopped)
    while pending:
        feed_one(pending.popleft(), after=True)
    result.advice = advise(result, ours)
    if timed_out is not None:
        result.advice.insert(0, dict(variable=timed_out.label.split("[")[0], why=(
            "%s backtracks without end on line %d (a search ran past %s s): the deploy's proof stops there and "
            "fails; use a regex without nested or overlapping repeats" % (
                timed_out.pattern if isinstance(timed_out.pattern, str) else timed_out.label, at.n,
                _fmt_s(timed_out.bound_s)))))
    if what_if and not result.ok and timed_out is None:
        found = passing_change(coll, text, result, ours, dict(line_interval_s=line_interval_s, clock=clock,
                                                              at_end=at_end, exit_status=exit_status, start=start))
        if found is not None:
            result.advice.insert(0, found)
    return result


def _tries_text(change: dict) -> str:
    """-e words that give CHANGE back as ansible-playbook (and this CLI) read them: key=value where
    Ansible's parser keeps the value as it is, else a JSON object (it decodes \\b, \\n ... in key=value)."""
    import json
    from ansible.parsing.splitter import parse_kv
    words = []
    for k, v in change.items():
        text = _fmt_s(v) if isinstance(v, float) else str(v)
        try:
            plain = "'" not in text and parse_kv("%s=%s" % (k, text), check_raw=False) == {k: text}
        except Exception:
            plain = False
        words.append("-e %s" % shlex.quote("%s=%s" % (k, text) if plain else json.dumps({k: v})))
    return " ".join(words)


def _longest_gap(lines) -> tuple:
    """(seconds, line) of the longest wait for a new step high after a line that read or looked
    like progress: a pause the trainer came out of (never the silence after its last rise)."""
    best, last = (0.0, None), None
    for r in lines:
        if r.step_counted and last is not None and r.t - last.t > best[0]:
            best = (r.t - last.t, r)
        if r.step_counted or r.progress_like or r.ready:
            last = r
    return best


def passing_change(coll: Collection, text: str, result: Replay, ours: list, kwargs: dict) -> Optional[dict]:
    """The smallest change of the proof's variables (tried in replays: one variable, then two, then
    three) under which this log would pass; None when none of the candidates does."""
    o = result.opts
    single = []
    ready = _ready_candidate(ours)
    if ready and not any(r.ready for r in ours):
        single.append({"trainer_ready_regex": ready})
    step = _step_candidate([r for r in ours if r.ready or r.progress_like])
    if step and not any(r.step_counted for r in ours):
        single.append({"trainer_step_regex": step})
    gap, _line = _longest_gap(ours)
    if gap > o["stall_s"]:
        stall = float(math.ceil(gap * 1.5))
        single.append({"trainer_ready_stall_s": stall, "trainer_ready_hold_s": max(o["hold_s"], stall)})
    tries = list(single)
    for i in range(len(single)):
        for j in range(i + 1, len(single)):
            tries.append(dict(single[i], **single[j]))
    if len(single) == 3:
        tries.append(dict(single[0], **dict(single[1], **single[2])))
    for change in tries:
        variables = dict(result.variables, **change)
        try:
            opts, variables = settings(coll, variables)
            other = replay(coll, text, opts, variables, source=result.source, what_if=False, **kwargs)
        except BadInput:
            continue
        if other.ok:
            return dict(variable=", ".join(change), verified=True,
                        why="with this change the proof would pass: READY at line %s (t=%s s)" % (
                            other.at_line, _fmt_s(round(other.at_t, 3))), **{"try": _tries_text(change)})
        for a in result.advice:  # a hint that was tried alone and is not enough
            if len(change) == 1 and a.get("try") == _tries_text(change):
                a["try"] = a["try"] + "  (alone not enough: replayed, still %s)" % other.state.upper()
    return None


# --- which variable to change ---------------------------------------------------------------------

def _ready_candidate(lines) -> Optional[str]:
    """A word that appears in most progress-like lines, as a regex (a hint for trainer_ready_regex)."""
    likely = [ANSI_RE.sub("", r.text) for r in lines if r.progress_like or r.step is not None]
    if not likely:
        return None
    for word in _READY_CANDIDATES:
        rx = re.compile(r"(?<![A-Za-z])%s(?![A-Za-z])" % re.escape(word), re.I)
        hits = sum(1 for text in likely if rx.search(text))
        if hits * 2 >= len(likely):
            return r"\b%s\b" % re.escape(word) if word[-1].isalnum() else re.escape(word)
    return None


def _step_candidate(lines) -> Optional[str]:
    """A regex reading the counter after a step word in lines the step regex did not read."""
    rx = re.compile(r"(?i)(?<![A-Za-z])(global_step|step|iteration|iter)([ \t]*[:=#]?[ \t]*)(\d+)")
    for r in lines:
        if r.step is not None:
            continue
        m = rx.search(ANSI_RE.sub("", r.text))
        if m:
            sep = m.group(2).strip()
            return r"%s%s\s*(\d+)" % (m.group(1), re.escape(sep) if sep else "")
    return None


def advise(result: Replay, lines: list) -> list:
    """[{variable, why, try}] for the verdict, from what the replay read (not from the words)."""
    out = []

    def add(variable, why, try_=None):
        out.append(dict(variable=variable, why=why, **({"try": try_} if try_ else {})))

    seen = [r for r in lines if r.t is not None and (result.at_t is None or r.t <= result.at_t + 1e-9)]
    ansi = any(ANSI_RE.search(r.text) for r in lines)
    ready_lines = [r for r in seen if r.ready]
    counted = [r for r in seen if r.step_counted]
    if result.state == READY:
        if not any(r.tok_s is not None for r in seen):
            add("trainer_tokps_regex", "the proof passes but reads no tok/s: the release's throughput (the ledger, "
                "trainer_min_tokps_ratio) is not measured")
        problems = sorted({r.figure_problem for r in seen if r.figure_problem})
        if problems:
            add("trainer_tokps_regex" if "tok/s" in problems[0] else "trainer_step_regex",
                "some figures could not be read: %s" % problems[0])
        return out
    if result.error_line is not None:
        hit = next(r for r in lines if r.n == result.error_line)
        add("trainer_error_regexes", "line %d matches the error pattern %r: the proof fails on it. If the trainer "
            "really failed, the fix is in the trainer (its reason: %s); if the line is harmless, narrow "
            "trainer_error_regexes" % (hit.n, hit.error, result.details.get("reason") or result.reason))
        return out
    if result.exited:
        add("(the trainer)", "the process exited after the log's last line (--at-end exit): no variable makes "
            "that ready; --at-end hang judges a capture that was cut while the trainer ran")
        return out
    if not ready_lines:
        cand = _ready_candidate(seen)
        likely = [str(r.n) for r in seen if r.progress_like or r.step is not None]
        add("trainer_ready_regex", "no line of this start matches it (%r)%s" % (
            result.opts["ready_regex"], "; lines that look like progress: %s%s" % (
                ", ".join(likely[:8]), ", …" if len(likely) > 8 else "") if likely else ""),
            _tries_text({"trainer_ready_regex": cand}) if cand else None)
    if ready_lines and not counted and result.opts["min_steps"] > 0:
        cand = _step_candidate(ready_lines)
        why = "lines match trainer_ready_regex (line %d: `%s`) but no step value was read from them" % (
            ready_lines[0].n, shown(ready_lines[0].text, 120))
        if ansi:
            why += ("; the lines carry ANSI colour codes (\\x1b[...m): a code's last letter sits right before the "
                    "word, turn colours off in the trainer or use a regex that allows it")
        add("trainer_step_regex", why, _tries_text({"trainer_step_regex": cand}) if cand else None)
    others = [r for r in seen if r.step is not None and not r.step_counted and r.step_note
              and r.step_note.startswith("another counter")]
    if others:
        first_counted = counted[0] if counted else None
        add("trainer_step_regex", "the progress counter is the first one read (line %s: `%s`, total %s); later "
            "step values with another total (line %d: `%s`) are another counter and do not count" % (
                first_counted.n if first_counted else "?", shown(first_counted.text, 80) if first_counted else "",
                first_counted.total if first_counted else "?", others[0].n, shown(others[0].text, 80)),
            "a trainer_step_regex that reads the training counter only")
    if result.went_back:
        add("trainer_step_regex", "the step went from %s back to %s: two counters read as one, or the trainer "
            "restarted inside" % tuple(result.went_back))
    if ready_lines and counted and not others and not result.went_back:
        rises = [r.t for r in counted]
        gaps = [(b - a, r) for a, b, r in zip(rises, rises[1:], counted[1:])]
        big = max(gaps, key=lambda g: g[0]) if gaps else None
        stall = result.opts["stall_s"]
        stalled = result.state == FAILED
        if big and big[0] > stall:
            add("trainer_ready_stall_s", "progress rose only after %s s at line %d (the stall window is %s s)%s" % (
                _fmt_s(big[0]), big[1].n, _fmt_s(stall), "" if result.clock == "timestamps" else
                "; this clock is --line-interval-s %s s per line: replay at the trainer's real rate" %
                _fmt_s(result.line_interval_s)),
                _tries_text({"trainer_ready_stall_s": math.ceil(big[0] * 1.5),
                             "trainer_ready_hold_s": max(result.opts["hold_s"], math.ceil(big[0] * 3))}))
        elif stalled and result.at_end == "hang" and result.last_t is not None and result.at_t > result.last_t:
            add("(the capture)", "the log ends at line %d (t=%s s) and the replay goes on as a trainer that prints "
                "nothing more: the proof fails such a stall; capture a longer log, or pass --at-end exit"
                % (result.last_line, _fmt_s(result.last_t)))
        elif stalled:
            last = counted[-1]
            add("trainer_ready_stall_s", "the step counter stopped rising at line %d (step %s, t=%s s) while the log "
                "went on: the trainer is stuck, or it pauses longer than the stall window (%s s); for a pause "
                "(evaluation, a checkpoint save) raise the window above it (and the hold with it)" % (
                    last.n, last.step, _fmt_s(last.t), _fmt_s(stall)))
        if len(counted) < result.opts["min_steps"]:
            add("trainer_ready_min_steps", "only %d increasing step values were read (it asks for %d)" % (
                len(counted), result.opts["min_steps"]))
        elif result.state == NEVER_READY:
            add("trainer_ready_hold_s", "the proof needs every condition to hold, with progress, for %s s; this "
                "start's progress lasts %s s of the replay: capture a longer log, or shorten the hold" % (
                    _fmt_s(result.opts["hold_s"]), _fmt_s(round(rises[-1] - rises[0], 3))))
    if not out and result.state != READY:
        add("(none found)", "the verdict's reason says what was missing: %s" % result.reason)
    return out


# --- the report -----------------------------------------------------------------------------------

_CHANGED_SHOWN = ("trainer_ready_regex", "trainer_step_regex", "trainer_tokps_regex", "trainer_error_regexes")


def report_text(result: Replay, defaults: Optional[dict] = None, show: str = "verdict", width: int = 100) -> str:
    """The report: header, one row per line (show: "verdict" up to the verdict, "all", "none"),
    the verdict and the advice."""
    out = []
    clock = ("the lines' own timestamps" if result.clock == "timestamps"
             else "one line every %s s (--line-interval-s)" % _fmt_s(result.line_interval_s))
    ours = [r for r in result.lines if r.ours]
    out.append("check-log %s: %d lines%s; this start: %d lines; clock: %s; after the last line the trainer %s"
               % (result.source, len(result.lines),
                  " (%d of them tqdm \\r redraws)" % result.redraws if result.redraws else "",
                  len(ours), clock, "prints nothing more" if result.at_end == "hang" else "exits"))
    if result.journal:
        out.append("journalctl prefixes removed (the proof reads the log file, which has none)")
    out.append("start: %s" % result.start_words)
    o = result.opts
    out.append("proof: hold %s s, stall %s s, timeout %s s, min steps %s, poll every %s s, GPUs %s at %s MiB "
               "(synthetic: the unit runs, the GPUs hold memory; only the log decides)" % (
                   _fmt_s(o["hold_s"]), _fmt_s(o["stall_s"]), _fmt_s(o["timeout_s"]), o["min_steps"],
                   _fmt_s(o["interval_s"]), ",".join(str(g) for g in o["gpus"]), o["min_mib"]))
    for var in _CHANGED_SHOWN:
        value = result.variables.get(var)
        if defaults is not None and value != defaults.get(var):
            out.append("  %s = %r" % (var, value))
    out.extend("note: %s" % n for n in result.notes)
    if show != "none":
        out.append("")
        out.append("%5s %7s  %-38s %s" % ("LINE", "T", "READ", "TEXT"))
        stopped = False
        for r in result.lines:
            if r.after_verdict and not stopped:
                rest = sum(1 for x in result.lines if x.after_verdict)
                if show != "all":
                    out.append("  … %d more line%s after the verdict (--all shows them)"
                               % (rest, "" if rest == 1 else "s"))
                    break
                out.append("  ---- the proof stops here; the rest is read for you ----")
                stopped = True
            if show != "all" and not r.ours and not r.marker:
                continue
            t = "" if r.t is None else "%.1fs" % r.t
            out.append("%5d %7s  %-38s %s" % (r.n, t, r.words(), shown(r.text, width)))
    out.append("")
    where = "at line %s" % result.at_line if result.at_line is not None else "before any line"
    when = "t=%s s" % _fmt_s(round(result.at_t, 3)) if result.at_t is not None else ""
    if result.state == NEVER_READY and result.last_line is not None:
        when += ", the start's last line %d came at t=%s s" % (result.last_line, _fmt_s(round(result.last_t, 3)))
    out.append("verdict: %s %s (%s): %s" % (result.state.upper(), where, when, result.reason))
    if result.error_line is not None:
        out.append("  the error: line %d" % result.error_line)
    if result.state == READY:
        d = result.details
        out.append("  step %s, tok/s %s, %s s to ready%s" % (
            d.get("step"), _fmt_num(d["tok_s"]) if d.get("tok_s") is not None else "not read",
            _fmt_s(d.get("seconds_to_ready")), "" if not result.measured or not result.measured.get("n") else
            "; tok/s median %s over %s s (n %d)" % (_fmt_num(result.measured["median"]),
                                                    _fmt_s(result.measured["window_s"]), result.measured["n"])))
    if result.advice:
        out.append("change:" if result.state != READY else "worth a look:")
        for a in result.advice:
            out.append("  %s: %s" % (a["variable"], a["why"]))
            if a.get("try"):
                out.append("    try: %s" % a["try"])
    elif result.state == READY:
        out.append("nothing to change: the proof would pass with these variables")
    return "\n".join(out)


def check_file(path: str, extravars: dict, coll: Optional[Collection] = None, **kwargs) -> tuple[Replay, dict]:
    """(the Replay of the log at PATH with the role defaults + EXTRAVARS, the defaults)."""
    coll = coll or load_collection()
    opts, variables, notes = proof_settings(coll, extravars)
    result = replay(coll, read_text(path), opts, variables, source=path, **kwargs)
    result.notes[:0] = notes
    return result, role_defaults(coll.root)


def check_lines(lines: list, extravars: dict, invocation: Optional[str] = None, release: Optional[str] = None,
                coll: Optional[Collection] = None, source: str = "log", **kwargs) -> tuple[Replay, dict]:
    """The Replay of LINES (a start's lines as `logs` fetched them), under its marker when INVOCATION is known."""
    coll = coll or load_collection()
    opts, variables, notes = proof_settings(coll, extravars)
    head = [coll.trainer_log.marker_line(invocation, release or "?", 0, "?")] if invocation else []
    result = replay(coll, "\n".join(head + list(lines)) + "\n", opts, variables, source=source, **kwargs)
    result.notes[:0] = notes
    return result, role_defaults(coll.root)
