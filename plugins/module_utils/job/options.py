# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""trainer_restart's options (its DOCUMENTATION documents them; tests/unit/test_argument_specs.py holds the two
equal): the job's settings, kept beside the job so that the module stays a thin dispatcher."""

from ansible_collections.dflash.trainer.plugins.module_utils.target.install import ENV_CONTENT_OPTION, INSTALL_SUBOPTIONS
from ansible_collections.dflash.trainer.plugins.module_utils.proof.preflight import PREFLIGHT_SUBOPTIONS
from ansible_collections.dflash.trainer.plugins.module_utils.proof.readiness import PROOF_SETTINGS, proof_options

# The lease the job renews (trainer_lock_lease_s's default): a job that dies leaves the lock to expire after it.
DEFAULT_LOCK_LEASE_S = 15


def proof_option(name):
    """The top-level option of proof setting ``name``: its type and default are the judge's
    (proof.readiness.Expectations, the one table)."""
    _variable, kind, default = PROOF_SETTINGS[name]
    if kind == "tuple":
        return dict(type="list", elements="str", default=list(default))
    return dict(type=kind, default=default)


def with_proof(params):
    """``params`` with O(proof)'s settings (checked and typed against the judge's table) over the top-level
    options of the same names -> params; ValueError naming the setting."""
    params.update(proof_options(params.get("proof")))
    return params


RESTART_OPTIONS = dict(
    operation=dict(type="str", choices=["start", "run", "wait", "stop", "preflight", "check", "good"], default="start"),
    job_id=dict(type="str"),
    begun=dict(type="dict"),
    kind=dict(type="str", choices=["restart", "start", "stop"], default="restart"),
    state_path=dict(type="path", default="/var/lib/dflash-trainer/restart.json"),
    wait_s=dict(type="float"),
    seen=dict(type="int"),
    watch_calls=dict(type="int"),
    group_hold=dict(type="dict"),
    group_barrier=dict(type="dict"),
    job=dict(type="dict"),
    preflight=dict(type="dict", options=PREFLIGHT_SUBOPTIONS),
    environment_json=dict(type="str", default="{}", no_log=True),
    install=dict(type="dict", options=INSTALL_SUBOPTIONS),
    env_content=ENV_CONTENT_OPTION,
    release=dict(type="str"),
    unit=dict(type="str"),
    root=dict(type="path"),
    log_path=dict(type="path"),
    progress_path=dict(type="path", default=""),
    purge_dir=dict(type="str", default=""),
    gpus=dict(type="list", elements="int"),
    drain_max_mib=dict(type="int", default=1024),
    gpu_foreign_mib=dict(type="dict", default={}),
    drain_timeout_s=dict(type="float", default=60),
    stop_timeout_s=dict(type="float", default=30),
    min_mib=proof_option("min_mib"),
    ready_regex=proof_option("ready_regex"),
    step_regex=proof_option("step_regex"),
    tokps_regex=proof_option("tokps_regex"),
    error_regexes=proof_option("error_regexes"),
    min_steps=proof_option("min_steps"),
    hold_s=proof_option("hold_s"),
    stall_s=proof_option("stall_s"),
    timeout_s=proof_option("timeout_s"),
    interval_s=proof_option("interval_s"),
    tail_lines=proof_option("tail_lines"),
    nvidia_smi=dict(type="str", default="nvidia-smi"),
    rollback=dict(type="bool", default=True),
    mark_good=dict(type="bool", default=True),
    keep_lock=dict(type="bool", default=False),
    restore_config=dict(type="bool", default=False),
    reasons=dict(type="list", elements="str", default=[]),
    owner=dict(type="str", default="unknown"),
    lock_path=dict(type="str", default=""),
    lock_token=dict(type="str", default="", no_log=False),
    lock_lease_s=dict(type="int", default=DEFAULT_LOCK_LEASE_S),
    # the proof's settings as one dict (the role passes them so: dflash.trainer.proof_options), over the
    # top-level options of the same names; its keys are PROOF_SETTINGS'
    proof=dict(type="dict", default={}),
    measure_s=dict(type="float"),
    measure_regexes=dict(type="dict", default={}),
    min_tokps_ratio=dict(type="float", default=0),
    source=dict(type="str", default=""),
    env_file=dict(type="path"),
    unit_path=dict(type="path"),
    launcher_path=dict(type="path"),
    disable=dict(type="bool", default=False),
    enable=dict(type="bool", default=False),
)
