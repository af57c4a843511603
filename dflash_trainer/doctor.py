"""`dflash-trainer doctor`: what playbooks/doctor.yml judged, read from its events and printed one line per
assumption. Pure (no ansible-runner): the checks themselves are judged in the collection
(plugins/plugin_utils/_doctor.py); each host's report is the fact `__trainer_doctor` its play's trainer_doctor
action returned (its task failed when an assumption does not hold):
{checks: [{name, mark, detail, remedy}], lines, failed, exit_code, summary}."""
from __future__ import annotations

from typing import Any, Mapping, Optional

from .results import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, RunResult

FACT = "__trainer_doctor"
MARKS = {"✓": "ok", "✗": "FAILED", "?": "not checked"}
# over several hosts the first of these that a host has wins (as results.py's)
_PRECEDENCE = (EXIT_FAILED, EXIT_UNREACHABLE, EXIT_REFUSED)


def report_of(event: Mapping[str, Any]) -> Optional[tuple]:
    """(host, report) when EVENT is the doctor's judgement (a result with the fact FACT: ok when every assumption
    holds, failed when one does not), else None."""
    if not isinstance(event, Mapping) or event.get("event") not in ("runner_on_ok", "runner_on_failed"):
        return None
    data = event.get("event_data") or {}
    facts = (data.get("res") or {}).get("ansible_facts") or {}
    report = facts.get(FACT)
    if not isinstance(report, Mapping) or not isinstance(report.get("checks"), list):
        return None
    return data.get("host"), dict(report)


def line(check: Mapping[str, Any]) -> str:
    """`  ✓ ssh          root@pve1 reached, host key accepted`; a ✗ with its remedy on the next line."""
    text = "  %s %-12s %s" % (check.get("mark", "?"), check.get("name", "?"), check.get("detail", ""))
    if check.get("mark") == "✗" and check.get("remedy"):
        text += "\n      remedy: %s" % check["remedy"]
    return text


def host_text(host: str, report: Mapping[str, Any]) -> str:
    checks = report.get("checks") or []
    bad = sum(1 for c in checks if c.get("mark") == "✗")
    head = "%s: %s" % (host, "every assumption holds" if not bad else "%d of %d assumptions do not hold" % (
        bad, len(checks)))
    return "\n".join([head] + [line(c) for c in checks])


def host_exit(report: Optional[Mapping[str, Any]], host_result=None) -> int:
    """The report's exit code (0 all ✓, 1 a ✗, 3 the node unreachable); without one the run's for the host."""
    if isinstance(report, Mapping) and isinstance(report.get("exit_code"), int):
        return report["exit_code"]
    return host_result.exit_code if host_result is not None else EXIT_FAILED


def run_exit(result: RunResult, reports: Mapping[str, Mapping]) -> int:
    """0 every host's assumptions hold; else the first of 1, 3, 2 a host has; the run's own code when no host
    was judged (no host matched, Ansible not started)."""
    if not reports:
        return result.exit_code if result.exit_code != EXIT_OK else EXIT_FAILED
    codes = [host_exit(reports.get(h), result.hosts.get(h)) for h in sorted(set(result.hosts) | set(reports))]
    for code in _PRECEDENCE:
        if code in codes:
            return code
    return max(codes) if codes else EXIT_OK


def text(result: RunResult, reports: Mapping[str, Mapping]) -> str:
    """Every judged host's lines; a host the play did not judge, with the run's reason."""
    out = [host_text(h, reports[h]) for h in sorted(reports)]
    for host in sorted(set(result.hosts) - set(reports)):
        h = result.hosts[host]
        out.append("%s: not judged: %s" % (host, ((h.reason or "no answer").strip().splitlines() or ["?"])[0]))
    if not out:
        out.append("doctor: no host judged: %s" % ((result.reason or "no host").strip().splitlines() or ["?"])[0])
    return "\n".join(out)
