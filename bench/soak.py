# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Soak (issue 7 item 8): python3 bench/soak.py [--cycles 100] [--vmid 240]

Runs N deploy cycles of ``deploy.yml`` on one lab container, good releases and every fault mode
of the stand-in trainer in a fixed order (``SCHEDULE``), each cycle a new release. After each
cycle it checks the verdict from the container itself (the restart job's state file, the unit's
``systemctl show``, ``current`` / ``last_good``, the running process's ``DFLASH_RELEASE``): a good
release is proved and runs; a fault fails with its reason, the last good release runs again and
is proved. Every ``--leak-every`` cycles and at the end it checks for leaks against a baseline
taken before the first cycle: processes outside the unit, GPU memory held by anything but the
running trainer, mounts, temp files, releases beyond ``trainer_release_keep``. Prints a table and
writes ``bench/results/soak.json``. See bench/README.md.

The pure parts (schedule, verdict, leak diff, table) are importable without the lab and
unit-tested in tests/unit/test_soak_helpers.py.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.append(ROOT)  # dflash_trainer, also when the checkout is not pip-installed

from dflash_trainer.programs import ProgramNotFound, program_env, require_program  # noqa: E402

PCT = "/usr/sbin/pct"
LAB_STATE = os.environ.get("DFLASH_LAB_STATE", "/var/lib/dflash-lab")
UNIT = "dflash-trainer"
TRAINER_ROOT = "/opt/dflash-trainer"
STATE_PATH = "/var/lib/dflash-trainer/restart.json"
LOCK_PATH = "/run/dflash-trainer.deploy.lock"
KEEP = 5  # trainer_release_keep (the role's default, passed explicitly)

# Short knobs, as molecule/faults does: a cycle takes seconds.
FAST = {
    "trainer_ready_hold_s": 4,
    "trainer_ready_stall_s": 2.5,
    "trainer_ready_timeout_s": 15,
    "trainer_stop_timeout_s": 3,
    "trainer_drain_timeout_s": 6,
    "trainer_release_keep": KEEP,
    "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.5"},
}

# fault -> (fault.env knobs, regex the restart job's failure must match); from molecule/faults
FAULTS = collections.OrderedDict([
    ("import_error", ("", r"exited with status 1 after [0-9.]+ s: ModuleNotFoundError: No module named 'flash_attn'")),
    ("exit0", ("", r"exited with status 0 after")),
    ("crash_after", ("CRASH_AFTER_STEPS=3", r"exited with status 1 after [0-9.]+ s: RuntimeError")),
    ("hang_before_alloc", ("", r"not ready after 15")),
    ("partial_alloc", ("", r"GPU 5 holds 0 MiB, GPU 6 holds 0 MiB, GPU 7 holds 0 MiB while the trainer is at step")),
    ("stall", ("STALL_AFTER_STEPS=2", r"no progress for")),
    ("cuda_oom", ("ERROR_AFTER_STEPS=1", r"log shows error: .*CUDA out of memory")),
    ("nccl_error", ("ERROR_AFTER_STEPS=1", r"log shows error: .*NCCL error")),
    ("crash_loop", ("", r"(exited with status 1|restarted)")),
    ("slow_start", ("", r"not ready after 15")),
])
GOOD = "good"
# One round = 12 cycles: a good release, five faults, a good release, five faults. A fault rolls
# back to the good release before it, so the next fault is deployed over a proved trainer too.
ROUND = [GOOD] + list(FAULTS)[:5] + [GOOD] + list(FAULTS)[5:]


def log(msg):
    print("soak: " + msg, flush=True)


# --------------------------------------------------------------------------------------------
# pure helpers

def schedule(n):
    """The kind of each of ``n`` cycles: ROUND repeated (``--cycles 24`` = two rounds)."""
    return [ROUND[i % len(ROUND)] for i in range(n)]


def fault_env(kind, cycle):
    """fault.env text of a fault release (None for a good one). The cycle number is a comment:
    every cycle is a new release (content hash) even for the same fault."""
    if kind == GOOD:
        return None
    knobs, _expect = FAULTS[kind]
    return "# soak cycle %d\nFAULT=%s\n%s" % (cycle, kind, knobs + "\n" if knobs else "")


def judge_cycle(kind, rc, job, snap, before_job_id, release, last_good):
    """Problems (a list of strings, empty = right verdict) of one cycle.

    kind: GOOD or a fault; rc: ansible-playbook's exit status; job: the restart job's state file
    after the run; snap: the container's state (``probe``); before_job_id: the job id on
    record before the run; release: the id of the release deployed; last_good: the release proved
    before this cycle (a fault must roll back to it)."""
    problems = []
    unit = snap.get("unit") or {}
    result = (job or {}).get("result") or {}
    if not job or job.get("job_id") == before_job_id:
        problems.append("no new restart job (state file job id %s)" % (job or {}).get("job_id"))
    elif not job.get("done"):
        problems.append("restart job %s not done (phase %s)" % (job.get("job_id"), job.get("phase")))
    if unit.get("ActiveState") != "active" or unit.get("MainPID") in (None, "", "0"):
        problems.append("unit %s/%s, MainPID %s" % (
            unit.get("ActiveState"), unit.get("SubState"), unit.get("MainPID")))
    if snap.get("lock"):
        problems.append("deploy lock left at %s" % LOCK_PATH)
    if kind == GOOD:
        expect_running = release
        if rc != 0:
            problems.append("good release: ansible-playbook exited %s" % rc)
        if result.get("ok") is not True or result.get("release") != release or not result.get("proof"):
            problems.append("good release %s not proved by the job: ok=%s release=%s outcome=%s" % (
                release, result.get("ok"), result.get("release"), result.get("outcome") or result.get("msg")))
    else:
        expect_running = last_good
        expect = FAULTS[kind][1]
        failure = result.get("failure") or result.get("msg") or ""
        if rc == 0:
            problems.append("fault %s: ansible-playbook exited 0" % kind)
        if result.get("ok") is not False or result.get("release") != release:
            problems.append("fault %s: job ok=%s for release %s (deployed %s)" % (
                kind, result.get("ok"), result.get("release"), release))
        if not re.search(expect, failure):
            first = failure.splitlines()[0] if failure else failure
            problems.append("fault %s: reason %r does not match %r" % (kind, first, expect))
        if not result.get("rolled_back") or result.get("rollback_release") != last_good \
                or not result.get("rollback_proof") or not str(result.get("outcome", "")).startswith("Rolled back"):
            problems.append("fault %s: not rolled back to %s and proved (rolled_back=%s to %s; %s)" % (
                kind, last_good, result.get("rolled_back"), result.get("rollback_release"),
                str(result.get("rollback_failure") or result.get("outcome"))[:200]))
    for what in ("running", "current", "last_good"):
        if snap.get(what) != expect_running:
            problems.append("%s release is %s, expected %s" % (what, snap.get(what), expect_running))
    return problems


def _in_unit(proc, unit=UNIT):
    return any(line.endswith("/%s.service" % unit) for line in proc.get("cgroup", []))


def leak_report(baseline, snap, keep=KEEP, unit=UNIT):
    """What the container holds that it did not hold before the soak (``baseline`` and ``snap``:
    results of ``probe``), beyond the running unit's own process tree. Returns a dict of lists
    (empty lists = no leak):

    - processes: outside the unit's cgroup and not in the baseline (by command line, counted),
      or any trainer.py / restart job (trainer_restart, AnsiballZ, async_wrapper) outside the unit;
    - gpu_holders: GPU memory held by a pid outside the unit, or used memory no live process holds;
    - mounts: mount points not in the baseline (counted);
    - temp_files: Ansible's remote temp dirs, /tmp/ansible*, releases/.tmp-*, /tmp entries not
      in the baseline (the trainer's own torchinductor cache excepted);
    - releases: more releases than ``keep`` plus the protected ones (current and last good are
      never pruned, so the last good release may be a 6th when the newest five all failed);
    - lock: the deploy lock left behind."""
    out = {"processes": [], "gpu_holders": [], "mounts": [], "temp_files": [], "releases": [], "lock": []}
    unit_pids = {p["pid"] for p in snap.get("procs", []) if _in_unit(p, unit)}
    base = collections.Counter(p["args"] for p in baseline.get("procs", []) if not _in_unit(p, unit))
    now = collections.Counter()
    for p in snap.get("procs", []):
        if _in_unit(p, unit):
            continue
        now[p["args"]] += 1
        if re.search(r"trainer\.py|trainer_restart|AnsiballZ|async_wrapper", p["args"]):
            out["processes"].append("%d %s (outside %s.service)" % (p["pid"], p["args"][:160], unit))
    for args, n in (now - base).items():
        if not re.search(r"trainer\.py|trainer_restart|AnsiballZ|async_wrapper", args):
            out["processes"].append("%d x %s (new since the baseline)" % (n, args[:160]))
    for gpu in snap.get("gpus", []):
        held = 0
        for holder in gpu.get("processes", []):
            held += holder.get("used_mib", 0)
            if holder.get("pid") not in unit_pids:
                out["gpu_holders"].append("GPU %s: pid %s (%s) holds %s MiB" % (
                    gpu.get("index"), holder.get("pid"), holder.get("name"), holder.get("used_mib")))
        if gpu.get("used_mib", 0) > held:
            out["gpu_holders"].append("GPU %s: %s MiB used by no live process" % (
                gpu.get("index"), gpu["used_mib"] - held))
    new_mounts = collections.Counter(snap.get("mounts", [])) - collections.Counter(baseline.get("mounts", []))
    for mnt, n in new_mounts.items():
        out["mounts"].append("%s%s" % (mnt, " (x%d)" % n if n > 1 else ""))
    tmp = snap.get("tmp", {})
    out["temp_files"] += ["/root/.ansible/tmp/" + x for x in tmp.get("ansible_remote", [])]
    out["temp_files"] += tmp.get("tmp_ansible", [])
    out["temp_files"] += tmp.get("release_tmp", [])
    base_tmp = set(baseline.get("tmp", {}).get("tmp_all", []))
    out["temp_files"] += ["/tmp/" + x for x in tmp.get("tmp_all", [])
                          if x not in base_tmp and not x.startswith(("ansible", "torchinductor_"))]
    releases = snap.get("releases", [])
    protected = {r for r in (snap.get("current"), snap.get("last_good")) if r}
    allowed = keep + len(protected - set(snap.get("newest", releases)[:keep]))
    if len(releases) > allowed:
        out["releases"].append("%d releases kept, at most %d expected (keep %d): %s" % (
            len(releases), allowed, keep, ", ".join(releases)))
    if snap.get("lock"):
        out["lock"].append(LOCK_PATH)
    return out


def leak_count(report):
    return sum(len(v) for v in report.values())


def median_by_kind(cycles):
    """{kind: {'n', 'median_s', 'max_s'}} of the cycles' wall times."""
    walls = collections.defaultdict(list)
    for c in cycles:
        walls[c["kind"]].append(c["wall_s"])
    return {k: {"n": len(v), "median_s": round(statistics.median(v), 2), "max_s": round(max(v), 2)}
            for k, v in walls.items()}


def figures_table(doc):
    """Markdown table of a soak document (``run`` writes it)."""
    lines = ["| kind | cycles | wrong verdicts | median s | max s |", "|---|---|---|---|---|"]
    wrong = collections.Counter(c["kind"] for c in doc["cycles"] if c["problems"])
    for kind in [GOOD] + list(FAULTS):
        s = doc["per_kind"].get(kind)
        if s:
            lines.append("| %s | %d | %d | %.1f | %.1f |" % (kind, s["n"], wrong[kind], s["median_s"], s["max_s"]))
    lines.append("| **all** | %d | %d | %.1f | %.1f |" % (
        len(doc["cycles"]), doc["wrong_verdicts"], doc["median_cycle_s"] or 0, doc["max_cycle_s"] or 0))
    checks = doc["leak_checks"]
    lines.append("")
    lines.append("Leak checks: %d (after cycles %s), leaks found: %d%s; releases kept at most %d (keep %d)." % (
        len(checks), ", ".join(str(c["after_cycle"]) for c in checks), doc["leaks"],
        "" if not doc["leaks"] else " (" + "; ".join(
            "%s: %s" % (k, v[0]) for c in checks for k, v in c["report"].items() if v)[:600] + ")",
        doc["max_releases"], KEEP))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# the container

PROBE = r'''
import glob, json, os, subprocess, sys
UNIT, ROOT, STATE, LOCK = sys.argv[1:5]
me = os.getpid()
skip = set()
p = me
while p > 1:
    skip.add(p)
    try:
        with open("/proc/%d/stat" % p) as fh:
            p = int(fh.read().rsplit(")", 1)[1].split()[1])
    except Exception:
        break
procs = []
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) in skip:
        continue
    try:
        with open("/proc/%s/cmdline" % d, "rb") as fh:
            args = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        with open("/proc/%s/cgroup" % d) as fh:
            cg = [line.strip().split(":", 2)[2] for line in fh if line.count(":") >= 2]
        with open("/proc/%s/stat" % d) as fh:
            ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
    except Exception:
        continue
    if not args:
        continue  # kernel threads / zombies
    procs.append({"pid": int(d), "ppid": ppid, "args": args, "cgroup": sorted(set(cg))})
out = {"procs": procs}
show = subprocess.run(["systemctl", "show", UNIT, "-p", "ActiveState", "-p", "SubState", "-p", "MainPID",
                       "-p", "InvocationID", "-p", "NRestarts", "-p", "Result"], capture_output=True, text=True)
out["unit"] = dict(l.split("=", 1) for l in show.stdout.splitlines() if "=" in l)
def env_release(pid):
    try:
        with open("/proc/%s/environ" % pid, "rb") as fh:
            for kv in fh.read().split(b"\0"):
                if kv.startswith(b"DFLASH_RELEASE="):
                    return kv.split(b"=", 1)[1].decode()
    except Exception:
        return None
mp = out["unit"].get("MainPID", "0")
running = None
if mp not in ("", "0"):
    running = env_release(mp)
    if running is None:
        for q in procs:
            if q["ppid"] == int(mp):
                running = env_release(q["pid"]) or running
out["running"] = running
try:
    import fakegpu
    out["gpus"] = fakegpu.snapshot()
except Exception as e:
    out["gpus"] = []
    out["gpu_error"] = repr(e)
with open("/proc/self/mountinfo") as fh:
    out["mounts"] = sorted(l.split()[4] for l in fh)
rel = os.path.join(ROOT, "releases")
names = [n for n in os.listdir(rel)] if os.path.isdir(rel) else []
out["releases"] = sorted(n for n in names if not n.startswith("."))
out["newest"] = sorted(out["releases"], key=lambda n: (os.stat(os.path.join(rel, n)).st_mtime, n), reverse=True)
out["tmp"] = {
    "ansible_remote": sorted(os.listdir("/root/.ansible/tmp")) if os.path.isdir("/root/.ansible/tmp") else [],
    "tmp_ansible": sorted(glob.glob("/tmp/ansible*")),
    "release_tmp": sorted(os.path.join(rel, n) for n in names if n.startswith(".tmp-")),
    "tmp_all": sorted(os.listdir("/tmp")),
}
try:
    out["current"] = os.path.basename(os.readlink(os.path.join(ROOT, "current")))
except OSError:
    out["current"] = None
try:
    with open(os.path.join(ROOT, "last_good")) as fh:
        out["last_good"] = fh.read().strip() or None
except OSError:
    out["last_good"] = None
try:
    with open(STATE) as fh:
        out["job"] = json.load(fh)
except Exception:
    out["job"] = None
out["lock"] = os.path.exists(LOCK)
print(json.dumps(out))
'''


def probe(vmid):
    """The container's state in one ``pct exec`` (see PROBE)."""
    argv = [PCT, "exec", str(vmid), "--", "python3", "-c", PROBE, UNIT, TRAINER_ROOT, STATE_PATH, LOCK_PATH]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError("probe of %s failed (exit %d): %s" % (vmid, proc.returncode, proc.stderr.strip()[-2000:]))
    return json.loads(proc.stdout)


def lab_conn_vars():
    """What tests/lab/conftest.py's lab.conn_vars() gives: the lab's sshd, key and known_hosts."""
    with open(os.path.join(LAB_STATE, "lab.json"), encoding="utf-8") as fh:
        facts = json.load(fh)
    return {"ansible_connection": "dflash.trainer.pct", "ansible_host": facts["ssh_host"],
            "ansible_port": facts["ssh_port"], "ansible_user": facts["ssh_user"],
            "ansible_ssh_private_key_file": facts["ssh_private_key"],
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_pct_known_hosts_file": facts["known_hosts"]}


def make_tree(dest, stamp, fault_text=None):
    """A copy of examples/trainer with a STAMP file (a new release each time) and fault.env."""
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), dest,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "fault.env"))
    with open(os.path.join(dest, "STAMP"), "w", encoding="utf-8") as fh:
        fh.write(stamp + "\n")
    if fault_text:
        with open(os.path.join(dest, "fault.env"), "w", encoding="utf-8") as fh:
            fh.write(fault_text)
    return dest


def release_id(src):
    sys.path.insert(0, os.path.join(ROOT, "plugins", "module_utils", "release"))
    import scan as _release_scan  # pylint: disable=import-outside-toplevel,import-error
    return _release_scan.scan_tree(src).release_id


def ansible_env(cp_dir):
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                ANSIBLE_RETRY_FILES_ENABLED="0", ANSIBLE_SSH_CONTROL_PATH_DIR=cp_dir)


def ansible_playbook():
    """ansible-playbook on PATH, else beside this Python (a venv's bin/ when run as .venv/bin/python);
    SystemExit saying where it looked when neither has it."""
    try:
        return require_program("ansible-playbook")
    except ProgramNotFound as e:
        raise SystemExit("%s: %s" % (os.path.basename(sys.argv[0] or "bench"), e)) from None


def playbook(inventory, extra, cp_dir, limit=None, forks=None, timeout=600):
    program = ansible_playbook()
    argv = [program, "-i", inventory,
            os.path.join(ROOT, "deploy.yml"), "-e", json.dumps(extra)]
    if limit:
        argv += ["-l", limit]
    if forks:
        argv += ["-f", str(forks)]
    m0 = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=program_env(program, ansible_env(cp_dir)), capture_output=True,
                          text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - m0


def lab_up(ids, recreate=False):
    base = [sys.executable, os.path.join(ROOT, "lab", "lab.py")]
    if recreate:
        subprocess.run(base + ["down", "--ids"] + [str(i) for i in ids], check=True, cwd=ROOT)
    subprocess.run(base + ["up", "--ids"] + [str(i) for i in ids], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def settled_leaks(vmid, baseline, tries=3, pause=3.0):
    """Leak report that persists across ``tries`` probes ``pause`` s apart (a process that is
    just exiting is not a leak); returns (report, probe)."""
    for i in range(tries):
        pr = probe(vmid)
        report = leak_report(baseline, pr)
        if not leak_count(report) or i == tries - 1:
            return report, pr
        time.sleep(pause)
    return report, pr  # pragma: no cover


def run(args):
    vmid = args.vmid
    lab_up([vmid], recreate=args.recreate)
    work = tempfile.mkdtemp(prefix="dflash-soak-")
    cp_dir = os.path.join(work, "cp")
    os.makedirs(cp_dir)
    host = "soak-%d" % vmid
    inventory = os.path.join(work, "hosts.json")
    conn = dict(lab_conn_vars(), ansible_control_path_dir=cp_dir)
    with open(inventory, "w", encoding="utf-8") as fh:
        json.dump({"all": {"hosts": {host: {"proxmox_vmid": vmid}}, "vars": conn}}, fh)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    baseline = probe(vmid)
    if baseline.get("unit", {}).get("ActiveState") == "active" or baseline["releases"]:
        log("container %d is not fresh (trainer %s, %d releases): the baseline takes it as it is; "
            "--recreate starts from a new container" % (
                vmid, baseline["unit"].get("ActiveState"), len(baseline["releases"])))
    log("baseline: %d processes, %d mounts, /tmp %s" % (len(baseline["procs"]), len(baseline["mounts"]),
                                                        baseline["tmp"]["tmp_all"]))
    last_good = baseline.get("last_good")
    cycles, leak_checks = [], []
    kinds = schedule(args.cycles)
    if kinds[0] != GOOD and not last_good:
        raise SystemExit("the first cycle must be a good release (nothing to roll back to)")
    max_releases = 0
    try:
        for n, kind in enumerate(kinds, 1):
            src = make_tree(os.path.join(work, "c%03d" % n), "soak cycle %d %s %s" % (n, kind, started),
                            fault_env(kind, n))
            rid = release_id(src)
            before = (probe(vmid).get("job") or {}).get("job_id") if n == 1 else cycles[-1]["job_id"]
            extra = dict(FAST, trainer_target_hosts=host, trainer_src=src)
            rc, out, wall = playbook(inventory, extra, cp_dir, limit=host)
            pr = probe(vmid)
            job = pr.get("job")
            problems = judge_cycle(kind, rc, job, pr, before, rid, last_good)
            result = (job or {}).get("result") or {}
            max_releases = max(max_releases, len(pr["releases"]))
            cycle = {"cycle": n, "kind": kind, "release": rid, "rc": rc, "wall_s": round(wall, 2),
                     "job_id": (job or {}).get("job_id"), "running": pr.get("running"),
                     "main_pid": pr["unit"].get("MainPID"), "problems": problems,
                     "reason": (result.get("failure") or "").splitlines()[0] if result.get("failure") else None,
                     "outcome": str(result.get("outcome") or "")[:300], "releases": len(pr["releases"])}
            if problems:
                cycle["output_tail"] = out[-4000:]
            cycles.append(cycle)
            if kind == GOOD and not problems:
                last_good = rid
            log("cycle %3d/%d %-17s %5.1f s rc=%d %s%s" % (
                n, len(kinds), kind, wall, rc, "OK" if not problems else "WRONG: " + "; ".join(problems),
                "" if kind == GOOD else " (%s)" % (cycle["reason"] or "")[:90]))
            if n % args.leak_every == 0 or n == len(kinds):
                report, pr2 = settled_leaks(vmid, baseline)
                leak_checks.append({"after_cycle": n, "report": report, "processes": len(pr2["procs"]),
                                    "releases": pr2["releases"]})
                log("leak check after cycle %d: %s" % (n, "none" if not leak_count(report) else json.dumps(
                    {k: v for k, v in report.items() if v})))
            if args.stop_on_wrong and problems:
                log("stopping at the first wrong verdict (--stop-on-wrong)")
                break
    finally:
        shutil.rmtree(work, ignore_errors=True)
    walls = [c["wall_s"] for c in cycles]
    doc = {
        "started": started, "total_s": round(time.monotonic() - t0, 1), "vmid": vmid,
        "cycles_asked": args.cycles, "settings": {"knobs": FAST, "round": ROUND, "leak_every": args.leak_every,
                                                  "keep": KEEP, "faults": {k: v[0] for k, v in FAULTS.items()}},
        "machine": {"cpus": os.cpu_count(), "loadavg_after": os.getloadavg()},
        "cycles": cycles, "per_kind": median_by_kind(cycles),
        "wrong_verdicts": sum(1 for c in cycles if c["problems"]),
        "median_cycle_s": round(statistics.median(walls), 2) if walls else None,
        "max_cycle_s": max(walls) if walls else None,
        "leak_checks": leak_checks, "leaks": sum(leak_count(c["report"]) for c in leak_checks),
        "max_releases": max_releases, "baseline": {"procs": [p["args"] for p in baseline["procs"]],
                                                   "mounts": len(baseline["mounts"]), "tmp": baseline["tmp"]},
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    print()
    print("Soak: %d cycles on container %d in %.0f s (%s), knobs %s." % (
        len(cycles), vmid, doc["total_s"], started, json.dumps(FAST, sort_keys=True)))
    print(figures_table(doc))
    print("\nwritten: %s" % args.output)
    return 1 if doc["wrong_verdicts"] or doc["leaks"] or len(cycles) < args.cycles else 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench/soak.py", description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=100, help="deploy cycles (default 100; 12 = one round of all kinds)")
    p.add_argument("--vmid", type=int, default=240, help="lab container (default 240)")
    p.add_argument("--leak-every", type=int, default=10, help="leak check every N cycles (and at the end)")
    p.add_argument("--recreate", action="store_true", help="lab.py down, then up: a fresh container")
    p.add_argument("--stop-on-wrong", action="store_true", help="stop at the first wrong verdict")
    p.add_argument("--output", default=os.path.join(HERE, "results", "soak.json"))
    args = p.parse_args(argv)
    if args.cycles < 1 or args.leak_every < 1:
        p.error("--cycles and --leak-every must be at least 1")
    log(shlex.join(["soak.py"] + (argv if argv is not None else sys.argv[1:])))
    ansible_playbook()  # before the lab is touched: a missing ansible-playbook says so, no traceback
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
