# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What trainer_status decides and how it shapes its answer.

The module gathers facts (the unit's properties, the running trainer's environment, the start's
log, ``current`` and ``last_good``, the ledger, the restart job's state, nvidia-smi's GPUs), hands
them to the pure functions here and reports what they return. The few readers here take paths
(``release_from_proc``, ``read_log``, ``read_log_chunk``; ``current`` and ``last_good`` are read by
``release.root``, the ledger by ``release.ledger``) and judge nothing; the judges of the module's waits
(``start_ended``, ``log_arrived``) are pure predicates for the one waiter (``job.wait.poll_until``).
What only trainer_plan decides - what the run may write, the lock and the restart job that may
hold it - is ``plan.first_read``'s: a read-only status ships no lock.
"""

from __future__ import annotations

import os
import time

from ansible_collections.dflash.trainer.plugins.module_utils.job.state import ENDED, job_end, outcome_words
from ansible_collections.dflash.trainer.plugins.module_utils.proof.log_file import read_start
from ansible_collections.dflash.trainer.plugins.module_utils.proof.log_tail import default_invocation, read_log_lines
from ansible_collections.dflash.trainer.plugins.module_utils.target.nvidia_smi import memory_by_index
from ansible_collections.dflash.trainer.plugins.module_utils.target.systemd import (
    exit_description,
    int_prop,
    is_running,
    parse_show,
)
from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import health
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import StartLog
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import done, poll_until, waiting

RELEASE_VAR = "DFLASH_RELEASE"

# what the status reports of each GPU (gpus): enough to check trainer_gpus and the minimum
GPU_KEYS = ("index", "uuid", "name", "memory_used_mib", "memory_total_mib")

# Status wants the latest progress line: the marker and this much of the end of this start (the
# window grows sixteenfold while it holds none). Every line read is judged, ≈ 0.1 ms each on the
# target: 64 KiB (≈ 1,000 lines) keeps a read of a chatty trainer's log well under 0.2 s.
LOG_TAIL_BYTES = 64 << 10

LOG_NEEDS_PATH = "log_lines and log_offset read the log: log_path is required"


# ---------------------------------------------------------------------------------------------
# the request

def wants_log(params):
    """Whether the call asks for a start's log in RV(log) (O(log_lines) > 0 or O(log_offset))."""
    return params.get("log_lines", 0) > 0 or params.get("log_offset") is not None


# ---------------------------------------------------------------------------------------------
# the restart job on record

def job_summary(job, alive):
    """RV(last_job) of the job state on record (None when there is none); ``alive``: whether it runs."""
    if job is None:
        return None
    return dict(job_id=job.get("job_id"), phase=job.get("phase"), done=bool(job.get("done")), alive=alive,
                ok=(job.get("result") or {}).get("ok"), words=outcome_words(job))


# ---------------------------------------------------------------------------------------------
# the unit

def unit_fields(props, seconds, environ_release=None):
    """The status of the unit from its properties (``systemctl show``): the answer's fields that
    are returned always, with the running release as read from the environment of its processes
    (``environ_release``) and ``seconds`` it has run (``target.systemd.runtime_s``)."""
    running = is_running(props)
    return dict(
        changed=False,
        load_state=props.get("LoadState", ""),
        fragment_path=props.get("FragmentPath", ""),
        description=props.get("Description", ""),
        active_state=props.get("ActiveState", ""),
        sub_state=props.get("SubState", ""),
        running=running,
        main_pid=int_prop(props, "MainPID", 0),
        invocation_id=props.get("InvocationID", ""),
        n_restarts=int_prop(props, "NRestarts", 0),
        result=props.get("Result", ""),
        started_at=props.get("ExecMainStartTimestamp", ""),
        seconds_since_start=round(seconds, 3) if seconds is not None else None,
        exit=None if running else exit_description(props),
        running_release=environ_release or None,
        running_release_source="environ" if environ_release else None,
        drift=False,
        gpus_mib=None,
        gpus=None,
    )


def start_ended(invocation):
    """Judge of (readable, unit properties): this start ended (not running, or another
    InvocationID), or the unit can no longer be read."""
    def judge(observed, _elapsed):
        readable, props = observed
        if not readable or not is_running(props) or props.get("InvocationID", "") != invocation:
            return done(props)
        return waiting("this start to end")
    return judge


def watch(read, props, watch_s, clock=time.monotonic, sleep=time.sleep, interval_s=1.0):
    """Read the unit (``read()`` -> (rc, out, err) of systemctl show) every ``interval_s`` until
    ``watch_s`` passed or this start ended (not running, or another InvocationID) -> (props, seconds)."""
    seen = [props]

    def look():
        rc, out, _err = read()
        if rc == 0:
            seen[0] = parse_show(out)
        return rc == 0, seen[0]

    out = poll_until(look, start_ended(props.get("InvocationID", "")), watch_s, interval_s,
                     clock=clock, sleep=sleep, first=(True, props))
    return out.snapshot[1], round(out.elapsed, 1)


# ---------------------------------------------------------------------------------------------
# the running release, from the environment of the unit's processes

def environ_value(data, key):
    """Value of ``key`` in a /proc/<pid>/environ blob, or None."""
    prefix = key.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "replace")
    return None


def release_from_proc(pid, depth=3, proc="/proc"):
    """DFLASH_RELEASE of ``pid`` or, breadth first, of its children (the launcher exports it to
    the command it runs, so its own initial environment may lack it)."""
    queue = [(pid, 0)]
    while queue:
        current, level = queue.pop(0)
        try:
            with open("%s/%d/environ" % (proc, current), "rb") as f:
                value = environ_value(f.read(), RELEASE_VAR)
        except (IOError, OSError):
            value = None
        if value:
            return value
        if level < depth:
            try:
                with open("%s/%d/task/%d/children" % (proc, current, current)) as f:
                    queue.extend((int(c), level + 1) for c in f.read().split())
            except (IOError, OSError, ValueError):
                pass
    return None


# ---------------------------------------------------------------------------------------------
# the log of this start

def read_log(path, invocation_id):
    """(StartLog, StartLocation) of this start, read from its marker's offset (the launcher's
    sidecar, else a backward scan), never from byte 0; only its last LOG_TAIL_BYTES (more when
    they hold no progress line)."""
    return read_start(path, invocation_id, lambda: StartLog(invocation_id, keep_lines=50),
                      tail_bytes=LOG_TAIL_BYTES)


def log_fields(follower, where, running, running_release):
    """The answer's log fields from this start's log (``follower``, a ``StartLog``, and ``where``,
    its ``StartLocation``; both None when it was not read): log_release, last_progress_line, tok_s,
    step, log_problem when the log lost the start, and the running release from the marker when
    the environment did not tell it (``running_release``)."""
    if follower is None:
        return dict(log_release=None, last_progress_line=None, tok_s=None, step=None)
    analysis = follower.analysis
    fields = dict(log_release=(follower.marker or {}).get("release"), last_progress_line=analysis.progress_line,
                  tok_s=analysis.tok_s, step=analysis.last_step)
    if where is not None and where.problem:
        fields["log_problem"] = where.problem
    if running and not running_release and fields["log_release"]:
        fields.update(running_release=fields["log_release"], running_release_source="log marker")
    return fields


def log_arrived(chunk, _elapsed):
    """Judge of a log chunk: lines came, or this start's log ended."""
    return done(chunk) if chunk.lines or chunk.ended else waiting("lines of the trainer's log")


def read_log_chunk(p, unit_invocation, clock=time.monotonic, sleep=time.sleep):
    """RV(log): the last O(log_lines) lines of a start, or (O(log_offset)) those appended since,
    waiting up to O(log_wait_s) for some."""
    invocation = p["log_invocation"] or default_invocation(unit_invocation, p["log_path"])
    if not invocation:
        return dict(invocation=None, release=None, lines=[], offset=0, inode=None, ended=False, found=False,
                    problem="no start of the trainer recorded in %s" % p["log_path"])
    following = p["log_offset"] is not None
    read = [dict(lines=p["log_lines"], offset=p["log_offset"], inode=p["log_inode"])]

    def look():
        chunk = read_log_lines(p["log_path"], invocation, **read[0])
        read[0] = dict(offset=chunk.offset, inode=chunk.inode)  # the next read goes on from here
        return chunk

    out = poll_until(look, log_arrived, max(p["log_wait_s"] or 0, 0) if following else 0, 0.25,
                     clock=clock, sleep=sleep)
    return out.snapshot.as_dict()


# ---------------------------------------------------------------------------------------------
# the release root: current, last_good, the ledger

def release_fields(current_link, last_good_text, running_release):
    """current_release (the basename of ``current``'s target), last_good (its text, stripped;
    None when empty) and drift (both releases known and the running one not ``current``)."""
    current = os.path.basename(current_link.rstrip("/")) if current_link is not None else None
    last_good = (last_good_text.strip() or None) if last_good_text is not None else None
    return dict(current_release=current, last_good=last_good,
                drift=bool(running_release and current and running_release != current))


def status_health(ledger, status, seconds, now, stopped=None):
    """RV(health) of the status fields gathered so far (``status``) against the ledger: the
    release judged is the running one, else the log's, else ``current``; this start began
    ``seconds`` (its runtime) before ``now`` (wall clock, s); ``stopped``: the deliberate stop on
    record that still holds (``stopped_on_purpose`` below), or None."""
    running = status["running"]
    started = now - seconds if running and seconds is not None else None
    release = status.get("running_release") or status.get("log_release") or status.get("current_release")
    return health(ledger, release, running, started_at=started, n_restarts=status["n_restarts"], now=now,
                  state="%s/%s" % (status["active_state"], status["sub_state"]), stopped=stopped)


# ---------------------------------------------------------------------------------------------
# a deliberate stop (trainer_restart operation=stop, job.stop), as status reads it

# the job state's ``kind`` of a deliberate stop (a restart job's state has none)
STOP_KIND = "stop"


def fmt_uptime(seconds):
    """Seconds in words: 42 s, 3 min 12 s, 5 h 03 min, 2 d 4 h."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return "%d s" % s
    if s < 3600:
        return "%d min %02d s" % (s // 60, s % 60)
    if s < 86400:
        return "%d h %02d min" % (s // 3600, (s % 3600) // 60)
    return "%d d %d h" % (s // 86400, (s % 86400) // 3600)


def stopped_on_purpose(state, props):
    """Status's judge: the deliberate stop on record in the job state ``state`` (``stopped`` of its
    result, with the job's id), when it still holds - the unit is not running and has not been started
    since (its ExecMainStartTimestamp is still the one the stop saw, or empty: no start since the
    container booted) - else None."""
    # (a stop that has not ended holds nothing yet, whether its process runs or not)
    if not state or state.get("kind") != STOP_KIND or job_end(state, False) != ENDED:
        return None
    stopped = (state.get("result") or {}).get("stopped")
    if not isinstance(stopped, dict) or is_running(props):
        return None
    started = props.get("ExecMainStartTimestamp", "") or None
    if started is not None and started != stopped.get("started_at"):
        return None  # started since (by hand, by a boot) and ended again: not the stop's doing
    return dict(stopped, job_id=state.get("job_id"),
                words="stopped on purpose by %s at %s%s" % (
                    stopped.get("by") or "?", stopped.get("at_words") or "?",
                    " (release %s, pid %s, up %s)" % (stopped.get("release") or "?", stopped.get("main_pid"),
                                                      fmt_uptime(stopped.get("seconds_up")))
                    if stopped.get("running") else ""))


# ---------------------------------------------------------------------------------------------
# the GPUs

def gpu_fields(gpus):
    """gpus_mib (memory used per index) and gpus (GPU_KEYS of each) of nvidia-smi's GPUs."""
    return dict(gpus_mib=memory_by_index(gpus), gpus=[dict((k, g.get(k)) for k in GPU_KEYS) for g in gpus])
