# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What trainer_plan (the first read of a locked entry point) decides besides the read it shares with
trainer_status (``plan.status_read``): what the run may write (O(owned)), judged before the lock is
taken, and the deploy lock (O(lock)) with the restart job that may hold it. Kept out of ``plan.status``
so that the read-only status ships neither the lock nor the ownership judges.
"""

from __future__ import annotations

import time

from ansible_collections.dflash.trainer.plugins.module_utils.job.state import (
    job_alive,
    job_end,
    observe_job,
    outcome_words,
    read_state,
)
from ansible_collections.dflash.trainer.plugins.module_utils.job.lock import REFUSE, STALE, acquire_waiting, release
from ansible_collections.dflash.trainer.plugins.module_utils.target.install import InstallError, install_all
from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import KINDS, PROGRAM, observe, problems
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import done, poll_until, waiting


# ---------------------------------------------------------------------------------------------
# what the run may write (O(owned)), judged before the lock is taken

def ownership_problems(owned, look=observe):
    """[variable: why] for what the run may not write or delete; ``look(path, kind)`` observes
    each path (``target.ownership.observe``: resolved on this host)."""
    targets = []
    for item in owned or []:
        variable, kind, path = item.get("variable"), item.get("kind"), item.get("path")
        # a program may be a name, looked up on the target (target.ownership.program_item)
        if kind not in KINDS or not isinstance(path, str) or not (path.startswith("/") or kind == PROGRAM and path):
            return ["%s: the role passed an unknown kind %r or a relative path" % (variable, kind)]
        targets.append((variable, kind, look(path, kind)))
    return ["%s: %s" % (variable, why) for variable, why in problems(targets)]


ACCEPTED_FILE = "a path that is absent or holds what dflash.trainer wrote there"
ACCEPTED_SEARCH = "an entry root owns and only root may write, in directories only root may write (or leave it out " \
                  "of trainer_env)"


def refusal_message(refused):
    """The failure message for the problems ``ownership_problems`` found."""
    return "refused before any change on the target (%d problem%s):\n%s" % (
        len(refused), "" if len(refused) == 1 else "s", "\n".join(
            "- %s; accepted: %s" % (r, ACCEPTED_SEARCH if r.startswith("trainer_env.") else ACCEPTED_FILE)
            for r in refused))


# ---------------------------------------------------------------------------------------------
# the lock (O(lock)) and the restart job that may hold it

def lock_holder_job(out, state, alive):
    """The restart job's ``state`` when the lock was refused (``out``, a ``job.lock.Outcome``)
    because that job holds it and still runs (``alive(state)``); else None."""
    record = out.record
    if out.ok or out.action != REFUSE or not record or not record.get("job"):
        return None
    return state if job_end(state, state is not None and alive(state), record.get("job")) is None else None


def lock_refusal(out):
    """fail_json's arguments for a lock not taken (``out``, a ``job.lock.Outcome``)."""
    return dict(msg=out.msg, action=out.action, lock_refused=True,
                **(dict(owner=out.owner()) if out.action == REFUSE else {}))


def lock_taken(out, attached=None):
    """RV(lock) for a lock taken: action and msg, what the run waited for (``attached``) and the
    previous owner of a stale lock."""
    taken = dict(action=out.action, msg=out.msg)
    if attached:
        taken["attached"] = attached
    if out.action == STALE:
        taken["previous_owner"] = out.owner()
    return taken


def job_over(job_id):
    """Judge of (state, alive): the job ``job_id`` ended (done, died, or another job on record)."""
    def judge(observed, _elapsed):
        state, alive = observed
        if job_end(state, alive, job_id) is not None:  # no state file: nothing to wait for
            return done(state)
        return waiting("restart job %s to end" % job_id)
    return judge


# ---------------------------------------------------------------------------------------------
# what the run reports right after the read (RV(report), RV(untouched_words))

def last_job_words(result):
    """What the last restart job did, in words (the one this run waited for, else the one on
    record); None when there is none."""
    attached = (result.get("lock") or {}).get("attached")
    job = result.get("last_job")
    return attached or (job or {}).get("words") or None


def untouched_words(unit, plan, result):
    """The report of a run that leaves the trainer running (its plan restarts nothing); None when
    the plan restarts."""
    if plan.get("restart"):
        return None
    up = result.get("seconds_since_start")
    return "%s left running: release %s unchanged, pid %s, up %s s" % (
        unit, plan.get("release"), result.get("main_pid"), "?" if up is None else up)


def read_report(entry, plan, result, unit):
    """The lines the run shows right after its first read: what the last restart job did, and, for a
    deploy that restarts nothing (it ends here, or only installs: the plan's V(untouched)), that the trainer is
    left running, for a deploy in check mode (V(would_restart)), what it would restart, for a stop in check mode
    (V(would_stop)), what it would stop, for a start that finds it
    running its proved release, that nothing was started - one report."""
    lines = [last_job_words(result)]
    if entry == "deploy" and (plan.get("no_op") or plan.get("untouched")):
        lines.append(untouched_words(unit, plan, result))
    if plan.get("would_restart"):
        lines.append("would restart %s: %s" % (unit, "; ".join(plan.get("reasons") or [])))
    if plan.get("would_stop"):
        lines.append("would stop %s (%s, pid %s, release %s)%s" % (
            unit, result.get("active_state") or "?", "?" if result.get("main_pid") is None else result["main_pid"],
            result.get("running_release") or "-", " and disable it" if plan.get("disable") else ""))
    if entry == "start" and plan.get("no_op") and plan.get("words"):  # it ends here, nothing started
        lines.append("%s %s (pid %s); nothing was started - left running (a restart: playbooks/restart.yml)"
                     % (unit, plan["words"], result.get("main_pid")))
    return [line for line in lines if line]


# ---------------------------------------------------------------------------------------------
# the module's calls that take the lock and install (trainer_plan's main)

def take_lock(module, lk, state_path):
    """Take the deploy lock (O(lock)) -> RV(lock); fail the module when it is not taken. A restart
    job of an earlier (interrupted) play that holds it is waited for (O(lock.job_wait_s)) first."""
    out = acquire_waiting(lk["path"], lk["token"], lk["owner"], lk["stale_s"], lease_s=lk["lease_s"],
                          wait_s=lk["wait_s"])
    attached = None
    job = lock_holder_job(out, read_state(state_path), job_alive) if state_path and not out.ok else None
    if job is not None:
        attached = wait_for_job(state_path, job, lk["job_wait_s"])
        out = acquire_waiting(lk["path"], lk["token"], lk["owner"], lk["stale_s"], lease_s=lk["lease_s"],
                              wait_s=max(lk["wait_s"], 5))
    if not out.ok:
        module.fail_json(lock_holder="nobody", **lock_refusal(out))
    return lock_taken(out, attached)


def wait_for_job(state_path, job, wait_s, clock=time.monotonic, sleep=time.sleep):
    """Wait (bounded) until the restart job ``job`` (its state, found running) has ended -> words
    for what it did."""
    out = poll_until(lambda: observe_job(state_path, alive=job_alive), job_over(job.get("job_id")), wait_s, 0.5,
                     clock=clock, sleep=sleep, first=(job, True))
    return "waited for %s" % outcome_words(out.snapshot[0])


def compare_install(module, run, systemctl):
    """What O(install) would change (compared, nothing written) -> (it, its diff); a refusal is said, not raised."""
    p = module.params
    try:
        found = install_all(dict(p["install"], env_content=p["env_content"] or ""), run, systemctl,
                            check_mode=True, diff=module._diff)
    except InstallError as e:  # the deploy's install refuses it too, before any write; say it there
        return dict(e.result, refused=e.msg), None
    return found, found.pop("diff", None)


def install_here(module, run, systemctl, lk):
    """Install the unit, environment file and launcher (O(install)) -> what changed; the module fails, the lock
    freed, when the install refuses (before any write)."""
    p = module.params
    try:
        return install_all(dict(p["install"], env_content=p["env_content"] or ""), run, systemctl,
                           check_mode=False, diff=False)
    except InstallError as e:
        release(lk["path"], lk["token"])
        module.fail_json(msg=e.msg, lock_holder="nobody", **e.result)
        raise  # not reached: fail_json exits
