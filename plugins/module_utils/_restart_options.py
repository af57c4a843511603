# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""trainer_restart's options (its DOCUMENTATION documents them; tests/unit/test_argument_specs.py holds the two
equal): the job's settings, kept beside the job so that the module stays a thin dispatcher."""

from ansible_collections.dflash.trainer.plugins.module_utils._install import ENV_CONTENT_OPTION, INSTALL_SUBOPTIONS
from ansible_collections.dflash.trainer.plugins.module_utils._preflight_run import PREFLIGHT_SUBOPTIONS
from ansible_collections.dflash.trainer.plugins.module_utils._trainer_log import (
    DEFAULT_READY_REGEX,
    DEFAULT_STEP_REGEX,
    DEFAULT_TOKPS_REGEX,
)

RESTART_OPTIONS = dict(
    state=dict(type="str", choices=["start", "run", "wait", "stop", "preflight"], default="start"),
    job_id=dict(type="str", required=True),
    state_path=dict(type="path", default="/var/lib/dflash-trainer/restart.json"),
    wait_s=dict(type="float"),
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
    min_mib=dict(type="int", default=1024),
    ready_regex=dict(type="str", default=DEFAULT_READY_REGEX),
    step_regex=dict(type="str", default=DEFAULT_STEP_REGEX),
    tokps_regex=dict(type="str", default=DEFAULT_TOKPS_REGEX),
    error_regexes=dict(type="list", elements="str", default=[]),
    min_steps=dict(type="int", default=2),
    hold_s=dict(type="float", default=10),
    stall_s=dict(type="float", default=5),
    timeout_s=dict(type="float", default=300),
    interval_s=dict(type="float", default=0.5),
    tail_lines=dict(type="int", default=20),
    nvidia_smi=dict(type="str", default="nvidia-smi"),
    rollback=dict(type="bool", default=True),
    mark_good=dict(type="bool", default=True),
    keep_lock=dict(type="bool", default=False),
    reasons=dict(type="list", elements="str", default=[]),
    owner=dict(type="str", default="unknown"),
    lock_path=dict(type="str", default=""),
    lock_token=dict(type="str", default="", no_log=False),
    lock_lease_s=dict(type="int", default=30),
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
