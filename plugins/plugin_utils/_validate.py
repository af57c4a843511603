# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checking the role's inputs before anything on the target changes (pure, unit-tested).

``check(variables, entry)`` answers a list of ``Problem``; each names the variable, the value
(never for secrets: ``trainer_env`` values), why it is refused and what is accepted. The role's
first task (``dflash.trainer.trainer_validate``, an action plugin: no remote call) fails with all
of them at once. The argument spec catches wrong types; this catches values that are well typed
and still dangerous or meaningless: a cache "purge" of the release root, a unit file written as
``ssh.service`` or ``../x.service``, a stall window longer than the hold, a regex that matches
every line. Checks that need the target (a unit of that name that is not ours, GPUs the host
lacks, a minimum above a GPU's memory) are in ``plan.target_checks.target_problems`` (a module on the
target imports it without this file) and run on what the first read returned, still before any change.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import select
import shlex
import stat
import subprocess
import sys
import time

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.dflash.trainer.plugins.module_utils.target.config_id import unit_path_of
from ansible_collections.dflash.trainer.plugins.module_utils.plan.fix import fix_line
from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import placement_problem, within
from ansible_collections.dflash.trainer.plugins.module_utils.plan.target_checks import UNIT_ACCEPTED, Problem, _is_int, _number, _show
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import (
    DEFAULT_ERROR_REGEXES,
    DEFAULT_READY_REGEX,
    DEFAULT_STEP_REGEX,
    DEFAULT_TOKPS_REGEX,
    marker_line,
)

ENTRIES = ("main", "restart", "rollback", "status")

# The role's entry points that run (main.yml, and restart, rollback, start and stop, which import it; group.yml,
# a trainer group's deploy): entry point -> (the input check's entry, the plan's intent entry:
# plugins/module_utils/plan/decide.py)
RUNS = {"main": ("main", "deploy"), "restart": ("restart", "restart"), "rollback": ("rollback", "rollback"),
        "start": ("restart", "start"), "stop": ("restart", "stop"), "group": ("main", "deploy")}
# the role's variables run_intent reads for each of them (tests/unit/test_argument_specs.py: each is in its spec)
_DEPLOY_VARIABLES = ("trainer_src", "trainer_release_excludes", "trainer_release_keep", "trainer_force_restart")
RUN_VARIABLES = {"main": _DEPLOY_VARIABLES, "group": _DEPLOY_VARIABLES, "restart": (),
                 "rollback": ("trainer_rollback_release",), "start": ("trainer_unit_enabled",),
                 "stop": ("trainer_stop_disable",)}


def run_intent(run, v, release=None):
    """What the run of the role's entry point ``run`` (RUNS) is for, from the play's variables ``v`` (checked;
    only those RUN_VARIABLES names for it are read) -> dict(intent, installs, enable, upload): V(intent) the first
    read plans from (entry; a deploy's ``release``, the id of trainer_src computed on the controller, and
    ``force``; a group member's ``hold``: its lock kept for the group to decide; a rollback's
    ``rollback_release``; a stop's ``disable``), V(installs) (the run's job installs the
    unit, launcher and environment file: a deploy), V(enable) (the job enables a unit a stop disabled: a start,
    unless trainer_unit_enabled is false), V(upload) (what a deploy sends when its plan uploads: src, excludes,
    keep; None for the others)."""
    if run not in RUNS:
        raise ValueError("run must be one of %s, not %r" % (", ".join(RUNS), run))
    entry = RUNS[run][1]
    intent, upload, enable = dict(entry=entry), None, False
    if entry == "deploy":
        intent.update(release=release or "", force=boolean(v.get("trainer_force_restart") or False, strict=False))
        upload = dict(src=v.get("trainer_src"), excludes=v.get("trainer_release_excludes"),
                      keep=v.get("trainer_release_keep"))
        if run == "group":
            intent["hold"] = True
    elif entry == "rollback":
        intent["rollback_release"] = v.get("trainer_rollback_release") or ""
    elif entry == "stop":
        intent["disable"] = boolean(v.get("trainer_stop_disable") or False, strict=False)
    elif entry == "start":
        enabled = v.get("trainer_unit_enabled")
        enable = boolean(True if enabled is None else enabled, strict=False)
    return dict(intent=intent, installs=entry == "deploy", enable=enable, upload=upload)


# Characters a path may hold: it reaches a unit file, an EnvironmentFile and argv lists; a space,
# a quote, `;`, `$`, `%` (a systemd specifier) or a control character is always a typo here.
_PATH_RE = re.compile(r"^/[A-Za-z0-9._+@=:,/-]*$")
PATH_ACCEPTED = "an absolute, normalised path of letters, digits and . _ - + @ = : , / (no '..', no '//', no trailing '/')"

# Directories no variable may name (or, for the purge, lie in): the system's own.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
               "/run", "/sbin", "/sys", "/usr", "/var", "/tmp", "/opt", "/srv", "/home", "/root",
               "/mnt", "/media", "/workspace")
# No managed file may live under these (kernel/virtual file systems).
VIRTUAL_DIRS = ("/proc", "/sys", "/dev")

_UNIT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")
_UNIT_SUFFIXES = (".service", ".socket", ".target", ".timer", ".mount", ".path", ".slice", ".scope",
                  ".device", ".swap", ".automount")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# environment names the unit, systemd and the launcher set or read: a trainer_env entry of one
# would hide this start from the proof (INVOCATION_ID) or break the unit (NOTIFY_SOCKET, LISTEN_*)
RESERVED_ENV = frozenset(("INVOCATION_ID", "NOTIFY_SOCKET", "MAINPID", "MANAGERPID", "JOURNAL_STREAM",
                          "SYSTEMD_EXEC_PID", "WATCHDOG_PID", "WATCHDOG_USEC", "TRIGGER_UNIT", "TRIGGER_PATH",
                          "TRIGGER_TIMER_REALTIME_USEC", "TRIGGER_TIMER_MONOTONIC_USEC", "RUNTIME_DIRECTORY",
                          "STATE_DIRECTORY", "CACHE_DIRECTORY", "LOGS_DIRECTORY", "CONFIGURATION_DIRECTORY",
                          "CREDENTIALS_DIRECTORY", "EXIT_CODE", "EXIT_STATUS", "SERVICE_RESULT", "MONITOR_SERVICE_RESULT",
                          "PIDFILE", "REMOTE_ADDR", "REMOTE_PORT", "TORCHINDUCTOR_CACHE_DIR"))
# (PYTHONUNBUFFERED is not among them: the role sets it to 1 unless trainer_env sets it)
RESERVED_ENV_PREFIXES = ("DFLASH_", "LISTEN_", "MONITOR_", "SYSTEMD_", "NOTIFY_")
ENV_VALUE_MAX = 32 * 1024
ENV_TOTAL_MAX = 256 * 1024
_RELEASE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
GPU_INDEX_MAX = 63
SECONDS_MAX = 7 * 24 * 3600

# (variable, minimum, maximum, unit words); the variables in _INTEGERS take whole numbers only
_NUMBERS = (
    ("trainer_release_keep", 1, 1000, "releases"),
    ("trainer_stop_timeout_s", 1, SECONDS_MAX, "s"),
    ("trainer_restart_sec", 0, SECONDS_MAX, "s"),
    ("trainer_start_limit_burst", 1, 1000, ""),
    ("trainer_start_limit_interval_s", 0, SECONDS_MAX, "s"),
    ("trainer_lock_stale_s", 10, SECONDS_MAX, "s"),
    ("trainer_drain_max_mib", 0, 16 * 1024 * 1024, "MiB"),
    ("trainer_drain_timeout_s", 1, SECONDS_MAX, "s"),
    ("trainer_gpu_min_mib", 1, 16 * 1024 * 1024, "MiB"),
    ("trainer_ready_min_steps", 1, 1000000, "steps"),
    ("trainer_ready_hold_s", 0.1, SECONDS_MAX, "s"),
    ("trainer_ready_stall_s", 0.1, SECONDS_MAX, "s"),
    ("trainer_ready_timeout_s", 1, SECONDS_MAX, "s"),
    ("trainer_ready_interval_s", 0.05, 3600, "s"),
    ("trainer_log_tail_lines", 0, 10000, "lines"),
    ("trainer_log_max_mib", 0, 1024 * 1024, "MiB"),
    ("trainer_log_keep", 0, 1000, "files"),
    ("trainer_preflight_timeout_s", 1, 3600, "s"),
    ("trainer_lock_lease_s", 10, 3600, "s"),
    ("trainer_min_tokps_ratio", 0, 10, ""),
    ("trainer_lock_wait_s", 0, SECONDS_MAX, "s"),
    ("trainer_watch_s", 0, SECONDS_MAX, "s"),
    ("trainer_metrics_interval_s", 1, 3600, "s"),
    ("trainer_metrics_window_s", 1, SECONDS_MAX, "s"),
)

_INTEGERS = frozenset(("trainer_release_keep", "trainer_start_limit_burst", "trainer_drain_max_mib",
                       "trainer_gpu_min_mib", "trainer_ready_min_steps", "trainer_log_tail_lines",
                       "trainer_log_max_mib", "trainer_log_keep", "trainer_lock_stale_s", "trainer_lock_lease_s",
                       "trainer_stop_timeout_s", "trainer_restart_sec", "trainer_start_limit_interval_s"))
# Restart= values systemd.service(5) accepts
RESTART_POLICIES = ("no", "on-success", "on-failure", "on-abnormal", "on-watchdog", "on-abort", "always")

_PATHS = ("trainer_root", "trainer_log_path", "trainer_env_file", "trainer_inductor_cache_dir",
          "trainer_launcher_path", "trainer_lock_path", "trainer_job_state_path")
_REGEXES = ("trainer_ready_regex", "trainer_step_regex", "trainer_tokps_regex")

# which variables each entry point uses (status reads only)
_STATUS_VARS = {"trainer_root", "trainer_log_path", "trainer_unit_name", "trainer_nvidia_smi", "trainer_env_file"}


def has_control(text):
    """A control character (newline, tab, NUL, DEL, ...): never in a value that reaches a unit file,
    an environment file or argv."""
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def path_problem(name, value):
    """The shape of one path variable: a Problem or None."""
    if not isinstance(value, str) or not value:
        return Problem(name, "must be a non-empty string", PATH_ACCEPTED, value)
    if not value.startswith("/"):
        return Problem(name, "is a relative path", PATH_ACCEPTED, value)
    if not _PATH_RE.match(value):
        bad = sorted({c for c in value if not re.match(r"[A-Za-z0-9._+@=:,/-]", c)})
        return Problem(name, "holds characters a path here may not hold (%s)" % " ".join(repr(c) for c in bad),
                       PATH_ACCEPTED, value)
    parts = value.split("/")[1:]
    if value != "/" and (value.endswith("/") or "" in parts):
        return Problem(name, "is not normalised (empty component or trailing '/')", PATH_ACCEPTED, value)
    if any(p in (".", "..") for p in parts):
        return Problem(name, "holds a '.' or '..' component", PATH_ACCEPTED, value)
    if value == "/" or value in SYSTEM_DIRS:
        return Problem(name, "is a system directory", PATH_ACCEPTED + ", not a system directory such as / /tmp /opt",
                       value)
    if name != "trainer_lock_path" and any(within(value, d) for d in VIRTUAL_DIRS):
        return Problem(name, "lies in a kernel file system (/proc, /sys, /dev)", PATH_ACCEPTED, value)
    return None


def _paths_problems(v):
    problems = []
    ok = {}
    for name in _PATHS:
        if name not in v:
            continue
        p = path_problem(name, v[name])
        if p is None:
            ok[name] = v[name]
        else:
            problems.append(p)
    root = ok.get("trainer_root")
    if root is not None:
        for name in ("trainer_log_path", "trainer_env_file", "trainer_launcher_path", "trainer_lock_path"):
            if name in ok and within(ok[name], root):
                problems.append(Problem(name, "lies inside trainer_root %s (releases there are immutable and pruned)" % root,
                                        "a path outside trainer_root", ok[name]))
            elif name in ok and within(root, ok[name]):
                problems.append(Problem(name, "contains trainer_root %s" % root, "a path outside trainer_root", ok[name]))
    cache = ok.get("trainer_inductor_cache_dir")
    if cache is not None:
        problems.extend(_cache_problems(cache, ok))
    seen = {}
    for name in ("trainer_log_path", "trainer_env_file", "trainer_launcher_path", "trainer_lock_path",
                 "trainer_job_state_path"):
        if name in ok:
            if ok[name] in seen:
                problems.append(Problem(name, "is the same file as %s" % seen[ok[name]], "a file of its own", ok[name]))
            seen.setdefault(ok[name], name)
    return problems


def _cache_problems(cache, ok):
    """The purge deletes this directory (rm -rf): it must be a cache and nothing else."""
    name = "trainer_inductor_cache_dir"
    accepted = ("a directory of its own at least two levels deep (e.g. /var/cache/dflash-trainer/inductor), that holds "
                "and is inside none of trainer_root, the log, the environment file, the launcher and the lock")
    if cache.count("/") < 2:
        return [Problem(name, "is a top-level directory: the restart would delete it with everything in it", accepted, cache)]
    for sysdir in ("/usr", "/etc", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/var/lib",
                   "/var/log", "/run/systemd"):
        if within(cache, sysdir):
            return [Problem(name, "lies in %s: the restart would delete system files" % sysdir, accepted, cache)]
    if re.match(r"^/home/[^/]+$", cache):
        return [Problem(name, "is a home directory: the restart would delete it", accepted, cache)]
    what = {
        "trainer_root": "the releases (every release would be deleted)",
        "trainer_log_path": "the trainer's log (a failed start's log would be deleted)",
        "trainer_env_file": "the environment file",
        "trainer_launcher_path": "the launcher",
        "trainer_lock_path": "the deploy lock",
        "trainer_job_state_path": "the restart job's state",
    }
    for other, words in what.items():
        if other not in ok:
            continue
        path = ok[other]
        if within(path, cache):
            return [Problem(name, "holds %s (%s=%s): the restart would delete it" % (words, other, path), accepted, cache)]
        if within(cache, path):
            return [Problem(name, "lies inside %s=%s: the restart would delete %s" % (other, path, words), accepted, cache)]
    return []


def unit_name_problem(value):
    name = "trainer_unit_name"
    if not isinstance(value, str) or not value:
        return Problem(name, "must be a non-empty string", UNIT_ACCEPTED, value)
    for suffix in _UNIT_SUFFIXES:
        if value.endswith(suffix):
            return Problem(name, "ends with %s: give the name without the suffix (%s)" % (suffix, value[:-len(suffix)]),
                           UNIT_ACCEPTED, value)
    if "@" in value:
        return Problem(name, "holds '@': template units are not supported", UNIT_ACCEPTED, value)
    if ".." in value or "/" in value:
        return Problem(name, "holds '/' or '..': the unit file would be written outside /etc/systemd/system",
                       UNIT_ACCEPTED, value)
    if not _UNIT_RE.match(value):
        return Problem(name, "holds characters a unit name may not hold", UNIT_ACCEPTED, value)
    return None


def _numbers_problems(v):
    problems = []
    nums = {}
    for name, lo, hi, unit in _NUMBERS:
        if name not in v:
            continue
        value = v[name]
        n = _number(value)
        whole = name in _INTEGERS
        accepted = "a %s from %s to %s%s, written as plain decimal digits (no exponent, '_', space or non-ASCII " \
                   "digit)" % ("whole number" if whole else "number", lo, hi, (" " + unit) if unit else "")
        if n is None:
            problems.append(Problem(name, "is not a number", accepted, value))
        elif whole and (isinstance(n, float) or (isinstance(value, str) and "." in value)):
            problems.append(Problem(name, "is not a whole number", accepted, value))
        elif math.isnan(n) or n < lo or n > hi:
            problems.append(Problem(name, "is out of range", accepted, value))
        else:
            nums[name] = n
    hold, stall = nums.get("trainer_ready_hold_s"), nums.get("trainer_ready_stall_s")
    timeout, interval = nums.get("trainer_ready_timeout_s"), nums.get("trainer_ready_interval_s")
    if hold is not None and stall is not None and stall > hold:
        problems.append(Problem("trainer_ready_stall_s", "is longer than trainer_ready_hold_s (%s s): progress could stop "
                                "for the whole hold and still count as held" % hold,
                                "a stall window no longer than the hold", v["trainer_ready_stall_s"]))
    if hold is not None and timeout is not None and hold >= timeout:
        problems.append(Problem("trainer_ready_hold_s", "is not shorter than trainer_ready_timeout_s (%s s): the proof "
                                "could never finish" % timeout, "a hold shorter than the deadline",
                                v["trainer_ready_hold_s"]))
    if interval is not None and hold is not None and interval > hold:
        problems.append(Problem("trainer_ready_interval_s", "is longer than trainer_ready_hold_s (%s s)" % hold,
                                "a poll interval no longer than the hold", v["trainer_ready_interval_s"]))
    return problems


def _regex_problems(v):
    problems = []
    marker = marker_line("0123456789abcdef0123456789abcdef", "0123456789abcdef", 1,
                         "2026-01-01T00:00:00+00:00").rstrip("\n")
    for name in _REGEXES + ("trainer_error_regexes",):
        if name not in v:
            continue
        values = v[name]
        if name == "trainer_error_regexes":
            if not isinstance(values, (list, tuple)):
                problems.append(Problem(name, "is not a list", "a list of Python regular expressions", values))
                continue
            items = [("%s[%d]" % (name, i), rx) for i, rx in enumerate(values)]
        else:
            items = [(name, values)]
        for label, rx in items:
            accepted = "a Python regular expression that matches some lines and not every line"
            if not isinstance(rx, str) or not rx:
                problems.append(Problem(label, "is empty (it would match every line)", accepted, rx))
                continue
            try:
                compiled = re.compile(rx)
            except (re.error, RecursionError, OverflowError) as exc:
                problems.append(Problem(label, "does not compile: %s" % exc, accepted, rx))
                continue
            if compiled.search(""):
                problems.append(Problem(label, "matches the empty line, so it matches every line", accepted, rx))
            elif compiled.search(marker):
                problems.append(Problem(label, "matches the launcher's own start marker line (%s), so it would match "
                                        "on every start" % marker, accepted, rx))
            elif name in ("trainer_step_regex", "trainer_tokps_regex") and compiled.groups < 1:
                problems.append(Problem(label, "has no capture group for the number",
                                        "a regular expression whose first group captures the number, e.g. %s"
                                        % (r"'\bstep[=: ]\s*(\d+)'" if name == "trainer_step_regex"
                                           else r"'tok/s[=: ]\s*([0-9.]+)'"), rx))
    return problems


# -- regexes that can hang the job ---------------------------------------------------------------
# The launcher and the restart job match each log line against the user's regexes (search) with
# the first REGEX_LINE_CHARS characters of the line only; a regex is refused here when one search
# on one adversarial line of that length takes longer than REGEX_LINE_BUDGET_S. The matching runs
# in a child process that the controller kills at the budget (a catastrophic pattern never returns:
# no thread, alarm or check inside the matcher's own process can stop it).
REGEX_LINE_CHARS = 4096   # = the launcher's MATCH_CHARS
REGEX_LINE_BUDGET_S = 0.5
REGEX_START_S = 5.0       # the child's own start (python3 -I -S), on a busy controller
_CHILD = r"""
import json, re, sys, time
items = json.loads(sys.stdin.read())
compiled = [re.compile(rx) for rx, _lines in items]
sys.stdout.write("go\n")
sys.stdout.flush()
for i, (rx, lines) in enumerate(items):
    for j, line in enumerate(lines):
        t0 = time.perf_counter()
        compiled[i].search(line)
        sys.stdout.write("%d %d %.6f\n" % (i, j, time.perf_counter() - t0))
        sys.stdout.flush()
"""

try:  # the regex parser (Python >= 3.11: re._parser; before: sre_parse)
    from re import _parser as _sre_parse
except ImportError:  # pragma: no cover
    import sre_parse as _sre_parse  # pylint: disable=deprecated-module

_CATEGORY_SAMPLE = {"CATEGORY_DIGIT": "0", "CATEGORY_NOT_DIGIT": "a", "CATEGORY_SPACE": " ",
                    "CATEGORY_NOT_SPACE": "a", "CATEGORY_WORD": "a", "CATEGORY_NOT_WORD": " "}


def _samples(parsed, chars, runs):
    """Characters the pattern can match (a literal, a class's first member) and its literal runs."""
    run = []
    for op, av in parsed:
        name = str(op)
        if name == "LITERAL":
            chars.append(chr(av))
            run.append(chr(av))
            continue
        if len(run) >= 2:
            runs.append("".join(run))
        run = []
        if name == "IN":
            for iop, iav in av:
                iname = str(iop)
                if iname == "LITERAL":
                    chars.append(chr(iav))
                elif iname == "RANGE":
                    chars.append(chr(iav[0]))
                elif iname == "CATEGORY":
                    chars.append(_CATEGORY_SAMPLE.get(str(iav), "a"))
        elif name == "ANY":
            chars.append("a")
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            _samples(av[2], chars, runs)
        elif name == "SUBPATTERN":
            _samples(av[-1], chars, runs)
        elif name == "BRANCH":
            for branch in av[1]:
                _samples(branch, chars, runs)
        elif name in ("ASSERT", "ASSERT_NOT"):
            _samples(av[1], chars, runs)
        elif name == "GROUPREF_EXISTS":
            for branch in av[1:]:
                if branch is not None:
                    _samples(branch, chars, runs)
    if len(run) >= 2:
        runs.append("".join(run))


def adversarial_lines(pattern, n=REGEX_LINE_CHARS):
    """Lines of ``n`` characters on which a backtracking pattern is slowest: one character it
    matches (or two, alternating), repeated, after one of its literal runs, ending in one it does
    not expect - the shape of every catastrophic case (``^(a+)+$`` on ``aaaa…!``)."""
    chars, runs = [], []
    try:
        _samples(_sre_parse.parse(pattern), chars, runs)
    except Exception:  # pylint: disable=broad-except  # compiled by re already; a parser quirk only
        pass
    seen = []
    for c in chars + list("a0 .-_/=:"):
        if c not in seen and c not in "\n\r":
            seen.append(c)
    seen = seen[:12]
    prefixes = [""] + sorted(set(runs), key=lambda r: (-len(r), r))[:3]
    lines = []
    for prefix in prefixes:
        room = n - len(prefix) - 1
        for c in seen:
            lines.append(prefix + c * room + "!")
        for c1, c2 in zip(seen[:4], seen[1:5]):
            lines.append(prefix + ((c1 + c2) * (room // 2 + 1))[:room] + "!")
    return lines


def slow_regexes(items, budget_s=REGEX_LINE_BUDGET_S, n=REGEX_LINE_CHARS, python=None):
    """``items``: [(label, regex)] (each compiles) -> {label: words} for each regex one search of
    which, on one of its ``adversarial_lines``, took longer than ``budget_s`` (the child process
    doing the searches is killed then: the budget is kept from outside the matcher)."""
    slow = {}
    todo = [(label, rx, adversarial_lines(rx, n)) for label, rx in items]
    while todo:
        proc = subprocess.Popen([python or sys.executable, "-I", "-S", "-c", _CHILD], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        proc.stdin.write(json.dumps([[rx, lines] for _l, rx, lines in todo]).encode())
        proc.stdin.close()
        done_upto, buf = None, b""     # the last (regex, line) searched
        deadline = time.monotonic() + REGEX_START_S + budget_s
        hung = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                hung = True
                break
            ready, _w, _x = select.select([proc.stdout], [], [], left)
            if not ready:
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            *rows, buf = buf.split(b"\n")
            for row in rows:
                if row == b"go":
                    continue
                i, j, took = row.split()
                done_upto = (int(i), int(j))
                if float(took) > budget_s:
                    slow.setdefault(todo[int(i)][0], "one search took %.1f s on a line of %d characters (%r...)"
                                    % (float(took), n, todo[int(i)][2][int(j)][:24]))
            deadline = time.monotonic() + budget_s
        if not hung and proc.wait() == 0:
            break
        proc.kill()
        proc.wait()
        # the regex being searched when the budget ran out: the one after the last line reported
        i, j = done_upto if done_upto is not None else (0, -1)
        if j + 1 >= len(todo[i][2]):
            i, j = i + 1, -1
        if i >= len(todo):
            break
        slow.setdefault(todo[i][0], "one search ran past %.1f s on a line of %d characters (%r...) and was "
                        "stopped" % (budget_s, n, todo[i][2][j + 1][:24]))
        todo = todo[i + 1:]
    return slow


# the collection's own regexes: proved linear by the unit tests (test_the_default_regexes_are_not_slow), so a
# run with the defaults starts no timing child (≈ 50 ms of every run's checks)
PROVED_LINEAR = frozenset((DEFAULT_READY_REGEX, DEFAULT_STEP_REGEX, DEFAULT_TOKPS_REGEX) + tuple(DEFAULT_ERROR_REGEXES))


def _pathological_problems(v, already):
    """Regexes that pass the other checks, timed on adversarial lines (see slow_regexes); the
    collection's own (PROVED_LINEAR) are not timed again."""
    items = []
    for name in _REGEXES:
        if isinstance(v.get(name), str) and v[name] and name not in already:
            items.append((name, v[name]))
    for i, rx in enumerate(v.get("trainer_error_regexes") or [] if isinstance(v.get("trainer_error_regexes"),
                                                                              (list, tuple)) else []):
        label = "trainer_error_regexes[%d]" % i
        if isinstance(rx, str) and rx and label not in already:
            items.append((label, rx))
    measure = v.get("trainer_measure_regexes")
    for key, rx in (measure.items() if isinstance(measure, dict) else []):
        label = "trainer_measure_regexes[%r]" % (key,)
        if isinstance(rx, str) and rx and label not in already:
            items.append((label, rx))
    compiled = []
    for label, rx in items:
        if rx in PROVED_LINEAR:
            continue
        try:
            re.compile(rx)
        except (re.error, RecursionError, OverflowError):
            continue
        compiled.append((label, rx))
    if not compiled:
        return []
    accepted = ("a regular expression without nested or overlapping repeats that backtrack without end (such as "
                "(a+)+, (a|a)*, (\\w+\\s?)+); searched on lines of up to %d characters, one search within %.1f s"
                % (REGEX_LINE_CHARS, REGEX_LINE_BUDGET_S))
    slow = slow_regexes(compiled)
    return [Problem(label, "can hang the restart job: %s" % slow[label], accepted, rx)
            for label, rx in compiled if label in slow]


def _command_problems(v, name="trainer_command", may_be_empty=False):
    accepted = "a %slist of strings (argv), e.g. ['./run.sh'] or ['python3', 'train.py']" % (
        "" if may_be_empty else "non-empty ")
    cmd = v.get(name)
    if isinstance(cmd, str):
        return [Problem(name, "is a string, not a list: it would run as one word", accepted, cmd)]
    if may_be_empty and isinstance(cmd, (list, tuple)) and not cmd:
        return []
    if not isinstance(cmd, (list, tuple)) or not cmd:
        return [Problem(name, "is empty or not a list", accepted, cmd)]
    for i, word in enumerate(cmd):
        if isinstance(word, (dict, list, tuple)) or word is None:
            return [Problem("%s[%d]" % (name, i), "is not a string", accepted, word)]
        word = str(word)
        if i == 0 and not word.strip():
            return [Problem("%s[0]" % name, "is empty", accepted, word)]
        if has_control(word):
            return [Problem("%s[%d]" % (name, i), "holds a control character (newline, tab, ...)", accepted, word)]
        if len(word) > 4096:
            return [Problem("%s[%d]" % (name, i), "is longer than 4096 characters", accepted, word)]
    return []


def _env_problems(v):
    name = "trainer_env"
    env = v.get(name)
    accepted = ("a mapping of NAME: value (NAME of letters, digits, _; values without control characters, "
                "at most %d bytes each and %d in all)" % (ENV_VALUE_MAX, ENV_TOTAL_MAX))
    if env is None:
        return []
    if not isinstance(env, dict):
        return [Problem(name, "is not a mapping", accepted, show_value=False)]
    problems = []
    total = 0
    for position, key in enumerate(env, 1):
        label = "%s[%r]" % (name, key)
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            if isinstance(key, str) and "=" not in key and len(key) <= 64 and not has_control(key):
                problems.append(Problem(label, "is not a valid environment variable name", accepted, show_value=False))
            else:  # never echoed: a key holding '=' is likely NAME=value, a secret pasted as the name
                problems.append(Problem("%s (its key number %d)" % (name, position),
                                        "has a key that is not a valid environment variable name (%s; the key is not "
                                        "shown: it may hold a secret)" % (
                                            "it holds '='" if isinstance(key, str) and "=" in key else
                                            "not letters, digits and _"), accepted, show_value=False))
            continue
        if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES):
            problems.append(Problem(label, "is a name the unit, systemd or the launcher sets or reads: set by the "
                                    "trainer's environment it would hide this start from the proof (INVOCATION_ID) or "
                                    "break the unit", "a name of the trainer's own (not %s)" % _reserved_words(),
                                    show_value=False))
            continue
        value = env[key]
        if isinstance(value, (dict, list, tuple)):
            problems.append(Problem(label, "is a %s, not a string or number" % type(value).__name__, accepted,
                                    secret=True))
            continue
        text = "" if value is None else str(value)
        size = len(text.encode("utf-8", "surrogateescape"))
        total += size + len(key) + 4
        if size > ENV_VALUE_MAX:
            problems.append(Problem(label, "is %d bytes long" % size, accepted, secret=True))
        elif has_control(text):
            problems.append(Problem(label, "holds a control character (newline, tab, NUL, ...)", accepted, secret=True))
    if total > ENV_TOTAL_MAX and not problems:
        problems.append(Problem(name, "is %d bytes in all" % total, accepted, secret=True))
    return problems


def _reserved_words():
    return ", ".join(sorted(RESERVED_ENV)) + " or a name starting with " + ", ".join(RESERVED_ENV_PREFIXES)


def _gpus_problems(v):
    name = "trainer_gpus"
    gpus = v.get(name)
    accepted = "a non-empty list of distinct GPU indexes from 0 to %d, each listed by nvidia-smi" % GPU_INDEX_MAX
    if not isinstance(gpus, (list, tuple)) or not gpus:
        return [Problem(name, "is empty or not a list", accepted, gpus)]
    ints = []
    for g in gpus:
        n = g if _is_int(g) else (int(g) if isinstance(g, str) and re.match(r"^[0-9]+\Z", g) else None)
        if n is None or n < 0 or n > GPU_INDEX_MAX:
            return [Problem(name, "holds %s, not a GPU index" % _show(g), accepted, gpus)]
        ints.append(n)
    dups = sorted({g for g in ints if ints.count(g) > 1})
    if dups:
        return [Problem(name, "lists GPU %s more than once" % ", ".join(str(d) for d in dups), accepted, gpus)]
    return []


def _measure_problems(v):
    problems = []
    m = v.get("trainer_measure_s")
    if m not in (None, "", 0):
        n = _number(m)
        if n is None or math.isnan(n) or n < 0.1 or n > SECONDS_MAX:
            problems.append(Problem("trainer_measure_s", "is not a number of seconds in range",
                                    "null (the hold) or 0.1 to %d s" % SECONDS_MAX, m))
    rxs = v.get("trainer_measure_regexes")
    if rxs in (None, ""):
        return problems
    if not isinstance(rxs, dict):
        return problems + [Problem("trainer_measure_regexes", "is not a mapping",
                                   "a mapping of figure name to a regex with a capture group", rxs)]
    for name, rx in rxs.items():
        label = "trainer_measure_regexes[%r]" % (name,)
        accepted = "a regex whose first group captures the number, e.g. 'q_hs=(\\d+)'"
        if not isinstance(name, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$", name) or name == "tok_s":
            problems.append(Problem(label, "is not a figure name (letters, digits, _; not tok_s)", accepted, name))
            continue
        try:
            compiled = re.compile(rx) if isinstance(rx, str) and rx else None
        except (re.error, RecursionError, OverflowError) as exc:
            problems.append(Problem(label, "does not compile: %s" % exc, accepted, rx))
            continue
        if compiled is None or compiled.groups < 1 or compiled.search(""):
            problems.append(Problem(label, "is empty, matches every line or has no capture group", accepted, rx))
    return problems


def src_problems(src, excludes=()):
    """The release source on the controller: a directory whose tree can become a release.

    Walks it without following symlinks (lstat only, no hashing): sockets, FIFOs and device
    nodes, symlink loops and symlinks that resolve outside the tree are refused here, before the
    deploy lock is taken.
    """
    from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import is_excluded

    name = "trainer_src"
    accepted = "a readable directory on the controller holding regular files, directories and symlinks that stay inside it"
    if not isinstance(src, str) or not src:
        return [Problem(name, "is not set", accepted, src)]
    if not os.path.lexists(src):
        return [Problem(name, "does not exist on the controller", accepted, src)]
    if not os.path.isdir(src):
        return [Problem(name, "is not a directory", accepted, src)]
    top = os.path.realpath(src)
    stack = [""]
    while stack:
        reldir = stack.pop()
        absdir = os.path.join(src, reldir) if reldir else src
        try:
            with os.scandir(absdir) as it:
                children = list(it)
        except OSError as exc:
            return [Problem(name, "cannot read %s: %s" % (absdir, exc.strerror or exc), accepted, src)]
        for child in children:
            rel = reldir + "/" + child.name if reldir else child.name
            if is_excluded(rel, excludes):
                continue
            try:
                st = os.lstat(child.path)
            except OSError as exc:
                return [Problem(name, "cannot read %s: %s" % (rel, exc.strerror or exc), accepted, src)]
            if stat.S_ISLNK(st.st_mode):
                try:
                    os.stat(child.path)
                except OSError as exc:
                    if exc.errno == 40:  # ELOOP
                        return [Problem(name, "holds a symlink loop at %s" % rel, accepted, src)]
                    continue  # dangling: allowed (it may point at something made at run time)
                target = os.path.realpath(child.path)
                if not within(target, top):
                    return [Problem(name, "holds a symlink %s that points outside the tree (%s)" % (rel, os.readlink(child.path)),
                                    accepted, src)]
            elif stat.S_ISDIR(st.st_mode):
                stack.append(rel)
            elif not stat.S_ISREG(st.st_mode):
                kind = ("a socket" if stat.S_ISSOCK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                        else "a device node")
                return [Problem(name, "holds %s at %s (exclude it with trainer_release_excludes)" % (kind, rel),
                                accepted, src)]
    return []


def inventory_problems(v):
    """proxmox_vmid where the connection needs one (pct-style connections)."""
    conn = str(v.get("ansible_connection") or "")
    if not conn.endswith("pct") and not conn.endswith("proxmox_pct_remote"):
        return []
    vmid = v.get("proxmox_vmid")
    accepted = "the numeric id of an existing container, 100 to 999999999 (inventory variable proxmox_vmid)"
    if vmid is None or vmid == "":
        return [Problem("proxmox_vmid", "is not set for this host", accepted, show_value=False)]
    text = str(vmid)
    if isinstance(vmid, bool) or not re.match(r"^\d+$", text) or not 100 <= int(text) <= 999999999:
        return [Problem("proxmox_vmid", "is not a container id", accepted, vmid)]
    return []


def host_view_problems(v):
    """trainer_gpu_host_view needs the dflash.trainer.pct connection (its pct_node runs a task on
    the node itself) and a plain program path for the node's python and nvidia-smi."""
    try:  # as Ansible reads a boolean (`-e trainer_gpu_host_view=true` arrives as a string)
        if not boolean(v.get("trainer_gpu_host_view", False), strict=True):
            return []
    except TypeError:
        return [Problem("trainer_gpu_host_view", "is not a boolean", "true or false (yes/no, 1/0)",
                        v.get("trainer_gpu_host_view"))]
    problems = []
    conn = str(v.get("ansible_connection") or "")
    if conn not in ("dflash.trainer.pct", "pct"):
        problems.append(Problem("trainer_gpu_host_view", "needs the dflash.trainer.pct connection (it reads the node "
                                "over the same ssh), not %s" % (conn or "the default connection"),
                                "ansible_connection: dflash.trainer.pct, or trainer_gpu_host_view: false", True))
    python = v.get("trainer_node_python", "/usr/bin/python3")
    if not isinstance(python, str) or not python.startswith("/") or not _PROGRAM_RE.match(python):
        problems.append(Problem("trainer_node_python", "is not an absolute program path",
                                "the node's python3, e.g. /usr/bin/python3", python))
    smi = v.get("trainer_node_nvidia_smi", "nvidia-smi")
    if not isinstance(smi, str) or not _PROGRAM_RE.match(smi):
        problems.append(Problem("trainer_node_nvidia_smi", "is not a program name or path",
                                "nvidia-smi, or an absolute path such as /usr/bin/nvidia-smi", smi))
    return problems


# a program name or absolute path: no spaces, quotes or shell characters
_PROGRAM_RE = re.compile(r"^[A-Za-z0-9_./+-]{1,4096}$")


def _restart_policy_problems(v):
    name = "trainer_restart_policy"
    if name not in v:
        return []
    value = v[name]
    if value not in RESTART_POLICIES:
        return [Problem(name, "is not a Restart= value systemd accepts", "one of %s" % ", ".join(RESTART_POLICIES),
                        value)]
    return []


def _controls(value, label, depth=0):
    """(label, value) of the first string inside ``value`` holding a control character, or None."""
    if isinstance(value, str):
        if has_control(value):
            return label, value
        return None
    if depth > 8:
        return None
    if isinstance(value, dict):
        for k, item in value.items():
            found = _controls(k, "%s (a key)" % label, depth + 1) or _controls(item, "%s[%r]" % (label, k), depth + 1)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _controls(item, "%s[%d]" % (label, i), depth + 1)
            if found:
                return found
    return None


# checked on their own (secrets, or with their own words)
_CONTROL_CHECKED_ELSEWHERE = frozenset(("trainer_env", "trainer_command", "trainer_preflight_command"))


def _control_problems(v):
    """No newline or other control character in any value: one would reach the unit file, the
    environment file or a log line as a second line (``Restart=always\nExecStartPre=...``)."""
    problems = []
    for name in sorted(v):
        if not name.startswith("trainer_") or name in _CONTROL_CHECKED_ELSEWHERE or name in _PATHS:
            continue
        found = _controls(v[name], name)
        if found:
            problems.append(Problem(found[0], "holds a control character (newline, tab, ...): it would reach the "
                                    "unit file or a log as another line", "a value without control characters",
                                    found[1]))
    return problems


def _placement_problems(v):
    """Where a file of ours may live, judged on the text here (and on the resolved path on the target)."""
    kinds = (("trainer_launcher_path", "launcher"), ("trainer_env_file", "env"), ("trainer_log_path", "log"),
             ("trainer_lock_path", "lock"), ("trainer_job_state_path", "state"),
             ("trainer_inductor_cache_dir", "cache"), ("trainer_metrics_path", "metrics"))
    problems = []
    for name, kind in kinds:
        value = v.get(name)
        if not isinstance(value, str) or path_problem(name, value) is not None:
            continue
        why = placement_problem(kind, value)
        if why:
            problems.append(Problem(name, why, _place_example(name), value))
    unit = v.get("trainer_unit_name")
    if isinstance(unit, str) and unit_name_problem(unit) is None:
        unit_path = unit_path_of(unit)
        for name, _kind in kinds:
            if v.get(name) == unit_path:
                problems.append(Problem(name, "is the unit file %s" % unit_path, "a file of its own", v.get(name)))
    return problems


_DEFAULT_PLACES = {"trainer_launcher_path": "/usr/local/lib/dflash-trainer/launch",
                   "trainer_env_file": "/etc/dflash-trainer/trainer.env",
                   "trainer_log_path": "/workspace/trainer.log",
                   "trainer_lock_path": "/run/dflash-trainer.deploy.lock",
                   "trainer_job_state_path": "/var/lib/dflash-trainer/restart.json",
                   "trainer_inductor_cache_dir": "/var/cache/dflash-trainer/inductor"}
# a path whose default is off (empty): an example, never called its default
_EXAMPLE_PLACES = {"trainer_metrics_path": "/var/lib/node_exporter/textfile_collector/dflash_trainer.prom"}


def _place_example(name):
    """What a refused placement of ``name`` should be instead, with the role's default (tests check
    _DEFAULT_PLACES against defaults/main.yml) or an example."""
    if name in _DEFAULT_PLACES:
        return "a path of the collection's own (e.g. the default %s)" % _DEFAULT_PLACES[name]
    if name in _EXAMPLE_PLACES:
        return "a path of the collection's own (e.g. %s)" % _EXAMPLE_PLACES[name]
    return PATH_ACCEPTED


METRICS_ACCEPTED = ("empty (no metrics), or an absolute path ending in .prom in node_exporter's textfile collector "
                    "directory, e.g. /var/lib/node_exporter/textfile_collector/dflash_trainer.prom")


def _metrics_problems(v):
    """trainer_metrics_path: off when empty; else a .prom file of its own (the launcher replaces it
    every few seconds: it must not be any other file of ours, nor lie in the release root)."""
    name = "trainer_metrics_path"
    value = v.get(name)
    if value in (None, ""):
        return []
    p = path_problem(name, value)
    if p is not None:
        return [Problem(name, p.why, METRICS_ACCEPTED, value)]
    if not value.endswith(".prom") or value == ".prom" or posixpath.basename(value).startswith("."):
        return [Problem(name, "does not end in .prom (node_exporter's textfile collector reads only *.prom files, "
                        "and skips hidden ones)", METRICS_ACCEPTED, value)]
    root = v.get("trainer_root")
    if isinstance(root, str) and root and within(value, root):
        return [Problem(name, "lies inside trainer_root %s (releases there are immutable and pruned)" % root,
                        METRICS_ACCEPTED, value)]
    for other in ("trainer_log_path", "trainer_env_file", "trainer_launcher_path", "trainer_lock_path",
                  "trainer_job_state_path"):
        if v.get(other) == value:
            return [Problem(name, "is the same file as %s" % other, METRICS_ACCEPTED, value)]
    return []


PROGRESS_ACCEPTED = ("empty (progress from trainer_log_path), or the absolute path of the file the trainer itself "
                     "writes its progress to (e.g. /workspace/own/train.log): only read, never a file the collection "
                     "writes")


def _progress_problems(v):
    """trainer_progress_path: off when empty; else a file the collection only READS, so never one it
    writes (the log and its rotations and start record, the environment file, the launcher, the
    unit, the metrics file, the lock and its guard, the job state, anything in trainer_root)."""
    name = "trainer_progress_path"
    value = v.get(name)
    if value in (None, ""):
        return []
    p = path_problem(name, value)
    if p is not None:
        return [Problem(name, p.why, PROGRESS_ACCEPTED, value)]
    root = v.get("trainer_root")
    if isinstance(root, str) and root and (within(value, root) or within(root, value)):
        return [Problem(name, "lies inside trainer_root %s (the collection writes and prunes releases there)" % root,
                        PROGRESS_ACCEPTED, value)]
    log = v.get("trainer_log_path")
    if isinstance(log, str) and log and value.startswith(log + ".") and (
            value[len(log) + 1:].isdigit() or value[len(log) + 1:] == "start"):
        return [Problem(name, "is %s of trainer_log_path, which the launcher writes" % (
            "the start-marker record" if value.endswith(".start") else "a rotation"), PROGRESS_ACCEPTED, value)]
    written = [(other, v.get(other)) for other in ("trainer_log_path", "trainer_env_file", "trainer_launcher_path",
                                                   "trainer_lock_path", "trainer_job_state_path", "trainer_metrics_path")]
    lock = v.get("trainer_lock_path")
    if isinstance(lock, str) and lock:
        written.append(("trainer_lock_path (its guard)", lock + ".guard"))
    unit = v.get("trainer_unit_name")
    if isinstance(unit, str) and unit:
        written.append(("trainer_unit_name (its unit file)", unit_path_of(unit)))
    for other, path in written:
        if path == value:
            return [Problem(name, "is the same file as %s, which the collection writes" % other, PROGRESS_ACCEPTED,
                            value)]
    return []


def group_problems(v, entry):
    """A trainer group (``trainer_group``: an inventory group whose hosts run one distributed job) is
    deployed whole, by the deploy entry point; one member is never restarted, started, stopped or
    rolled back alone."""
    name = v.get("trainer_group")
    if not name:
        return []
    accepted = "the name of an inventory group that holds this host (or empty: not a group)"
    if not isinstance(name, str):
        return [Problem("trainer_group", "is not a group name", accepted, name)]
    members = (v.get("groups") or {}).get(name)
    if members is None:
        return [Problem("trainer_group", "names no inventory group", accepted, name)]
    if v.get("inventory_hostname") not in members:
        return [Problem("trainer_group", "names an inventory group this host is not in", accepted, name)]
    if entry != "main":
        return [Problem("trainer_group", "makes this host a member of trainer group %s (%s), whose job restarts only "
                        "as one: a %s of one member is refused" % (name, ", ".join(members), entry),
                        "a deploy of the whole group (add -e trainer_force_restart=true to restart it):%s"
                        % fix_line("ansible-playbook dflash.trainer.deploy -l %s" % shlex.quote(name)),
                        name)]
    return []


def check(v, entry="main"):
    """Every Problem with the variables ``v`` (the play's vars) for entry point ``entry``."""
    if entry not in ENTRIES:
        raise ValueError("unknown entry point %r" % entry)
    if entry == "status":
        v = {k: val for k, val in v.items() if k in _STATUS_VARS or not k.startswith("trainer_")}
    problems = []
    problems.extend(inventory_problems(v))
    problems.extend(_paths_problems(v))
    problems.extend(_placement_problems(v))
    problems.extend(_control_problems(v))
    if "trainer_unit_name" in v:
        p = unit_name_problem(v["trainer_unit_name"])
        if p:
            problems.append(p)
    if entry == "status":
        return problems
    problems.extend(_numbers_problems(v))
    problems.extend(_restart_policy_problems(v))
    problems.extend(_regex_problems(v))
    problems.extend(_pathological_problems(v, {p.variable for p in problems}))
    if "trainer_command" in v:
        problems.extend(_command_problems(v))
    if "trainer_preflight_command" in v:
        problems.extend(_command_problems(v, "trainer_preflight_command", may_be_empty=True))
    problems.extend(_env_problems(v))
    if "trainer_gpus" in v:
        problems.extend(_gpus_problems(v))
    problems.extend(_measure_problems(v))
    problems.extend(_metrics_problems(v))
    problems.extend(_progress_problems(v))
    problems.extend(host_view_problems(v))
    problems.extend(group_problems(v, entry))
    if entry == "rollback" and v.get("trainer_rollback_release"):
        rid = v["trainer_rollback_release"]
        if not isinstance(rid, str) or not _RELEASE_ID_RE.match(rid):
            problems.append(Problem("trainer_rollback_release", "is not a release id",
                                    "a release id as listed by status (e.g. dda2287ea665b415)", rid))
    return problems


def normalised(path):
    return posixpath.normpath(path)
