# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the role's read-only entry points show and decide (pure, unit-tested; the trainer_status action asks).

status, logs and history read the target once (trainer_status); these functions make, from that read, the lines
each entry point shows and, for status, its verdict: whether the trainer - and its trainer group, judged by
plugin_utils/_group.py's ``as_one`` - runs its proved release healthily, and the message the run fails with when it
does not. A value the read left empty reads as the role showed it before these lines were made here: nothing for a
null, ``-`` for a missing value where one was shown.
"""
from __future__ import annotations

from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import HISTORY_HEADER

NO_HISTORY = "(no release measured yet)"


def _text(value):
    """A value in a line: nothing for null."""
    return "" if value is None else str(value)


def _or_dash(value):
    """A value in a line, ``-`` when it is empty (null, "", 0, false)."""
    return _text(value) if value else "-"


def as_expected(read):
    """Whether a status read (trainer_status's result) found the trainer running its proved release healthily
    (health.ok), or stopped on purpose and not started since (health.stopped)."""
    health = read.get("health") if isinstance(read.get("health"), dict) else {}
    return bool(health.get("ok") or health.get("stopped"))


def status_lines(unit, read):
    """The lines status shows of one read: the unit, the releases (drift), the GPUs' memory, the last restart job,
    the last progress and the health."""
    health = read.get("health") if isinstance(read.get("health"), dict) else {}
    job = read.get("last_job") if isinstance(read.get("last_job"), dict) else {}
    return [
        "unit %s: %s/%s, pid %s, up %s s, restarts %s" % (
            unit, _text(read.get("active_state")), _text(read.get("sub_state")), _text(read.get("main_pid")),
            _text(read["seconds_since_start"]) if "seconds_since_start" in read else "-", _text(read.get("n_restarts"))),
        "release running %s, current %s, last good %s%s" % (
            _or_dash(read.get("running_release")), _or_dash(read.get("current_release")), _or_dash(read.get("last_good")),
            " — DRIFT" if read.get("drift") else ""),
        "GPU MiB %s" % _text(read.get("gpus_mib", {})),
        "last restart: %s" % (_text(job["words"]) if "words" in job else "-"),
        "last progress: %s (%s tok/s)" % (_or_dash(read.get("last_progress_line")), _or_dash(read.get("tok_s"))),
        "health: %s" % _text(health.get("words")),
    ]


def status_verdict(unit, read, group_status=None):
    """Status's verdict on one host from its read and, for a member of a trainer group, the group's (``as_one``'s
    answer; None: not a member) -> dict(ok, failure, lines, group_status, group_failed).

    ok: the trainer runs its proved release healthily or was stopped on purpose (``as_expected``), and its group, if
    any, was not found to be other than one proved job (a group not judged - some members not read - does not fail
    it). failure: the message the run fails with - the host's own first, else the group's words; None when ok.
    lines: what status shows - ``status_lines``, and the group's words for a member."""
    group_failed = group_status is not None and group_status.get("ok") is False
    if not as_expected(read):
        health = read.get("health") if isinstance(read.get("health"), dict) else {}
        failure = "%s is not running its proved release healthily: %s" % (unit, _text(health.get("words")))
    elif group_failed:
        failure = _text(group_status.get("words"))
    else:
        failure = None
    lines = status_lines(unit, read) + ([_text(group_status.get("words"))] if group_status is not None else [])
    return dict(ok=failure is None, failure=failure, lines=lines, group_status=group_status, group_failed=group_failed)


def log_lines(read):
    """The lines logs shows of a log read (trainer_status's ``log``): the start's lines, then why the log could not
    be read, if it could not."""
    log = read.get("log") if isinstance(read.get("log"), dict) else {}
    problem = log.get("problem")
    return list(log.get("lines") or []) + ([problem] if problem else [])


def history_lines(read):
    """The lines history shows of a read of the release ledger (trainer_status's ``history``, newest first): a
    header, each entry's line (or that no release was measured yet), and the drift when the running release is not
    current."""
    rows = [row for row in read.get("history") or [] if isinstance(row, dict)]
    lines = [HISTORY_HEADER] + [row.get("line") for row in rows] + ([] if rows else [NO_HISTORY])
    if read.get("drift"):
        lines.append("DRIFT: running %s is not current %s" % (read.get("running_release"), read.get("current_release")))
    return lines
