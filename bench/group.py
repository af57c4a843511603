# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A trainer group's forced restart against a single host's: `deploy.yml -e trainer_force_restart=true`
of the stand-in distributed trainer (examples/dist_trainer) on one plain host (no trainer_group,
DIST_TRAINER_NNODES=1), on a group of 2 and on a group of 3, the median wall time of the whole
ansible-playbook command each, and the ratios group/single (goal: <= 1.3x).

    python bench/group.py [--reps 3] [--forks 10] [--reuse-lab]

Containers 350, 351 and 352 (`lab.py group --fresh`: fresh containers sharing one rendezvous directory;
the single host is 350 with NNODES=1, the mount present). Every case: a first deploy (not timed; it
starts the trainer with this case's environment), then ``--reps`` forced restarts, each checked: rc 0,
every member's restart job ended ok, every member's unit restarted (new InvocationID). Task times
come from the ansible.posix.json callback (controller clock) and say where the time goes. Prints a
table and writes bench/results/group-<UTC date>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(ROOT)  # dflash_trainer, also when the checkout is not pip-installed
sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # benchlib

import benchlib as bl  # noqa: E402
from dflash_trainer.programs import ProgramNotFound, program_env, require_program  # noqa: E402

CTS = ("350", "351", "352")
LAB_GROUP = "bench-group350"  # the rendezvous directory every container of the bench shares
UNIT = "dflash-trainer"
# the readiness settings of tests/lab/test_group_lab.py, the same for every case
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 40,
        "trainer_restart_sec": 2, "trainer_drain_timeout_s": 20}
CASES = (("single", 1), ("group2", 2), ("group3", 3))
GOAL = 1.3  # group / single, medians


def log(msg):
    sys.stderr.write("group-bench: %s\n" % msg)
    sys.stderr.flush()


def ansible_playbook():
    try:
        return require_program("ansible-playbook")
    except ProgramNotFound as e:
        raise SystemExit("group-bench: %s" % e) from None


def lab_facts():
    with open(os.path.join(os.environ.get("DFLASH_LAB_STATE", "/var/lib/dflash-lab"), "lab.json")) as fh:
        return json.load(fh)


def host_name(ct):
    return "ct%s" % ct


def inventory(case, n, path):
    """The inventory of one case: n containers; n == 1 a plain host, else a trainer group named ``case``
    (per-host rank, progress read on rank 0 only), as tests/lab/test_group_lab.py builds it."""
    facts = lab_facts()
    conn = {"ansible_connection": "dflash.trainer.pct", "ansible_host": facts["ssh_host"],
            "ansible_port": facts["ssh_port"], "ansible_user": facts["ssh_user"],
            "ansible_ssh_private_key_file": facts["ssh_private_key"],
            "ansible_python_interpreter": "/usr/bin/python3", "ansible_pct_known_hosts_file": facts["known_hosts"]}
    hosts = {}
    for rank, ct in enumerate(CTS[:n]):
        host = dict(conn, proxmox_vmid=int(ct),
                    trainer_env={"DIST_TRAINER_NODE_RANK": str(rank), "DIST_TRAINER_NNODES": str(n)})
        if n > 1:
            host["trainer_group_progress"] = rank == 0
        hosts[host_name(ct)] = host
    children = {"trainer_hosts": {"hosts": {h: {} for h in hosts}}}
    if n > 1:
        children[case] = {"hosts": {h: {} for h in hosts}, "vars": {"trainer_group": case}}
    # host variables live under all.hosts; the groups name them
    with open(path, "w") as fh:
        json.dump({"all": {"hosts": hosts, "children": children}}, fh, indent=1)
    return path


def cpu_times():
    """(busy, total) jiffies of the whole machine, from /proc/stat's first line."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def play(inv, extra, forks):
    """One ansible-playbook deploy.yml run with the json callback: (wall s, rc, doc or None, stdout, stderr,
    facts: epoch start/end, the controller's CPU seconds (ansible-playbook and what it started: ssh ...),
    the whole machine's busy share of its CPUs during the run)."""
    program = ansible_playbook()
    env = program_env(program, dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                                    ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_VERBOSE_TO_STDERR="1"))
    argv = [program, "-i", inv, "-f", str(forks), os.path.join(ROOT, "deploy.yml"), "-e", json.dumps(extra)]
    ru0, (busy0, total0) = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_times()
    load1 = os.getloadavg()[0]
    t_start = time.time()
    began = time.monotonic()
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    wall = time.monotonic() - began
    t_end = time.time()
    ru1, (busy1, total1) = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_times()
    facts = {"t_start": t_start, "t_end": t_end, "load1_before": round(load1, 2),
             "controller_cpu_s": round((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime), 2),
             "machine_busy": round((busy1 - busy0) / float(max(1, total1 - total0)), 3)}
    try:
        doc = bl.json_document(res.stdout)
    except ValueError:
        doc = None
    return wall, res.returncode, doc, res.stdout, res.stderr, facts


def unit_state(ct):
    out = subprocess.run(["pct", "exec", ct, "--", "systemctl", "show", UNIT, "-p", "InvocationID", "-p", "MainPID",
                          "-p", "ActiveState"], capture_output=True, text=True, timeout=60, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def failure_words(doc, stdout, stderr):
    """The failed tasks' messages (the json document), else the output's tail."""
    words = []
    for row in bl.task_results(doc) if doc else []:
        r = row["result"]
        if r.get("failed") or r.get("unreachable"):
            words.append("%s [%s]: %s" % (row["host"], row["name"], r.get("msg", "")))
    return "\n".join(words) if words else (stdout[-3000:] + "\n" + stderr[-2000:])


def check_run(doc, n, before):
    """Problems with a forced restart (empty: it did what it should): every member's restart job ended
    ok and every member's unit has a new InvocationID."""
    problems = []
    rows = bl.task_results(doc)
    for ct in CTS[:n]:
        _row, job = bl.job_outcome(rows, host_name(ct))
        if not job or not job.get("ok"):
            problems.append("%s: no restart job ended ok (%s)" % (ct, (job or {}).get("msg", "none seen")))
        after = unit_state(ct)
        if after.get("ActiveState") != "active" or after.get("InvocationID") == before[ct].get("InvocationID"):
            problems.append("%s: unit not restarted (%s -> %s)" % (ct, before[ct], after))
    return problems


def task_spans(doc):
    """[(task name, seconds from the task's start to its last host's result)] in play order, skipped-only
    tasks left out; the span of a task is the same for every host of the batch."""
    spans = []
    for play_ in doc.get("plays", []):
        for task in play_.get("tasks", []):
            info = task.get("task", {})
            dur = info.get("duration", {})
            hosts = task.get("hosts", {})
            if not dur.get("start") or not dur.get("end") or not hosts:
                continue
            if all(r.get("skipped") for r in hosts.values()):
                continue
            spans.append((info.get("name", ""), bl.parse_iso_utc(dur["end"]) - bl.parse_iso_utc(dur["start"])))
    return spans


def first_last(doc):
    """(first task's start, last task's end), epoch seconds."""
    starts, ends = [], []
    for play_ in doc.get("plays", []):
        for task in play_.get("tasks", []):
            dur = task.get("task", {}).get("duration", {})
            if dur.get("start"):
                starts.append(bl.parse_iso_utc(dur["start"]))
            if dur.get("end"):
                ends.append(bl.parse_iso_utc(dur["end"]))
    return (min(starts), max(ends)) if starts and ends else (None, None)


def breakdown(runs):
    """Median seconds per task name over the runs (a name repeated in a run is summed), in the order of
    the first run, and the median of: ansible-playbook's start-up to the first task, the last task's end
    to its exit, the tasks' own sum, and the gaps between tasks."""
    per = {}
    order = []
    for r in runs:
        seen = {}
        for name, span in r["spans"]:
            seen[name] = seen.get(name, 0.0) + span
            if name not in order:
                order.append(name)
        for name, total in seen.items():
            per.setdefault(name, []).append(total)
    tasks = [(name, statistics.median(per[name]), len(per[name])) for name in order]

    def med(key):
        return statistics.median([r[key] for r in runs])
    return {"tasks": [{"name": n, "median_s": round(s, 3), "runs": k} for n, s, k in tasks],
            "startup_s": round(med("startup_s"), 3), "exit_s": round(med("exit_s"), 3),
            "tasks_sum_s": round(med("tasks_sum_s"), 3), "gaps_s": round(med("gaps_s"), 3),
            "tasks_run": med("tasks_run"), "controller_cpu_s": round(med("controller_cpu_s"), 2),
            "machine_busy": round(med("machine_busy"), 3)}


def job_figures(doc, n):
    """Each member's restart job as the role took it: its proof's timing keys (whatever the job reports)."""
    rows = bl.task_results(doc)
    out = {}
    for ct in CTS[:n]:
        row, job = bl.job_outcome(rows, host_name(ct))
        if job:
            out[ct] = {"ok": job.get("ok"), "outcome": job.get("outcome"), "figures": job.get("figures"),
                       "proof": {k: v for k, v in (job.get("proof") or {}).items()
                                 if isinstance(v, (int, float, str, bool)) or v is None}}
    return out


def run_case(case, n, inv, reps, forks, src):
    extra = dict(FAST, trainer_src=src)
    log("%s: first deploy on %s (not timed)" % (case, " ".join(CTS[:n])))
    wall, rc, doc, out, err, _facts = play(inv, extra, forks)
    if rc != 0:
        raise SystemExit("group-bench: %s: the first deploy failed (rc %d):\n%s" % (case, rc, failure_words(doc, out, err)))
    first = round(wall, 3)
    runs = []
    for rep in range(reps):
        before = {ct: unit_state(ct) for ct in CTS[:n]}
        wall, rc, doc, out, err, facts = play(inv, dict(extra, trainer_force_restart=True), forks)
        if rc != 0 or doc is None:
            raise SystemExit("group-bench: %s: forced restart %d failed (rc %d):\n%s" % (
                case, rep + 1, rc, failure_words(doc, out, err)))
        problems = check_run(doc, n, before)
        if problems:
            raise SystemExit("group-bench: %s: forced restart %d did not restart every member:\n%s" % (
                case, rep + 1, "\n".join(problems)))
        spans = task_spans(doc)
        t0, t1 = first_last(doc)
        tasks_sum = sum(s for _n, s in spans)
        run = {"wall_s": round(wall, 3), "spans": [(name, round(s, 3)) for name, s in spans],
               "startup_s": t0 - facts["t_start"], "exit_s": facts["t_end"] - t1, "tasks_sum_s": tasks_sum,
               "gaps_s": (t1 - t0) - tasks_sum, "tasks_run": len(spans), "recap": bl.recap_totals(doc),
               "jobs": job_figures(doc, n), "controller_cpu_s": facts["controller_cpu_s"],
               "machine_busy": facts["machine_busy"], "load1_before": facts["load1_before"]}
        runs.append(run)
        log("%s: forced restart %d/%d: %.2f s (tasks %.2f s, start-up %.2f s, exit %.2f s, controller CPU %.1f s, "
            "machine busy %.0f %%, load %.1f)" % (
                case, rep + 1, reps, wall, tasks_sum, run["startup_s"], run["exit_s"], facts["controller_cpu_s"],
                100 * facts["machine_busy"], facts["load1_before"]))
    walls = [r["wall_s"] for r in runs]
    return {"case": case, "hosts": list(CTS[:n]), "first_deploy_s": first, "summary": bl.summary(walls),
            "breakdown": breakdown(runs), "runs": runs}


def ansible_core_version():
    out = subprocess.run([ansible_playbook(), "--version"], capture_output=True, text=True, check=False).stdout
    first = out.splitlines()[0] if out else ""
    return first.split("core", 1)[-1].strip(" ]") if "core" in first else first


def table(results):
    single = results["single"]["summary"]["median"]
    lines = ["| case | hosts | median | min | max | / single | goal |", "|---|---|---|---|---|---|---|"]
    for case, _n in CASES:
        r = results[case]
        s = r["summary"]
        ratio = bl.ratio(s["median"], single)
        goal = "" if case == "single" else ("≤ %.1f×: %s" % (GOAL, "met" if ratio <= GOAL else "MISSED"))
        lines.append("| %s | %s | %.2f s | %.2f s | %.2f s | %s | %s |" % (
            case, " ".join(r["hosts"]), s["median"], s["min"], s["max"],
            "-" if case == "single" else "%.2f×" % ratio, goal))
    return "\n".join(lines)


def where_table(results, top=12):
    """The tasks with the largest median span per case, side by side with the start-up and exit."""
    lines = []
    for case, _n in CASES:
        b = results[case]["breakdown"]
        lines.append("%s: start-up %.2f s, %d tasks %.2f s, gaps %.2f s, exit %.2f s; controller CPU %.1f s, "
                     "machine busy %.0f %% (medians)" % (
                         case, b["startup_s"], b["tasks_run"], b["tasks_sum_s"], b["gaps_s"], b["exit_s"],
                         b["controller_cpu_s"], 100 * b["machine_busy"]))
        for t in sorted(b["tasks"], key=lambda t: -t["median_s"])[:top]:
            lines.append("    %6.2f s  %s" % (t["median_s"], t["name"]))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--forks", type=int, default=10)
    p.add_argument("--reuse-lab", action="store_true", help="skip `lab.py group --fresh` (containers as they are)")
    args = p.parse_args(argv)
    if args.reps < 1:
        raise SystemExit("group-bench: --reps must be at least 1")
    version = ansible_core_version()  # before the lab is touched: a missing ansible-playbook says so
    load_before = os.getloadavg()
    began = time.time()
    if not args.reuse_lab:
        log("lab.py group --name %s --ids %s --fresh" % (LAB_GROUP, " ".join(CTS)))
        subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "group", "--name", LAB_GROUP, "--ids",
                        *CTS, "--fresh"], check=True, stdout=subprocess.DEVNULL)
    src = os.path.join(ROOT, "examples", "dist_trainer")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-group-") as work:
        for case, n in CASES:
            inv = inventory(case, n, os.path.join(work, "%s.json" % case))
            results[case] = run_case(case, n, inv, args.reps, args.forks, src)
    single = results["single"]["summary"]["median"]
    ratios = {case: round(bl.ratio(results[case]["summary"]["median"], single), 3) for case, _n in CASES[1:]}
    doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)), "took_s": round(time.time() - began, 1),
           "machine": {"nproc": os.cpu_count(), "ansible_core": version, "python": platform.python_version(),
                       "load_before": [round(x, 2) for x in load_before],
                       "load_after": [round(x, 2) for x in os.getloadavg()]},
           "settings": {"reps": args.reps, "forks": args.forks, "containers": list(CTS), "lab_group": LAB_GROUP,
                        "trainer_src": "examples/dist_trainer", "extra_vars": FAST,
                        "force": "trainer_force_restart=true after a first deploy"},
           "goal": {"group_over_single_max": GOAL},
           "ratios": ratios, "cases": results}
    out_dir = os.path.join(ROOT, "bench", "results")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "group-%s.json" % time.strftime("%Y-%m-%d", time.gmtime(began)))
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
    print("Forced restart, deploy.yml -e trainer_force_restart=true, -f %d, %d reps; %d CPUs, ansible-core %s; "
          "load %.1f before / %.1f after" % (args.forks, args.reps, os.cpu_count(), version, load_before[0],
                                             os.getloadavg()[0]))
    print(table(results))
    print()
    print(where_table(results))
    print("\nwritten: %s" % os.path.relpath(path, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
