# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watch of a restart (or stop) job from the controller, as lines a person reads while it runs.

The job keeps its timeline ([phase, seconds since it began], ...) and what its phase still waits
for (the GPUs held so far, the step reached, the proof's hold) in its state file; each watch call
(``trainer_restart`` O(operation=wait) with O(seen)) comes back as soon as a phase more has begun, or
after its wait. ``lines`` turns what one call returned into the lines not said yet: one per new
phase, with when it began, and what the phase waits for each time that changes - instead of
Ansible's "FAILED - RETRYING" of an until loop, which says nothing of what happens.
"""
from __future__ import annotations

from collections.abc import Mapping

# a phase's "waiting" text is said again after this long even when unchanged (a long proof shows life)
REPEAT_S = 30.0


def _seconds(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def lines(result, seen, said, now, said_at):
    """What to say for one watch call's ``result`` -> (lines, seen, said, said_at).

    ``seen``: how many timeline entries were said before; ``said``: the last "waiting" text said,
    at ``said_at`` (controller seconds; ``now`` is the time of this call)."""
    out = []
    timeline = result.get("timeline") if isinstance(result.get("timeline"), list) else []
    for entry in timeline[seen:]:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2 or entry[0] == "finished":
            continue  # ("finished": the record's own last entry, after "done")
        at = _seconds(entry[1])
        out.append("%s%s" % (entry[0], "" if at is None else " (at %.1f s)" % at))
    seen = max(seen, len(timeline))
    waiting = str(result.get("waiting") or "")
    if result.get("finished"):
        job = str(result.get("job") or "").strip()
        if job:  # "restart job ID (who, when) ended: ..." -> "ended: ..." (the line says whose job)
            out.append(job[job.index(" ended: ") + 1:] if " ended: " in job else job)
    elif waiting and (waiting != said or said_at is None or now - said_at >= REPEAT_S):
        last = timeline[-1][0] if timeline and isinstance(timeline[-1], (list, tuple)) and timeline[-1] else "?"
        out.append("%s: %s" % (last, waiting))
        said, said_at = waiting, now
    return out, seen, said, said_at


def say_start(display, host, result):
    """The phases of a job that a start call watched (``result``: trainer_restart O(operation=start), or
    trainer_plan's ``job_start``), said as the watch says them; the watch task goes on from there
    (O(seen): the length of that timeline)."""
    if isinstance(result, dict) and result.get("started"):
        for line in lines(result, 0, "", 0.0, None)[0]:
            display.display("[%s] restart job: %s" % (host, line))


def proof_words(unit, proof, reasons):
    """The proof of a restart in one line: ``unit`` ready, the release, its start, how long it took, the step and
    throughput it showed, the GPU memory it holds; ``reasons``: why it restarted."""
    proof = dict((k, "" if v is None else v) for k, v in proof.items()) if isinstance(proof, Mapping) else {}
    words = "%s ready: release %s, invocation %s, pid %s, %s s to ready, step %s, %s tok/s, GPU MiB %s" % tuple(
        [unit] + [proof.get(k, "") for k in ("release", "invocation_id", "main_pid", "seconds_to_ready", "step",
                                             "tok_s", "gpus_mib")])
    if "baseline_words" in proof:
        words += " (not counted for the trainer: %s held before the start)" % proof["baseline_words"]
    if "gpu_memory" in proof:
        words += "; GPU memory counted: %s" % proof["gpu_memory"]
    if "paused_s" in proof:
        words += "; the proof did not run for %s s (its container frozen), not counted" % proof["paused_s"]
    return "%s; restarted because: %s" % (words, "; ".join(str(r) for r in reasons or []))


def outcome(job, unit, reasons, kind="restart"):
    """What the role shows of a job's end (``job``: the watch's result, or the start call's when the job ended
    within it) -> dict(ok, words, fail_msg): V(ok) the job's verdict; V(words) what a proved restart (its proof,
    and its throughput beside the previous good release's) or a stop (what was stopped) says; V(fail_msg) what a
    job that failed, or did not end within its budget, fails with. ``reasons``: why it restarted (the start
    call's, else the plan's); ``kind``: restart or stop."""
    job = job if isinstance(job, Mapping) else {}
    result = job.get("result") if isinstance(job.get("result"), Mapping) else {}
    ok = result.get("ok") is True
    words = []
    if ok and kind == "stop":
        words = [result.get("outcome")]
    elif ok:
        words = [proof_words(unit, result.get("proof"), reasons)]
        if isinstance(result.get("comparison"), Mapping):
            words.append(result["comparison"].get("words"))
    fail_msg = job.get("msg") or "the %s job did not finish within its budget (phase %s)" % (
        kind, job.get("phase") or "?")
    return dict(ok=ok, words=words, fail_msg=None if ok else fail_msg)


def not_started_msg(begun):
    """The failure of a call that was to start a job and did not say it started (``begun``: its result): its
    message, its output indented, and - unless it said nothing was started - that the job may run on."""
    lines = [begun.get("msg") or "the call that starts the restart job failed"]
    lines.extend("    %s" % line for line in begun.get("output") or [])
    if not begun.get("not_started"):
        lines.append("(the restart job may have started: it goes on on the target and releases the lock when it ends;"
                     " the next run reports its outcome)")
    return "\n".join(lines)
