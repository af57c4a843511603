# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pre-flight of a release while the old trainer still runs: the decisions (pure, unit-tested) and
their run on the target.

A release whose command cannot run (no exec bit, a missing interpreter, a missing module at
import) used to stop a healthy trainer first and be found out after the start. These checks run
before the stop: ``command_problem`` (the command exists and can be executed, or is run through
an interpreter that exists), the user's own pre-flight command (run by the module), and
``gpu_problem`` (no trainer GPU holds memory that is not the running trainer's own: such a holder
would only fail the drain gate after the stop, stranding a stopped trainer).

``run_preflight`` judges the new environment file, then runs in the unit's own environment (a
transient unit with the new unit's user, environment files - the new one staged root-only - and
the release as working directory: ``UnitShell``) a probe of that environment, the command
resolved on its real PATH, the launcher's and the command's interpreters started harmlessly and
the user's ``trainer_preflight_command`` (bounded, its output's tail kept, secrets masked); then it
reads the GPUs and the unit's processes for ``gpu_problem`` - for ``trainer_restart``, which
pre-flights in the same remote call as it starts the job (or alone: operation=preflight).
``PREFLIGHT_OPTIONS`` is its argument spec.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
import time

from ansible_collections.dflash.trainer.plugins.module_utils.target.node_gpu import mib_by_index
from ansible_collections.dflash.trainer.plugins.module_utils.target.nvidia_smi import NvidiaSmiError, locate, read_gpus
from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import ENV_MARK
from ansible_collections.dflash.trainer.plugins.module_utils.target.command import CommandTimeout, Runner, run_bounded
from ansible_collections.dflash.trainer.plugins.module_utils.target.secrets import mask, parse_env_file, secret_values
from ansible_collections.dflash.trainer.plugins.module_utils.target.systemd import SYSTEMD_PATH, int_prop, is_running, parse_show

# interpreters whose first non-option argument is a file the release must hold
INTERPRETERS = ("python", "python3", "bash", "sh", "dash", "perl", "ruby", "node")


def which(name, path):
    """The first executable regular file called ``name`` on ``path`` (a PATH string), or None."""
    for d in (path or "").split(":"):
        if not d:
            continue
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _mode(path):
    try:
        return "%04o" % stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return "?"


def shebang(path):
    """The interpreter argv of a script's ``#!`` line, or None."""
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    return shebang_words(first)


def shebang_words(first):
    """The interpreter argv of a ``#!`` line (bytes), or None."""
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    return words or None


def command_problem(argv, release_dir, path=SYSTEMD_PATH, release=None):
    """Why ``argv`` cannot start in ``release_dir`` (words), or None.

    Follows what execve would do: a word with a '/' is a file (relative to the release
    directory), which must be a regular, executable file whose ``#!`` interpreter exists; a bare
    word is looked up on PATH. An interpreter (python3, bash, ...) given a relative script
    needs that script in the release.
    """
    where = "release %s" % (release or os.path.basename(release_dir.rstrip("/")))
    if not argv:
        return "trainer_command is empty"
    prog = str(argv[0])
    if "/" in prog:
        full = prog if prog.startswith("/") else os.path.join(release_dir, prog)
        if not os.path.exists(full):
            return "trainer_command[0] %s does not exist in %s" % (prog, where)
        if not os.path.isfile(full):
            return "trainer_command[0] %s in %s is not a regular file" % (prog, where)
        if not os.access(full, os.X_OK):
            return ("trainer_command[0] %s in %s is not executable (mode %s): set its exec bit in the source, "
                    "or run it through its interpreter, e.g. ['bash', '%s']" % (prog, where, _mode(full), prog))
        interp = shebang(full)
        if interp:
            exe = interp[0]
            if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
                return "trainer_command[0] %s in %s names the interpreter %s in its #! line, which does not exist" % (
                    prog, where, exe)
            if os.path.basename(exe) == "env" and len(interp) > 1 and not interp[1].startswith("-"):
                if which(interp[1], path) is None:
                    return "trainer_command[0] %s in %s runs %s (#!%s), which is not on PATH (%s)" % (
                        prog, where, interp[1], " ".join(interp), path)
        return None
    found = which(prog, path)
    if found is None:
        return "trainer_command[0] %s is not on PATH (%s)" % (prog, path)
    if os.path.basename(prog).rstrip("0123456789.") in INTERPRETERS:
        script = None
        for word in (str(a) for a in argv[1:]):
            if word in ("-c", "-m") or (word.startswith("-") and not word.startswith("--") and "c" in word):
                break  # code or a module follows, not a file
            if word.startswith("-"):
                continue
            script = word
            break
        if script and not script.startswith("/") and not os.path.exists(os.path.join(release_dir, script)):
            return "trainer_command runs %s %s, which does not exist in %s" % (prog, script, where)
    return None


def gpu_problem(gpus, indexes, max_mib, running, trainer_pids, visible_pid=None, allowance=None):
    """Why a trainer GPU is held by someone else (words), or None.

    ``gpus``: read_gpus() output (index, memory_used_mib, processes with pid). The trainer not
    running: any trainer GPU above ``max_mib`` is someone else's. Running: a listed holder whose
    pid is visible here and not the trainer's is someone else's; when nvidia-smi lists no
    visible PIDs (a container: the driver reports host PIDs) memory cannot be attributed, and the
    drain gate after the stop stays the judge. ``allowance``: {index: MiB} other tenants hold
    (the node's view): allowed on top of ``max_mib``, as the drain gate allows it.
    """
    allowance = allowance or {}
    visible_pid = visible_pid or (lambda pid: os.path.exists("/proc/%d" % pid))
    by_index = dict((g.get("index"), g) for g in gpus)
    held = []
    strangers = []
    for i in indexes:
        g = by_index.get(i)
        if g is None:
            continue
        used = g.get("memory_used_mib")
        if used is None or used <= max_mib + allowance.get(i, 0):
            continue
        held.append((i, used))
        for proc in g.get("processes") or []:
            pid = proc.get("pid")
            if isinstance(pid, int) and visible_pid(pid) and pid not in trainer_pids:
                strangers.append("pid %d %s (%s MiB on GPU %d)" % (
                    pid, proc.get("process_name") or "?", proc.get("used_memory_mib", "?"), i))
    if not held:
        return None
    gpus_words = ", ".join("GPU %d %d MiB" % h for h in held)
    if not running:
        who = "; holders: " + ", ".join(strangers) if strangers else ""
        return ("%s held while the trainer is stopped (above trainer_drain_max_mib %d): the drain gate "
                "would fail after the stop%s" % (gpus_words, max_mib, who))
    if strangers:
        return ("trainer GPUs hold memory that is not the running trainer's: %s; the drain gate would fail "
                "after the stop" % ", ".join(strangers))
    return None


def reason_line(tail):
    """The line of an output's tail that says why: the last one naming an error (``Fatal Python error:
    ...``, ``ModuleNotFoundError: ...``, ``bash: line 3: ...: No such file``), else the last line."""
    for line in reversed(tail or []):
        if re.search(r"(Error|error|Exception)\b|No such file|not found|[Pp]ermission denied", line):
            return line.strip()
    return tail[-1].strip() if tail else "no output"


def output_tail(stdout, stderr, lines=20):
    text = (stdout or "") + (("\n" + stderr) if stderr else "")
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return tail


# -- the unit's environment -------------------------------------------------------------------------
# variables that hold a list of directories: systemd passes an environment file's values literally
# (no $VAR, no ~), so "/opt/conda/bin:$PATH" gives a PATH with a directory called "$PATH" in it
PATH_LISTS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "LIBRARY_PATH", "CPATH", "MANPATH")
# the [Service] settings that make the process's user, environment and place (systemd.exec(5)): a
# pre-flight in a transient unit with the same ones runs in the environment the trainer gets
EXEC_PROPERTIES = ("User", "Group", "SupplementaryGroups", "WorkingDirectory", "Environment", "EnvironmentFile",
                   "UnsetEnvironment", "PassEnvironment", "UMask", "RootDirectory")
# what the role's unit has when no unit text is given (roles/trainer/templates/trainer.service.j2)
DEFAULT_PROPERTIES = (("User", "root"), ("EnvironmentFile", "-/etc/default/locale"),
                      ("EnvironmentFile", "-/etc/locale.conf"))


def environment_problem(env):
    """Why the environment ``env`` (the environment file's mapping) breaks what it names (words that
    never show a value: they are secrets), or None: a list of directories with ``$`` or ``~`` in it
    (systemd expands neither) or with a relative entry."""
    for key in PATH_LISTS:
        value = env.get(key)
        if value is None:
            continue
        entries = str(value).split(":")
        if any("$" in e for e in entries):
            return ("trainer_env %s holds a '$': systemd does not expand variables in an environment file, so it "
                    "would stay literal (write the whole list, e.g. PATH: /opt/conda/bin:%s)" % (key, SYSTEMD_PATH))
        if any(e.startswith("~") for e in entries):
            return "trainer_env %s holds a '~': systemd does not expand it (write the directory, e.g. /root/...)" % key
        if key == "PATH" and any(e and not e.startswith("/") for e in entries):
            return "trainer_env PATH holds a relative directory: write absolute directories only"
        if key == "PATH" and not any(e for e in entries):
            return "trainer_env PATH is empty: the trainer could find no program"
    return None


def unit_exec_properties(unit_text):
    """[(key, value)] of the ``[Service]`` settings of ``unit_text`` in EXEC_PROPERTIES, in order
    (comments and other sections skipped)."""
    props = []
    section = None
    for raw in (unit_text or "").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section != "Service" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        if key.strip() in EXEC_PROPERTIES:
            props.append((key.strip(), value.strip()))
    return props


def preflight_properties(props, env_path, staged_env, release_dir):
    """The transient unit's properties: the unit's own ``props`` with the trainer's environment file
    ``env_path`` replaced by the staged new one and the working directory the release's (where the
    launcher runs the command) -> [(key, value)]."""
    out, replaced = [], False
    for key, value in props:
        if key == "WorkingDirectory":
            continue
        if key == "EnvironmentFile" and value.lstrip("-") == env_path:
            out.append((key, staged_env))
            replaced = True
            continue
        out.append((key, value))
    if not replaced:
        out.append(("EnvironmentFile", staged_env))
    out.append(("WorkingDirectory", release_dir))
    return out


def transient_argv(systemd_run, name, props, argv, timeout_s, setenv=()):
    """``systemd-run`` running ``argv`` in a transient service ``name`` with ``props``, waiting for it,
    its output on our pipes, its exit status ours; ``setenv``: NAME=value words set for the command
    itself (through env(1), so they win over the environment files, as the launcher's do)."""
    cmd = [systemd_run, "--wait", "--pipe", "--collect", "--quiet", "--service-type=exec", "--unit", name,
           "-p", "RuntimeMaxSec=%d" % max(1, int(timeout_s + 0.999))]
    for key, value in props:
        cmd += ["-p", "%s=%s" % (key, value)]
    cmd.append("--")
    if setenv:
        cmd += ["/usr/bin/env"] + list(setenv)
    return cmd + [str(a) for a in argv]


def interpreter_of(argv, release_dir, path):
    """The program the trainer's command starts first and its kind -> (program, kind) with kind
    "python", "shell" or None (not one we know how to start harmlessly), or (None, None)."""
    if not argv:
        return None, None
    prog = str(argv[0])
    if "/" in prog:
        full = prog if prog.startswith("/") else os.path.join(release_dir, prog)
        interp = shebang(full)
        if not interp:
            return None, None
        exe = interp[0]
        if os.path.basename(exe) == "env" and len(interp) > 1 and not interp[1].startswith("-"):
            exe = which(interp[1], path)
    else:
        exe = which(prog, path)
    if not exe:
        return None, None
    base = os.path.basename(exe).rstrip("0123456789.")
    if base == "python":
        return exe, "python"
    if base in ("bash", "sh", "dash"):
        return exe, "shell"
    return exe, None


def interpreter_check(argv, release_dir, path):
    """The harmless start of the trainer's interpreter in the unit's environment -> (argv, words) or
    (None, None): python - ``-c pass`` (it starts, finds its standard library and site-packages, and
    runs nothing of the release); a shell with its script - ``-n`` (reads it, runs nothing)."""
    exe, kind = interpreter_of(argv, release_dir, path)
    if kind == "python":
        return [exe, "-c", "pass"], "%s starts" % exe
    if kind == "shell":
        prog = str(argv[0])
        if "/" in prog:  # a script run by its #! shell
            return [exe, "-n", prog], "%s reads %s" % (exe, prog)
        words = [str(a) for a in argv[1:]]
        for i, word in enumerate(words):
            if word.startswith("-") and not word.startswith("--") and "c" in word[1:]:
                # sh -c 'COMMAND' (or -lc, -ec): the command string is read, not a file
                if i + 1 < len(words):
                    return [exe, "-n", "-c", words[i + 1]], "%s reads its -c command" % exe
                return None, None
            if not word.startswith("-"):
                return [exe, "-n", word], "%s reads %s" % (exe, word)
    return None, None


def launcher_check(launcher_text, path):
    """The harmless start of the unit's own first program - the launcher, a script run by its ``#!``
    interpreter with the trainer's environment (a PYTHONHOME or PYTHONPATH that breaks python breaks
    it before the trainer) -> (argv, words) or (None, None)."""
    interp = shebang_words((launcher_text or "").encode("utf-8", "replace").split(b"\n", 1)[0] + b"\n")
    if not interp:
        return None, None
    exe = interp[0]
    if os.path.basename(exe) == "env" and len(interp) > 1 and not interp[1].startswith("-"):
        exe = which(interp[1], path)
    if exe and os.path.basename(exe).rstrip("0123456789.") == "python":
        return [exe, "-c", "pass"], "the launcher's %s starts" % exe
    return None, None


# ---------------------------------------------------------------------------------------------
# the run on the target

# the pre-flight's options; trainer_restart's `preflight` takes them as
# suboptions (PREFLIGHT_SUBOPTIONS) but the secret, its top-level environment_json (no_log: see
# target.install.INSTALL_OPTIONS for why a secret is never a suboption)
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
