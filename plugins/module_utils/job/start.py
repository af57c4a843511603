# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Starting a job of the restart job's kind from a module - the one path of ``trainer_restart``
(O(operation=start), O(operation=stop)) and of ``trainer_plan`` (a plan that restarts what is already on
the target starts its job in the same call as the read: one remote call).

``start_job`` checks that no other job runs, pre-flights and installs (``job.steps.before_start``),
detaches the job, waits until it has recorded itself and watches it for ``p["wait_s"]`` ->
(ok, fields): the fields trainer_restart O(operation=start) returns, ``not_started`` and ``lock_holder``
among them. ``job_params`` makes the job's parameters from a plan and the role's ``job`` settings
(``JOB_OPTIONS``: trainer_restart's options less the ones the plan decides), checked with Ansible's own
argument-spec validator.
"""

from __future__ import annotations

import os
import random
import time

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed
from ansible_collections.dflash.trainer.plugins.module_utils.target.install import InstallError
from ansible_collections.dflash.trainer.plugins.module_utils.job.state import job_alive, observe_job, outcome_words, read_state
from ansible_collections.dflash.trainer.plugins.module_utils.target.nvidia_smi import locate
from ansible_collections.dflash.trainer.plugins.module_utils.proof.preflight import Refused
from ansible_collections.dflash.trainer.plugins.module_utils.proof.progress_file import collision
from ansible_collections.dflash.trainer.plugins.module_utils.job.options import RESTART_OPTIONS, with_proof
from ansible_collections.dflash.trainer.plugins.module_utils.job.steps import (
    before_start,
    detach,
    job_ended,
    job_recorded,
    run_restart,
    summary,
    wait_report,
)
from ansible_collections.dflash.trainer.plugins.module_utils.job.stop import enable_unit, run_stop
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import WAITING, poll_until

# how often a watch reads the job's state file (a small JSON file and /proc/<pid>/stat): the job's outcome
# reaches the controller within this of the job writing it
JOB_POLL_S = 0.02

# what the plan decides (trainer_plan sets them from it) or what is a secret (a top-level option of its own)
PLANNED = ("operation", "release", "reasons", "min_tokps_ratio", "install", "env_content", "environment_json")


def _job_options():
    options = {k: dict(v) for k, v in RESTART_OPTIONS.items() if k not in PLANNED and k != "job"}
    options["job_id"] = dict(type="str")  # made here when not given: the lock token and 8 random digits
    # the plan's release is the one pre-flighted: its directory is known once the plan is made
    options["preflight"]["options"] = dict(options["preflight"]["options"])
    options["preflight"]["options"]["release_dir"] = dict(options["preflight"]["options"]["release_dir"],
                                                          required=False)
    return options


JOB_OPTIONS = _job_options()


def job_params(job, plan, root, top):
    """The restart job's parameters (trainer_restart's, O(operation=start)) for ``plan``: ``job`` (the role's
    settings, JOB_OPTIONS) checked and completed with their defaults, the plan's release, reasons, throughput
    gate and pre-flight (of the plan's release, when the plan says so) and from ``top`` the install and the
    secrets -> params; ValueError saying what is wrong."""
    checked = ArgumentSpecValidator(JOB_OPTIONS).validate(job)
    if checked.error_messages:
        raise ValueError("job: %s" % "; ".join(checked.error_messages))
    p = dict(checked.validated_parameters, operation="start", release=plan["release"], reasons=list(plan["reasons"]),
             min_tokps_ratio=plan.get("min_tokps_ratio") or 0, install=top.get("install"),
             env_content=top.get("env_content"), environment_json=top.get("environment_json") or "{}")
    if plan.get("preflight") and p.get("preflight"):
        p["preflight"] = dict(p["preflight"], release_dir=os.path.join(root, "releases", plan["release"]))
    else:
        p["preflight"] = None
    if p["wait_s"] is None:
        p["wait_s"] = 0
    if not p["job_id"]:
        p["job_id"] = "%s-%08d" % (p["lock_token"] or "nolock", random.SystemRandom().randrange(10 ** 8))
    return with_proof(p)


def start_planned(module, plan, job, root, top, runner):
    """Start the job of ``plan`` (see ``job_params``) -> the fields of its start, with ``failed``."""
    try:
        p = job_params(job, plan, root, top)
    except ValueError as exc:  # nothing was started: the lock is still the play's
        return dict(failed=True, not_started=True, lock_holder="play", msg=str(exc))
    ok, fields = start_job(module, p, runner)
    return dict(fields, failed=not ok)


def run_job(module, p):
    """The detached job's body (or trainer_restart O(operation=run)): the restart, or the deliberate stop, to
    its outcome, which ends the module (exit_json / fail_json)."""
    systemctl = module.get_bin_path("systemctl", required=True)
    nvidia_smi = locate(p["nvidia_smi"], module.get_bin_path)
    if nvidia_smi is None:
        module.fail_json(msg="nvidia-smi (%s) not found on the target" % p["nvidia_smi"])
    os.umask(0o077)  # the state file, the ledger and their temporary files: 0600 (log tails are kept there)
    ok, fields = summary((run_stop if p["operation"] == "stop" else run_restart)(p, systemctl, nvidia_smi))
    if ok:
        module.exit_json(**fields)
    module.fail_json(**fields)


def start_job(module, p, runner):
    """Start the job of ``p`` detached from this module's session and streams (it survives the
    connection, the controller and this process) once it has recorded itself, watched for
    ``p["wait_s"]`` -> (ok, fields). Every refusal before the fork says ``not_started``: nothing was
    stopped and the lock is still the play's."""
    def refused(**kw):
        return False, dict(not_started=True, lock_holder="play", **kw)

    earlier = read_state(p["state_path"]) or {}
    if earlier.get("job_id") == p["job_id"]:
        return False, dict(msg="restart job %s was already started" % p["job_id"], lock_holder="job")
    if job_alive(earlier):
        return refused(msg="refused: %s; one restart at a time" % outcome_words(earlier))
    why = collision(p)  # the progress file is only read: never a file the collection writes
    if why:
        return refused(msg="trainer_progress_path: %s; nothing was changed" % why)
    systemctl = module.get_bin_path("systemctl", required=True)
    try:  # a deliberate stop (operation=stop) has nothing to pre-flight, install or enable
        before = {} if p["operation"] == "stop" else before_start(p, module.get_bin_path, runner, systemctl)
        if p["enable"] and p["operation"] == "start":  # a stop with disable=true disabled it
            before["enabled_unit"] = enable_unit(runner, systemctl, p["unit"])
    except Refused as exc:  # the old trainer runs on, untouched
        return refused(preflight_refused=True, **exc.result)
    except InstallError as exc:  # nothing was stopped
        return refused(msg=exc.msg, install=exc.result, install_failed=True)
    except StepFailed as exc:  # enabling the unit failed: nothing was stopped
        return refused(msg=exc.msg)
    pid = detach(lambda: run_job(module, p))
    recorded = poll_until(lambda: read_state(p["state_path"]) or {}, job_recorded(p["job_id"]), 10, 0.05)
    if not recorded.ok:
        return False, dict(before, msg="restart job %s (pid %s) did not record itself in %s within 10 s"
                           % (p["job_id"], pid, p["state_path"]), lock_holder="unknown")
    started = dict(before, changed=True, started=True, lock_holder="play" if p["keep_lock"] else "job",
                   job_id=p["job_id"], pid=int(pid) if pid.isdigit() else None, reasons=p["reasons"],
                   phase=recorded.value.get("phase"), finished=False)
    if p["wait_s"]:  # the first watch rides with the start (a short restart needs no second call)
        ok, fields = wait_for_job(p)
        return ok, dict(started, **dict(fields, changed=True, started=True))
    return True, started


def wait_for_job(p, clock=time.monotonic, sleep=time.sleep):
    """Watch the job ``p["job_id"]`` for ``p["wait_s"]`` -> (ok, fields) of O(operation=wait); with
    ``p["seen"]`` (the phases the watcher has shown), back as soon as a phase more has begun."""
    out = poll_until(lambda: observe_job(p["state_path"], alive=job_alive),
                     new_phase(job_ended(p["job_id"]), p.get("seen")), p["wait_s"], JOB_POLL_S, clock=clock,
                     sleep=sleep)
    return wait_report(out, p["state_path"])


def new_phase(judge, seen):
    """``judge`` (of ``job_ended``), ending the wait as soon as the job's timeline holds more than
    ``seen`` phases (None: only at the end or the deadline) - a wait that ends so is not finished."""
    if seen is None:
        return judge

    def judge_new(observed, elapsed):
        verdict = judge(observed, elapsed)
        state = observed[0] or {}
        if verdict.state == WAITING and len(state.get("timeline") or ()) > seen:
            return verdict._replace(deadline=elapsed)  # ends this round, undecided: the watcher shows it
        return verdict
    return judge_new
