"""dflash-trainer (python -m dflash_trainer) deploy|status|restart|rollback|history [-l HOST] [-i INVENTORY]
[-e k=v]... [--json]

Exit status: 0 when every host is ok, 1 when the run or a host failed (a run that matches no
host included), 2 on a usage error.
-e takes what ansible-playbook's -e takes: key=value (value a string), a JSON object, @file (YAML/JSON).
Configuration and inventory are the caller's, as for ansible-playbook run from the checkout:
$ANSIBLE_CONFIG when set (else the checkout's ansible.cfg), -i when given (else that
configuration's inventory); host key checking stays as that configuration says.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Optional

from . import api
from .results import HostResult, RunResult


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
        if s.history:
            lines.append("  RELEASE           WHEN                  VERDICT       TOK/S MEDIAN (P10-P90, N)   SOURCE")
            lines.extend("  " + str(row.get("line") or row.get("release")) for row in s.history)
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
    if not result.hosts:
        lines.append("no host matched%s: no host was processed (the playbooks act on the group trainer_hosts "
                     "of the inventory, or -e trainer_target_hosts=PATTERN)"
                     % (" the limit %r" % limit if limit else ""))
    for h in result.hosts.values():
        lines.extend(describe_host(h))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_trainer",
                                     description="Run the dflash.trainer playbooks and report typed per-host results.")
    parser.add_argument("action", choices=sorted(api.PLAYBOOKS))
    parser.add_argument("-l", "--limit", help="host pattern (ansible-playbook -l)")
    parser.add_argument("-i", "--inventory",
                        help="inventory path or host list (default: the configured inventory, as ansible-playbook)")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                        help="key=value, a JSON object or @file; repeatable")
    parser.add_argument("--release", help="rollback: the release to switch to (default: the last good one)")
    parser.add_argument("-n", "--count", type=int, help="history: how many releases (default 10)")
    parser.add_argument("--timeout", type=int, help="seconds for the whole run")
    parser.add_argument("--json", action="store_true", help="print the RunResult as JSON")
    args = parser.parse_args(argv)

    extravars: dict = {}
    try:
        for item in args.extra_vars:
            extravars.update(parse_extravar(item))
    except (ValueError, OSError) as e:
        parser.error(str(e))
    if args.release and args.action != "rollback":
        parser.error("--release only goes with rollback")

    kwargs = dict(limit=args.limit, inventory=args.inventory, extravars=extravars, timeout=args.timeout)
    if args.action == "rollback":
        result = api.rollback(release=args.release, **kwargs)
    elif args.action == "history":
        result = api.history(count=args.count, **kwargs)
    else:
        result = getattr(api, args.action)(**kwargs)

    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(describe(result, args.limit))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
