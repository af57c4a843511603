"""dflash-trainer (python -m dflash_trainer): the dflash.trainer playbooks as subcommands, with
typed per-host results, and check-log, which fits the readiness proof to a trainer offline.

    dflash-trainer deploy   [--src DIR] [--force] [-C|--check] [-D|--diff] [-l HOST] [-i INVENTORY] [-e VARS]...
    dflash-trainer restart  [-C] [-D] [...]      dflash-trainer rollback [--to RELEASE] [-C] [-D] [...]
    dflash-trainer stop     [...]                 dflash-trainer start    [...]
    dflash-trainer status   [--watch [SECONDS]] [-l HOST] [-i INVENTORY] [-e VARS]... [--json]
    dflash-trainer history  [-n RELEASES] [--plot FILE [--min-tokps-ratio R]] [...]
    dflash-trainer logs     [-n LINES] [-f] [--start INVOCATION] [--explain] [...]
    dflash-trainer check-log FILE [-e VARS]... [--line-interval-s S] [--clock ...] [--at-end ...] [--json]
    dflash-trainer --version

Each subcommand is the API function of the same name (dflash_trainer.deploy(limit, src=..., force=...,
...)). Each has its own --help. While a play runs, stderr says what it does (`step: <task>`, the
restart job's phase); at the end stdout has each host's report, the diffs (--diff) and the summary:
one block per host (verdict, release and source, configuration, tok/s against the previous
configuration, what was done, time taken) and the inventory read. --json prints the RunResult
instead (RunResult.from_dict reads it back), the same summary in it. -v, -vv, ... is Ansible's
verbosity; ansible-playbook's own output then goes to stderr too.

Exit status (RunResult.exit_code, derived from the structured results): 0 healthy / proved; 1 the
trainer is unhealthy or the proof failed (rolled back or not), or the run was stopped; 2 refused
before any change (bad input and usage errors, lock held, pre-flight refused, no host matched); 3 a
host unreachable; 4 Ansible could not be started. logs -f stopped by Ctrl-C / SIGTERM: 0.
check-log and logs --explain: 0 when the proof would pass, 1 when it would fail, 2 on bad input.
-e takes what ansible-playbook's -e takes: key=value (Ansible's own parser: quotes group words,
backslashes stay), a JSON object, @file (YAML/JSON).
Configuration and inventory are the caller's (see dflash_trainer.api): -i, else $ANSIBLE_INVENTORY,
else the configuration's (ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg).
The checkout's ansible.cfg, and with it the lab's inventory, only when working inside the checkout.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
from typing import Optional

from . import api, doctor, plot, progress
from .results import EXIT_REFUSED, HostResult, RunResult, TrainerLog

# the module (the package's name check_log is the API function)
check_log = importlib.import_module(__package__ + ".check_log" if __package__ else "dflash_trainer.check_log")

WATCH_S = 10  # status --watch: seconds between two reads
PLOT_HISTORY = 50  # the ledger's length (LEDGER_KEEP in plugins/module_utils/proof/throughput.py)
EXPLAIN_LINES = 5000  # logs --explain: this start's lines fetched to replay (unless -n says otherwise)


def parse_extravar(text: str) -> dict:
    """One -e value as ansible-playbook reads it: @FILE (YAML/JSON), a JSON object, or key=value
    words (ansible's parse_kv: quotes group words, backslashes are kept, so regexes pass intact)."""
    text = text.strip()
    if text.startswith("@"):
        import yaml
        with open(text[1:]) as fh:
            data = yaml.safe_load(fh) or {}
    elif text.startswith("{"):
        data = json.loads(text)
    else:
        from ansible.parsing.splitter import parse_kv
        try:
            data = parse_kv(text, check_raw=False)
        except Exception as e:  # AnsibleParserError: unbalanced quotes and the like
            raise ValueError("cannot read -e %r: %s" % (text, e)) from None
        raw = data.pop("_raw_params", None)
        if raw is not None:
            raise ValueError("expected key=value, got %r" % raw)
    if not isinstance(data, dict):
        raise ValueError("extra vars must be a mapping: %r" % text)
    return data


# The history table's header: the columns of the lines the status module writes (the collection's
# proof.throughput.HISTORY_HEADER, which tests/unit/test_cli.py keeps this equal to)
HISTORY_HEADER = "RELEASE           CONFIG    WHEN                  VERDICT       TOK/S MEDIAN (P10-P90, N)  SOURCE"


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
            lines.append("  " + HISTORY_HEADER)
            lines.extend("  " + str(row.get("line") or row.get("release")) for row in s.history)
            spark = plot.sparkline_line(s.history)
            if spark:
                lines.append("  " + spark)
    if h.group and h.group.get("words"):  # a trainer group's member: the group as a whole
        lines.append("  %s" % h.group["words"])
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
    lines = (EXPLAIN_LINES if args.explain else 20) if args.count is None else args.count
    if not args.follow:
        result = api.logs(lines=lines, invocation=args.start, cancel=stop, **kwargs)
        many = len(result.hosts) > 1
        verdicts = []
        for host, h in result.hosts.items():
            if h.log is None:
                continue
            if args.explain:
                verdicts.append(explain_log(host, h.log, lines, kwargs["extravars"], args))
            else:
                print_log(host, h.log, many, args.json)
        if not result.ok:
            print(describe(result, args.limit), file=sys.stderr)
            return result.exit_code
        if args.explain:
            return 2 if 2 in verdicts else 0 if verdicts and all(v == 0 for v in verdicts) else 1
        return 0
    seen: set = set()

    def on_lines(host, log):
        seen.add(host)
        print_log(host, log, len(seen) > 1 or bool(args.limit and "," in args.limit), args.json)

    kwargs.pop("timeout", None)
    result = api.follow_logs(on_lines, lines=lines, invocation=args.start, stop=stop, **kwargs)
    if stop():
        return 0
    print(describe(result, args.limit), file=sys.stderr)
    return result.exit_code


def explain_log(host: str, log: TrainerLog, asked: int, extravars: dict, args) -> int:
    """logs --explain: this start's lines, as fetched, replayed through the proof (check-log's
    replay, with the role defaults and -e; the inventory's variables are not known here)."""
    if not log.lines:
        print("%s: nothing to explain: %s" % (host, log.problem or "this start's log has no lines yet"),
              file=sys.stderr)
        return 1
    try:
        result, defaults = check_log.check_lines(
            log.lines, extravars, invocation=log.invocation, release=log.release,
            source="%s (start %s)" % (host, log.invocation), **replay_options(args))
    except check_log.BadInput as e:
        print("dflash-trainer logs --explain: %s" % e, file=sys.stderr)
        return 2
    result.notes.append("variables: the role defaults and -e only (the inventory's are not read: pass them with -e)")
    if len(log.lines) >= asked:
        result.notes.append("only this start's last %d lines were fetched (-n): the replay begins there" % asked)
    print_replay(result, defaults, args)
    return 0 if result.ok else 1


def replay_options(args) -> dict:
    return dict(line_interval_s=args.line_interval_s, clock=args.clock, at_end=args.at_end,
                exit_status=args.exit_status)


def print_replay(result, defaults: dict, args) -> None:
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, sort_keys=True, default=str))
    else:
        show = "none" if getattr(args, "quiet", False) else "all" if getattr(args, "all", False) else "verdict"
        print(check_log.report_text(result, defaults, show=show))


def run_check_log(args, extravars: dict) -> int:
    try:
        result, defaults = check_log.check_file(args.file, extravars, start=args.start, **replay_options(args))
    except check_log.BadInput as e:
        print("dflash-trainer check-log: %s" % e, file=sys.stderr)
        return 2
    print_replay(result, defaults, args)
    return 0 if result.ok else 1


# --- the command line ------------------------------------------------------------------------------

def package_version() -> str:
    """dflash-trainer's version (the package metadata) and the collection's (galaxy.yml or MANIFEST.json)."""
    from importlib import metadata
    try:
        pkg = metadata.version("dflash-trainer")
    except metadata.PackageNotFoundError:
        pkg = "(not installed)"
    try:
        root = check_log.collection_root()
        coll = None
        if os.path.isfile(os.path.join(root, "MANIFEST.json")):
            with open(os.path.join(root, "MANIFEST.json")) as fh:
                coll = json.load(fh)["collection_info"]["version"]
        else:
            import yaml
            with open(os.path.join(root, "galaxy.yml")) as fh:
                coll = yaml.safe_load(fh)["version"]
        where = "collection dflash.trainer %s at %s" % (coll, root)
    except (OSError, ValueError, KeyError, TypeError) as e:
        where = "collection dflash.trainer not found: %s" % e
    return "dflash-trainer %s (%s)" % (pkg, where)


class VersionAction(argparse.Action):
    """--version, worked out only when asked (finding an installed collection reads Ansible's configuration)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(package_version())
        parser.exit()


HELP = {
    "deploy": "upload trainer_src as a release, install the unit, restart if anything changed, prove it "
              "ready; roll back on a failed proof (deploy.yml)",
    "status": "read-only: the unit, the releases, GPU memory, this start's last progress line",
    "restart": "restart on the current release and prove it (playbooks/restart.yml)",
    "rollback": "switch to the last good release (or --to RELEASE), restart, prove (playbooks/rollback.yml)",
    "stop": "stop the trainer on purpose, under the deploy lock (playbooks/stop.yml)",
    "start": "start the stopped trainer on its current release and prove it (playbooks/start.yml)",
    "history": "read-only: the last releases with their measured tok/s and verdicts",
    "logs": "read-only: this start's last log lines (-f follows them, --explain replays them through the proof)",
    "doctor": "read-only, seconds: check every assumption about the node and the container (ssh, sudo, pct, the "
              "container running, unlocked and not frozen, systemd, python3, nvidia-smi, its GPUs paired with the "
              "node's by UUID, device nodes, free space, clock), "
              "one line each with its remedy (playbooks/doctor.yml)",
    "check-log": "offline: replay a captured log through the readiness proof's log judge",
}
CHECK_LOG_DESCRIPTION = """\
Replay a captured trainer log through the readiness proof's log judge, offline, in seconds: what
each line shows (step and total, tok/s, a line matching trainer_ready_regex, an error pattern, a
reason line), the verdict the proof would reach (READY, FAILED and why, NEVER READY and what was
missing), at which line, and which variable to change.

The variables are those a deploy would use: the role defaults of the collection this CLI runs
(roles/trainer/defaults/main.yml, read now) with -e on top, checked as the deploy checks them.

A log has no clock, so one is simulated: each line arrives --line-interval-s after the one before
(default %s s, the proof's default poll interval), or at its own timestamp when the lines carry
one (--clock auto: when at least half of them do). The unit and the GPUs are synthetic and healthy
- unit active/running with one invocation id and no restart, every GPU of trainer_gpus at
trainer_gpu_min_mib - so that only the log decides. A "\\r" (a tqdm redraw) ends a line, as it
does for the proof; LINE numbers count such lines. A log without a dflash start marker (a capture
usually has none) is all this start's: the marker is synthesised before line 1; a copy of the
trainer's log file is judged for its last start (or --start). journalctl's line prefixes are
removed (their time is used).

Capture a log: journalctl -u dflash-trainer -o short-iso -a --no-pager > trainer.log (in the
container; -a keeps lines with "\\r"), or cp /workspace/trainer.log (trainer_log_path).
""" % check_log.DEFAULT_LINE_INTERVAL_S
EXIT_TAIL = ("2 refused before any change (bad input or usage, the deploy lock held, the pre-flight refused, no host "
             "matched); 3 a host unreachable; 4 Ansible could not be started (no ansible-playbook, configuration "
             "or collection)")
EPILOGS = {
    "deploy": "exit status: 0 proved (or nothing to change); 1 the proof failed (rolled back or not), or the run "
              "was stopped; " + EXIT_TAIL,
    "restart": "exit status: 0 proved; 1 the proof failed (rolled back or not), or the run was stopped; " + EXIT_TAIL,
    "rollback": "exit status: 0 the release rolled back to was proved; 1 its proof failed, or the run was stopped; "
                + EXIT_TAIL,
    "start": "exit status: 0 started and proved; 1 the proof failed, or the run was stopped; " + EXIT_TAIL,
    "stop": "exit status: 0 stopped; 1 the stop failed, or the run was stopped; " + EXIT_TAIL,
    "status": "exit status: 0 every trainer runs its proved release healthily; 1 one does not; " + EXIT_TAIL
              + ". --watch: the last read's status when Ctrl-C ends it",
    "doctor": "exit status: 0 every assumption holds; 1 one does not; " + EXIT_TAIL
              + " (for doctor: the node, by ssh or its host key)",
    "history": "exit status: 0 read (and the chart written); 1 the read failed or no chart was written; " + EXIT_TAIL,
    "logs": "exit status: 0 read (-f: also when Ctrl-C or SIGTERM ends it); 1 the read failed; " + EXIT_TAIL
            + ". --explain: 0 when the proof would pass, 1 when it would fail, 2 on bad input",
}
EPILOG = "exit status: 0 healthy / proved; 1 unhealthy or the proof failed (rolled back or not); " + EXIT_TAIL
CHECK_EPILOG = "exit status: 0 when the proof would pass, 1 when it would fail, 2 on bad input"


def _add_extra_vars(p, dest="extra_vars"):
    p.add_argument("-e", "--extra-vars", dest=dest, action="append", default=[], metavar="VARS",
                   help="key=value (as ansible-playbook -e), a JSON object or @file (YAML/JSON); repeatable")


def _add_target(p, progress_lines=True):
    p.add_argument("-l", "--limit", help="host pattern (ansible-playbook -l)")
    p.add_argument("host", nargs="?", metavar="HOST", help="host pattern, the same as -l HOST")
    p.add_argument("-i", "--inventory",
                   help="inventory path or host list (default: the configured inventory, as ansible-playbook)")
    _add_extra_vars(p)
    p.add_argument("--timeout", type=int, help="seconds for the whole run")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="Ansible's verbosity (-v, -vv, ...; ANSIBLE_VERBOSITY for the run); ansible-playbook's own "
                        "output is printed to stderr")
    if progress_lines:
        p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def _add_change(p):
    p.add_argument("-C", "--check", action="store_true", help="ansible-playbook --check: change nothing")
    p.add_argument("-D", "--diff", action="store_true",
                   help="ansible-playbook --diff: the release's files, the unit and environment file changes")


def _add_replay(p):
    p.add_argument("--line-interval-s", type=float, default=check_log.DEFAULT_LINE_INTERVAL_S, metavar="S",
                   help="seconds between two lines of the simulated clock (default %(default)s)")
    p.add_argument("--clock", choices=("auto", "interval", "timestamps"), default="auto",
                   help="auto (default): the lines' own timestamps when at least half of them have one, else "
                        "--line-interval-s; interval: always the fixed rate; timestamps: always the lines' times")
    p.add_argument("--at-end", choices=("hang", "exit"), default="hang",
                   help="after the last line the trainer goes on printing nothing (hang, default) or its process "
                        "exits (exit, with --exit-status)")
    p.add_argument("--exit-status", type=int, default=1, metavar="N",
                   help="--at-end exit: the process's exit status (default %(default)s)")


# global spellings of the run options, accepted before the subcommand too (as the flat parser had them)
PRE_OPTIONS = (("-l", "--limit", "limit", dict()), ("-i", "--inventory", "inventory", dict()),
               ("-e", "--extra-vars", "extra_vars", dict(action="append", default=[])),
               ("-v", "--verbose", "verbose", dict(action="count", default=0)),
               ("-q", "--quiet", "quiet", dict(action="store_true")),
               (None, "--json", "json", dict(action="store_true")),
               ("-C", "--check", "check", dict(action="store_true")),
               ("-D", "--diff", "diff", dict(action="store_true")),
               (None, "--timeout", "timeout", dict(type=int)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-trainer", epilog="each subcommand has its own --help; " + EPILOG,
        description="Run the dflash.trainer playbooks and report typed per-host results; check-log fits the "
                    "readiness proof to a trainer's log offline.")
    parser.add_argument("--version", action=VersionAction, help="the package's and the collection's version")
    for short, long, dest, kw in PRE_OPTIONS:
        parser.add_argument(*[o for o in (short, long) if o], dest="pre_" + dest, help=argparse.SUPPRESS, **kw)
    sub = parser.add_subparsers(dest="action", metavar="COMMAND", required=True)
    parser.commands = {}  # name -> its parser (its errors show its own usage)

    def command(name, epilog=None, **kw):
        parser.commands[name] = sub.add_parser(
            name, help=HELP[name], description=kw.pop("description", HELP[name]), epilog=epilog or EPILOGS[name],
            formatter_class=kw.pop("formatter_class", argparse.HelpFormatter), **kw)
        return parser.commands[name]

    for name in ("deploy", "restart", "rollback", "stop", "start"):
        p = command(name)
        _add_target(p)
        _add_change(p)
        if name == "deploy":
            p.add_argument("--src", metavar="DIR", help="the trainer's code to upload (trainer_src; default: the "
                                                        "inventory's or -e trainer_src)")
            p.add_argument("--force", action="store_true",
                           help="restart and prove even when nothing changed, and accept a slower release "
                                "(trainer_force_restart=true)")
        if name == "stop":
            p.add_argument("--disable", action="store_true", help="also disable the unit: it stays stopped across a "
                                                                  "reboot of the container (trainer_stop_disable=true)")
        if name == "rollback":
            p.add_argument("--to", "--release", dest="to", metavar="RELEASE",
                           help="the release to switch to (trainer_rollback_release; default: the last good one)")
        p.add_argument("--json", action="store_true", help="print the RunResult as JSON (with exit_code and each "
                                                           "host's summary)")
    p = command("status")
    _add_target(p)
    p.add_argument("--watch", nargs="?", type=float, const=WATCH_S, metavar="SECONDS",
                   help="read the status again every SECONDS (default %d; one ansible-playbook run per read) and "
                        "print a line per host when something changes (the unit, the releases, the health, the "
                        "restarts, the last job), until Ctrl-C" % WATCH_S)
    p.add_argument("--json", action="store_true", help="print the RunResult as JSON (--watch: one object per change)")
    p = command("doctor")
    _add_target(p)
    p.add_argument("--json", action="store_true", help="print each host's checks as JSON (with exit_code)")
    p.add_argument("--record", metavar="DIR",
                   help="also write what each node and container answered (the scripts' output, the clock, the lines "
                        "judged; trainer_env's values masked) to DIR/HOST.json, mode 0600: attach it to a bug report "
                        "- the collection's unit tests replay such a file (trainer_doctor_record_dir)")
    p = command("history")
    _add_target(p)
    p.add_argument("-n", "--count", type=int, metavar="RELEASES", help="how many releases (default 10)")
    p.add_argument("--plot", metavar="FILE",
                   help="draw tok/s per release into FILE (.png, .svg, or .html: a page with the SVG inline); needs "
                        "matplotlib: pip install 'dflash-trainer[plot]'")
    p.add_argument("--min-tokps-ratio", type=float, metavar="RATIO",
                   help="--plot: draw the throughput gate's threshold, RATIO x the previous good release's median "
                        "(default: -e trainer_min_tokps_ratio=..., else none)")
    p.add_argument("--json", action="store_true", help="print the RunResult as JSON")
    p = command("logs")
    _add_target(p, progress_lines=False)
    p.add_argument("-n", "--lines", dest="count", type=int, metavar="LINES",
                   help="how many of this start's last lines (default 20; --explain: %d)" % EXPLAIN_LINES)
    p.add_argument("-f", "--follow", action="store_true", help="follow the log (Ctrl-C stops)")
    p.add_argument("--start", metavar="INVOCATION",
                   help="the start (invocation id, as in the log's marker lines) to read; default this one")
    p.add_argument("--explain", action="store_true",
                   help="replay the lines through the proof, as check-log does (role defaults and -e; not the "
                        "inventory's variables)")
    p.add_argument("--all", action="store_true", help="--explain: show every line, also those after the verdict")
    _add_replay(p)
    p.add_argument("--json", action="store_true", help="one JSON object per host (--explain: the replay)")
    p = command("check-log", epilog=CHECK_EPILOG, description=CHECK_LOG_DESCRIPTION,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", help="the captured log ('-': standard input)")
    _add_extra_vars(p)
    _add_replay(p)
    p.add_argument("--start", metavar="INVOCATION",
                   help="a log with dflash start markers: the start to judge (default: the last one)")
    p.add_argument("--all", action="store_true", help="show every line, also those after the verdict and other starts'")
    p.add_argument("-q", "--quiet", action="store_true", help="the verdict and the advice only, no line table")
    p.add_argument("--json", action="store_true", help="print the replay as JSON (every line, the verdict, the advice)")
    return parser


def unknown_words(parser, action: str, unknown: list) -> str:
    """"unrecognized arguments: ..." and, for an option another subcommand has, which ones it goes with."""
    words = "unrecognized arguments: %s" % " ".join(unknown)
    where: dict = {}
    for token in unknown:
        option = token.split("=", 1)[0]
        if not option.startswith("-"):
            continue
        owners = [name for name, p in parser.commands.items() if option in p._option_string_actions]
        if owners:
            where.setdefault(", ".join(owners), []).append(option)
    for owners, options in where.items():
        words += "; options that only go with %s: %s (see dflash-trainer %s --help)" % (
            owners, ", ".join(options), owners.split(", ")[0])
    return words


def merge_pre_options(parser, args) -> None:
    """Options given before the subcommand join the subcommand's own (a subcommand that has no such
    option refuses it)."""
    for short, long, dest, _kw in PRE_OPTIONS:
        pre = getattr(args, "pre_" + dest)
        delattr(args, "pre_" + dest)
        if pre in (None, False, 0, []):
            continue
        if not hasattr(args, dest):
            parser.error("%s does not go with %s" % (long, args.action))
        current = getattr(args, dest)
        if dest in ("extra_vars", "verbose"):
            setattr(args, dest, pre + current)
        elif current in (None, False):
            setattr(args, dest, pre)


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    sub = parser.commands[args.action]
    if unknown:
        sub.error(unknown_words(parser, args.action, unknown))
    merge_pre_options(parser, args)
    if getattr(args, "host", None):  # `status gpu-host` is `status -l gpu-host`
        if args.limit and args.limit != args.host:
            sub.error("the host pattern is given twice (%s and -l %s): give one" % (args.host, args.limit))
        args.limit = args.host
    if hasattr(args, "host"):
        del args.host

    extravars: dict = {}
    try:
        for item in args.extra_vars:
            extravars.update(parse_extravar(item))
    except (ValueError, OSError) as e:
        sub.error("-e: %s" % e)
    if args.action == "check-log":
        return run_check_log(args, extravars)
    if args.action == "logs":
        if args.follow and args.explain:
            sub.error("--explain reads this start's lines once: it does not go with -f")
    if getattr(args, "record", None):
        try:  # before the run: a directory that cannot be written is said at once
            extravars["trainer_doctor_record_dir"] = record_dir(args.record)
        except OSError as e:
            sub.error("--record %s: %s" % (args.record, e.strerror or e))
    if getattr(args, "plot", None):
        try:  # before the run: a chart that cannot be written is said at once
            plot.chart_format(args.plot)
            plot.require_matplotlib()
            args.min_tokps_ratio = gate_ratio(args.min_tokps_ratio, extravars)
        except (ValueError, plot.PlotUnavailable) as e:
            sub.error(str(e))
    elif getattr(args, "min_tokps_ratio", None) is not None:
        sub.error("--min-tokps-ratio goes with --plot")

    stop = Stop().install()
    try:
        with ansible_verbosity(args.verbose):
            return run(args, extravars, stop)
    finally:
        stop.uninstall()


def record_dir(path: str) -> str:
    """doctor --record DIR: DIR made absolute, created (0700) when missing, writable -> its path; OSError."""
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(path, mode=0o700, exist_ok=True)
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(13, "not writable")
    return path


@contextlib.contextmanager
def ansible_verbosity(level: int):
    """ANSIBLE_VERBOSITY=LEVEL for the runs inside (ansible-runner passes our environment on)."""
    if not level:
        yield
        return
    before = os.environ.get("ANSIBLE_VERBOSITY")
    os.environ["ANSIBLE_VERBOSITY"] = str(level)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("ANSIBLE_VERBOSITY", None)
        else:
            os.environ["ANSIBLE_VERBOSITY"] = before


def with_ansible_output(watcher, stream=None):
    """An event handler that prints ansible-playbook's own output (each event's stdout) to STREAM,
    then hands the event to WATCHER (the progress lines; None: none)."""
    stream = sys.stderr if stream is None else stream

    def handle(event: dict) -> None:
        text = event.get("stdout")
        data = event.get("event_data") if isinstance(event.get("event_data"), dict) else {}
        if event.get("event") == "runner_retry" and progress._is(progress._action(data), "trainer_restart"):
            text = None  # "FAILED - RETRYING: ... Watch the restart job": the phase line says what it waits for
        if watcher is not None and event.get("event") == "verbose" and progress.WATCH_MARK in str(text or ""):
            text = None  # the watch's own phase line: the progress line says it (once)
        if text:
            stream.write(text + "\n")
            stream.flush()
        if watcher is not None:
            watcher(event)
    return handle


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


def api_call(args, extravars: dict, on_event, stop: Stop) -> RunResult:
    """The subcommand as its API function, with the CLI's options as its keyword arguments."""
    kwargs = dict(extravars=extravars, inventory=args.inventory, timeout=args.timeout, on_event=on_event, cancel=stop)
    if args.action in ("deploy", "restart", "rollback", "stop", "start"):
        kwargs.update(check=args.check, diff=args.diff)
    if args.action == "deploy":
        kwargs.update(src=args.src, force=args.force)
    elif args.action == "rollback":
        kwargs.update(to=args.to)
    elif args.action == "stop":
        kwargs.update(disable=args.disable)
    elif args.action == "history" and (args.count or args.plot):
        # a chart shows the whole ledger (its last 50 entries) unless -n says otherwise
        kwargs.update(count=int(args.count or PLOT_HISTORY))
    result = getattr(api, args.action)(args.limit, **kwargs)
    result.playbook = result.playbook or args.action
    return result


def watch_line(host: str, h: Optional[HostResult], result: RunResult) -> str:
    """status --watch: one host's state in one line."""
    import time
    stamp = time.strftime("%H:%M:%S")
    if not host:
        return "%s run: exit %d: %s" % (stamp, result.exit_code, ((result.reason or "no host").splitlines() or ["?"])[0])
    if h is None:
        return "%s %s: no longer in the run" % (stamp, host)
    s = h.status
    if s is None:
        return "%s %s: %s (exit %d): %s" % (stamp, host, h.verdict("status").upper(), h.exit_code,
                                            ((h.reason or "").splitlines() or ["no status read"])[0])
    health = (s.health or {}).get("words") or "-"
    return "%s %s: %s (exit %d) unit %s/%s pid %s, running %s, current %s, last good %s%s, restarts %s, %s tok/s; %s" % (
        stamp, host, h.verdict("status").upper(), h.exit_code, s.active_state, s.sub_state, s.main_pid,
        s.running_release or "-", s.current_release or "-", s.last_good or "-", " DRIFT" if s.drift else "",
        s.n_restarts, progress._fmt_tok_s(s.tok_s), health)


def run_watch(args, extravars: dict, stop: Stop) -> int:
    def on_change(host, h, result):
        if args.json:
            print(json.dumps(dict(host=host or None, exit_code=h.exit_code if h else result.exit_code,
                                  result=h.to_dict("status") if h else None), sort_keys=True), flush=True)
        else:
            print(watch_line(host, h, result), flush=True)

    result = api.watch_status(on_change, args.limit, interval_s=args.watch, stop=stop, extravars=extravars,
                              inventory=args.inventory, timeout=args.timeout)
    return result.exit_code


def run_doctor(args, extravars: dict, stop: Stop) -> int:
    reports = {}
    watcher = None if args.quiet else progress.Progress(sys.stderr)
    if args.verbose:
        watcher = with_ansible_output(watcher)

    def on_event(event):
        found = doctor.report_of(event)
        if found:  # what --record wrote is in its file, not in what is printed
            reports[found[0]] = {k: v for k, v in found[1].items() if k != "record"}
        if watcher is not None:
            watcher(event)

    result = api_call(args, extravars, on_event, stop)
    code = doctor.run_exit(result, reports)
    if args.json:
        print(json.dumps(dict(exit_code=code, hosts=reports), indent=2, sort_keys=True, ensure_ascii=False))
    else:
        print(doctor.text(result, reports))
    return code


def run(args, extravars: dict, stop: Stop) -> int:
    if args.action == "doctor":
        return run_doctor(args, extravars, stop)
    if args.action == "logs":
        kwargs = dict(limit=args.limit, inventory=args.inventory, extravars=extravars, timeout=args.timeout)
        return run_logs(args, kwargs, stop)
    if getattr(args, "watch", None) is not None:
        if args.watch <= 0:
            print("dflash-trainer status: --watch SECONDS must be more than 0, got %s" % args.watch, file=sys.stderr)
            return EXIT_REFUSED
        return run_watch(args, extravars, stop)
    watcher = None if args.quiet else progress.Progress(sys.stderr)
    if args.verbose:
        watcher = with_ansible_output(watcher)
    result = api_call(args, extravars, watcher, stop)

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
        progress.print_summary(result)
    if getattr(args, "plot", None) and result.ok:
        return write_chart(result, args.plot, args.min_tokps_ratio)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
