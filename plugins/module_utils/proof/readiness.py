# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Judging readiness and GPU drain: pure predicates plus a clock (kubernetes.core waiter style).

A module polls, builds a ``Snapshot`` per poll and hands it to a judge's ``observe``; the judge
holds the expectations and the clock state and answers a ``Verdict`` (pending, ready or
failed, with a reason in words). No I/O here: tests drive a fake clock through snapshots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from ansible_collections.dflash.trainer.plugins.module_utils.proof.progress_elsewhere import FAIL_AFTER_S as ELSEWHERE_FAIL_AFTER_S
from ansible_collections.dflash.trainer.plugins.module_utils.proof.progress_elsewhere import elsewhere_words, log_shows_progress
from ansible_collections.dflash.trainer.plugins.module_utils.target.systemd import (
    exit_description,
    int_prop,
    is_running,
    pick,
    runtime_s,
    state_words,
)
from ansible_collections.dflash.trainer.plugins.module_utils.target.nvidia_smi import index_ranges
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import (
    DEFAULT_ERROR_REGEXES,
    DEFAULT_READY_REGEX,
    DEFAULT_STEP_REGEX,
    DEFAULT_TOKPS_REGEX,
    is_reason_line,
)

PENDING = "pending"
READY = "ready"
FAILED = "failed"

DEFAULT_HOLD_S = 10.0
DEFAULT_STALL_S = 5.0
DEFAULT_TIMEOUT_S = 900.0

# The stall window follows the trainer's own cadence: a trainer that reports every N s may go
# STALL_CADENCE_FACTOR x N s without a rise (N: the low median of the last CADENCE_GAPS gaps between
# rises once the progress clock runs), never less than stall_s. 3 x N lets a trainer that reports
# every 5-10 s through with the 5 s default and still names a hang within three missed reports.
STALL_CADENCE_FACTOR = 3.0
CADENCE_GAPS = 16
# READY needs the step counter to rise this many times inside the hold window (one rise could be
# the last one before a hang that the stall window has not reached yet).
MIN_HOLD_RISES = 2
# The early word when nothing in the log looks like progress and nothing was read from it: the log
# grew at UNREAD_TICKS moments at least UNREAD_TICK_S apart (five minutes of steady output) and by
# UNREAD_LINES lines. A healthy trainer's load and compile output comes in bursts and stops, or
# holds a line the proof reads, long before that; the deadline bounds the rest.
UNREAD_LINES = 300
UNREAD_TICK_S = 10.0
UNREAD_TICKS = 30


def fmt_s(seconds, up=False):
    """0.6 -> "0.6", 120.0 -> "120", 15.34 -> "15".

    ``up`` rounds up at the precision shown, for a measured time said to be longer than a window:
    a stall of 3.04 s past a 3 s window reads "3.1", never "3.0 s: longer than 3"."""
    if seconds is None:
        return "?"
    if up and not float(seconds).is_integer():
        step = 0.1 if seconds < 10 else 1.0
        seconds = round(math.ceil(round(seconds / step, 6)) * step, 1)
    if float(seconds).is_integer():
        return "%d" % seconds
    if seconds < 10:
        return "%.1f" % seconds
    return "%.0f" % seconds


def fmt_gpu_list(indexes):
    return ("GPU %s" if len(indexes) == 1 else "GPUs %s") % ", ".join(str(i) for i in indexes)


def setting(name, value):
    """"trainer_ready_stall_s=5": the variable behind expectation ``name`` and its value."""
    shown = fmt_s(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    return "%s=%s" % (VARIABLES.get(name, name), shown)


@dataclass
class Verdict:
    state: str
    reason: str = ""
    details: dict = field(default_factory=dict)

    @property
    def done(self):
        return self.state != PENDING


@dataclass
class Snapshot:
    """One poll: ``now`` (monotonic s), ``unit`` (systemctl show props), ``gpus_mib``
    ({index: MiB or None}), ``log`` (what this start's lines show: a ``proof.trainer_log.ProgressAnalysis``,
    which reads plain lines and JSONL records alike, or a ``LogAnalysis``; its ``marker`` is None until
    our marker line was seen).

    A caller that reads the log more often than the unit and the GPUs (the proof: ``job.cycle.prove``)
    says when the log showed what it shows, in the same clock: ``step_seen_at``, when its highest
    step value was first read; ``log_ready_at``, when its conditions (a ready line, ``min_steps``
    step values) first all held. The Judge times progress and the hold's start by them when they fall
    after the observation before (``read_at``); None: ``now``."""
    now: float
    unit: dict
    gpus_mib: dict
    log: object = None
    step_seen_at: float = None
    log_ready_at: float = None
    # (path, line): a file the trainer writes whose lines read as progress while this start's log
    # shows none (``proof.progress_elsewhere``); None: none found, or not looked for
    elsewhere: tuple = None


def read_at(seen, before, now):
    """When the log showed something, for the Judge: ``seen`` when it falls after the observation
    before (``before``) and not after ``now``; else ``now`` (nothing earlier is known)."""
    if seen is None or before is None or not before < seen <= now:
        return now
    return seen


def _proof_setting(default, variable):
    """A field of Expectations that is a proof setting: the role variable ``variable`` sets it (its
    default in roles/trainer/defaults/main.yml is this ``default``, tests/unit/test_defaults_once.py)."""
    # a field() made here for the dataclass below, which is what dataclasses' docs do for shared field settings
    return field(default=default, metadata={"variable": variable})  # pylint: disable=invalid-field-call


@dataclass
class Expectations:
    """What one start must show. The fields made with ``_proof_setting`` are the proof's settings - the
    table (``PROOF_SETTINGS``) the role's ``trainer_*`` variables, trainer_restart's O(proof), the
    CLI's check-log and the verdicts' words are all derived from: a new setting is a field here, its
    role default and argument spec entry, and its use in the judge."""
    invocation_id: str
    n_restarts: int = 0
    gpus: list = None          # None: every GPU in the snapshot
    min_mib: int = _proof_setting(1024, "trainer_gpu_min_mib")
    # The role refuses less than 1. 0 (for a standalone caller) turns the step checks off - count,
    # increase, stall, GPU left behind, the early word on steps - and the READY verdict says so.
    min_steps: int = _proof_setting(2, "trainer_ready_min_steps")
    hold_s: float = _proof_setting(DEFAULT_HOLD_S, "trainer_ready_hold_s")
    stall_s: float = _proof_setting(DEFAULT_STALL_S, "trainer_ready_stall_s")
    timeout_s: float = _proof_setting(DEFAULT_TIMEOUT_S, "trainer_ready_timeout_s")
    tail_lines: int = _proof_setting(20, "trainer_log_tail_lines")
    ready_regex: str = _proof_setting(DEFAULT_READY_REGEX, "trainer_ready_regex")
    # how this start's log is read (proof.trainer_log.StartLog) and how often the proof polls
    step_regex: str = _proof_setting(DEFAULT_STEP_REGEX, "trainer_step_regex")
    tokps_regex: str = _proof_setting(DEFAULT_TOKPS_REGEX, "trainer_tokps_regex")
    error_regexes: tuple = _proof_setting(DEFAULT_ERROR_REGEXES, "trainer_error_regexes")
    interval_s: float = _proof_setting(0.5, "trainer_ready_interval_s")


def proof_settings(cls):
    """The proof's settings of an Expectations class, in field order: {name: (role variable, type name, default)}."""
    return dict((f.name, (f.metadata["variable"], f.type if isinstance(f.type, str) else f.type.__name__, f.default))
                for f in fields(cls) if "variable" in f.metadata)


PROOF_SETTINGS = proof_settings(Expectations)
# The role variables behind each expectation: every verdict that depends on one names it and its value.
VARIABLES = dict((name, variable) for name, (variable, _type, _default) in PROOF_SETTINGS.items())

_CASTS = {"int": int, "float": float, "str": str}


def proof_options(given, settings=None):
    """``given`` (a dict of proof settings by name, as trainer_restart's O(proof) takes it) checked and
    typed -> {name: value}; ValueError naming the setting for an unknown name or a value of the wrong type."""
    settings = PROOF_SETTINGS if settings is None else settings
    out = {}
    for name, value in (given or {}).items():
        if name not in settings:
            raise ValueError("proof: unknown setting %r (known: %s)" % (name, ", ".join(settings)))
        kind = settings[name][1]
        try:
            if kind in ("tuple", "list"):
                if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                    raise TypeError("not a list")
                value = [str(v) for v in value]
            elif kind in _CASTS:
                if isinstance(value, bool) or isinstance(value, (list, dict)):
                    raise TypeError("not a %s" % kind)
                value = _CASTS[kind](value)
        except (TypeError, ValueError) as exc:
            raise ValueError("proof: %s (%s) must be a %s: %r (%s)"
                             % (name, settings[name][0], "list" if kind == "tuple" else kind, value, exc)) from None
        out[name] = value
    return out


def role_proof(variables, progress=True, settings=None):
    """The proof's settings from the role's variables (a mapping: a play's ``vars``) -> {name: value},
    as the role passes them to trainer_restart's O(proof). ``progress`` false: a trainer group's member
    whose log does not show the job's progress (trainer_group_progress) - no ready line and no step
    values are asked of it; it is proved by its GPUs, its unit and its errors."""
    settings = PROOF_SETTINGS if settings is None else settings
    out = dict((name, variables[variable]) for name, (variable, _type, _default) in settings.items())
    if not progress:
        out.update(ready_regex=".", min_steps=0)
    return out


def expectations(invocation_id, n_restarts, options, gpus=None, cls=None):
    """Expectations for one start from the proof's options (every setting of PROOF_SETTINGS present
    in ``options`` is taken; the others keep their defaults)."""
    cls = Expectations if cls is None else cls
    return cls(invocation_id=invocation_id, n_restarts=n_restarts, gpus=gpus,
               **dict((n, options[n]) for n in proof_settings(cls) if options.get(n) is not None))


def window_problem(hold_s, stall_s):
    """Why ``hold_s`` / ``stall_s`` cannot prove progress, in words; None when they can.

    A stall window longer than the hold would let a trainer stop at the start of the hold and
    still count as held."""
    if stall_s is None or not stall_s > 0:
        return "stall_s (%s) must be greater than 0 s" % stall_s
    if hold_s is None or not stall_s <= hold_s:
        return ("stall_s (%s s) is longer than hold_s (%s s): progress could stop for the whole hold "
                "and still count as held; set stall_s no longer than hold_s" % (fmt_s(stall_s), fmt_s(hold_s)))
    return None


def stall_window(stall_s, gaps):
    """The stall window for a trainer whose last gaps between rises were ``gaps`` (s): at least
    ``stall_s``, else STALL_CADENCE_FACTOR x their low median."""
    if not gaps:
        return stall_s
    ordered = sorted(gaps)
    return max(stall_s, STALL_CADENCE_FACTOR * ordered[(len(ordered) - 1) // 2])


def expected_gpus(expect, gpus_mib):
    return list(expect.gpus) if expect.gpus is not None else sorted(gpus_mib)


def gpu_shortfall(indexes, gpus_mib, min_mib):
    """(absent, unreadable, [(index, mib) below min_mib])."""
    absent = [i for i in indexes if i not in gpus_mib]
    unreadable = [i for i in indexes if i in gpus_mib and gpus_mib[i] is None]
    low = [(i, gpus_mib[i]) for i in indexes
           if i in gpus_mib and gpus_mib[i] is not None and gpus_mib[i] < min_mib]
    return absent, unreadable, low


def missing_conditions(expect, snap):
    """What still keeps the trainer from READY, in words (empty: all conditions hold)."""
    return state_missing(expect, snap) + log_missing(expect, snap.log)


def state_missing(expect, snap):
    """The conditions of the unit and the GPUs that do not hold, in words."""
    missing = []
    indexes = expected_gpus(expect, snap.gpus_mib)
    if not indexes:
        missing.append("nvidia-smi reports no GPUs")
    _absent, unreadable, low = gpu_shortfall(indexes, snap.gpus_mib, expect.min_mib)
    if unreadable:
        missing.append("%s memory unreadable" % fmt_gpu_list(unreadable))
    if low:
        missing.append("%s below %d MiB (%s MiB)" % (
            fmt_gpu_list([i for i, _mib in low]), expect.min_mib, ", ".join(str(m) for _i, m in low)))
    # the unit's identity: without a readable NRestarts and an InvocationID nothing shows whether
    # the unit restarted under us, so garbage there can never count as ready
    if not snap.unit.get("InvocationID"):
        missing.append("systemd reports no InvocationID for the unit")
    if int_prop(snap.unit, "NRestarts", None) is None:
        missing.append("the unit's NRestarts is unreadable (%r)" % snap.unit.get("NRestarts"))
    return missing


def log_missing(expect, log):
    """The conditions of this start's log that do not hold, in words."""
    missing = []
    if log is None or getattr(log, "marker", None) is None:
        missing.append("no start marker for invocation %s in the log" % expect.invocation_id)
        return missing
    if log.ready_line is None:
        missing.append("no line matching %r in this start's log" % expect.ready_regex)
    if expect.min_steps > 0 and log.n_steps < expect.min_steps:
        if log.n_steps == 0:
            missing.append("no step values in this start's log")
        else:
            missing.append("only %d of %d increasing step values in this start's log (last step=%s)"
                           % (log.n_steps, expect.min_steps, log.last_step))
    return missing


def step_regex_words(pattern):
    """How a step regex is named in a verdict: the default by what it reads, another verbatim."""
    if pattern == DEFAULT_STEP_REGEX:
        return "trainer_step_regex (the default: step, global_step, iter, iteration, it=, batch, [N/M], tqdm's N/M [)"
    return "trainer_step_regex '%s'" % pattern


def ready_regex_words(pattern):
    """How a ready regex is named in a verdict (see ``step_regex_words``)."""
    if pattern == DEFAULT_READY_REGEX:
        return "trainer_ready_regex (the default: a tok/s, tokens/s, tok/sec or tokens per second figure)"
    return "trainer_ready_regex '%s'" % pattern


def _shown(line):
    shown = (line or "").strip()
    return shown[:200] + "…" if len(shown) > 200 else shown


def _pattern(compiled, fallback="?"):
    return getattr(compiled, "pattern", fallback)


def _steps_what(log):
    problems = [p for p in getattr(log, "problems", None) or [] if p.startswith("step:")]
    return "read no whole step number (%s)" % problems[0] if problems else "matched nothing"


def steps_unread_words(log, waited_s, stall_s=None, since="the first line matching trainer_ready_regex"):
    """"the log shows `iter 5 | 21.5K tok/s` but trainer_step_regex '…' matched nothing …" for a
    log that shows progress lines (``ready_line``) and no step value read from any of them."""
    words = ("the log shows `%s` but %s %s for %s s after %s: "
             "set trainer_step_regex to a regex whose first group is the progress counter" % (
                 _shown(log.ready_line), step_regex_words(_pattern(getattr(log, "step_re", None))),
                 _steps_what(log), fmt_s(waited_s, up=True), since))
    if stall_s is not None:
        words += " (the early word comes after %s)" % setting("stall_s", stall_s)
    return words


def nothing_read_words(log, line, waited_s, since_words, window_words):
    """Neither a ready line nor a step value read for ``waited_s`` s while progress-like lines kept
    coming: name both regexes (and the throughput one)."""
    return ("the log shows `%s` but the proof read nothing from this start's log for %s s after %s: %s "
            "matched no line and %s %s; set trainer_ready_regex to a regex that matches the trainer's progress "
            "line and trainer_step_regex to one whose first group is its step counter (trainer_tokps_regex "
            "reads its throughput figure) (the early word comes after %s)" % (
                _shown(line), fmt_s(waited_s, up=True), since_words,
                ready_regex_words(_pattern(getattr(log, "ready_re", None))),
                step_regex_words(_pattern(getattr(log, "step_re", None))), _steps_what(log), window_words))


def ready_unread_words(log, line, waited_s, window_words):
    """Step values read, no line matching the ready regex for ``waited_s`` s of progress."""
    read = " (step %s read by trainer_step_regex)" % log.last_step if log.last_step is not None else ""
    return ("the log shows `%s`%s but %s matched no line for %s s after the "
            "first line that looks like progress: set trainer_ready_regex to a regex that matches the trainer's "
            "progress line (and trainer_tokps_regex to one that reads its throughput figure, if it has one) "
            "(the early word comes after %s)" % (
                _shown(line), read, ready_regex_words(_pattern(getattr(log, "ready_re", None))),
                fmt_s(waited_s, up=True), window_words))


def output_unread_words(log, lines, span_s):
    """Minutes of output, none of it read."""
    return ("this start's log grew by %d lines over %s s and the proof read nothing from it: %s matched no line "
            "and %s %s; the last line: `%s`; set trainer_ready_regex and trainer_step_regex (trainer_tokps_regex "
            "for the throughput figure) to read the trainer's progress line (the early word comes after %d lines "
            "written over %d moments %s s apart)" % (
                lines, fmt_s(span_s), ready_regex_words(_pattern(getattr(log, "ready_re", None))),
                step_regex_words(_pattern(getattr(log, "step_re", None))), _steps_what(log),
                _shown(log.tail(1)[-1] if log.tail(1) else ""), UNREAD_LINES, UNREAD_TICKS, fmt_s(UNREAD_TICK_S)))


_ABSENT = object()


def progress_signature(log):
    """What changes when more progress output arrives. With the log reader's progress-like lines
    (``last_progress_like_line``): a new progress-like line, ready line, step or throughput value -
    other output (compile logs, warnings) does not count; without them: any new line."""
    if getattr(log, "last_progress_like_line", _ABSENT) is _ABSENT:
        return (getattr(log, "line_count", 0),)
    return (getattr(log, "ready_count", 0), getattr(log, "n_steps", 0),
            len(getattr(log, "tokps_values", None) or ()), log.last_progress_like_line)


def death_words(props, log):
    """"exited with status 1 after 0.6 s: <reason line>" (parts left out when unknown)."""
    words = exit_description(props)
    if words:
        runtime = runtime_s(props)
        if runtime is not None:
            words += " after %s s" % fmt_s(runtime)
    else:
        words = "is not running (%s)" % state_words(props)
    reason = log.reason if log is not None and getattr(log, "marker", None) is not None else None
    if reason:
        words += ": " + reason
    elif log is None or getattr(log, "marker", None) is None:
        words += ": no start marker for this invocation in the log"
    return words


class Judge(object):
    """Readiness of one trainer start.

    Progress is the step counter (the highest step value in this start's log) rising between two
    observations; its clock runs once the log shows ``min_steps`` increasing step values. The
    stall window is ``stall_s`` or, for a trainer that reports less often, STALL_CADENCE_FACTOR x
    its own gap between rises (``stall_window``: the low median of the last gaps the clock saw).
    Nothing before the first step value is a stall: a silent load or compile is the deadline's.

    FAILED at once, for what cannot improve by waiting:
      - the unit is not active/running, or it restarted (NRestarts above the baseline, a new
        InvocationID);
      - an error pattern in this start's log; an expected GPU that nvidia-smi does not report;
      - a stall: an observation without a rise more than the stall window after the last rise
        ("no progress for 6.2 s (last step=5): longer than trainer_ready_stall_s=5"), named as a
        restart inside when the step went back meanwhile ("step went from 6 back to 1: ...");
      - a GPU left behind: the trainer has made progress for a stall window since its first step
        and an expected GPU stayed below ``min_mib`` on every observation of that time
        ("GPU 7 holds 100 MiB while the trainer is at step 40 ...");
      - the early word, when the log goes on showing progress that the proof cannot read (what it
        needs: a line matching the ready regex, step values): counted from the first observation
        that shows a line looking like progress (the log reader's ``progress_like_line``, a ready
        line, a step or throughput value), and only once more progress output came after it
        (``progress_signature``):
          * no step value read for more than ``stall_s`` (with a ready line: "the log shows `iter 5
            | 21.5K tok/s` but trainer_step_regex ... matched nothing ..."; without: both regexes
            named);
          * step values read and no ready line for more than the hold (``hold_s``, or the stall
            window when that is longer);
          * nothing that looks like progress and nothing read: UNREAD_LINES lines written over
            UNREAD_TICKS moments UNREAD_TICK_S apart.
    READY when every condition (see ``missing_conditions``) held on every observation for
    ``hold_s`` and progress held through that window: the step counter rose at least
    MIN_HOLD_RISES times after the window began, and no gap between rises, nor the one from the
    last rise to the verdict, exceeded the stall window. A rise seen more than the stall window
    after the previous one with no observation in between (a poll that came late) proves neither a
    stall nor progress: the window starts again (and the gap does not count as the cadence).
    FAILED at ``timeout_s`` after the first observation, naming what was missing: the deadline
    is for what can still change (a slow start, GPUs allocated before the first step).
    ``min_steps`` 0 turns the step checks off (a standalone caller's choice; the role refuses it):
    the READY verdict then says "no step checks".

    ``stall_s`` longer than ``hold_s`` is refused (ValueError, see ``window_problem``).
    """

    def __init__(self, expect, start=None):
        problem = window_problem(expect.hold_s, expect.stall_s)
        if problem:
            raise ValueError(problem)
        self.expect = expect
        self.start = start
        self.hold_since = None
        self.hold_step = None
        self.hold_rises = 0
        self.last_now = None  # the time of the last observation
        self.state_held = False  # the unit's and the GPUs' conditions held at the last observation
        self.progress_step = None
        self.progress_at = None
        self.first_step_at = None
        self.progress_clock = False
        self.gaps = []
        self.low_since = {}
        self.observations = 0
        # the early word: when progress first showed, what it was, the progress output then
        self.early_at = None
        self.early_kind = None
        self.early_sig = None
        # output that nothing reads: lines seen, moments it grew (UNREAD_TICK_S apart), the first one
        self.lines_seen = 0
        self.ticks = 0
        self.tick_at = None
        self.first_tick_at = None

    # -- clock ---------------------------------------------------------------------------------
    @property
    def deadline(self):
        return None if self.start is None else self.start + self.expect.timeout_s

    def next_wait(self, now, interval):
        """Seconds to sleep before the next poll: ``interval``, shortened to land on the
        deadline (never negative)."""
        if self.deadline is None:
            return max(0.0, interval)
        return max(0.0, min(interval, self.deadline - now))

    @property
    def wake_at(self):
        """When the next observation should come at the latest: the end of the hold window while
        every condition holds and it is still ahead (the verdict then comes when the hold ends, not
        up to a poll interval later), else the deadline."""
        ends = [self.deadline]
        if self.hold_since is not None and self.last_now is not None:
            hold_end = self.hold_since + self.expect.hold_s
            if hold_end > self.last_now:
                ends.append(hold_end)
        ends = [t for t in ends if t is not None]
        return min(ends) if ends else None

    @property
    def stall_window_s(self):
        """The stall window now (see ``stall_window``)."""
        return stall_window(self.expect.stall_s, self.gaps)

    @property
    def cadence_s(self):
        """The trainer's own gap between rises (the low median the stall window follows), or None."""
        if not self.gaps:
            return None
        ordered = sorted(self.gaps)
        return ordered[(len(ordered) - 1) // 2]

    def stall_words(self):
        """"trainer_ready_stall_s=5", or how the window followed the trainer's cadence."""
        window = self.stall_window_s
        if window <= self.expect.stall_s:
            return setting("stall_s", self.expect.stall_s)
        return "%s s = %s x the %s s this trainer takes between steps, at least %s" % (
            fmt_s(window), fmt_s(STALL_CADENCE_FACTOR), fmt_s(self.cadence_s), setting("stall_s", self.expect.stall_s))

    # -- verdicts ------------------------------------------------------------------------------
    def _details(self, snap, missing=None):
        log = snap.log
        has_log = log is not None and getattr(log, "marker", None) is not None
        indexes = expected_gpus(self.expect, snap.gpus_mib)
        details = {
            "invocation_id": self.expect.invocation_id,
            "release": (log.marker or {}).get("release") if has_log else None,
            "unit": pick(snap.unit),
            "gpus_mib": {i: snap.gpus_mib.get(i) for i in indexes},
            "elapsed_s": round(snap.now - self.start, 3),
            "log_tail": log.tail(self.expect.tail_lines) if has_log else [],
            "step": log.last_step if has_log else None,
        }
        if has_log and getattr(log, "problems", None):
            details["figure_problems"] = list(log.problems)
        if missing is not None:
            details["missing"] = missing
        return details

    def _fail(self, snap, reason, missing=None):
        details = self._details(snap, missing)
        details["reason"] = reason
        return Verdict(FAILED, reason, details)

    def _progress(self, snap, log, has_log, before):
        """Update the progress clock (a rise is timed when the log showed it: ``read_at``); returns
        (step, stalled_s or None, window broken, rose)."""
        expect = self.expect
        step = log.max_step if has_log else None
        clock_was_running = self.progress_clock
        self.progress_clock = expect.min_steps > 0 and has_log and log.n_steps >= expect.min_steps
        if step is not None and (self.progress_step is None or step > self.progress_step):
            at = read_at(snap.step_seen_at, before, snap.now)
            gap = None if self.progress_at is None else at - self.progress_at
            broken = clock_was_running and gap is not None and gap > self.stall_window_s
            if gap is not None and self.progress_clock and not broken:
                # the trainer's cadence: gaps once the clock runs (the one that starts it counts:
                # with min_steps 2 it is the only one a slow trainer shows before its first stall check)
                self.gaps.append(gap)
                del self.gaps[:-CADENCE_GAPS]
            if self.first_step_at is None:
                self.first_step_at = at
            self.progress_step = step
            self.progress_at = at
            return step, None, broken, True
        if self.progress_clock and self.progress_at is not None:
            stalled = snap.now - self.progress_at
            if stalled > self.stall_window_s:
                return step, stalled, False, False
        return step, None, False, False

    def _count_output(self, snap, log):
        """Count the moments (UNREAD_TICK_S apart) at which this start's log grew."""
        lines = getattr(log, "line_count", 0)
        if lines > self.lines_seen:
            if self.tick_at is None or snap.now - self.tick_at >= UNREAD_TICK_S:
                self.ticks += 1
                self.tick_at = snap.now
                if self.first_tick_at is None:
                    self.first_tick_at = snap.now
        self.lines_seen = lines

    def _early_word(self, snap, log, has_log):
        """Words of a failure when the log goes on showing progress the proof cannot read (see the
        class: the early word); else None."""
        if not has_log:
            return None
        expect = self.expect
        self._count_output(snap, log)
        steps_unread = expect.min_steps > 0 and log.n_steps == 0
        ready_unread = log.ready_line is None
        if not (steps_unread or ready_unread):
            return None
        like = getattr(log, "progress_like_line", None)
        tokps = getattr(log, "tokps_values", None) or ()
        if self.early_at is None:
            if log.ready_line is not None:
                kind = "ready"
            elif like is not None or log.n_steps or tokps:
                kind = "like"
            else:
                kind = None
            if kind is not None:
                self.early_at, self.early_kind, self.early_sig = snap.now, kind, progress_signature(log)
                return None
        elif progress_signature(log) != self.early_sig:
            waited = snap.now - self.early_at
            if steps_unread and waited > expect.stall_s:
                if not ready_unread:
                    since = "the first line matching trainer_ready_regex" if self.early_kind == "ready" else \
                        "the first line that looks like progress"
                    return steps_unread_words(log, waited, expect.stall_s, since)
                line = getattr(log, "last_progress_like_line", None) or like or getattr(log, "progress_line", None)
                return nothing_read_words(log, line, waited, "the first line that looks like progress",
                                          setting("stall_s", expect.stall_s))
            window = max(expect.hold_s, self.stall_window_s)
            if not steps_unread and ready_unread and waited > window:
                line = getattr(log, "last_progress_like_line", None) or getattr(log, "progress_line", None) or like
                words = setting("hold_s", expect.hold_s) if window <= expect.hold_s else "the stall window, " + \
                    self.stall_words()
                return ready_unread_words(log, line, waited, words)
        if steps_unread and ready_unread and self.ticks >= UNREAD_TICKS and log.line_count >= UNREAD_LINES:
            return output_unread_words(log, log.line_count, snap.now - self.first_tick_at)
        return None

    def _gpus_left_behind(self, snap, indexes, step):
        """[(index, MiB, seconds)] for expected GPUs below min_mib on every observation of the
        last stall window of progress (only while the step counter advances)."""
        expect = self.expect
        for i in indexes:
            mib = snap.gpus_mib.get(i)
            if mib is not None and mib < expect.min_mib:
                self.low_since.setdefault(i, snap.now)
            else:
                self.low_since.pop(i, None)
        if not self.progress_clock or step is None or snap.log.n_steps < 2:
            return []      # no progress (yet): a late allocation can still come; the deadline judges
        behind = []
        window = self.stall_window_s
        for i in indexes:
            if i in self.low_since:
                low_s = snap.now - max(self.low_since[i], self.first_step_at)
                if low_s >= window:
                    behind.append((i, snap.gpus_mib[i], low_s))
        return behind

    def observe(self, snap):
        if self.start is None:
            self.start = snap.now
        self.observations += 1
        before, self.last_now = self.last_now, snap.now
        expect = self.expect
        props = snap.unit
        log = snap.log
        has_log = log is not None and getattr(log, "marker", None) is not None

        # 1. the unit: restarted, or not running
        n_restarts = int_prop(props, "NRestarts", 0)
        invocation = props.get("InvocationID", "")
        if n_restarts > expect.n_restarts:
            return self._fail(snap, "trainer restarted (NRestarts %d → %d): %s (crash loop)" % (
                expect.n_restarts, n_restarts, death_words(props, log)))
        if invocation and invocation != expect.invocation_id:
            return self._fail(snap, "trainer restarted (InvocationID %s → %s): %s" % (
                expect.invocation_id, invocation, death_words(props, log)))
        if not is_running(props):
            return self._fail(snap, "trainer " + death_words(props, log))

        # 2. an error pattern in this start's log
        if has_log and log.errors:
            line = log.first_error
            reason = log.reason
            words = "log shows error: " + line
            if reason and reason != line and is_reason_line(reason):
                words += " … " + reason
            return self._fail(snap, words)

        # 3. GPUs that nvidia-smi does not report will not appear by waiting
        indexes = expected_gpus(expect, snap.gpus_mib)
        absent = [i for i in indexes if i not in snap.gpus_mib]
        if absent:
            return self._fail(snap, "%s not reported by nvidia-smi (it reports %s)" % (
                fmt_gpu_list(absent), index_ranges(snap.gpus_mib) or "none"))

        # 4. progress: a stall fails; a late poll restarts the window
        step, stalled, window_broken, rose = self._progress(snap, log, has_log, before)
        if stalled is not None:
            back = getattr(log, "went_back", None) if has_log else None
            if back:
                return self._fail(snap, "step went from %s back to %s: the trainer restarted inside "
                                        "(no progress past step %s for %s s; longer than %s)" % (
                                            back[0], back[1], back[0], fmt_s(stalled, up=True), self.stall_words()))
            return self._fail(snap, "no progress for %s s (last step=%s): longer than %s" % (
                fmt_s(stalled, up=True), step, self.stall_words()))

        # 5. a GPU still below min_mib while the trainer makes progress will not fill by waiting
        behind = self._gpus_left_behind(snap, indexes, step)
        if behind:
            return self._fail(snap, "%s while the trainer is at step %s (below %s MiB through %s s of progress; %s)" % (
                ", ".join("GPU %s holds %s MiB" % (i, mib) for i, mib, _s in behind), step,
                setting("min_mib", expect.min_mib), fmt_s(min(s for _i, _mib, s in behind), up=True), self.stall_words()))

        # 6. the early word: the log goes on showing progress that the proof cannot read
        unread = self._early_word(snap, log, has_log)
        if unread:
            return self._fail(snap, unread)

        # 6b. progress that goes to a file of the trainer's, not to this log: said, and the verdict by
        # FAIL_AFTER_S (never the whole ready timeout for a trainer whose progress is elsewhere)
        elsewhere = snap.elsewhere if snap.elsewhere and not log_shows_progress(log) else None
        if elsewhere and snap.now - self.start >= ELSEWHERE_FAIL_AFTER_S:
            return self._fail(snap, "no progress in this start's log after %s s: %s" % (
                fmt_s(snap.now - self.start), elsewhere_words(elsewhere)))

        # 7. the hold window: it begins when the last condition came to hold - when the log showed it (its
        # conditions, or the rise after a late poll), if the unit's and the GPUs' held at the observation before
        state_missing_now = state_missing(expect, snap)
        missing = state_missing_now + log_missing(expect, log)
        held_before, self.state_held = self.state_held, not state_missing_now
        if missing:
            self.hold_since = None
            self.hold_step = None
            self.hold_rises = 0
        else:
            if self.hold_since is None or window_broken:
                if not held_before:
                    self.hold_since = snap.now
                elif window_broken:
                    self.hold_since = self.progress_at
                else:
                    self.hold_since = read_at(snap.log_ready_at, before, snap.now)
                self.hold_step = step
                self.hold_rises = 0
            elif rose:
                self.hold_rises += 1
            held = snap.now - self.hold_since
            progressed = expect.min_steps <= 0 or (
                self.hold_rises >= MIN_HOLD_RISES and snap.now - self.progress_at <= self.stall_window_s)
            if held >= expect.hold_s and progressed:
                return self._ready(snap)

        # 8. the deadline
        if snap.now - self.start >= expect.timeout_s:
            if not missing:
                held = snap.now - self.hold_since
                if held < expect.hold_s:
                    missing = ["conditions held for only %s of %s s (%s)" % (
                        fmt_s(held), fmt_s(expect.hold_s), setting("hold_s", expect.hold_s))]
                else:
                    missing = ["the step counter rose %d times during the hold window, %d needed (step=%s)" % (
                        self.hold_rises, MIN_HOLD_RISES, step)]
            if elsewhere:
                missing = missing + [elsewhere_words(elsewhere)]
            return self._fail(snap, "not ready after %s s (%s): %s" % (
                fmt_s(expect.timeout_s), setting("timeout_s", expect.timeout_s), "; ".join(missing)), missing)
        if elsewhere:
            missing = missing + [elsewhere_words(elsewhere)]
        return Verdict(PENDING, "; ".join(missing) if missing else "holding", {"missing": missing})

    def _ready(self, snap):
        log = snap.log
        indexes = expected_gpus(self.expect, snap.gpus_mib)
        details = {
            "release": (log.marker or {}).get("release"),
            "invocation_id": self.expect.invocation_id,
            "main_pid": int_prop(snap.unit, "MainPID", 0),
            "gpus_mib": {i: snap.gpus_mib[i] for i in indexes},
            "matched_line": log.ready_line,
            "tok_s": log.tok_s,
            "step": log.last_step,
            "seconds_to_ready": round(snap.now - self.start, 3),
        }
        if getattr(log, "problems", None):
            details["figure_problems"] = list(log.problems)
        if self.expect.min_steps <= 0:
            details["step_checks"] = False
            return Verdict(READY, "ready (no step checks: %s): %s" % (
                setting("min_steps", self.expect.min_steps), log.ready_line), details)
        return Verdict(READY, "ready: %s" % log.ready_line, details)


# ---------------------------------------------------------------------------------------------
# GPU drain

def holders_words(gpus, indexes):
    """"pid 1234 python3 (5000 MiB on GPU 5), ..." for processes on the given GPUs."""
    parts = []
    for gpu in gpus:
        if gpu["index"] not in indexes:
            continue
        for proc in gpu.get("processes") or []:
            parts.append("pid %s %s (%s MiB on GPU %s)" % (
                proc.get("pid") if proc.get("pid") is not None else "?",
                proc.get("process_name") or "[name not visible]",
                proc.get("used_memory_mib") if proc.get("used_memory_mib") is not None else "?",
                gpu["index"]))
    return ", ".join(parts)


class DrainJudge(object):
    """Every selected GPU at or below ``max_mib`` on ``consecutive`` samples in a row; FAILED
    at ``timeout_s`` naming the GPUs still held and the holders nvidia-smi shows (inside a
    container often none: memory is judged from the per-GPU figures only).

    ``allowance``: {index: MiB} other tenants hold on that GPU (known from the node's view,
    read before the stop): it is allowed on top of ``max_mib``."""

    def __init__(self, max_mib=1024, consecutive=2, timeout_s=60.0, gpus=None, start=None, allowance=None):
        self.allowance = dict(allowance or {})
        self.max_mib = max_mib
        self.consecutive = max(1, consecutive)
        self.timeout_s = timeout_s
        self.gpus = gpus
        self.start = start
        self.samples = 0
        self.streak = 0

    @property
    def deadline(self):
        return None if self.start is None else self.start + self.timeout_s

    def next_wait(self, now, interval):
        if self.deadline is None:
            return max(0.0, interval)
        return max(0.0, min(interval, self.deadline - now))

    def observe(self, now, gpus):
        """``gpus``: parsed query-gpu rows (with ``processes`` when known)."""
        if self.start is None:
            self.start = now
        self.samples += 1
        mib = {g["index"]: g["memory_used_mib"] for g in gpus}
        indexes = list(self.gpus) if self.gpus is not None else sorted(mib)
        details = {
            "samples": self.samples,
            "waited_s": round(now - self.start, 3),
            "gpus_mib": {i: mib.get(i) for i in indexes},
        }
        absent = [i for i in indexes if i not in mib]
        if absent:
            reason = "%s not reported by nvidia-smi (it reports %s)" % (
                fmt_gpu_list(absent), index_ranges(mib) or "none")
            return Verdict(FAILED, reason, dict(details, reason=reason))
        held = [i for i in indexes if mib[i] is None or mib[i] > self.max_mib + self.allowance.get(i, 0)]
        # a sample with no GPU at all proves nothing drained (Judge: "nvidia-smi reports no GPUs")
        self.streak = 0 if held or not indexes else self.streak + 1
        if self.streak >= self.consecutive:
            return Verdict(READY, "GPU memory at or below %d MiB on %d consecutive samples" % (
                self.max_mib, self.consecutive), details)
        if now - self.start >= self.timeout_s:
            if held:
                what = ", ".join("GPU %s %s%s" % (
                    i, "%s MiB" % mib[i] if mib[i] is not None else "unreadable",
                    " (%d of them another tenant's)" % self.allowance[i] if self.allowance.get(i) else "")
                    for i in held)
                holders = holders_words(gpus, held) or \
                    "none visible from here (inside a container the process list is often empty)"
                reason = "GPU memory still held after %s s: %s; holders: %s" % (
                    fmt_s(self.timeout_s), what, holders)
            else:
                reason = "GPU memory not drained on %d consecutive samples within %s s" % (
                    self.consecutive, fmt_s(self.timeout_s))
            details["held"] = held
            return Verdict(FAILED, reason, dict(details, reason=reason))
        return Verdict(PENDING, "held: %s" % ", ".join(str(i) for i in held) if held else "draining",
                       details)
