#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_plan
short_description: Take the deploy lock, read the trainer's state and make the run's plan, in one call
version_added: "0.1.0"
description:
  - The first call of every locked entry point (deploy, restart, start, rollback, stop). It judges every path the
    run may write (O(owned)), takes the deploy lock (O(lock)), reads what M(dflash.trainer.trainer_status)
    reads, compares what a deploy would install (O(install), nothing written) and returns the run's plan
    (RV(plan)) - made once, here, by one pure function - which the role and the restart job carry out.
  - A plan that does nothing past this call (its V(no_op)) or that refuses (its V(refused)) releases the
    lock in this call; RV(lock_holder) says who holds the lock when the call returns.
  - A restart job of an interrupted earlier run that holds the lock is waited for (O(lock.job_wait_s)), and
    the plan is made from what it left.
extends_documentation_fragment:
  - dflash.trainer.install_files
  - dflash.trainer.group_barrier
options:
  intent:
    description: What the run was asked to do.
    type: dict
    required: true
    suboptions:
      entry:
        description: The entry point.
        type: str
        choices: [deploy, restart, start, rollback, stop]
        required: true
      release:
        description: With O(intent.entry=deploy), the id of the release the deploy brings (computed on the controller).
        type: str
      force:
        description: With O(intent.entry=deploy), restart even when nothing changed.
        type: bool
        default: false
      rollback_release:
        description: With O(intent.entry=rollback), the release to go back to (default - the last good one).
        type: str
      hold:
        description: Keep the lock even when the plan does nothing past this call (a member of a trainer group, whose
          play decides for the whole group).
        type: bool
        default: false
      disable:
        description: A stop's - disable the unit after the stop (the role's C(trainer_stop_disable)); the plan carries
          it to the stop job (V(disable)) and says it in check mode's report.
        type: bool
        default: false
  unit:
    description: The trainer's systemd unit.
    type: str
    required: true
  trainer_root:
    description: Directory holding C(releases/), the C(current) symlink and C(last_good).
    type: path
  log_path:
    description: The trainer's log file (with the launcher's marker lines).
    type: path
  job_state_path:
    description: The restart job's state file.
    type: path
  env_file:
    description: The trainer's environment file; its values are secrets, replaced by C(***) in what is returned.
    type: path
  nvidia_smi:
    description: Name (looked up in E(PATH)) or absolute path of nvidia-smi.
    type: str
    default: nvidia-smi
  owned:
    description:
      - Every file the run writes and the directory it purges (C(variable), C(kind), C(path)), as
        P(dflash.trainer.trainer_validate#module) returns them; each must be absent or the collection's, in
        directories only root may write - else the module fails before the lock is taken, with RV(problems).
    type: list
    elements: dict
    default: []
  lock:
    description: The deploy lock, as P(dflash.trainer.trainer_lock#module) takes it. Omitted in check mode.
    type: dict
    suboptions:
      path:
        description: The lock file.
        type: path
        required: true
      token:
        description: This play's token.
        type: str
        required: true
      owner:
        description: Who holds it, in words.
        type: str
        default: unknown
      stale_s:
        description: A lock without a lease older than this is taken over.
        type: int
        default: 3600
      lease_s:
        description: The lease (seconds).
        type: int
      wait_s:
        description: Seconds to wait for a live holder.
        type: float
        default: 0
      job_wait_s:
        description:
          - How long to wait for a running restart job that holds the lock.
          - Default - the restart job's budget from O(settings) (1800 without them); V(0) for a trainer group's
            member (O(intent.hold)), whose earlier job still running refuses the group.
        type: float
  settings:
    description:
      - The role's settings the plan derives the run's job from - its budget (seconds), how long the play watches
        the job (V(job_budget_s), V(watch_retries) of RV(plan)) and waits for an earlier one (O(lock.job_wait_s)),
        and the throughput gate (V(min_tokps_ratio) of RV(plan)). An unset setting counts as 0.
    type: dict
    suboptions:
      stop_timeout_s:
        description: The unit's TimeoutStopSec.
        type: float
      drain_timeout_s:
        description: How long the GPU drain may take.
        type: float
      ready_timeout_s:
        description: The proof's deadline.
        type: float
      measure_s:
        description: The throughput window after the proof (0 - none).
        type: float
      min_tokps_ratio:
        description: The throughput gate of an ordinary deploy (a forced one, O(intent.force), has none).
        type: float
      watch_s:
        description: How long a deploy's proved trainer is watched after its restart (the role's C(trainer_watch_s);
          V(watch) of RV(plan)).
        type: float
      gpu_host_view:
        description: The node's view of the GPUs is read around the job (the role's C(trainer_gpu_host_view);
          V(node_view_before), V(node_view_after) of RV(plan)).
        type: bool
      check_mode:
        description: The play runs in check mode (this module runs with C(check_mode=false), to read) - no job
          runs (V(run_job) of RV(plan)).
        type: bool
  checks:
    description:
      - The role's variables the read is checked against before anything changes (by their names -
        V(trainer_gpus), V(trainer_gpu_min_mib), V(trainer_nvidia_smi), V(trainer_unit_name)) - every trainer GPU
        is listed by nvidia-smi and has the memory asked for, the unit is the collection's or free. A problem fails
        the module (RV(problems)), the lock released.
    type: dict
  job:
    description:
      - The restart job's settings - the options of M(dflash.trainer.trainer_restart) with C(operation=start), less
        the ones the plan decides (its release, reasons and throughput gate, whether to pre-flight, and
        C(preflight.release_dir)) and those given here at the top (O(install), O(env_content),
        O(environment_json)). With them, a plan that restarts a release already on the target (no upload)
        starts its job in this call (RV(job_start)); a plan that uploads leaves it to the role.
      - Checked as M(dflash.trainer.trainer_restart) checks its options; a wrong one fails the task, nothing started.
    type: dict
  environment_json:
    description: With O(job), the unit's environment for the job's pre-flight, JSON (a secret, never logged).
    type: str
    default: "{}"
  node_view_first:
    description: The run reads the node's view of the GPUs before the stop (the role's C(trainer_gpu_host_view)) - the
      plan's job is then started by the call after that read, never in this one, even with O(job).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Takes no lock and changes nothing in check mode; the plan says what would be done.
  diff_mode:
    support: partial
    description: With O(install), the files it would change (the environment file's values masked).
author:
  - dflash.trainer maintainers (@dflash)
"""
EXAMPLES = r"""
- name: Take the lock and plan the deploy of a release
  dflash.trainer.trainer_plan:
    intent: {entry: deploy, release: 0123456789abcdef}
    unit: dflash-trainer
    trainer_root: /opt/dflash-trainer
    lock: {path: /run/dflash-trainer.deploy.lock, token: "{{ token }}"}
  register: __trainer_first_read
"""
RETURN = r"""
plan:
  description:
    - The run's plan - V(entry), V(release) (what runs once it is carried out), V(restart), V(reasons), V(preflight),
      V(upload) (the release is not C(current) - send it), V(install) (files to install with no restart due),
      V(refused) (why nothing may be done), V(no_op) (nothing past this call), V(current), V(last_good).
    - With O(settings), V(job_budget_s) (how long the play watches the run's job), V(watch_retries) (how many
      watch calls of 10 s that takes) and V(min_tokps_ratio) (the throughput gate of its job).
    - The role's steps past this call, booleans (module_utils/plan/decide.py C(steps)) - V(run_job), V(start_job) (false
      when this call started the job), V(node_view_before), V(node_view_after), V(watch), V(untouched),
      V(install_unit), V(done) (the restart this call started ended proved within it, no watch after it).
  returned: success, or failure when the plan refuses
  type: dict
lock_holder:
  description: Who holds the deploy lock now - V(play) (this run releases it at its end) or V(nobody).
  returned: always
  type: str
install:
  description: What O(install) would change (compared, nothing written).
  returned: when O(install) is given
  type: dict
problems:
  description: What O(owned) refused, one line per variable.
  returned: when a path of O(owned) is refused
  type: list
  elements: str
lock:
  description: What taking the lock did - V(action), V(msg), V(previous_owner), V(attached), V(released).
  returned: when the lock was taken
  type: dict
lock_refused:
  description: V(true) when the lock was not taken (the module then fails).
  returned: failure
  type: bool
job_start:
  description:
    - The start of the plan's restart job in this call (with O(job), a plan that restarts without an upload) -
      what M(dflash.trainer.trainer_restart) C(operation=start) returns (V(started), V(finished), V(lock_holder),
      V(result) when it ended within its C(wait_s), V(not_started) with the reason when it refused), and
      V(failed).
    - When the job ended within this call, what the role shows of its end (the action's) - V(ok), V(words) (the
      proof), V(fail_msg).
  returned: when the call started the plan's job
  type: dict
report:
  description: What the run shows right after this call - what the last restart job did (the one this call waited for,
    V(attached) of RV(lock), else the one on record) and, for a deploy whose plan changes nothing, RV(untouched_words).
  returned: success
  type: list
  elements: str
has_report:
  description: Whether RV(report) has a line to show.
  returned: success
  type: bool
untouched_words:
  description: The report of a plan that leaves the trainer running (no restart) - its unit, release, main PID and uptime;
    V(null) when the plan restarts.
  returned: success
  type: str
current_release:
  description: The release C(current) points at; every field M(dflash.trainer.trainer_status) returns is returned too.
  returned: when O(trainer_root) is given
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils.plan.first_read import (
    compare_install,
    install_here,
    ownership_problems,
    read_report,
    refusal_message,
    take_lock,
    untouched_words,
)
from ansible_collections.dflash.trainer.plugins.module_utils.target.config_id import unit_path_of
from ansible_collections.dflash.trainer.plugins.module_utils.target.install import ENV_CONTENT_OPTION, INSTALL_SUBOPTIONS
from ansible_collections.dflash.trainer.plugins.module_utils.job.lock import release
from ansible_collections.dflash.trainer.plugins.module_utils.plan.decide import (
    ENTRIES,
    job_wait_s,
    lock_holder,
    make_plan,
    restart_done,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.prune import order_newest_first
from ansible_collections.dflash.trainer.plugins.module_utils.release.root import list_releases
from ansible_collections.dflash.trainer.plugins.module_utils.target.command import ModuleRunner
from ansible_collections.dflash.trainer.plugins.module_utils.target.secrets import mask, read_secrets
from ansible_collections.dflash.trainer.plugins.module_utils.plan.status_read import READ_OPTIONS, read_status
from ansible_collections.dflash.trainer.plugins.module_utils.plan.target_checks import message, target_problems


def start_job(module, plan, p, run):
    """Start the plan's restart job in this call -> RV(job_start). The job's code (a third of the payload's
    Python) is imported only here: the target compiles it on every call (the payload is a zip, no bytecode
    cache), and most first reads start no job."""
    from ansible_collections.dflash.trainer.plugins.module_utils.job.start import start_planned  # pylint: disable=import-outside-toplevel

    return start_planned(module, plan, p["job"], p["trainer_root"], p, run)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            READ_OPTIONS, group_barrier=dict(type="dict"),  # group_barrier: the action's own (plugin_utils/_group.py)
            intent=dict(type="dict", required=True, options=dict(
                entry=dict(type="str", choices=list(ENTRIES), required=True),
                release=dict(type="str"),
                force=dict(type="bool", default=False),
                rollback_release=dict(type="str"),
                hold=dict(type="bool", default=False),
                disable=dict(type="bool", default=False),
            )),
            owned=dict(type="list", elements="dict", default=[]),
            settings=dict(type="dict", options=dict(
                stop_timeout_s=dict(type="float"),
                drain_timeout_s=dict(type="float"),
                ready_timeout_s=dict(type="float"),
                measure_s=dict(type="float"),
                min_tokps_ratio=dict(type="float"),
                watch_s=dict(type="float"),
                gpu_host_view=dict(type="bool"),
                check_mode=dict(type="bool"),
            )),
            install=dict(type="dict", options=INSTALL_SUBOPTIONS),
            env_content=ENV_CONTENT_OPTION,
            checks=dict(type="dict"),
            job=dict(type="dict"),
            environment_json=dict(type="str", default="{}", no_log=True),
            node_view_first=dict(type="bool", default=False),
            lock=dict(type="dict", options=dict(
                path=dict(type="path", required=True),
                token=dict(type="str", required=True, no_log=False),
                owner=dict(type="str", default="unknown"),
                stale_s=dict(type="int", default=3600),
                lease_s=dict(type="int"),
                wait_s=dict(type="float", default=0),
                job_wait_s=dict(type="float"),
            )),
        ),
        supports_check_mode=True,
    )
    p = module.params
    refused = ownership_problems(p["owned"])
    if refused:
        module.fail_json(msg=refusal_message(refused), problems=refused, lock_refused=True, lock_holder="nobody")
    if p["lock"] and p["lock"]["job_wait_s"] is None:
        p["lock"]["job_wait_s"] = job_wait_s(p["intent"], p["settings"])
    taken = take_lock(module, p["lock"], p["job_state_path"]) if p["lock"] and not module.check_mode else None
    systemctl = module.get_bin_path("systemctl", required=True)
    run = ModuleRunner(module)  # each command bounded: 30 s
    result = read_status(module, p, run, systemctl)
    for warning in result.get("gpu_warnings") or []:
        module.warn(warning)
    if p["trainer_root"]:
        result["releases"] = order_newest_first(list_releases(p["trainer_root"]))
    if p["install"]:
        result["install"], diff = compare_install(module, run, systemctl)
        if diff:  # diff mode: the files the deploy installs, the environment masked
            result["diff"] = diff
    plan = result["plan"] = make_plan(p["intent"], result, result.get("install"), settings=p["settings"])
    # a stop starts no CUDA process: missing device nodes refuse only what starts the trainer
    read = dict(result, device_problems=None) if p["intent"]["entry"] == "stop" else result
    problems = [str(x) for x in target_problems(p["checks"], result.get("gpus") or [], read,
                                                unit_path_of(p["unit"]))] if p["checks"] else []
    if problems:  # before any change, the lock freed: the read refutes an input
        plan["refused"] = message(problems)
        result["problems"] = problems
    result["lock_holder"] = "play" if taken is not None else "nobody"
    if taken is not None:
        result["lock"] = taken
        if plan["install_unit"] and not (problems or p["intent"]["hold"]):
            # a deploy that restarts nothing but changes the unit's enablement: installed here, the trainer
            # untouched - nothing is left past this call
            result["install"] = install_here(module, run, systemctl, p["lock"])
            result["changed"] = bool(result["install"].get("changed"))
            plan.update(install_unit=False, end=True)
        if problems or plan["end"] or lock_holder(plan, hold=p["intent"]["hold"]) == "nobody":  # nothing past this call: freed here
            freed = release(p["lock"]["path"], p["lock"]["token"])
            taken["released"] = bool(freed.ok)
            result["lock_holder"] = "nobody" if freed.ok else "play"
        elif p["job"] and plan["restart"] and not (plan["upload"] or p["intent"]["hold"] or p["node_view_first"]):
            # a restart of what is on the target: its job starts here (one remote call); the lock is the job's
            result["job_start"] = start_job(module, plan, p, run)
            result["lock_holder"] = result["job_start"].get("lock_holder", "unknown")
            result["changed"] = bool(result["job_start"].get("started"))
            plan["start_job"] = False  # started here (or refused here: the role reports it)
            plan["done"] = restart_done(result, 1 if plan["watch"] else 0)
            plan["end"] = plan["done"]
    result.update(report=read_report(p["intent"]["entry"], plan, result, p["unit"]),
                  untouched_words=untouched_words(p["unit"], plan, result))
    result["has_report"] = bool(result["report"])
    result = mask(result, read_secrets(p["env_file"]))
    if plan["refused"]:
        module.fail_json(msg=plan["refused"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
