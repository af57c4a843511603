# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pre-flight of a release while the old trainer still runs (pure decisions, unit-tested).

A release whose command cannot run (no exec bit, a missing interpreter, a missing module at
import) used to stop a healthy trainer first and be found out after the start. These checks run
before the stop: ``command_problem`` (the command exists and can be executed, or is run through
an interpreter that exists), the user's own pre-flight command (run by the module), and
``gpu_problem`` (no trainer GPU holds memory that is not the running trainer's own: such a holder
would only fail the drain gate after the stop, stranding a stopped trainer).
"""

from __future__ import annotations

import os
import re
import stat

# systemd's default PATH for system units (a unit without Environment=PATH= gets this)
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
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
