# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a command on the target with a time bound of its own.

Why not ``AnsibleModule.run_command``: in ansible-core 2.19 it has no timeout (its loop reads
the pipes until they close), so one hung ``nvidia-smi`` -- a GPU stuck in the driver, which
real GPUs do -- or a ``systemctl`` waiting on a busy systemd blocks the module until the
connection's limit (1800 s). ``run_bounded`` starts the command in a session of its own, gives
it ``timeout_s``, then SIGKILLs its whole process group (a wrapper script's children too: a
child left holding the pipe would otherwise keep us waiting) and reaps it; it returns within
``timeout_s + 2 * KILL_WAIT_S`` whatever the command does.

The environment is the one ``run_command`` would give (the module's, plus
``module.run_command_environ_update``, ansiballz paths dropped from PYTHONPATH).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

DEFAULT_TIMEOUT_S = 30.0
# A poll cut short by its module's deadline still gets this long (a healthy nvidia-smi answers
# in well under a second); the deadline is then kept within this.
MIN_POLL_S = 1.0
# After SIGKILL: how long to wait for the pipes to close, then for the process to be reaped.
KILL_WAIT_S = 1.0
WAIT_SLICE_S = 1.0  # how often run_bounded reads a caller's clock


class CommandTimeout(Exception):
    """The command did not answer within its bound; it has been killed."""

    def __init__(self, argv, timeout_s, stdout="", stderr=""):
        self.argv = list(argv)
        self.timeout_s = timeout_s
        self.stdout = stdout
        self.stderr = stderr
        super(CommandTimeout, self).__init__(timeout_message(argv, timeout_s))


def command_name(argv):
    """``/usr/bin/nvidia-smi --query-gpu=…`` -> "nvidia-smi"; ``systemctl show x`` -> "systemctl show"."""
    name = os.path.basename(argv[0])
    if len(argv) > 1 and not argv[1].startswith("-"):
        name += " " + argv[1]
    return name


def seconds_text(value):
    """30.0 -> "30", 1.5 -> "1.5", 0.25 -> "0.25"."""
    return ("%.2f" % value).rstrip("0").rstrip(".")


def timeout_message(argv, timeout_s):
    return "%s did not answer within %s s" % (command_name(argv), seconds_text(timeout_s))


def command_env(environ, update=None):
    """The environment run_command would give a command: ``environ`` + ``update``, PYTHONPATH
    without the entries ansiballz adds."""
    env = dict(environ)
    env.update(update or {})
    if "PYTHONPATH" in env:
        kept = [p for p in env["PYTHONPATH"].split(":")
                if p and not p.endswith("/ansible_modlib.zip") and not p.endswith("/debug_dir")]
        if kept:
            env["PYTHONPATH"] = ":".join(kept)
        else:
            del env["PYTHONPATH"]
    return env


def _text(data):
    return (data or b"").decode("utf-8", "replace")


def _kill_group(proc):
    """SIGKILL the command's process group and reap it; (stdout, stderr) read so far."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: its pgid is its pid
    except (ProcessLookupError, PermissionError):
        proc.kill()
    try:
        return proc.communicate(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        # Something outside the group (it called setsid) holds a pipe open: stop reading.
        for pipe in (proc.stdout, proc.stderr):
            if pipe:
                pipe.close()
        try:
            proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass  # uninterruptible (D state, inside the driver): the kernel owns it now
        return b"", b""


def run_bounded(argv, timeout_s, env=None, cwd=None, clock=None):
    """Run argv (a list, no shell) -> (rc, stdout, stderr) as text; raise CommandTimeout when it
    has not finished within ``timeout_s`` seconds (it and its process group are killed). ``clock`` (a
    ``job.wait.PausedClock``'s): the seconds are read on it, WAIT_SLICE_S at a time - a freeze of caller and command."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=cwd, close_fds=True, start_new_session=True)
    left = max(timeout_s, 0)
    while True:
        began = clock() if clock else 0
        try:
            out, err = proc.communicate(timeout=min(left, WAIT_SLICE_S) if clock else left)
            return proc.returncode, _text(out), _text(err)
        except subprocess.TimeoutExpired:
            left = left - (clock() - began) if clock else 0
            if left <= 0:
                out, err = _kill_group(proc)
                raise CommandTimeout(argv, timeout_s, _text(out), _text(err))


class Runner(object):
    """``run(argv) -> (rc, stdout, stderr)``, each command bounded by ``timeout_s`` (default
    DEFAULT_TIMEOUT_S) and, when
    a ``deadline`` (``clock()`` time) is given, by the time left until it (at least
    ``min_s``): a polling module keeps its own deadline even when a command hangs."""

    def __init__(self, timeout_s=None, deadline=None, env=None, min_s=MIN_POLL_S,
                 clock=time.monotonic):
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        self.deadline = deadline
        self.env = env
        self.min_s = min_s
        self.clock = clock

    def bound(self):
        if self.deadline is None:
            return self.timeout_s
        return min(self.timeout_s, max(self.deadline - self.clock(), self.min_s))

    def __call__(self, argv):
        return run_bounded(argv, self.bound(), env=self.env, clock=None if self.clock is time.monotonic else self.clock)


class ModuleRunner(Runner):
    """A Runner with the module's command environment; ``or_fail(argv)`` fails the module with
    "systemctl show did not answer within 30 s" instead of raising."""

    def __init__(self, module, timeout_s=None, deadline=None, **kwargs):
        env = command_env(os.environ, getattr(module, "run_command_environ_update", None))
        super(ModuleRunner, self).__init__(timeout_s, deadline=deadline, env=env, **kwargs)
        self.module = module

    def or_fail(self, argv, hint=None, **details):
        try:
            return self(argv)
        except CommandTimeout as e:
            self.module.fail_json(msg=str(e) + ("; " + hint if hint else ""), cmd=argv, **details)
