# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each release's measured throughput, the release ledger's entries, the comparison and the gate
(pure, unit-tested; the ledger's file - its reader, writer and lock - is ``release.ledger``'s).

The proof's window (and, when ``trainer_measure_s`` is longer, the seconds after it) gives the
tok/s samples of this start: median, p10, p90, their number, plus any figure the user names by
regex. The ledger (``<trainer_root>/ledger.json``, written atomically, the last ``release.ledger.LEDGER_KEEP``
entries) keeps per experiment - a release and a configuration: release id, configuration id (a
keyed hash of the trainer's command and environment, ``target.config_id``; absent in entries written
before it), time, source (git commit + dirty, or content hash), verdict (proved / failed: reason /
rolled back) and figures. ``compare`` puts a new measurement beside the entry before it that was
proved (whichever release and configuration it ran: ``previous_proved``) and the best one;
``gate`` refuses one below ``min_ratio`` of it when it ran another release.

Figures are read as people write them (``parse_figure``): ``12.4K``, ``12,400``, ``1.2e4`` are all
12400.0; every reader of a figure (tok/s, the user's named figures, the step counter) reads it
through ``read_figure``, and a figure that cannot be read is reported as such (``None`` in the
values, counted as ``unreadable``), never stored as a different number.
"""

from __future__ import annotations

import math
import re
import time

PROVED = "proved"
# a proved entry's start of the trainer may be read a little before the proof's own clock
START_SLACK_S = 2.0

# --- figures as people write them -----------------------------------------------------------

SUFFIXES = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}
# A figure in a line: digits (thousands grouped by "," or "_", or not), a fraction, an exponent
# and a K/M/G suffix not followed by a letter ("12.4K", "12,400", "1.2e4", "21.5K"). Lowercase m
# and g are not suffixes (milli, grams): "5m" is not 5 million.
FIGURE = r"(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:_\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?(?:[kKMG](?![A-Za-z]))?"
_FIGURE_AT = re.compile(FIGURE)
_FIGURE_WHOLE = re.compile(
    r"\s*([+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:_\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)([kKMG]?)\s*")


def parse_figure(text):
    """The number a person wrote: "12.4K" -> 12400.0, "12,400" -> 12400.0, "1.2e4" -> 12000.0,
    "41250.3" -> 41250.3. ValueError (naming the text) for anything else: "12.4.5", "12,40",
    "nan", "inf", "" are not figures."""
    m = _FIGURE_WHOLE.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise ValueError("%r is not a number" % (text,))
    value = float(m.group(1).replace(",", "").replace("_", ""))
    if m.group(2):
        value *= SUFFIXES[m.group(2)]
    if not math.isfinite(value):
        raise ValueError("%r is not a finite number" % (text,))
    return value


def figure_group(match):
    """The index of the group that holds the figure: the first group that took part in the match
    (a regex with alternatives, such as the default tok/s regex, has one group per form), 0 when
    the regex has no group."""
    for index in range(1, (match.re.groups or 0) + 1):
        if match.group(index) is not None:
            return index
    return 0


def read_figure(match):
    """(value, None) for the figure a regex match captured, or (None, words) when it cannot be
    read: not a number, or only part of the figure the line shows (a regex capturing "12" of
    "12.4K" or "400" of "12,400" would store a different number)."""
    group = figure_group(match)
    text = match.group(group)
    start, end = match.span(group)
    line = match.string
    whole = _FIGURE_AT.match(line, start)
    if whole is not None and whole.end() > end:
        return None, "read %r where the line shows %r" % (text, whole.group(0))
    if start > 0 and (line[start - 1].isdigit() or (
            start > 1 and line[start - 1] in ",_." and line[start - 2].isdigit())):
        return None, "read %r, the end of a longer figure" % text
    try:
        return parse_figure(text), None
    except ValueError as exc:
        return None, str(exc)


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values, window_s=None):
    """{median, p10, p90, n, window_s} of the finite numbers in values (n 0: no figures), with
    ``unreadable``: how many figures could not be read (None in values), when any."""
    xs = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    out = {"n": len(xs), "window_s": window_s}
    unreadable = sum(1 for v in values if v is None)
    if unreadable:
        out["unreadable"] = unreadable
    for name, q in (("median", 0.5), ("p10", 0.1), ("p90", 0.9)):
        value = percentile(xs, q)
        out[name] = None if value is None else round(value, 1)
    return out


def short_k(value):
    """41250.3 -> "41.3K", 950 -> "950"."""
    if value is None:
        return "?"
    return "%.1fK" % (value / 1000.0) if abs(value) >= 1000 else "%.0f" % value


def pct_change(new, old):
    if new is None or not old:
        return None
    return (new - old) / old * 100.0


def previous_proved(ledger):
    """The entry before this one in time that was proved with a tok/s median, whichever release and
    configuration it ran: what a new measurement is compared with (an experiment that changed only
    the command or the environment is compared with the configuration before it, not with itself)."""
    for e in reversed(ledger or []):
        if e.get("verdict") == PROVED and _median(e) is not None:
            return e
    return None


def previous_good(ledger, release):
    """The bar of the throughput gate for ``release``: the previous proved entry when it ran another
    release, else None (the gate judges a change of code; a rollback brings back a release)."""
    prev = previous_proved(ledger)
    return prev if prev is not None and prev.get("release") != release else None


def best(ledger):
    proved = [e for e in ledger or [] if e.get("verdict") == PROVED and _median(e) is not None]
    return max(proved, key=_median) if proved else None


def _median(entry):
    return ((entry or {}).get("figures") or {}).get("tok_s", {}).get("median")


def config_of(e):
    """The configuration id of a ledger entry; None for an entry written before configurations were
    recorded (an unknown configuration)."""
    cid = (e or {}).get("config")
    return cid if isinstance(cid, str) and cid else None


def config_name(cid):
    """"1a2b3c4d", or "unknown" for an entry without a configuration id."""
    return cid or "unknown"


def what_changed(release, config, prev):
    """In words, what differs between (release, config) and the ledger entry ``prev``: "code changed",
    "command or environment changed", "code, command or environment changed", "nothing changed";
    with an unknown configuration on either side, only what is known."""
    code = release != prev.get("release")
    prev_config = config_of(prev)
    if config is None or prev_config is None:
        return ("code changed" if code else "same code") + "; configuration not recorded" + (
            "" if config is None else " before")
    if config != prev_config:
        return "code, command or environment changed" if code else "command or environment changed"
    return "code changed" if code else "nothing changed"


def compare(figures, ledger, release, source=None, config=None):
    """The comparison of this release's figures (run with configuration ``config``) with the entry
    before it that was proved (``previous_proved``) and the best: a dict with the words of the
    deploy's last line."""
    tok = (figures or {}).get("tok_s") or {}
    prev = previous_proved(ledger)
    top = best(ledger)
    median = tok.get("median")
    words = "release %s%s: %s tok/s (median of %d samples over %s s)" % (
        release, " (%s)" % source if source else "", short_k(median), tok.get("n") or 0,
        "%.0f" % tok["window_s"] if tok.get("window_s") is not None else "?")
    if tok.get("unreadable"):
        words += " [%d tok/s figure%s could not be read]" % (tok["unreadable"], "" if tok["unreadable"] == 1 else "s")
    change = None
    if prev is not None:
        change = pct_change(median, _median(prev))
        words += " — previous %s: %s (%s)" % (
            prev.get("release"), short_k(_median(prev)),
            "%+.0f%%" % change if change is not None else "n/a")
        if config is not None or config_of(prev) is not None:
            words += ", config %s vs %s (%s)" % (config_name(config), config_name(config_of(prev)),
                                                 what_changed(release, config, prev))
    else:
        words += " — no previous good release measured"
        if config is not None:
            words += ", config %s" % config
    best_median = max(_median(top), median or 0) if top is not None else median
    if best_median is not None:
        words += ", best %s" % short_k(best_median)
    return {"words": words, "median": median, "release": release, "config": config,
            "previous_release": prev.get("release") if prev else None,
            "previous_config": config_of(prev), "previous_at": prev.get("at") if prev else None,
            "previous_median": _median(prev), "change_pct": None if change is None else round(change, 1),
            "best_median": best_median}


def gate(comparison, min_ratio):
    """Words of a refusal when the median is below min_ratio of the previous proved entry's, else None.

    The gate judges a change of code only: when the previous proved entry ran the same release (an
    experiment with the command or the environment, a restart), there is no other release to roll
    back to, so the comparison is said and never refused here."""
    if not min_ratio or comparison.get("previous_median") in (None, 0) or comparison.get("median") is None:
        return None
    if comparison.get("release") is not None and comparison.get("release") == comparison.get("previous_release"):
        return None
    ratio = comparison["median"] / comparison["previous_median"]
    if ratio >= min_ratio:
        return None
    return ("throughput gate: %s tok/s is %.0f%% of the previous good release %s (%s tok/s); "
            "trainer_min_tokps_ratio asks for at least %.0f%%" % (
                short_k(comparison["median"]), ratio * 100, comparison["previous_release"],
                short_k(comparison["previous_median"]), min_ratio * 100))


def entry(release, verdict, figures=None, source=None, reason=None, now=None, config=None):
    """A ledger entry: ``config`` is the configuration id (``target.config_id``: a keyed hash of the command
    and the environment, never a value) - kept when known, absent when not."""
    now = time.time() if now is None else now
    out = {"release": release, "time": round(now, 3),
           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
           "source": source, "verdict": verdict, "figures": figures or {}}
    if config:
        out["config"] = config
    if reason:
        # its first line, whole: the writer masks it, then cuts it to REASON_CHARS (a cut before the
        # mask could leave the start of a secret; job.steps.Layout.record)
        out["reason"] = reason.splitlines()[0]
    return out


REASON_CHARS = 500


# --- a death after the proof ---------------------------------------------------------------------
# The launcher (roles/trainer/files/dflash-trainer-launch) notices its trainer exiting without a
# stop (no SIGTERM from systemd) and adds to the ledger entry that proved this activation
# ``died``: {after_s, at, time, reason, exit, invocation, count}. The words and the health of the
# running trainer are judged here, from the ledger and the unit (pure).

def fmt_age(seconds):
    """23 -> "23 s", 190 -> "3 min", 7300 -> "2 h 2 min"."""
    if seconds is None:
        return "?"
    seconds = max(0.0, float(seconds))
    if seconds < 120:
        return "%.0f s" % seconds
    if seconds < 7200:
        return "%.0f min" % (seconds / 60.0)
    return "%d h %d min" % (seconds // 3600, (seconds % 3600) // 60)


def died_words(e):
    """"proved, then died after 23 s: torch.OutOfMemoryError: …" for a proved entry whose trainer died
    after its proof, else None."""
    died = (e or {}).get("died")
    if (e or {}).get("verdict") != PROVED or not isinstance(died, dict):
        return None
    words = "proved, then died after %s: %s" % (
        fmt_age(died.get("after_s")), died.get("reason") or died.get("exit") or "no reason in the log")
    if (died.get("count") or 1) > 1:
        words += " (%d deaths since the proof)" % died["count"]
    return words


def latest_entry(ledger, release):
    """The newest ledger entry of ``release`` (any verdict), or None."""
    for e in reversed(ledger or []):
        if release and e.get("release") == release:
            return e
    return None


def health(ledger, release, running, started_at=None, n_restarts=0, now=None, state="?", stopped=None):
    """Is the trainer running its proved release healthily? -> dict(ok, words, died, proved_at,
    seconds_since_proof).

    ``release``: the release running (or, when nothing runs, the one that ran last); ``started_at``:
    this activation's start (wall clock, s); ``state``: the unit's ActiveState/SubState in words.
    Healthy: it runs, the release's newest ledger entry is ``proved``, nothing died since, and this
    activation is the one that was proved (it started before the proof: a start after it is systemd's
    Restart= bringing back a trainer that exited). ``stopped``: the deliberate stop on record that still
    holds (``plan.status.stopped_on_purpose``): not running then is no failure - ``stopped`` says so, ``ok`` stays
    false (it does not run)."""
    now = time.time() if now is None else now
    e = latest_entry(ledger, release)
    restarts = " (unit restarts: %s)" % n_restarts
    out = {"ok": False, "died": None, "proved_at": None, "seconds_since_proof": None, "release": release}
    if e is not None and e.get("verdict") == PROVED:
        out["proved_at"] = e.get("at")
        if isinstance(e.get("time"), (int, float)):
            out["seconds_since_proof"] = round(now - e["time"], 1)
    died = e.get("died") if e is not None and e.get("verdict") == PROVED and isinstance(e.get("died"), dict) else None
    if stopped and not running:
        out["stopped"] = stopped
        out["words"] = "%s%s" % (stopped.get("words") or "stopped on purpose", restarts)
        return out
    if died:
        out["died"] = dict(died, words=died_words(e))
        out["words"] = "died %s after its proof: %s%s; %s" % (
            fmt_age(died.get("after_s")), died.get("reason") or died.get("exit") or "no reason in the log", restarts,
            "running again, not proved since" if running else "not running (%s)" % state)
        return out
    if not running:
        out["words"] = "not running (%s)%s%s" % (state, restarts, ", last release %s" % release if release else "")
        return out
    if e is None:
        out["words"] = "running release %s has no proof on record%s" % (release or "?", restarts)
        return out
    if e.get("verdict") != PROVED:
        out["words"] = "running release %s, whose last verdict is %s%s%s" % (
            release, e.get("verdict"), ": %s" % e["reason"] if e.get("reason") else "", restarts)
        return out
    if started_at is not None and isinstance(e.get("time"), (int, float)) and started_at > e["time"] + START_SLACK_S:
        out["words"] = "restarted %s after its proof, not proved since%s" % (fmt_age(started_at - e["time"]), restarts)
        return out
    out.update(ok=True, words="running release %s, proved %s ago%s" % (
        release, fmt_age(out["seconds_since_proof"]), restarts))
    return out


# The history table's header, its columns as history_line writes them (the role's history task and
# the CLI print it above the lines).
HISTORY_HEADER = "%-16s  %-8s  %-20s  %-12s  %-25s  %s" % (
    "RELEASE", "CONFIG", "WHEN", "VERDICT", "TOK/S MEDIAN (P10-P90, N)", "SOURCE")


def history_rows(ledger, running=None, current=None, limit=10, running_config=None):
    """The last ``limit`` entries, newest first, as rows for a table (release, config, at, verdict,
    median, p10, p90, n, source, vs: the comparison with the entry before it that was proved, marks:
    running / current). An experiment - the same release with another command or environment - is a
    row of its own; ``running_config`` (the configuration installed on the target, when known) puts
    the running mark on the rows of that configuration only."""
    rows = []
    entries = list(ledger or [])
    first = max(0, len(entries) - limit)
    for i in range(len(entries) - 1, first - 1, -1):
        e = entries[i]
        tok = (e.get("figures") or {}).get("tok_s") or {}
        config = config_of(e)
        marks = [m for m, rid in (("running", running), ("current", current)) if rid and rid == e.get("release")
                 and not (m == "running" and running_config and config != running_config)]
        rows.append({"release": e.get("release"), "config": config, "at": e.get("at"), "verdict": e.get("verdict"),
                     "reason": e.get("reason"), "median": tok.get("median"), "p10": tok.get("p10"),
                     "p90": tok.get("p90"), "n": tok.get("n"), "source": e.get("source"),
                     "marks": marks, "extra": {k: v for k, v in (e.get("figures") or {}).items() if k != "tok_s"},
                     "died": died_words(e), "vs": vs_previous(entries[:i], e)})
        rows[-1]["line"] = history_line(rows[-1])
    return rows


def vs_previous(before, e):
    """An entry against the entry before it that was proved (``previous_proved``): {release, config,
    median, change_pct, words} - words such as "config 1a2b3c4d vs 9f8e7d6c: -12% (command or
    environment changed)" - or None when nothing before it was proved or it has no figure."""
    prev = previous_proved(before)
    median = _median(e)
    if prev is None or median is None:
        return None
    change = pct_change(median, _median(prev))
    return {"release": prev.get("release"), "config": config_of(prev), "median": _median(prev),
            "change_pct": None if change is None else round(change, 1),
            "words": "config %s vs %s: %s (%s)" % (
                config_name(config_of(e)), config_name(config_of(prev)),
                "%+.0f%%" % change if change is not None else "n/a",
                what_changed(e.get("release"), config_of(e), prev))}


def history_line(row):
    """One line of the history table for a row of ``history_rows`` (columns: ``HISTORY_HEADER``)."""
    tok = "%s (%s-%s, %s)" % (short_k(row.get("median")), short_k(row.get("p10")), short_k(row.get("p90")),
                              row.get("n") if row.get("n") is not None else "?")
    verdict = row.get("verdict") or "?"
    marks = " <- %s" % ", ".join(row.get("marks") or []) if row.get("marks") else ""
    reason = "  [%s]" % row["reason"] if row.get("reason") and verdict != PROVED else ""
    if row.get("died"):
        reason += "  [%s]" % row["died"]
    extra = "".join("  %s=%s" % (k, (v or {}).get("median")) for k, v in sorted((row.get("extra") or {}).items()))
    vs = "  (%s)" % row["vs"]["words"] if isinstance(row.get("vs"), dict) and row["vs"].get("words") else ""
    return "%-16s  %-8s  %-20s  %-12s  %-25s  %s%s%s%s%s" % (
        row.get("release") or "?", row.get("config") or "?", row.get("at") or "?", verdict, tok,
        row.get("source") or "-", extra, vs, marks, reason)
