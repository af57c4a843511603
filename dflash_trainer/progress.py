"""What the CLI shows while a play runs and after it: progress lines from ansible-runner's events
(the restart job's phase: stopping, draining, purging, starting, proving, ...), the end-of-run
summary (one block per host), diffs, log lines.

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
# what the watch of a restart job says of each phase (plugins/action/trainer_restart.py): "[host] restart job: ..."
WATCH_MARK = "] restart job: "


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
        self._phase_said: Optional[float] = None

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
        elif name == "verbose" and WATCH_MARK in str(event.get("stdout") or ""):
            # the watch task's own lines (plugins/action/trainer_restart.py): "[host] restart job: <phase ...>"
            text = str(event.get("stdout")).strip()
            host, _sep, said = text.partition(WATCH_MARK)
            self.say("  %s: restart job: %s" % (host.strip().lstrip("["), said.strip()), style="cyan")
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

    HEARTBEAT_S = 30  # a phase that lasts is said again this often (the watch comes back every 10 s)

    def _phase(self, phase: str) -> None:
        """The restart job's phase, when it changes (and every HEARTBEAT_S while it lasts): the
        watch task's retries are these lines, never Ansible's "FAILED - RETRYING"."""
        now = self.clock()
        since = "" if self._job_started is None else " (%d s)" % int(now - self._job_started)
        if phase != self._last_phase or self._phase_said is None or now - self._phase_said >= self.HEARTBEAT_S:
            self.say("  restart job: %s%s" % (phase, since), style="cyan")
            self._phase_said = now
        self._last_phase = phase


# --- after the run ---------------------------------------------------------------------------------

def _fmt_tok_s(value) -> str:
    try:
        return "%.0f" % float(value)
    except (TypeError, ValueError):
        return "-"


def _fmt_s(value) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "?"
    return "%d min %02d s" % divmod(int(round(value)), 60) if value >= 120 else "%.1f s" % value if value < 10 \
        else "%d s" % round(value)


def host_block(h: HostResult, playbook: Optional[str] = None, run_elapsed_s: Optional[float] = None) -> list[str]:
    """One host's block of the end-of-run summary (HostResult.summary in words): the verdict and
    exit code, the release and its source, the configuration, tok/s against the previous
    configuration, what was done, the time taken."""
    s = h.summary(playbook)
    elapsed = s["elapsed_s"] if s["elapsed_s"] is not None else run_elapsed_s
    lines = ["%s: %s (exit %d)%s" % (h.host, s["verdict"].upper(), s["exit_code"],
                                     " in %s" % _fmt_s(elapsed) if elapsed is not None else "")]
    if s["release"]:
        was = " (was %s)" % s["previous_release"] if s["previous_release"] and s["previous_release"] != s["release"] \
            else ""
        source = s["source"] or ("its content (trainer_src is not a git checkout)" if s["source"] == "" else "-")
        lines.append("  release %s%s, source %s" % (s["release"], was, source))
    t = s["tok_s"]
    if s["config"] or t["previous_config"]:
        lines.append("  config %s%s" % (s["config"] or "?", " (previous %s)" % t["previous_config"]
                                        if t["previous_config"] and t["previous_config"] != s["config"] else ""))
    if t["now"] is not None:
        if t["previous"] is not None:
            pct = t["change_pct"]
            if pct is None and t["previous"]:
                pct = 100.0 * (t["now"] - t["previous"]) / t["previous"]
            lines.append("  tok/s %s vs %s before%s (release %s, config %s)" % (
                _fmt_tok_s(t["now"]), _fmt_tok_s(t["previous"]), "" if pct is None else " (%+.1f%%)" % pct,
                t["previous_release"] or "?", t["previous_config"] or "?"))
        else:
            lines.append("  tok/s %s (no earlier proved entry to compare with)" % _fmt_tok_s(t["now"]))
    for words in s["done"]:
        lines.append("  " + words)
    return lines


def summary(result: RunResult) -> str:
    """The end-of-run summary: a line for the run (what ran, how long, which inventory), one block
    per host, and the exit status with its meaning."""
    from .results import EXIT_CODES
    head = "summary: %s" % (result.playbook or "run")
    if result.elapsed_s is not None:
        head += ", %s" % _fmt_s(result.elapsed_s)
    if result.inventory:
        head += "; inventory %s (%s)" % (", ".join(result.inventory), result.inventory_from or "?")
    if result.started and result.playbook:
        head += "; Ansible configuration %s" % (result.config or "none (Ansible's defaults)")
    lines = [head]
    if result.config_ignored:
        lines.append("not read: %s (its directory is one every user may write; Ansible ignores it too)"
                     % result.config_ignored)
    for h in result.hosts.values():
        lines.extend(host_block(h, result.playbook, result.elapsed_s))
    if not result.hosts:
        lines.append("no host: %s" % ((result.reason or "no host was processed").splitlines() or ["?"])[0])
    code = result.exit_code
    lines.append("exit status %d: %s" % (code, EXIT_CODES.get(code, "?")))
    return "\n".join(lines)


def print_summary(result: RunResult, stream: Optional[TextIO] = None) -> None:
    stream = sys.stdout if stream is None else stream
    text = summary(result)
    console = _rich_console(stream)
    if console is None:
        stream.write(text + "\n")
        stream.flush()
        return
    for line in text.splitlines():
        bad = not line.startswith(" ") and "(exit " in line and "(exit 0)" not in line
        console.print(line, style="bold red" if bad else "bold" if "(exit 0)" in line else None,
                      markup=False, highlight=False)


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
