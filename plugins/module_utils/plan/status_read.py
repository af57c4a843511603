# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The read of the trainer's state that trainer_status (read-only) and trainer_plan (the first read of
a locked entry point) share: the unit, the running release, this start's log, the releases, the
health, the last restart job and the GPUs -> the result's fields (secrets not yet masked)."""

import os
import time

from ansible_collections.dflash.trainer.plugins.module_utils.target.config_id import installed_config, unit_path_of
from ansible_collections.dflash.trainer.plugins.module_utils.job.state import observe_job, read_state
from ansible_collections.dflash.trainer.plugins.module_utils.release.ledger import ledger_path, read_ledger
from ansible_collections.dflash.trainer.plugins.module_utils.target.nvidia_smi import (
    NvidiaSmiError,
    locate,
    node_problems,
    not_found_message,
    read_gpus,
    read_nodes,
)
from ansible_collections.dflash.trainer.plugins.module_utils.plan.status import (
    gpu_fields,
    job_summary,
    log_fields,
    read_log,
    read_log_chunk,
    release_fields,
    release_from_proc,
    status_health,
    stopped_on_purpose,
    unit_fields,
    wants_log,
    watch,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.root import read_release_marks
from ansible_collections.dflash.trainer.plugins.module_utils.target.systemd import int_prop, is_running, parse_show, runtime_s, show_argv
from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import history_rows

# the read's options, as both modules take them
READ_OPTIONS = dict(
    unit=dict(type="str", required=True),
    trainer_root=dict(type="path"),
    log_path=dict(type="path"),
    nvidia_smi=dict(type="str", default="nvidia-smi"),
    job_state_path=dict(type="path"),
    env_file=dict(type="path"),
)


def read_status(module, p, run, systemctl):
    """Read everything ``p`` asks for (the modules' options) -> the result's fields."""
    def show():
        return run.or_fail(show_argv(p["unit"], systemctl=systemctl))

    rc, out, err = show()
    if rc != 0:
        module.fail_json(msg="Unable to read unit %s: %s" % (p["unit"], (err or out).strip()))
    props, watched = parse_show(out), None
    if p.get("watch_s", 0) > 0 and is_running(props):
        props, watched = watch(show, props, p["watch_s"])
    running, main_pid, invocation = is_running(props), int_prop(props, "MainPID", 0), props.get("InvocationID", "")
    seconds = runtime_s(props, now_monotonic_s=time.monotonic() if running else None)
    result = unit_fields(props, seconds, release_from_proc(main_pid) if running and main_pid > 0 else None)
    if p["log_path"]:
        follower = where = None
        if invocation and os.path.exists(p["log_path"]):
            try:
                follower, where = read_log(p["log_path"], invocation)
            except (IOError, OSError) as e:
                module.warn("Unable to read log %s: %s" % (p["log_path"], e))
        result.update(log_fields(follower, where, running, result["running_release"]))
    if wants_log(p):
        result["log"] = read_log_chunk(p, invocation)
    if watched is not None:
        result["watched_s"] = watched
    if p["trainer_root"]:
        result.update(release_fields(*read_release_marks(p["trainer_root"]), running_release=result["running_release"]))
        ledger = read_ledger(ledger_path(p["trainer_root"]))
        # a deliberate stop on record (trainer_restart operation=stop) that still holds: not running is no failure
        stopped = stopped_on_purpose(read_state(p["job_state_path"]), props) if p["job_state_path"] else None
        result["health"] = status_health(ledger, result, seconds, time.time(), stopped=stopped)
        # (the environment file is part of the configuration: without O(env_file) it is unknown)
        result["config"] = installed_config(p["trainer_root"], result.get("fragment_path") or unit_path_of(p["unit"]),
                                            p["env_file"])[0] if p["env_file"] else None
        if p.get("history", 0) > 0:
            result["history"] = history_rows(ledger, result.get("running_release"), result.get("current_release"),
                                             p["history"], running_config=result["config"])
    if p["job_state_path"]:
        result["last_job"] = job_summary(*observe_job(p["job_state_path"]))
    nvidia_smi = locate(p["nvidia_smi"], module.get_bin_path)
    if nvidia_smi is None:
        result["gpu_error"] = not_found_message(p["nvidia_smi"])
    else:
        try:
            gpus, warnings = read_gpus(run, nvidia_smi, processes=False)
            result.update(gpu_fields(gpus))
            # nvidia-smi answers without /dev/nvidia-uvm; CUDA does not: the nodes are judged too
            problems, node_warnings = node_problems(read_nodes())
            if problems:
                result["device_problems"] = problems
            warnings = warnings + node_warnings
            if warnings:  # a status that only warns (infoROM corrupted): the figures are used
                result["gpu_warnings"] = warnings
        except NvidiaSmiError as e:
            result["gpu_error"] = str(e)
            if e.node_fault:  # the node's, never the trainer's: refused before anything changes
                result["gpu_node_fault"] = True
    return result
