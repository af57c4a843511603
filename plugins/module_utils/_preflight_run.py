# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Running the pre-flight of a release on the target (the decisions are ``_preflight``'s).

``run_preflight`` judges the new environment file, then runs in the unit's own environment (a
transient unit with the new unit's user, environment files - the new one staged root-only - and
the release as working directory: ``UnitShell``) a probe of that environment, the command
resolved on its real PATH, the launcher's and the command's interpreters started harmlessly and
the user's ``trainer_preflight_command`` (bounded, its output's tail kept, secrets masked); then it
reads the GPUs and the unit's processes for ``gpu_problem`` - for ``trainer_preflight`` and for
``trainer_restart``, which pre-flights in the same remote call as it starts the job.
``PREFLIGHT_OPTIONS`` is their shared argument spec.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time

from ansible_collections.dflash.trainer.plugins.module_utils._node_gpu import mib_by_index
from ansible_collections.dflash.trainer.plugins.module_utils._nvidia_smi import NvidiaSmiError, locate, read_gpus
from ansible_collections.dflash.trainer.plugins.module_utils._ownership import ENV_MARK
from ansible_collections.dflash.trainer.plugins.module_utils._preflight import (
    DEFAULT_PROPERTIES,
    SYSTEMD_PATH,
    command_problem,
    environment_problem,
    gpu_problem,
    interpreter_check,
    launcher_check,
    output_tail,
    preflight_properties,
    reason_line,
    transient_argv,
    unit_exec_properties,
)
from ansible_collections.dflash.trainer.plugins.module_utils._run import CommandTimeout, Runner, run_bounded
from ansible_collections.dflash.trainer.plugins.module_utils._secrets import mask, parse_env_file, secret_values
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


# The environment probe: the container's own python, isolated (-I: no PYTHON* variable, no user
# site; -S: no site-packages), so a broken PYTHONHOME in the new environment cannot break the probe
PYTHON = "/usr/bin/python3"
PROBE = ("import json, os, sys; sys.stdout.write(json.dumps(dict(env=dict(os.environ), cwd=os.getcwd(), "
         "uid=os.getuid())))")
PROBE_TIMEOUT_S = 30


def env_file_text(env):
    """``env`` as the environment file the role writes (its systemd_env_file filter's format, with the
    collection's mark line) - for a pre-flight given only the mapping."""
    lines = [ENV_MARK]
    for key in sorted(env):
        lines.append('%s="%s"' % (key, re.sub(r'(["\\`$])', r"\\\1", env[key])))
    return "\n".join(lines) + "\n"


class UnitShell(object):
    """Runs commands as the trainer's unit runs its command: in a transient unit (``systemd-run``) with
    the unit's user, environment files and the release as working directory - the NEW environment
    file staged root-only (a private temporary directory, the file 0600, removed by ``close``)."""

    def __init__(self, systemd_run, systemctl, props, env_text, env_path, release_dir):
        self.systemd_run, self.systemctl = systemd_run, systemctl
        self.dir = tempfile.mkdtemp(prefix="dflash-preflight-")  # mode 0700
        staged = os.path.join(self.dir, "trainer.env")
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(env_text)
        self.props = preflight_properties(props, env_path, staged, release_dir)
        self.where = "a transient unit with the unit's user, environment files and the release as working directory"

    def run(self, argv, timeout_s, setenv=()):
        name = "dflash-preflight-%s.service" % os.urandom(4).hex()
        try:
            return run_bounded(transient_argv(self.systemd_run, name, self.props, argv, timeout_s, setenv),
                               timeout_s + 10)
        except CommandTimeout:
            run_bounded([self.systemctl, "stop", name], 30)
            raise

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class DirectShell(object):
    """Where systemd does not run (tests on a host without it): the command in the release with the
    environment file's variables over the ones systemd gives a root unit."""

    def __init__(self, env_text, release_dir):
        self.env = dict(PATH=SYSTEMD_PATH, LANG="C.UTF-8", HOME="/root", USER="root", LOGNAME="root", SHELL="/bin/sh")
        self.env.update(parse_env_file(env_text))
        self.cwd = release_dir
        self.where = "the release directory with the environment file's variables (systemd is not running here)"

    def run(self, argv, timeout_s, setenv=()):
        env = dict(self.env)
        env.update(w.split("=", 1) for w in setenv)
        return run_bounded([str(a) for a in argv], timeout_s, env=env, cwd=self.cwd)

    def close(self):
        pass


def unit_shell(get_bin_path, props, env_text, env_path, release_dir):
    """The UnitShell of the target (a DirectShell where systemd is not running)."""
    systemd_run = get_bin_path("systemd-run")
    systemctl = get_bin_path("systemctl")
    if systemd_run and systemctl and os.path.isdir("/run/systemd/system"):
        return UnitShell(systemd_run, systemctl, props, env_text, env_path, release_dir)
    return DirectShell(env_text, release_dir)


def _read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except (IOError, OSError, TypeError):
        return None


def run_preflight(p, get_bin_path, make_shell=unit_shell):
    """Run the checks of ``p`` (PREFLIGHT_OPTIONS' values) -> the result (secrets masked); raises
    Refused. ``get_bin_path(name)``: the path of a program on the target, or None. ``p["unit_files"]``: what the
    trainer's unit will be - ``env_content`` (the new environment file, without its mark line),
    ``unit_content`` (the new unit), ``env_path``, ``unit_path`` (the files in place when a content is
    not given); without them, the environment file ``p["environment_json"]`` gives and the role's
    unit settings.

    Every check that runs something runs it in the unit's environment (``make_shell``: a transient
    unit with the new unit's user, environment files - the new one staged root-only - and the
    release as working directory): the environment probe (what the unit's process really gets:
    HOME, PATH, the locale ...), the command resolved on that PATH, the command's interpreter
    started harmlessly (``interpreter_check``) and the user's pre-flight command."""
    try:
        environment = json.loads(p["environment_json"] or "{}")
    except ValueError:
        raise Refused(dict(msg="pre-flight: environment_json is not a JSON object")) from None
    env = dict((str(k), "" if v is None else str(v)) for k, v in (environment or {}).items())
    unit = p.get("unit_files") or {}
    if unit.get("env_content") is not None:
        env_text = ENV_MARK + "\n" + unit["env_content"]
    else:
        env_text = _read(unit.get("env_path")) if unit.get("env_path") else None  # the one the unit will read
        env_text = env_text if env_text is not None else env_file_text(env)
    file_env = parse_env_file(env_text)
    # trainer_env values are secrets: a pre-flight that prints its token shows *** instead
    secrets = sorted(set(secret_values(env)) | set(secret_values(file_env)), key=lambda v: (-len(v), v))

    def fail(msg, **kw):
        raise Refused(mask(dict(msg="pre-flight refused the release (the running trainer is untouched): " + msg,
                                **kw), secrets))

    checks = []
    release_dir = p["release_dir"]
    if not os.path.isdir(release_dir):
        raise Refused(dict(msg="pre-flight: release directory %s does not exist" % release_dir, checks=checks))
    problem = environment_problem(file_env)
    if problem:
        fail(problem, checks=checks)
    checks.append("environment file: %d variables, no unexpandable directory list" % len(file_env))

    unit_text = unit.get("unit_content") if unit.get("unit_content") is not None else _read(unit.get("unit_path"))
    props = unit_exec_properties(unit_text) if unit_text else list(DEFAULT_PROPERTIES)
    launcher_text = (unit.get("launcher_content") if unit.get("launcher_content") is not None
                     else _read(unit.get("launcher_path")))
    release = os.path.basename(release_dir.rstrip("/"))
    launcher_env = ["DFLASH_RELEASE=%s" % release, "DFLASH_RELEASE_DIR=%s" % release_dir]
    try:
        shell = make_shell(get_bin_path, props, env_text, unit.get("env_path") or "", release_dir)
    except (IOError, OSError) as exc:
        raise Refused(dict(msg="pre-flight: cannot stage the new environment file: %s" % exc)) from None
    try:
        result = _in_unit(p, shell, release_dir, launcher_env, checks, fail, launcher_text)
    finally:
        shell.close()

    if p["gpus"]:
        nvidia_smi = locate(p["nvidia_smi"], get_bin_path)
        if nvidia_smi is not None:
            run = Runner(timeout_s=30)
            try:
                gpus, _warnings = read_gpus(run, nvidia_smi, processes=True)
            except (NvidiaSmiError, CommandTimeout) as exc:
                raise Refused(mask(dict(msg="pre-flight: %s" % exc, checks=checks), secrets)) from None
            running, pids = unit_pids(run, p["unit"])
            problem = gpu_problem(gpus, p["gpus"], p["max_mib"], running, pids,
                                  allowance=mib_by_index(p["gpu_foreign_mib"]))
            if problem:
                fail(problem, checks=checks)
            checks.append("no other holder on GPUs %s" % ", ".join(str(g) for g in p["gpus"]))
    return mask(result, secrets)


def _in_unit(p, shell, release_dir, launcher_env, checks, fail, launcher_text=None):
    """The checks that run in the unit's environment (``shell``) -> the result so far."""
    try:
        rc, out, err = shell.run([PYTHON, "-I", "-S", "-c", PROBE], PROBE_TIMEOUT_S, setenv=launcher_env)
    except CommandTimeout:
        fail("the unit's environment could not start a process within %d s" % PROBE_TIMEOUT_S, checks=checks)
    except OSError as exc:
        fail("the unit's environment cannot start a process: %s" % exc, checks=checks)
    try:
        probe = json.loads(out) if rc == 0 else None
    except ValueError:
        probe = None
    if not isinstance(probe, dict) or not isinstance(probe.get("env"), dict):
        tail = output_tail(out, err)
        fail("the unit's environment cannot start a process (%s exited with status %d): %s"
             % (PYTHON, rc, tail[-1] if tail else "no output"), output=tail, checks=checks)
    unit_env = probe["env"]
    path = unit_env.get("PATH", SYSTEMD_PATH)
    checks.append("unit environment: uid %s in %s, HOME %s, LANG %s (%s)" % (
        probe.get("uid"), probe.get("cwd"), unit_env.get("HOME", "unset"), unit_env.get("LANG", "unset"), shell.where))

    problem = command_problem(p["command"], release_dir, path)
    if problem:
        fail(problem, checks=checks)
    checks.append("command %s can be executed" % p["command"][0])

    started = []
    for argv, words in (launcher_check(launcher_text, path), interpreter_check(p["command"], release_dir, path)):
        if not argv or argv in started:
            continue
        started.append(argv)
        what = "the unit's launcher" if words.startswith("the launcher") else "the trainer's interpreter"
        try:
            rc, out, err = shell.run(argv, PROBE_TIMEOUT_S, setenv=launcher_env)
        except CommandTimeout:
            fail("%s did not start within %d s in the new environment (%s)"
                 % (what, PROBE_TIMEOUT_S, " ".join(argv)), checks=checks)
        except OSError as exc:
            fail("%s cannot start: %s" % (what, exc), checks=checks)
        if rc != 0:
            tail = output_tail(out, err)
            fail("%s does not start in the new environment: %s exited with status %d: %s"
                 % (what, " ".join(argv), rc, reason_line(tail)), output=tail, checks=checks)
        checks.append("in the new environment %s" % words)

    result = dict(changed=False, checks=checks)
    if p["preflight_command"]:
        began = time.monotonic()
        setenv = launcher_env + ["CUDA_VISIBLE_DEVICES=", "DFLASH_PREFLIGHT=1"]
        try:
            rc, out, err = shell.run(p["preflight_command"], p["timeout_s"], setenv=setenv)
        except CommandTimeout as exc:
            fail("trainer_preflight_command did not finish within %g s" % p["timeout_s"],
                 output=output_tail(exc.stdout, exc.stderr), checks=checks)
        except OSError as exc:
            fail("trainer_preflight_command cannot run: %s" % exc, checks=checks)
        tail = output_tail(out, err)
        result["output"] = tail
        if rc != 0:
            last = tail[-1] if tail else "no output"
            fail("trainer_preflight_command exited with status %d: %s" % (rc, last), output=tail, checks=checks)
        checks.append("pre-flight command exited 0 in %.1f s" % (time.monotonic() - began))
    return result
