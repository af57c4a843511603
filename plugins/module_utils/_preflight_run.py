# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Running the pre-flight of a release on the target (the decisions are ``_preflight``'s).

``run_preflight`` checks the command, runs the user's ``trainer_preflight_command`` in the
release (bounded, its output's tail kept, secrets masked) and reads the GPUs and the unit's
processes for ``gpu_problem`` - for ``trainer_preflight`` and for ``trainer_restart``, which
pre-flights in the same remote call as it starts the job. ``PREFLIGHT_OPTIONS`` is their shared
argument spec.
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.dflash.trainer.plugins.module_utils._node_gpu import mib_by_index
from ansible_collections.dflash.trainer.plugins.module_utils._nvidia_smi import NvidiaSmiError, locate, read_gpus
from ansible_collections.dflash.trainer.plugins.module_utils._preflight import (
    SYSTEMD_PATH,
    command_problem,
    gpu_problem,
    output_tail,
)
from ansible_collections.dflash.trainer.plugins.module_utils._run import CommandTimeout, Runner, run_bounded
from ansible_collections.dflash.trainer.plugins.module_utils._secrets import mask, secret_values
from ansible_collections.dflash.trainer.plugins.module_utils._systemd import int_prop, is_running, parse_show

# the options of trainer_preflight (but its lock); trainer_restart's `preflight` takes them as
# suboptions (PREFLIGHT_SUBOPTIONS) but the secret, its top-level environment_json (no_log: see
# _install.INSTALL_OPTIONS for why a secret is never a suboption)
PREFLIGHT_OPTIONS = dict(
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
)
PREFLIGHT_SUBOPTIONS = dict((k, v) for k, v in PREFLIGHT_OPTIONS.items() if k != "environment_json")


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


class Refused(Exception):
    """The pre-flight refused the release: ``result`` is the failure (masked)."""

    def __init__(self, result):
        super().__init__(result.get("msg"))
        self.result = result


def run_preflight(p, get_bin_path):
    """Run the checks of ``p`` (PREFLIGHT_OPTIONS' values) -> the result (secrets masked); raises
    Refused. ``get_bin_path(name)``: the path of a program on the target, or None."""
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
        nvidia_smi = locate(p["nvidia_smi"], get_bin_path)
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
