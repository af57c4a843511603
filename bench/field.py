# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy at field cost (issue 8 item 6): no-op deploy, forced restart and status, with the
lab's pct answering at once and after a 500 ms start-up per call (Proxmox's pct is a Perl program
that loads its cluster stack on every call), for dflash.trainer and for the plain-Ansible deploy
a user has today (bench/plain: copy + template + systemd_service + wait_for over
community.proxmox.proxmox_pct_remote), side by side in one run.

    python bench/field.py [--reps 3] [--delays 0,0.5]       # make bench-field

Remote calls are counted from each connection's -vvv trace (EXEC, PUT, FETCH), in one untimed run
per case; the timed runs go without the trace. Containers 227
(ours) and 228 (baseline); the delay is the lab pct's per-container file
/etc/dflash-lab/pct-delay.<vmid>, removed at the end. Prints a Markdown table and writes
bench/results/field.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(ROOT)  # dflash_trainer, also when the checkout is not pip-installed

from dflash_trainer.programs import ProgramNotFound, program_env, require_program  # noqa: E402

OURS, PLAIN = "227", "228"
CONF_DIR = os.environ.get("DFLASH_LAB_CONF", "/etc/dflash-lab")
CALL = re.compile(r"^<[^>]+> (?:PCT )?(EXEC|PUT|FETCH)\b", re.M)
# the stand-in trainer: 0.3 s of start-up, a step every 0.25 s; the proof: 2 steps, then a 2 s hold
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 60,
        "trainer_ready_min_steps": 2,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3", "FAKE_TRAINER_STEP_INTERVAL_S": "0.25"},
        "trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer")}


def log(msg):
    sys.stderr.write("field: %s\n" % msg)


def lab_facts():
    with open(os.path.join(os.environ.get("DFLASH_LAB_STATE", "/var/lib/dflash-lab"), "lab.json")) as fh:
        return json.load(fh)


def inventories(work):
    facts = lab_facts()
    conn = {"ansible_host": facts["ssh_host"], "ansible_port": facts["ssh_port"], "ansible_user": facts["ssh_user"],
            "ansible_ssh_private_key_file": facts["ssh_private_key"],
            "ansible_python_interpreter": "/usr/bin/python3"}
    ours = dict(conn, ansible_connection="dflash.trainer.pct", ansible_pct_known_hosts_file=facts["known_hosts"])
    # proxmox_pct_remote (paramiko) reads only ~/.ssh/known_hosts: checking off, for this loopback lab only
    plain = dict(conn, ansible_connection="community.proxmox.proxmox_pct_remote", ansible_host_key_checking=False,
                 plain_src=os.path.join(ROOT, "examples", "trainer"))
    paths = {}
    for name, vmid, conn_vars in (("ours", OURS, ours), ("plain", PLAIN, plain)):
        path = os.path.join(work, "%s.json" % name)
        with open(path, "w") as fh:
            json.dump({"all": {"hosts": {"%s-%s" % (name, vmid): {"proxmox_vmid": int(vmid)}}, "vars": conn_vars}}, fh)
        paths[name] = path
    return paths


def ansible_playbook():
    """ansible-playbook on PATH, else beside this Python (.venv/bin); SystemExit saying where it looked."""
    try:
        return require_program("ansible-playbook")
    except ProgramNotFound as e:
        raise SystemExit("field: %s" % e) from None


def play(inventory, playbook, extra=None, trace=False):
    """(wall seconds, remote calls, rc, output) of one ansible-playbook run; remote calls are
    counted only with ``trace`` (a -vvv run, never one that is timed: the trace costs time)."""
    program = ansible_playbook()
    env = program_env(program, dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1"))
    argv = [program] + (["-vvv"] if trace else []) + ["-i", inventory, playbook]
    if extra:
        argv += ["-e", json.dumps(extra)]
    began = time.monotonic()
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    wall = time.monotonic() - began
    return wall, (len(CALL.findall(res.stdout)) if trace else None), res.returncode, res.stdout


def set_delay(vmid, seconds):
    os.makedirs(CONF_DIR, exist_ok=True)
    path = os.path.join(CONF_DIR, "pct-delay.%s" % vmid)
    if seconds:
        with open(path, "w") as fh:
            fh.write("%g\n" % seconds)
    elif os.path.exists(path):
        os.unlink(path)


CASES = (
    # (what, ours: playbook + extra, plain: playbook + extra)
    ("no-op deploy", ("deploy.yml", FAST), ("bench/plain/deploy.yml", None)),
    ("forced restart", ("deploy.yml", dict(FAST, trainer_force_restart=True)),
     ("bench/plain/deploy.yml", {"plain_restart": True})),
    ("status", ("playbooks/status.yml", {"trainer_target_hosts": "all"}), ("bench/plain/status.yml", None)),
    # the floor: ansible-playbook's start-up, one ping over the same connection, the exit
    ("floor: one remote call", ("bench/floor/one_call.yml", None), ("bench/floor/one_call.yml", None)),
)
FLOOR_PLAYBOOK = "bench/floor/one_call.yml"


def measure(paths, delays, reps):
    rows = []
    for delay in delays:
        for vmid in (OURS, PLAIN):
            set_delay(vmid, delay)
        try:
            for what, ours, plain in CASES:
                row = {"case": what, "delay_s": delay}
                for name, (playbook, extra) in (("ours", ours), ("plain", plain)):
                    walls, paired = [], []
                    # one -vvv run counts the remote calls (untimed), then reps timed runs without the trace;
                    # each of ours right after a floor run of its own (the ratio is then paired: a machine
                    # whose speed drifts during the run moves both)
                    for rep in range(reps + 1):
                        if rep and name == "ours" and what != FLOOR_CASE:
                            paired.append(play(paths[name], os.path.join(ROOT, FLOOR_PLAYBOOK))[0])
                        wall, n, rc, out = play(paths[name], os.path.join(ROOT, playbook), extra, trace=rep == 0)
                        if rc != 0:
                            raise SystemExit("field: %s %s failed (rc %d):\n%s" % (name, what, rc, out[-3000:]))
                        if rep == 0:
                            calls = n
                        else:
                            walls.append(wall)
                    row[name] = {"wall_min": round(min(walls), 2), "wall_median": round(statistics.median(walls), 2),
                                 "calls": calls}
                    if paired:
                        row[name]["floor_median"] = round(statistics.median(paired), 2)
                    log("delay %gs %-15s %-5s median %.2f s, %d remote calls" % (
                        delay, what, name, row[name]["wall_median"], row[name]["calls"]))
                row["speedup"] = round(row["plain"]["wall_median"] / row["ours"]["wall_median"], 2)
                rows.append(row)
        finally:
            for vmid in (OURS, PLAIN):
                set_delay(vmid, 0)
    return rows


# Targets as ratios to the floor of the same run and pct delay (only ratios carry over between
# machines): a no-op deploy <= 1.3x the floor, status <= 1.2x the floor, a forced restart <= the floor
# + 1.5 s beyond the trainer's own start-up and hold.
FLOOR_CASE = "floor: one remote call"
RATIO_TARGETS = {"no-op deploy": 1.3, "status": 1.2}
RESTART_BEYOND_FLOOR_S = 1.5
# the trainer's own as configured: its start-up, the steps the proof waits for before its hold, and
# the hold - the earliest moment any proof of this trainer could end, its interpreter's start aside
TRAINER_OWN_S = (float(FAST["trainer_env"]["FAKE_TRAINER_STARTUP_S"])
                 + FAST["trainer_ready_min_steps"] * float(FAST["trainer_env"]["FAKE_TRAINER_STEP_INTERVAL_S"])
                 + FAST["trainer_ready_hold_s"])
# ... and as measured: the release's run.sh started in the container (the unit stopped, so the GPUs
# are free), timed from its spawn to its min_steps-th progress line, plus the hold. The launcher and
# everything around the start stay overhead.
OWN_PROBE = r"""
import os, subprocess, sys, time
n, env = int(sys.argv[1]), dict(os.environ, **dict(a.split("=", 1) for a in sys.argv[2:]))
began = time.monotonic()
p = subprocess.Popen(["./run.sh"], cwd="%s/current", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
seen = 0
for line in p.stdout:
    seen += line.startswith(b"step=")
    if seen >= n:
        break
took = time.monotonic() - began
p.terminate()
p.wait()
print("%%.3f" %% took if seen >= n else "none")
"""


def trainer_own_s(vmid, reps=3, root="/opt/dflash-trainer", unit="dflash-trainer"):
    """(median seconds from spawn to the proof's steps, each rep) of the release's run.sh in container
    ``vmid``, the unit stopped meanwhile (the caller's next deploy starts and proves it again)."""
    pct = ["pct", "exec", vmid, "--"]
    subprocess.run(pct + ["systemctl", "stop", unit], check=True)
    env = ["%s=%s" % kv for kv in sorted(FAST["trainer_env"].items())] + ["PYTHONUNBUFFERED=1"]
    took = []
    for _rep in range(reps):
        res = subprocess.run(pct + ["python3", "-c", OWN_PROBE % root, str(FAST["trainer_ready_min_steps"])] + env,
                             capture_output=True, text=True, timeout=60, check=False)
        if res.returncode != 0 or res.stdout.strip() in ("", "none"):
            raise SystemExit("field: the trainer's own start-up could not be measured: %s" % (res.stderr or res.stdout))
        took.append(float(res.stdout.strip()))
    return statistics.median(took), took


def floors(rows):
    """{pct delay: our floor's median} of the rows that measured the floor."""
    return {r["delay_s"]: r["ours"]["wall_median"] for r in rows if r["case"] == FLOOR_CASE}


def verdict(row, floor_s, own_s):
    """(our median against the floor, words with the target and met/MISSED) for one row; the floor paired
    with the row's own runs (``floor_median``), else the floor of the row's pct delay; (None, "") where
    neither was measured."""
    paired = row["ours"].get("floor_median")  # the floor paired with the row's runs, when measured
    floor_s = floor_s if paired is None else paired
    if floor_s is None or row["case"] == FLOOR_CASE:
        return None, ""
    name = "the floor" if paired is None else "its paired floor (%.2f s)" % paired
    ours = row["ours"]["wall_median"]
    ratio = ours / floor_s
    if row["case"] in RATIO_TARGETS:
        limit = RATIO_TARGETS[row["case"]]
        return ratio, "%.2f× %s (≤ %g×: %s)" % (ratio, name, limit, "met" if ratio <= limit else "MISSED")
    if row["case"] == "forced restart":
        beyond = ours - own_s - floor_s
        return ratio, "%s + trainer's own (%.2f s) + %.2f s (≤ %g s: %s)" % (
            name, own_s, beyond, RESTART_BEYOND_FLOOR_S,
            "met" if beyond <= RESTART_BEYOND_FLOOR_S else "MISSED")
    return ratio, "%.2f× %s" % (ratio, name)


def table(rows, own_s=TRAINER_OWN_S):
    out = ["| case | pct delay | ours: median (min) | ours: remote calls | plain Ansible: median (min) | "
           "plain: remote calls | plain / ours | ours against the floor |", "|---|---|---|---|---|---|---|---|"]
    floor = floors(rows)
    for r in rows:
        _ratio, words = verdict(r, floor.get(r["delay_s"]), own_s)
        out.append("| %s | %g s | %.2f s (%.2f) | %d | %.2f s (%.2f) | %d | %.2f× | %s |" % (
            r["case"], r["delay_s"], r["ours"]["wall_median"], r["ours"]["wall_min"], r["ours"]["calls"],
            r["plain"]["wall_median"], r["plain"]["wall_min"], r["plain"]["calls"], r["speedup"], words))
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--delays", default="0,0.5", help="pct start-up delays to model, seconds (comma list)")
    args = p.parse_args(argv)
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    ansible_playbook()  # before the lab is touched: a missing ansible-playbook says so, no traceback
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", OURS, PLAIN], check=True,
                   stdout=subprocess.DEVNULL)
    work = os.path.join(ROOT, "bench", "results")
    os.makedirs(work, exist_ok=True)
    paths = inventories(work)
    log("first deploys (not timed)")
    for name, playbook, extra in (("ours", "deploy.yml", FAST), ("plain", "bench/plain/deploy.yml", None)):
        _wall, _n, rc, out = play(paths[name], os.path.join(ROOT, playbook), extra)
        if rc != 0:
            raise SystemExit("field: first %s deploy failed:\n%s" % (name, out[-3000:]))
    startup_s, startup_reps = trainer_own_s(OURS)
    own_s = startup_s + FAST["trainer_ready_hold_s"]
    log("the trainer's own: %.2f s to %d steps (%s), + %g s hold = %.2f s (%.2f s as configured)" % (
        startup_s, FAST["trainer_ready_min_steps"], ", ".join("%.2f" % t for t in startup_reps),
        FAST["trainer_ready_hold_s"], own_s, TRAINER_OWN_S))
    _wall, _n, rc, out = play(paths["ours"], os.path.join(ROOT, "deploy.yml"), FAST)  # started and proved again
    if rc != 0:
        raise SystemExit("field: the deploy after the start-up probe failed:\n%s" % out[-3000:])
    rows = measure(paths, delays, args.reps)
    floor = floors(rows)
    for r in rows:
        ratio, r["against_floor"] = verdict(r, floor.get(r["delay_s"]), own_s)
        r["ratio_to_floor"] = None if ratio is None else round(ratio, 3)
    text = table(rows, own_s)
    print(text)
    with open(os.path.join(work, "field.json"), "w") as fh:
        json.dump({"reps": args.reps, "delays": delays, "rows": rows, "trainer_own_s": round(own_s, 3),
                   "trainer_startup_s": startup_reps, "trainer_own_configured_s": TRAINER_OWN_S,
                   "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
