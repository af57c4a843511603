# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The restart job's result: every key it may hold, declared once.

The job (``job.restart.RestartJob.run``, and ``job.steps.run_restart`` when it stops before
the cycle) returns a dict that the module returns as ``result`` (``trainer_restart``), that the
role reads (``__trainer_job.result``), that the job's state file keeps, and that the Python API
reads from the runner's events (``dflash_trainer.results``). ``FIELDS`` is that dict's
declaration: its keys, their Ansible types (the ``type`` of a RETURN entry), the words and the
``returned`` of each. trainer_restart's RETURN documents ``result`` with exactly these
(``contains``), and a unit test holds the two, and the keys the API reads, to it.

``JobResult`` is how the job builds its result: setting a key that is not declared, or a value of
the wrong kind, raises ``JobResultError``; ``to_dict()`` gives the plain dict that is returned and
stored. ``check(data)`` (``problems(data)`` in words) judges a dict that was built elsewhere.
Any declared key may hold None (JSON null): the job writes null for what it has not got (no proof
yet, no phase yet, no ``current``).

Standard library only: this file is shipped in the module's payload.
"""

from __future__ import annotations

import collections

Field = collections.namedtuple("Field", "name type description returned elements")

# the Python kinds a value of each Ansible type may be (besides None)
KINDS = {
    "bool": (bool,),
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "dict": (dict,),
    "list": (list, tuple),
}


def _field(name, type_, description, returned, elements=None):
    return Field(name, type_, description, returned, elements)


_CYCLE = "unless the job stopped before its cycle (a lost lease, a crash, an invalid pattern)"

FIELDS = (
    _field("ok", "bool",
           "Whether the release that C(current) pointed at was proved ready (V(false) for any failure, "
           "even one that a rollback or a restore repaired).",
           "always"),
    _field("msg", "str",
           "Why the restart failed, in words (the failed step's reason, the lost lease, the crash).",
           "on failure"),
    _field("outcome", "str",
           "What the job did and what runs now, in words (C(ready: ...), C(Rolled back: ...), C(Restored: ...), "
           "C(No rollback: ...), C(... FAILED as well: ...)), its warnings appended.",
           "always"),
    _field("release", "str",
           "The release the job restarted (its O(release), switched to before the stop; else the one C(current) "
           "pointed at when the job began).",
           _CYCLE),
    _field("previous", "str",
           "The release C(current) pointed at when the job began (before it switched to C(release)).",
           _CYCLE),
    _field("switched", "bool",
           "Whether the job switched C(current) to C(release) before the stop.",
           _CYCLE),
    _field("restarted", "bool",
           "Whether the release was started (the job reached its proof).",
           _CYCLE),
    _field("rolled_back", "bool",
           "Whether the job went back to the last good release (see C(rollback_proof) or C(rollback_failure)).",
           _CYCLE),
    _field("proof", "dict",
           "What proved the release ready (release, invocation_id, "
           "main_pid, gpus_mib, step, tok_s, seconds_to_ready, with the measured C(figures)); V(null) unless it was "
           "proved.",
           _CYCLE),
    _field("started", "dict",
           "What the start reported (invocation_id, main_pid, n_restarts, active_state, sub_state, started_at, ...).",
           "when the release was started and proved (a throughput gate's refusal included)"),
    _field("figures", "dict",
           "The throughput measured after the proof (C(tok_s): median, p10, p90, n, window_s) and the named figures.",
           "when the release was proved (a throughput gate's refusal included)"),
    _field("comparison", "dict",
           "The measured throughput against the entry before it that was proved, whichever release and "
           "configuration it ran, and the best (words, median, release, config, previous_release, previous_config, "
           "previous_at, previous_median, change_pct, best_median).",
           "when the release was proved (a throughput gate's refusal included)"),
    _field("warnings", "list",
           "What went wrong without changing the verdict (a drain gate or a purge that failed while a release was "
           "brought back, a release that could not be recorded as last good).",
           "when there were any", "str"),
    _field("failure", "str",
           "Why the restart failed: the failed step's reason, the throughput gate's refusal, an unexpected error.",
           "when the cycle failed"),
    _field("failed_phase", "str",
           "The phase the job was in when it failed (stopping, draining, purging, starting, proving, gated); after "
           "a lost lease, the phase before it.",
           "when the cycle failed or the lease was lost"),
    _field("log_tail", "list",
           "The last lines of the failed start's log (empty when the failure read none).",
           "when the cycle failed", "str"),
    _field("failure_details", "dict",
           "What the failed step reported besides its reason (log_tail, the unit's state, GPU memory, ...; "
           "C(unexpected) for an error that was not the step's own verdict).",
           "when the cycle failed"),
    _field("restored", "bool",
           "The release that ran was brought back and proved ready: its stop, drain, purge or start failed (nothing "
           "was proved wrong with it) and there was no other good release.",
           "when it was restored"),
    _field("rollback_proof", "dict",
           "What proved the release that was brought back ready (the last good one, or the restored one).",
           "after a rollback or a restore that was proved"),
    _field("rollback_release", "str",
           "The last good release the job rolled back to.",
           "when it rolled back"),
    _field("rollback_failure", "str",
           "Why the rollback or the restore failed as well.",
           "when it failed"),
    _field("stop_failure", "str",
           "Why stopping the failed trainer failed (no release to roll back to).",
           "when that stop failed"),
    _field("lease_lost", "bool",
           "The deploy lock stopped being the job's: it stopped acting, nothing more was stopped, switched or "
           "started by it.",
           "when the lease was lost"),
    _field("ledger_error", "str",
           "Why the release ledger could not be written (the verdict stands).",
           "when it could not be written"),
    _field("stopped", "dict",
           "What a deliberate stop (O(operation=stop)) stopped - running, release, main_pid, invocation_id, started_at, "
           "seconds_up, step, tok_s (this start's last progress), state_before - by whom (by) and when (at, "
           "at_words), gpus_mib after the drain, enabled (the unit starts again at the container's boot), disabled; "
           "status reads it as stopped on purpose.",
           "after a stop job that reached systemctl stop"),
)

KEYS = tuple(f.name for f in FIELDS)
BY_NAME = dict((f.name, f) for f in FIELDS)


class JobResultError(ValueError):
    """A key that the job result does not declare, or a value of the wrong kind for its key."""


def problem(key, value):
    """What is wrong with ``key`` = ``value`` in a job result, in words; None when nothing is."""
    field = BY_NAME.get(key)
    if field is None:
        return "%r is not a key of the restart job's result (declared: %s)" % (key, ", ".join(KEYS))
    if value is None:
        return None
    kinds = KINDS[field.type]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        return "%s of the restart job's result is a %s, not a %s" % (key, type(value).__name__, field.type)
    if field.elements and not all(isinstance(v, KINDS[field.elements]) for v in value):
        return "%s of the restart job's result holds an element that is not a %s" % (key, field.elements)
    return None


def problems(data):
    """Everything wrong with ``data`` as a job result, in words ([]: it conforms)."""
    if not isinstance(data, dict):
        return ["the restart job's result is a %s, not a dict" % type(data).__name__]
    return [p for p in (problem(k, v) for k, v in data.items()) if p]


def check(data):
    """``data`` when it is a conforming job result; JobResultError naming what is wrong otherwise."""
    found = problems(data)
    if found:
        raise JobResultError("; ".join(found))
    return data


class JobResult(object):
    """The job's result while the job builds it: only declared keys, each of its declared kind.
    ``result[key]``, ``result.get(key)``, ``key in result``, ``result.update(...)`` as on a dict;
    ``to_dict()`` -> the plain dict (keys in the order they were first set)."""

    __slots__ = ("_values",)
    KEYS = KEYS

    def __init__(self, **values):
        self._values = {}
        self.update(**values)

    def __setitem__(self, key, value):
        words = problem(key, value)
        if words:
            raise JobResultError(words)
        self._values[key] = value

    def __getitem__(self, key):
        return self._values[key]

    def __contains__(self, key):
        return key in self._values

    def get(self, key, default=None):
        return self._values.get(key, default)

    def update(self, **values):
        """Set every key of ``values``; nothing is set when one of them does not conform."""
        found = [p for p in (problem(k, v) for k, v in values.items()) if p]
        if found:
            raise JobResultError("; ".join(found))
        self._values.update(values)

    def to_dict(self):
        """The result as the job returns and stores it: a plain dict (a copy)."""
        return dict(self._values)

    @classmethod
    def from_dict(cls, data):
        """A JobResult from a result dict (``to_dict()``, or its JSON); JobResultError when it does not conform."""
        return cls(**check(data))

    def __eq__(self, other):
        return isinstance(other, JobResult) and self._values == other._values

    __hash__ = None

    def __repr__(self):
        return "JobResult(%s)" % ", ".join("%s=%r" % kv for kv in self._values.items())
