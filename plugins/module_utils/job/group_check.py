# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The group's check of one member (``trainer_restart`` operation=check): once every member's own job has
proved it, each member is looked at again at one moment - one task on every member at once - and the
group is proved only when every member still runs what its job proved: the unit active, the same start
(main pid, invocation) as at its proof, its GPUs still held and, where its log shows steps, progress past
the proof's last step. A member that died, restarted or stalled in between fails the group, with its
reason (the error lines of the start that was proved: its traceback).

``still_proved`` is the pure judge; ``check_member`` reads the job's proof from its state file and the
member now, through the one waiter (progress may need a moment: up to the proof's stall window)."""

from __future__ import annotations

from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed, compile_regexes, ours, show
from ansible_collections.dflash.trainer.plugins.module_utils.job.state import read_state
from ansible_collections.dflash.trainer.plugins.module_utils.proof.log_file import read_start
from ansible_collections.dflash.trainer.plugins.module_utils.target.nvidia_smi import NvidiaSmiError, memory_by_index, read_gpus
from ansible_collections.dflash.trainer.plugins.module_utils.target.command import Runner
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import StartLog
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import done, failed, poll_until, waiting

NO_PROGRESS = "no progress"


def _int(value, default=0):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def still_proved(proof, unit, gpus_mib, min_mib, step=None):
    """Why a member no longer runs what its job proved, in words; None when it still does.

    ``proof``: the job's proof (main_pid, invocation_id, gpus_mib: the GPUs it proved, step); ``unit``: the
    unit's properties now; ``gpus_mib``: {index: MiB} the trainer holds now (memory there before its start
    left out); ``step``: the highest step of the proved start's log now (None: progress is not judged)."""
    proved_pid = _int(proof.get("main_pid"))
    pid, state = _int(unit.get("MainPID")), unit.get("ActiveState") or "unknown"
    if state != "active" or pid <= 0:
        return "its unit is %s (%s) since its proof (main pid %s then)" % (
            state, unit.get("SubState") or "?", proved_pid)
    if pid != proved_pid or (proof.get("invocation_id") and unit.get("InvocationID") != proof["invocation_id"]):
        return ("the main pid %s proved is gone: the unit runs pid %s now (restarted %s time(s) since its start)"
                % (proved_pid, pid, unit.get("NRestarts", "?")))
    held = dict((str(i), m) for i, m in (gpus_mib or {}).items())
    short = sorted((str(i) for i in (proof.get("gpus_mib") or {}) if (held.get(str(i)) or 0) < min_mib), key=_int)
    if short:
        return "GPU %s no longer held (%s, below %d MiB)" % (
            ", ".join(short), ", ".join("%s MiB" % held.get(i) for i in short), min_mib)
    if step is not None and proof.get("step") is not None and step <= proof["step"]:
        return "%s since its proof (step %s then, step %s now)" % (NO_PROGRESS, proof["step"], step)
    return None


def _proof_of(p):
    """The proof of this member's job (``p["job_id"]``) from its state file -> dict, or raises StepFailed."""
    state = read_state(p["state_path"]) or {}
    if state.get("job_id") != p["job_id"]:
        raise StepFailed("its restart job %s is not on record (the state file holds %s)"
                         % (p["job_id"], state.get("job_id") or "nothing"))
    result = state.get("result") or {}
    if not result.get("ok") or not result.get("proof"):
        raise StepFailed("its restart job %s did not prove it" % p["job_id"])
    return result["proof"]


def check_member(p, systemctl, nvidia_smi):
    """The member now against its job's proof -> dict(ok, msg, proof, main_pid, step); progress (where the
    proved start's log shows steps) may take up to ``p["stall_s"]`` to pass the proof's step."""
    try:
        proof = _proof_of(p)
    except StepFailed as exc:
        return dict(ok=False, msg=exc.msg)
    regexes = compile_regexes(p["ready_regex"], p["step_regex"], p["tokps_regex"], p["error_regexes"])
    invocation = proof.get("invocation_id") or ""
    judged = proof.get("step") is not None and not p.get("progress_path")
    # memory a GPU held before the start (another tenant's) is never the trainer's (as in the proof)
    baseline = dict((_int(i), m) for i, m in (proof.get("baseline_mib") or {}).items())

    def read_log():
        try:
            follower, _where = read_start(p["log_path"], invocation, lambda: StartLog(
                invocation, ready_regex=regexes["ready_regex"], step_regex=regexes["step_regex"],
                tokps_regex=regexes["tokps_regex"], error_regexes=regexes["error_regexes"], keep_lines=50),
                tail_bytes=1 << 20)
        except (IOError, OSError):
            return None
        return follower.analysis

    def observe():
        unit = show(Runner(30), systemctl, p["unit"])
        try:
            gpus = memory_by_index(read_gpus(Runner(30), nvidia_smi, processes=False)[0])
        except NvidiaSmiError as exc:
            raise StepFailed(str(exc))
        return unit, ours(gpus, baseline), read_log()

    def judge(seen, _elapsed):
        unit, gpus, log = seen
        why = still_proved(proof, unit, gpus, p["min_mib"], step=(log.max_step if log else None) if judged else None)
        if why is None:
            return done(dict(unit=unit, step=log.max_step if log else None))
        if why.startswith(NO_PROGRESS):
            return waiting(why)
        errors = [line.strip() for _rx, line in (log.errors if log else [])][:5]
        return failed(why + (": " + " | ".join(errors) if errors else ""), errors)

    try:
        out = poll_until(observe, judge, p["stall_s"] if judged else 0, min(p["interval_s"], 0.5))
    except StepFailed as exc:
        return dict(ok=False, msg="the check could not read it: %s" % exc.msg, proof=proof)
    if out.state == "done":
        return dict(ok=True, msg="still runs what was proved (pid %s)" % proof.get("main_pid"), proof=proof,
                    main_pid=proof.get("main_pid"), step=out.value.get("step"))
    return dict(ok=False, msg=out.words, proof=proof, errors=out.value if isinstance(out.value, list) else [])
