#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_preflight
short_description: Check a release can start while the old trainer still runs
description:
  - Runs before the stop, so that a release that cannot start is refused while the running
    trainer is untouched.
  - The command (O(command)) must exist in the release directory and be executable, with an
    existing C(#!) interpreter, or be found on C(PATH) (and, for an interpreter such as
    C(python3), its script must be in the release).
  - O(preflight_command), when given, runs in the release directory with the unit's environment
    (O(environment_json), C(DFLASH_RELEASE), C(DFLASH_RELEASE_DIR)) and no GPU (C(CUDA_VISIBLE_DEVICES)
    empty), bounded by O(timeout_s); it must exit 0.
  - No GPU in O(gpus) may hold more than O(max_mib) of memory that is not the running trainer's own
    (any memory at all when the trainer is not running); where nvidia-smi lists no process the
    container can see, memory cannot be attributed and the drain gate after the stop decides.
author:
  - dflash.trainer maintainers (@dflash)
version_added: 0.2.0
extends_documentation_fragment:
  - dflash.trainer.nvidia_smi
  - dflash.trainer.play_lock
options:
  release_dir:
    description: The release directory the trainer would start in.
    type: path
    required: true
  command:
    description: The trainer's command (argv), as in the unit.
    type: list
    elements: str
    required: true
  environment_json:
    description:
      - The unit's environment as one JSON object (values are secrets, never printed). One string
        rather than a dict, so that Ansible's no_log masking hides exactly it, not every short value
        (a value V(1) would otherwise mask every "1" in the output).
    type: str
    default: "{}"
  preflight_command:
    description: A command (argv) that must exit 0 in the release directory, e.g. C([python3, -c, import train]).
    type: list
    elements: str
    default: []
  timeout_s:
    description: Seconds O(preflight_command) may take before it is killed and the pre-flight fails.
    type: float
    default: 60
  unit:
    description: The trainer's unit (to tell its processes from other holders).
    type: str
    required: true
  gpus:
    description: The trainer's GPU indexes; empty skips the GPU check.
    type: list
    elements: int
    default: []
  max_mib:
    description: Memory a GPU may hold (MiB) that is not the trainer's.
    type: int
    default: 1024
  gpu_foreign_mib:
    description: Per GPU index, the MiB other tenants hold (the node's view); allowed on top of O(max_mib).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Pre-flight the new release
  dflash.trainer.trainer_preflight:
    release_dir: /opt/dflash-trainer/releases/dda2287ea665b415
    command: [./run.sh]
    preflight_command: [python3, -c, import train_dflash_pipeline]
    unit: dflash-trainer
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
"""

RETURN = r"""
checks:
  description: What was checked, in words.
  returned: always
  type: list
  elements: str
  sample: ["command ./run.sh is executable", "pre-flight command exited 0 in 1.2 s"]
output:
  description: The last lines of the pre-flight command's output.
  returned: when O(preflight_command) ran
  type: list
  elements: str
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils._lock import PLAY_LOCK_SPEC, play_lease
from ansible_collections.dflash.trainer.plugins.module_utils._nvidia_smi import (
    NvidiaSmiError,
    locate,
    read_gpus,
)
from ansible_collections.dflash.trainer.plugins.module_utils._node_gpu import mib_by_index
from ansible_collections.dflash.trainer.plugins.module_utils._preflight import (
    SYSTEMD_PATH,
    command_problem,
    gpu_problem,
    output_tail,
)
from ansible_collections.dflash.trainer.plugins.module_utils._run import CommandTimeout, Runner, run_bounded
from ansible_collections.dflash.trainer.plugins.module_utils._secrets import mask, secret_values
from ansible_collections.dflash.trainer.plugins.module_utils._systemd import int_prop, is_running, parse_show


def unit_pids(run, unit):
    """(running, pids of the unit's control group) through systemctl show."""
    rc, out, _err = run(["systemctl", "show", unit, "--no-pager", "-p", "ActiveState,SubState,MainPID,ControlGroup"])
    props = parse_show(out) if rc == 0 else {}
    pids = set()
    cgroup = props.get("ControlGroup") or ""
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"):
        try:
            with open(os.path.join(base, cgroup.lstrip("/"), "cgroup.procs")) as f:
                pids.update(int(x) for x in f.read().split())
            break
        except (IOError, OSError, ValueError):
            continue
    main_pid = int_prop(props, "MainPID", 0)
    if main_pid:
        pids.add(main_pid)
    return is_running(props), pids


def main():
    module = AnsibleModule(
        argument_spec=dict(
            release_dir=dict(type="path", required=True),
            command=dict(type="list", elements="str", required=True),
            environment_json=dict(type="str", default="{}", no_log=True),
            preflight_command=dict(type="list", elements="str", default=[]),
            timeout_s=dict(type="float", default=60),
            unit=dict(type="str", required=True),
            gpus=dict(type="list", elements="int", default=[]),
            max_mib=dict(type="int", default=1024),
            gpu_foreign_mib=dict(type="dict", default={}),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            lock=PLAY_LOCK_SPEC,
        ),
        supports_check_mode=True,
    )
    # the play's lease is renewed while the pre-flight runs (it may take longer than the lease)
    # (a lease lost meanwhile is found by the restart job, which then touches nothing)
    # The result is printed after the keeper stopped: it probes the module's output (see play_lease).
    try:
        with play_lease(module.params["lock"]):
            result = preflight(module)
    except Refused as exc:
        module.fail_json(**exc.result)
    module.exit_json(**result)


class Refused(Exception):
    """The pre-flight refused the release: ``result`` is the module's failure (masked)."""

    def __init__(self, result):
        super().__init__(result.get("msg"))
        self.result = result


def preflight(module):
    """Run the checks -> the result (secrets masked); raises Refused."""
    p = module.params
    try:
        environment = json.loads(p["environment_json"] or "{}")
    except ValueError:
        raise Refused(dict(msg="pre-flight: environment_json is not a JSON object")) from None
    env = dict((str(k), "" if v is None else str(v)) for k, v in (environment or {}).items())
    # trainer_env values are secrets: a pre-flight that prints its token shows *** instead
    secrets = secret_values(env)

    def fail(**kw):
        raise Refused(mask(kw, secrets))

    path = env.get("PATH", SYSTEMD_PATH)
    checks = []
    release_dir = p["release_dir"]
    if not os.path.isdir(release_dir):
        fail(msg="pre-flight: release directory %s does not exist" % release_dir, checks=checks)

    problem = command_problem(p["command"], release_dir, path)
    if problem:
        fail(msg="pre-flight refused the release (the running trainer is untouched): " + problem, checks=checks)
    checks.append("command %s can be executed" % p["command"][0])

    result = dict(changed=False, checks=checks)
    if p["preflight_command"]:
        run_env = dict(PATH=path, HOME="/root", LANG="C.UTF-8")
        run_env.update(env)
        run_env.update(DFLASH_RELEASE=os.path.basename(release_dir.rstrip("/")), DFLASH_RELEASE_DIR=release_dir,
                       CUDA_VISIBLE_DEVICES="", DFLASH_PREFLIGHT="1")
        began = time.monotonic()
        try:
            rc, out, err = run_bounded(p["preflight_command"], p["timeout_s"], env=run_env, cwd=release_dir)
        except CommandTimeout as exc:
            fail(msg="pre-flight refused the release (the running trainer is untouched): "
                 "trainer_preflight_command did not finish within %g s" % p["timeout_s"],
                 output=output_tail(exc.stdout, exc.stderr), checks=checks)
        except OSError as exc:
            fail(msg="pre-flight refused the release (the running trainer is untouched): "
                 "trainer_preflight_command cannot run: %s" % exc, checks=checks)
        tail = output_tail(out, err)
        result["output"] = tail
        if rc != 0:
            last = tail[-1] if tail else "no output"
            fail(msg="pre-flight refused the release (the running trainer is untouched): "
                 "trainer_preflight_command exited with status %d: %s" % (rc, last),
                 output=tail, checks=checks)
        checks.append("pre-flight command exited 0 in %.1f s" % (time.monotonic() - began))

    if p["gpus"]:
        nvidia_smi = locate(p["nvidia_smi"], module.get_bin_path)
        if nvidia_smi is not None:
            run = Runner(timeout_s=30)
            try:
                gpus, _warnings = read_gpus(run, nvidia_smi, processes=True)
            except (NvidiaSmiError, CommandTimeout) as exc:
                fail(msg="pre-flight: %s" % exc, checks=checks)
            running, pids = unit_pids(run, p["unit"])
            problem = gpu_problem(gpus, p["gpus"], p["max_mib"], running, pids,
                                  allowance=mib_by_index(p["gpu_foreign_mib"]))
            if problem:
                fail(msg="pre-flight refused the release (the running trainer is untouched): " + problem,
                     checks=checks)
            checks.append("no other holder on GPUs %s" % ", ".join(str(g) for g in p["gpus"]))
    return mask(result, secrets)


if __name__ == "__main__":
    main()
