"""dflash-trainer (python -m dflash_trainer) deploy|status|restart|rollback|history|logs [-l HOST]
[-i INVENTORY] [-e k=v]... [--check] [--diff] [--json] [-q]
dflash-trainer logs -l HOST [-n 20] [-f] [--start INVOCATION]
dflash-trainer history -l HOST [-n 10] [--plot FILE.png|.svg|.html [--min-tokps-ratio 0.9]]

While a play runs, stderr says what it does (`step: <task>`, the restart job's phase); at the end
stdout has each host's report, the diffs (--diff) and a summary table (deploy, restart, rollback).
--json prints the RunResult instead (RunResult.from_dict reads it back). logs prints this start's
last lines (-n), -f follows them until Ctrl-C or SIGTERM. history prints the ledger's table and a
sparkline of tok/s per release; --plot draws the chart (dflash_trainer/plot.py, matplotlib).

Exit status: 0 when every host is ok, 1 when the run or a host failed (a run that matches no
host included, a play stopped by Ctrl-C / SIGTERM), 2 on a usage error; logs -f stopped by
Ctrl-C / SIGTERM: 0.
-e takes what ansible-playbook's -e takes: key=value (value a string), a JSON object, @file (YAML/JSON).
Configuration and inventory are the caller's, as for ansible-playbook run from the checkout:
$ANSIBLE_CONFIG when set (else the checkout's ansible.cfg), -i when given (else that
configuration's inventory); host key checking stays as that configuration says.
"""
from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from typing import Optional

from . import api, plot, progress
from .results import HostResult, RunResult, TrainerLog

PLOT_HISTORY = 50  # the ledger's length (LEDGER_KEEP in plugins/module_utils/_throughput.py)


def parse_extravar(text: str) -> dict:
    text = text.strip()
    if text.startswith("@"):
        import yaml
        with open(text[1:]) as fh:
            data = yaml.safe_load(fh) or {}
    elif text.startswith("{"):
        data = json.loads(text)
    else:
        data = {}
        # like ansible-playbook -e: shell-style words, so 'msg="two words"' is one value
        for part in shlex.split(text):
            if "=" not in part:
                raise ValueError("expected key=value, got %r" % part)
            key, value = part.split("=", 1)
            data[key] = value
    if not isinstance(data, dict):
        raise ValueError("extra vars must be a mapping: %r" % text)
    return data


def describe_host(h: HostResult) -> list[str]:
    lines = ["%s: %s%s" % (h.host, "ok" if h.ok else "FAILED", " (changed)" if h.changed else "")]
    if h.release:
        was = " (was %s)" % h.previous_release if h.previous_release and h.previous_release != h.release else ""
        lines.append("  release %s%s" % (h.release, was))
    if h.rolled_back:
        lines.append("  rolled back")
    if h.proof:
        p = h.proof
        lines.append("  proved ready: release %s, pid %s, step %s, %s tok/s, %s s to ready, GPU MiB %s"
                     % (p.release, p.main_pid, p.step, p.tok_s, p.seconds_to_ready, p.gpus_mib))
    elif h.restarted:
        lines.append("  restarted")
    if h.status:
        s = h.status
        lines.append("  unit %s/%s pid %s, running %s, current %s, last good %s%s"
                     % (s.active_state, s.sub_state, s.main_pid, s.running_release, s.current_release,
                        s.last_good, " DRIFT" if s.drift else ""))
        lines.append("  GPU MiB %s; last progress: %s (%s tok/s)" % (s.gpus_mib, s.last_progress_line, s.tok_s))
        if s.last_job:
            lines.append("  last restart: %s" % s.last_job.get("words"))
        if s.health:
            lines.append("  health: %s%s" % ("" if s.health.get("ok") else "NOT OK: ", s.health.get("words")))
        if s.history:
            lines.append("  RELEASE           WHEN                  VERDICT       TOK/S MEDIAN (P10-P90, N)   SOURCE")
            lines.extend("  " + str(row.get("line") or row.get("release")) for row in s.history)
            spark = plot.sparkline_line(s.history)
            if spark:
                lines.append("  " + spark)
    if h.comparison:
        lines.append("  " + h.comparison.get("words", ""))
    if not h.ok:
        lines.append("  failed task: %s" % h.failed_task)
        for line in (h.reason or "").splitlines():
            lines.append("  | " + line)
        if h.log_tail:
            lines.append("  log tail:")
            lines.extend("    " + line for line in h.log_tail)
    return lines


def describe(result: RunResult, limit: Optional[str] = None) -> str:
    lines = ["%s (runner status %s, rc %s)" % ("OK" if result.ok else "FAILED", result.status, result.rc)]
    if not result.hosts and "leaves us with no hosts to target" in (result.reason or ""):
        lines.append("no host matched the limit %r: ansible-playbook found no host to target in the inventory"
                     % limit if limit else "no host matched: ansible-playbook found no host to target in the inventory")
    elif result.reason:  # the run could not start, or ended before its recap: say why
        lines.extend(result.reason.splitlines())
    elif not result.hosts:
        lines.append("no host matched%s: no host was processed (the playbooks act on the group trainer_hosts "
                     "of the inventory, or -e trainer_target_hosts=PATTERN)"
                     % (" the limit %r" % limit if limit else ""))
    for h in result.hosts.values():
        lines.extend(describe_host(h))
    return "\n".join(lines)


class Stop:
    """Set by Ctrl-C (SIGINT) or SIGTERM: the running play is cancelled (ansible-runner's
    cancel_callback) and the CLI ends cleanly. A second signal ends it at once."""

    def __init__(self):
        self.signal: Optional[int] = None
        self._previous: dict = {}

    def __call__(self) -> bool:
        return self.signal is not None

    def handle(self, signum, _frame):
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signum

    def install(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self.handle)
        return self

    def uninstall(self):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


def print_log(host: str, log: TrainerLog, many: bool, as_json: bool, out=None) -> None:
    out = out or sys.stdout
    if as_json:
        out.write(json.dumps(dict(host=host, **log.__dict__), sort_keys=True) + "\n")
    else:
        prefix = "%s | " % host if many else ""
        for line in log.lines:
            out.write(prefix + line + "\n")
        if log.problem and not log.lines:
            sys.stderr.write("%s: %s\n" % (host, log.problem))
        if log.ended:
            sys.stderr.write("%s: start %s ended (the trainer started again)\n" % (host, log.invocation))
    out.flush()


def run_logs(args, kwargs, stop: Stop) -> int:
    lines = 20 if args.count is None else args.count
    if not args.follow:
        result = api.logs(lines=lines, invocation=args.start, cancel=stop, **kwargs)
        many = len(result.hosts) > 1
        for host, h in result.hosts.items():
            if h.log is not None:
                print_log(host, h.log, many, args.json)
        if not result.ok:
            print(describe(result, args.limit), file=sys.stderr)
        return 0 if result.ok else 1
    seen: set = set()

    def on_lines(host, log):
        seen.add(host)
        print_log(host, log, len(seen) > 1 or bool(args.limit and "," in args.limit), args.json)

    kwargs.pop("timeout", None)
    result = api.follow_logs(on_lines, lines=lines, invocation=args.start, stop=stop, **kwargs)
    if stop():
        return 0
    print(describe(result, args.limit), file=sys.stderr)
    return 0 if result.ok else 1


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="dflash-trainer",
                                     description="Run the dflash.trainer playbooks and report typed per-host results.")
    parser.add_argument("action", choices=sorted(api.PLAYBOOKS))
    parser.add_argument("-l", "--limit", help="host pattern (ansible-playbook -l)")
    parser.add_argument("-i", "--inventory",
                        help="inventory path or host list (default: the configured inventory, as ansible-playbook)")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                        help="key=value (shell-style words), a JSON object or @file; repeatable")
    parser.add_argument("--release", help="rollback: the release to switch to (default: the last good one)")
    parser.add_argument("-n", "--count", type=int,
                        help="history: how many releases (default 10); logs: how many lines (default 20)")
    parser.add_argument("-f", "--follow", action="store_true", help="logs: follow the log (Ctrl-C stops)")
    parser.add_argument("--start", metavar="INVOCATION",
                        help="logs: the start (invocation id, as in the log's marker lines) to read; default this one")
    parser.add_argument("-C", "--check", action="store_true", help="ansible-playbook --check: change nothing")
    parser.add_argument("-D", "--diff", action="store_true",
                        help="ansible-playbook --diff: the release's files, the unit and environment file changes")
    parser.add_argument("--plot", metavar="FILE",
                        help="history: draw tok/s per release into FILE (.png, .svg, or .html: a page with the SVG "
                             "inline); needs matplotlib: pip install 'dflash-trainer[plot]'")
    parser.add_argument("--min-tokps-ratio", type=float, metavar="RATIO",
                        help="history --plot: draw the throughput gate's threshold, RATIO x the previous good "
                             "release's median (default: -e trainer_min_tokps_ratio=..., else none)")
    parser.add_argument("--timeout", type=int, help="seconds for the whole run")
    parser.add_argument("--json", action="store_true", help="print the RunResult as JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)

    extravars: dict = {}
    try:
        for item in args.extra_vars:
            extravars.update(parse_extravar(item))
    except (ValueError, OSError) as e:
        parser.error(str(e))
    if args.release and args.action != "rollback":
        parser.error("--release only goes with rollback")
    if (args.follow or args.start) and args.action != "logs":
        parser.error("-f and --start only go with logs")
    if args.count is not None and args.action not in ("history", "logs"):
        parser.error("-n only goes with history and logs")
    if (args.plot or args.min_tokps_ratio is not None) and args.action != "history":
        parser.error("--plot and --min-tokps-ratio only go with history")
    if args.plot:
        try:  # before the run: a chart that cannot be written is said at once
            plot.chart_format(args.plot)
            plot.require_matplotlib()
            args.min_tokps_ratio = gate_ratio(args.min_tokps_ratio, extravars)
        except (ValueError, plot.PlotUnavailable) as e:
            parser.error(str(e))

    stop = Stop().install()
    try:
        return run(args, extravars, stop)
    finally:
        stop.uninstall()


def gate_ratio(given: Optional[float], extravars: dict) -> Optional[float]:
    """The ratio whose threshold the chart draws: --min-tokps-ratio, else -e trainer_min_tokps_ratio;
    None (no threshold) for neither or 0. ValueError for a value that is not a ratio."""
    value = given if given is not None else extravars.get("trainer_min_tokps_ratio")
    if value in (None, ""):
        return None
    try:
        ratio = float(value)
    except (TypeError, ValueError):
        raise ValueError("trainer_min_tokps_ratio: expected a number between 0 and 1, got %r" % (value,)) from None
    if not 0 <= ratio <= 1:
        raise ValueError("trainer_min_tokps_ratio: expected a number between 0 and 1, got %r" % (value,))
    return ratio or None


def write_chart(result: RunResult, path: str, min_ratio: Optional[float]) -> int:
    """history --plot: the chart of every host's history into PATH; 0, or 1 with the reason on stderr."""
    by_host = dict((host, plot.points(h.status.history, min_ratio)) for host, h in result.hosts.items()
                   if h.status is not None and h.status.history)
    if not by_host:
        print("no chart written: no release measured yet on %s" % (", ".join(result.hosts) or "any host"),
              file=sys.stderr)
        return 1
    try:
        plot.render(by_host, path, min_ratio)
    except (OSError, ValueError, plot.PlotUnavailable) as e:
        print("no chart written to %s: %s" % (path, e), file=sys.stderr)
        return 1
    print("chart: %s (%s)" % (path, "; ".join("%s: %d releases" % (h, len(p)) for h, p in by_host.items())),
          file=sys.stderr)
    return 0


def run(args, extravars: dict, stop: Stop) -> int:
    kwargs = dict(limit=args.limit, inventory=args.inventory, extravars=extravars, timeout=args.timeout)
    if args.action == "logs":
        return run_logs(args, kwargs, stop)
    if args.action == "rollback" and args.release:
        extravars["trainer_rollback_release"] = args.release
    if args.action == "history" and (args.count or args.plot):
        # a chart shows the whole ledger (its last 50 entries) unless -n says otherwise
        extravars["trainer_history_count"] = int(args.count or PLOT_HISTORY)
    watcher = None if args.quiet else progress.Progress(sys.stderr)
    result = api.run_playbook_live(args.action, check=args.check, diff=args.diff, on_event=watcher, cancel=stop,
                                   **kwargs)

    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        if stop():
            print("stopped by %s: the play was cancelled (a restart job already started goes on on the target; "
                  "`dflash-trainer status` reports it)" % signal.Signals(stop.signal).name, file=sys.stderr)
        print(describe(result, args.limit))
        diffs = progress.diffs_text(result)
        if diffs:
            print(diffs)
        if args.action in ("deploy", "restart", "rollback") and result.hosts:
            progress.print_summary(result)
    if args.plot and result.ok:
        return write_chart(result, args.plot, args.min_tokps_ratio)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
