"""The optimization loop as a picture: tok/s per release over time, from the release ledger.

`dflash-trainer history --plot FILE` (FILE .png, .svg, or .html: a self-contained page with the
SVG inline and the table beside it) draws, per host, each ledger entry in deploy order: the tok/s
median, its p10-p90 band, a marker by verdict (proved, rolled back, failed - a release that
failed before any figure sits on the bottom edge), the running release ringed, each point labelled
with its release id, source (git commit or content hash) and configuration id (its command and
environment: an experiment with a knob is a point of its own), and the throughput gate's threshold
when a ratio is set: the bar each release had to clear, `trainer_min_tokps_ratio` × the median of
the entry before it that was proved, drawn where the gate judges - a change of release (the rule of
plugins/module_utils/proof/throughput.py: previous_proved, gate).
`sparkline` gives the same series as one line of text for the terminal.

The data shaping (`points`, `previous_good`, `sparkline`, labels) is pure and unit-tested;
matplotlib (the [plot] extra: `pip install 'dflash-trainer[plot]'`) is imported only to draw.
"""
from __future__ import annotations

import dataclasses
import datetime
import html
import io
import os
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from dflash_trainer.results import _float  # one reading of a ledger number for the table and the chart

__all__ = ["PlotUnavailable", "Point", "FORMATS", "chart_format", "points", "previous_proved", "previous_good",
           "short_source",
           "point_label", "sparkline", "sparkline_line", "require_matplotlib", "figure", "render"]

FORMATS = {".png": "png", ".svg": "svg", ".html": "html"}
PROVED, ROLLED_BACK, FAILED = "proved", "rolled back", "failed"
SPARKS = "▁▂▃▄▅▆▇█"
NO_FIGURE = "·"  # an entry without a tok/s median (a release that failed before its first figure)
INSTALL_HINT = "pip install 'dflash-trainer[plot]' (in a checkout: pip install -e '.[plot]', or make setup)"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


@dataclass(frozen=True)
class Point:
    """One ledger entry, in deploy order (index 0 the oldest shown)."""
    index: int
    release: str
    at: Optional[datetime.datetime]
    verdict: str
    median: Optional[float]
    p10: Optional[float]
    p90: Optional[float]
    n: Optional[int]
    source: Optional[str]
    reason: Optional[str] = None
    running: bool = False  # the newest entry of the release the unit runs
    current: bool = False  # the newest entry of the release `current` points at
    threshold: Optional[float] = None  # the gate's bar for this entry (None: no ratio, no previous good)
    config: Optional[str] = None  # the configuration id (command and environment); None: not recorded


def chart_format(path: str) -> str:
    """png, svg or html by PATH's extension; ValueError naming the accepted ones."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise ValueError("--plot %s: the chart's format comes from the extension, one of %s"
                         % (path, ", ".join(sorted(FORMATS))))
    return FORMATS[ext]


def _at(text) -> Optional[datetime.datetime]:
    """The ledger's `at` ("2026-11-30T17:36:02Z") as an aware datetime; None when unreadable."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        return None


def previous_proved(before: Sequence[Point]) -> Optional[Point]:
    """The latest proved entry with a median, whichever release and configuration (what an entry is
    compared with)."""
    for p in reversed(before):
        if p.verdict == PROVED and p.median is not None:
            return p
    return None


def previous_good(before: Sequence[Point], release: str) -> Optional[Point]:
    """What the gate compares ``release`` with: the previous proved entry when it ran another release
    (the gate judges changes of code; an experiment with the same release is compared, never gated)."""
    prev = previous_proved(before)
    return prev if prev is not None and prev.release != release else None


def points(rows: Iterable[Mapping], min_ratio: Optional[float] = None) -> list[Point]:
    """Chart points from `history` rows (TrainerStatus.history: newest first, as trainer_status
    returns them), oldest first; threshold = min_ratio × previous good median when min_ratio > 0."""
    rows = [r for r in rows if isinstance(r, Mapping)][::-1]
    newest = {}
    for i, r in enumerate(rows):
        newest[str(r.get("release"))] = i
    # the running mark: the newest row that carries it (rows of the running release, of its configuration
    # when the target knows it)
    running_at = max([i for i, r in enumerate(rows) if "running" in (r.get("marks") or [])], default=None)
    out: list[Point] = []
    for i, r in enumerate(rows):
        release = str(r.get("release") or "?")
        marks = r.get("marks") or []
        n = r.get("n")
        p = Point(index=i, release=release, at=_at(r.get("at")), verdict=str(r.get("verdict") or "?"),
                  median=_float(r.get("median")), p10=_float(r.get("p10")), p90=_float(r.get("p90")),
                  n=n if isinstance(n, int) and not isinstance(n, bool) else None,
                  source=r.get("source") or None, reason=r.get("reason") or None,
                  running="running" in marks and running_at == i,
                  current="current" in marks and newest.get(release) == i,
                  config=r.get("config") if isinstance(r.get("config"), str) and r.get("config") else None)
        if min_ratio:
            prev = previous_good(out, release)
            if prev is not None:
                p = dataclasses.replace(p, threshold=round(min_ratio * prev.median, 1))
        out.append(p)
    return out


def short_source(source: Optional[str]) -> str:
    """"git 4f1c2d9 dirty" -> "git 4f1c2d9+", "content 1bbe159d6a73a747" -> "content 1bbe159d"."""
    if not source:
        return "-"
    words = source.split()
    if words[0] == "git" and len(words) > 1:
        return "git %s%s" % (words[1], "+" if "dirty" in words[2:] else "")
    if words[0] == "content" and len(words) > 1:
        return "content %s" % words[1][:8]
    return source[:24]


def point_label(p: Point) -> str:
    """The lines beside a point: the release id (8 characters, as the table's first column starts)
    and its source; then "config <id>" when the entry has one (an experiment with the same code is told
    apart by it), and "no tok/s" for an entry without a median (drawn on the bottom edge)."""
    return "%s\n%s%s%s" % (p.release[:8], short_source(p.source), "\nconfig %s" % p.config if p.config else "",
                           "" if p.median is not None else "\nno tok/s")


def sparkline(values: Sequence[Optional[float]]) -> str:
    """▁…█ scaled between the smallest and largest value; · for None."""
    known = [v for v in values if v is not None]
    if not known:
        return NO_FIGURE * len(values)
    lo, hi = min(known), max(known)
    out = []
    for v in values:
        if v is None:
            out.append(NO_FIGURE)
        elif hi == lo:
            out.append(SPARKS[len(SPARKS) // 2])
        else:
            out.append(SPARKS[min(len(SPARKS) - 1, int((v - lo) / (hi - lo) * len(SPARKS)))])
    return "".join(out)


def sparkline_line(rows: Iterable[Mapping]) -> Optional[str]:
    """The history's tok/s medians as one line, oldest to newest (None without rows)."""
    pts = points(rows)
    if not pts:
        return None
    known = [p.median for p in pts if p.median is not None]
    span = "%s … %s" % (_k(min(known)), _k(max(known))) if known else "no figures"
    return "tok/s per release, oldest → newest: %s  (%s; %s = no figure)" % (
        sparkline([p.median for p in pts]), span, NO_FIGURE)


def _k(value: float) -> str:
    return "%.1fK" % (value / 1000.0) if abs(value) >= 1000 else "%.0f" % value


# --- drawing (matplotlib) --------------------------------------------------------------------------

def require_matplotlib():
    """matplotlib's Figure, or PlotUnavailable saying how to install it."""
    try:
        from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise PlotUnavailable("the chart needs matplotlib, which is not installed (%s): %s" % (e, INSTALL_HINT)) \
            from None
    return Figure


STYLE = {  # verdict -> marker, colour, legend words
    PROVED: ("o", "#1f77b4", "proved"),
    ROLLED_BACK: ("v", "#ff7f0e", "rolled back"),
    FAILED: ("X", "#d62728", "failed"),
}


def _draw_host(ax, host: str, pts: Sequence[Point], min_ratio: Optional[float]) -> None:
    from matplotlib.ticker import FuncFormatter  # pylint: disable=import-outside-toplevel
    from matplotlib.transforms import blended_transform_factory  # pylint: disable=import-outside-toplevel

    edge = blended_transform_factory(ax.transData, ax.transAxes)  # x in data, y on the axes (0 = bottom)
    measured = [p for p in pts if p.median is not None]
    banded = [p for p in pts if p.p10 is not None and p.p90 is not None]
    for p in banded:
        ax.bar([p.index], [p.p90 - p.p10], bottom=[p.p10], width=0.5, color="#1f77b4", alpha=0.18,
               gid="band-%d" % p.index, label="p10–p90" if p is banded[0] else None)
    if measured:
        ax.plot([p.index for p in measured], [p.median for p in measured], "-", color="#7f7f7f", lw=1,
                gid="median-line")
    shown = set()
    for p in pts:
        marker, colour, words = STYLE.get(p.verdict, ("s", "#9467bd", p.verdict))
        label = None if words in shown else words
        shown.add(words)
        if p.median is not None:
            ax.plot([p.index], [p.median], marker=marker, color=colour, ms=8, ls="none", label=label,
                    gid="point-%d" % p.index)
            anchor, transform = (p.index, p.median), ax.transData
        else:  # failed before any figure: on the bottom edge
            ax.plot([p.index], [0.04], marker=marker, color=colour, ms=9, ls="none", transform=edge, label=label,
                    clip_on=False, gid="point-%d" % p.index)
            anchor, transform = (p.index, 0.04), edge
        ax.annotate(point_label(p), anchor, xycoords=transform, xytext=(0, 10), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7, gid="label-%d" % p.index)
        if p.running:
            ax.plot([anchor[0]], [anchor[1]], marker="o", ms=17, mfc="none", mec="#2ca02c", mew=2, ls="none",
                    transform=transform, label="running", gid="running-%d" % p.index)
    gated = [p for p in pts if p.threshold is not None]
    if gated:
        ax.hlines([p.threshold for p in gated], [p.index - 0.45 for p in gated], [p.index + 0.45 for p in gated],
                  colors="#d62728", linestyles="dashed", lw=1.5, gid="gate-threshold",
                  label="gate: %.0f%% of the previous good median" % (min_ratio * 100))
    ax.set_title(host, loc="left", fontsize=10)
    ax.set_ylabel("tok/s (median)")
    ax.set_xticks([p.index for p in pts])
    ax.set_xticklabels([p.at.strftime("%m-%d %H:%M") if p.at else "?" for p in pts], rotation=30, ha="right",
                       fontsize=7)
    ax.set_xlim(-0.7, max(len(pts) - 0.3, 0.7))
    ys = [y for p in pts for y in (p.p10, p.p90, p.median, p.threshold) if y is not None]
    if ys:
        span = max(ys) - min(ys) or max(ys) * 0.1 or 1.0
        ax.set_ylim(max(0.0, min(ys) - 0.35 * span), max(ys) + 0.35 * span)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: _k(y)))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def figure(by_host: Mapping[str, Sequence[Point]], min_ratio: Optional[float] = None):
    """The chart as a matplotlib Figure: one row per host (no pyplot, no global backend)."""
    Figure = require_matplotlib()
    hosts = [h for h in by_host if by_host[h]]
    if not hosts:
        raise ValueError("no release measured yet: nothing to draw")
    width = max(7.0, 1.0 + 0.9 * max(len(by_host[h]) for h in hosts))
    fig = Figure(figsize=(width + 2.5, 3.6 * len(hosts)), layout="constrained")
    axes = fig.subplots(len(hosts), 1, squeeze=False)[:, 0]
    for ax, host in zip(axes, hosts):
        _draw_host(ax, host, by_host[host], min_ratio)
    fig.suptitle("dflash-trainer history: tok/s per release", fontsize=11)
    return fig


def _svg(fig) -> str:
    import matplotlib  # pylint: disable=import-outside-toplevel

    buf = io.StringIO()
    # text stays text (searchable, selectable); ids do not change from run to run
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dflash-trainer"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def _html(fig, by_host: Mapping[str, Sequence[Point]]) -> str:
    svg = _svg(fig)
    svg = svg[svg.index("<svg"):]  # no XML declaration nor DOCTYPE inside the page
    rows = []
    for host, pts in by_host.items():
        for p in reversed(pts):
            cells = (host, p.release, p.config or "-", p.at.strftime("%Y-%m-%dT%H:%M:%SZ") if p.at else "?", p.verdict,
                     "-" if p.median is None else "%.1f" % p.median,
                     "-" if p.p10 is None or p.p90 is None else "%.1f–%.1f" % (p.p10, p.p90),
                     "-" if p.n is None else str(p.n), p.source or "-",
                     "-" if p.threshold is None else "%.1f" % p.threshold,
                     ", ".join(m for m, on in (("running", p.running), ("current", p.current)) if on),
                     p.reason or "")
            rows.append("<tr>%s</tr>" % "".join("<td>%s</td>" % html.escape(c) for c in cells))
    head = ("host", "release", "config", "when", "verdict", "tok/s median", "p10–p90", "n", "source",
            "gate threshold", "", "reason")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>dflash-trainer history</title>"
            "<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;font-size:90%%}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}</style></head><body>\n"
            "<h1>dflash-trainer history</h1>\n%s\n<table><thead><tr>%s</tr></thead><tbody>\n%s\n</tbody></table>\n"
            "</body></html>\n" % (svg, "".join("<th>%s</th>" % html.escape(h) for h in head), "\n".join(rows)))


def render(by_host: Mapping[str, Sequence[Point]], path: str, min_ratio: Optional[float] = None) -> str:
    """Write the chart to PATH (format by extension, see chart_format); returns the format.
    The file is written whole or not at all (temp file + rename)."""
    fmt = chart_format(path)
    fig = figure(by_host, min_ratio)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        if fmt == "png":
            fig.savefig(tmp, format="png", dpi=120, metadata={"Software": None})
        else:
            text = _svg(fig) if fmt == "svg" else _html(fig, by_host)
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return fmt
