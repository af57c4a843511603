"""What the CLI shows while a play runs and after it: progress lines from ansible-runner's events,
a summary table, diffs, log lines.

Terminal output goes through rich (`pip install dflash-trainer[cli]`) when it is installed and the
stream is a terminal; otherwise - or when rich is missing - plain text, the same words.
"""
from __future__ import annotations

import difflib
import sys
import time
from typing import Callable, Optional, TextIO

from .results import HostResult, RunResult

COLLECTION = "dflash.trainer"


def _rich_console(stream: TextIO):
    """A rich Console on STREAM when rich is installed and STREAM is a terminal, else None."""
    try:
        isatty = stream.isatty()
    except (AttributeError, ValueError):
        isatty = False
    if not isatty:
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(file=stream, highlight=False, soft_wrap=True)


def _action(data: dict) -> str:
    return str(data.get("resolved_action") or data.get("task_action") or "")


def _is(action: str, module: str) -> bool:
    return action in ("%s.%s" % (COLLECTION, module), module)


class Progress:
    """An ansible-runner event handler that says what the play is doing, one line at a time:
    `step: <task name>` when a task starts; while the restart job runs, its phase each time the
    watch task comes back (`restart job: proving (45 s)`); a failed task's first line of message.
    lines: what it printed (for tests); clock: time.monotonic."""

    def __init__(self, stream: Optional[TextIO] = None, clock: Callable[[], float] = time.monotonic):
        self.stream = stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.started = clock()
        self.lines: list[str] = []
        self._console = _rich_console(stream)
        self._job_started: Optional[float] = None
        self._last_phase: Optional[str] = None

    def say(self, text: str, style: Optional[str] = None) -> None:
        self.lines.append(text)
        stamp = "[%4ds] " % int(self.clock() - self.started)
        if self._console is not None:
            self._console.print(stamp + text, style=style, markup=False)
        else:
            self.stream.write(stamp + text + "\n")
            self.stream.flush()

    def __call__(self, event: dict) -> None:
        name = event.get("event")
        data = event.get("event_data") or {}
        if not isinstance(data, dict):
            return
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        action = _action(data)
        if name == "playbook_on_task_start":
            task = data.get("task") or action
            if task:
                self.say("step: %s" % task, style="bold")
        elif name == "runner_retry":
            if _is(action, "trainer_restart"):
                self._phase(res.get("phase") or "?")
            else:
                self.say("  still waiting: %s (attempt %s of %s)" % (
                    data.get("task"), res.get("attempts", "?"), res.get("retries", "?")), style="dim")
        elif name == "runner_on_ok" and _is(action, "trainer_restart"):
            if res.get("started"):
                self._job_started = self.clock()
                self._phase(res.get("phase") or "started")
            elif res.get("finished"):
                self._phase("done")
        elif name in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            msg = str(res.get("msg") or "").strip().splitlines()
            self.say("  %s on %s: %s" % ("UNREACHABLE" if name == "runner_on_unreachable" else "failed",
                                         data.get("host"), msg[0] if msg else "(no message)"), style="red")

    def _phase(self, phase: str) -> None:
        since = "" if self._job_started is None else " (%d s)" % int(self.clock() - self._job_started)
        if phase != self._last_phase or since:
            self.say("  restart job: %s%s" % (phase, since), style="cyan")
        self._last_phase = phase


# --- after the run ---------------------------------------------------------------------------------

def _tok_s(h: HostResult) -> Optional[float]:
    if h.comparison and h.comparison.get("median") is not None:
        return h.comparison.get("median")
    if h.proof and h.proof.tok_s is not None:
        return h.proof.tok_s
    if h.status and h.status.tok_s is not None:
        return h.status.tok_s
    return None


def _fmt_tok_s(value) -> str:
    try:
        return "%.0f" % float(value)
    except (TypeError, ValueError):
        return "-"


def summary_rows(result: RunResult) -> list[list[str]]:
    """[host, result, release, restarted, rolled back, tok/s] per host."""
    rows = []
    for h in result.hosts.values():
        rows.append([h.host, ("ok" if h.ok else "FAILED") + (" (changed)" if h.ok and h.changed else ""),
                     h.release or "-", "yes" if h.restarted else "no", "yes" if h.rolled_back else "no",
                     _fmt_tok_s(_tok_s(h))])
    return rows


HEADER = ["HOST", "RESULT", "RELEASE", "RESTARTED", "ROLLED BACK", "TOK/S"]


def plain_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header] + rows)


def summary(result: RunResult) -> str:
    """The summary table (plain text) and, under it, each host's comparison line."""
    lines = [plain_table(HEADER, summary_rows(result))]
    for h in result.hosts.values():
        if h.comparison and h.comparison.get("words"):
            lines.append("%s: %s" % (h.host, h.comparison["words"]))
    return "\n".join(lines)


def print_summary(result: RunResult, stream: Optional[TextIO] = None) -> None:
    stream = sys.stdout if stream is None else stream
    console = _rich_console(stream)
    if console is None:
        stream.write(summary(result) + "\n")
        return
    from rich.table import Table
    table = Table(*HEADER, title="summary", title_justify="left")
    for row in summary_rows(result):
        table.add_row(*row, style=None if row[1].startswith("ok") else "red")
    console.print(table)
    for h in result.hosts.values():
        if h.comparison and h.comparison.get("words"):
            console.print("%s: %s" % (h.host, h.comparison["words"]), markup=False, highlight=False)


def render_diff(d: dict) -> str:
    """One of Ansible's diffs as text: `prepared` as is, else a unified diff of before/after."""
    if d.get("prepared"):
        return d["prepared"].rstrip("\n")
    before, after = d.get("before") or "", d.get("after") or ""
    out = difflib.unified_diff(before.splitlines(), after.splitlines(), d.get("before_header") or "before",
                               d.get("after_header") or "after", lineterm="")
    return "\n".join(out)


def diffs_text(result: RunResult) -> str:
    """Every host's diffs (diff mode), each under its task's name; empty when there are none."""
    lines = []
    for h in result.hosts.values():
        for d in h.diffs:
            text = render_diff(d)
            if text:
                lines.append("--- %s: %s" % (h.host, d.get("task")))
                lines.append(text)
    return "\n".join(lines)
