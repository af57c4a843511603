# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet under fault (issue 7 item 9): python3 bench/fleet_fault.py [--ids 240 ... 247] [--bad 4]

Eight lab containers. A good release is deployed to all of them; then a new release that is good
everywhere except on one host (the 4th by default: its host var ``trainer_src`` is the same tree
with ``FAULT=import_error``), once with ``-e trainer_serial=1`` and once with ``trainer_serial=8``
(``-f 8`` both times; every host changes release in each rollout). After each rollout a status
pass reads every container directly (restart job state file, ``systemctl show``, current,
last good, the running process's release) and classifies each host:

- ``proved``: a new restart job proved the new release, which runs;
- ``rolled back``: a new job failed and put the host's last good release back, proved;
- ``untouched``: no new job, the same MainPID and InvocationID as before the rollout, the old
  release still running;
- anything else (stopped, wrong release, lock left) is ``WRONG``.

Expected: serial 1 — hosts before the bad one proved, the bad one rolled back, the hosts after it
untouched; serial 8 — see ``expected_outcomes``. Prints a per-host table and writes
``bench/results/fleet_fault.json``. See bench/README.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import soak  # noqa: E402  pylint: disable=wrong-import-position

IDS = list(range(240, 248))


def log(msg):
    print("fleet: " + msg, flush=True)


# --------------------------------------------------------------------------------------------
# pure helpers

def expected_outcomes(hosts, bad, serial):
    """{host: 'proved' | 'rolled back' | 'untouched'} for a rollout in batches of ``serial`` where
    ``bad`` fails its proof: its batch runs to the end of the restart (every host of the batch
    proves or rolls back on its own target), then the play stops (max_fail_percentage 0) and the
    later batches are untouched."""
    i = hosts.index(bad)
    batch_end = (i // serial + 1) * serial
    return {h: ("rolled back" if h == bad else "proved" if j < batch_end else "untouched")
            for j, h in enumerate(hosts)}


def classify_host(before, after, new_release):
    """The outcome of one host from its probes before and after the rollout: 'proved',
    'rolled back', 'untouched' or 'WRONG: ...'."""
    unit_b, unit_a = before.get("unit", {}), after.get("unit", {})
    job_b, job_a = (before.get("job") or {}).get("job_id"), (after.get("job") or {}).get("job_id")
    result = ((after.get("job") or {}).get("result")) or {}
    wrong = []
    if unit_a.get("ActiveState") != "active" or unit_a.get("MainPID") in (None, "", "0"):
        wrong.append("unit %s, MainPID %s" % (unit_a.get("ActiveState"), unit_a.get("MainPID")))
    if after.get("lock"):
        wrong.append("deploy lock left")
    if not (after.get("running") == after.get("current") == after.get("last_good")):
        wrong.append("running %s, current %s, last good %s" % (after.get("running"), after.get("current"),
                                                               after.get("last_good")))
    if job_a == job_b:
        outcome = "untouched"
        if unit_a.get("MainPID") != unit_b.get("MainPID") or unit_a.get("InvocationID") != unit_b.get("InvocationID"):
            wrong.append("no new restart job, yet the trainer was restarted")
        if after.get("running") != before.get("running"):
            wrong.append("running %s, before %s" % (after.get("running"), before.get("running")))
    elif not (after.get("job") or {}).get("done"):
        wrong.append("restart job %s not done (phase %s)" % (job_a, (after.get("job") or {}).get("phase")))
        outcome = "running"
    elif result.get("ok"):
        outcome = "proved"
        if after.get("running") != new_release:
            wrong.append("proved, but runs %s (new release %s)" % (after.get("running"), new_release))
    else:
        outcome = "rolled back"
        if not (result.get("rolled_back") and result.get("rollback_proof")
                and result.get("rollback_release") == before.get("last_good") == after.get("running")):
            wrong.append("failed without a proved rollback to %s: %s" % (
                before.get("last_good"), str(result.get("outcome"))[:200]))
    return outcome if not wrong else "WRONG: %s (%s)" % ("; ".join(wrong), outcome)


def host_table(rows):
    """Markdown table of the status pass."""
    lines = ["| host | outcome | expected | running | current | last good | unit | MainPID | last restart job |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["host"], r["outcome"], r["expected"], r["running"], r["current"], r["last_good"], r["unit"],
            r["main_pid"], r["job"].replace("|", "/")))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# the lab

def probe_all(vmids):
    with ThreadPoolExecutor(max_workers=4) as ex:
        return dict(zip(vmids, ex.map(soak.probe, vmids)))


def write_inventory(path, hosts, conn, good_src, bad_host=None, bad_src=None):
    """Group trainer_hosts, trainer_src as a group var; the bad host's own trainer_src as a host
    var (extra vars would override host vars, so trainer_src is never passed with -e)."""
    hv = {h: {"proxmox_vmid": vmid} for h, vmid in hosts.items()}
    if bad_host:
        hv[bad_host]["trainer_src"] = bad_src
    doc = {"all": {"vars": conn, "children": {"trainer_hosts": {"hosts": hv, "vars": {"trainer_src": good_src}}}}}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)


def rollout(name, serial, hosts, vmids, bad_host, work, conn, cp_dir, stamp):
    good = soak.make_tree(os.path.join(work, name + "-good"), "fleet %s %s" % (name, stamp))
    bad = soak.make_tree(os.path.join(work, name + "-bad"), "fleet %s %s" % (name, stamp),
                         "FAULT=import_error\n")
    new_good, new_bad = soak.release_id(good), soak.release_id(bad)
    inv = os.path.join(work, name + ".json")
    write_inventory(inv, hosts, conn, good, bad_host, bad)
    before = probe_all(vmids)
    extra = dict(soak.FAST)
    extra["trainer_serial"] = serial
    log("%s: serial %d, -f 8, release %s (bad host %s: %s)" % (name, serial, new_good, bad_host, new_bad))
    rc, out, wall = soak.playbook(inv, extra, cp_dir, forks=8, timeout=900)
    t_status = time.monotonic()
    after = probe_all(vmids)
    status_s = time.monotonic() - t_status
    expected = expected_outcomes(list(hosts), bad_host, serial)
    rows = []
    for h, vmid in hosts.items():
        a = after[vmid]
        job = a.get("job") or {}
        outcome = classify_host(before[vmid], a, new_bad if h == bad_host else new_good)
        rows.append({"host": h, "vmid": vmid, "outcome": outcome, "expected": expected[h],
                     "ok": outcome == expected[h], "running": a.get("running"), "current": a.get("current"),
                     "last_good": a.get("last_good"), "unit": a["unit"].get("ActiveState"),
                     "main_pid": a["unit"].get("MainPID"),
                     "main_pid_before": before[vmid]["unit"].get("MainPID"),
                     "job": "%s: %s" % (job.get("job_id", "-"), str(
                         (job.get("result") or {}).get("outcome") or job.get("phase") or "-")[:90]),
                     "failure": ((job.get("result") or {}).get("failure") or "").split("\n")[0][:200]})
    recap = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[1] == ":" and parts[0] in hosts:
            recap[parts[0]] = " ".join(parts[2:])
    res = {"serial": serial, "rc": rc, "wall_s": round(wall, 2), "status_pass_s": round(status_s, 2),
           "new_release": new_good, "bad_release": new_bad, "bad_host": bad_host, "hosts": rows,
           "recap": recap, "hosts_in_recap": len(recap), "all_as_expected": all(r["ok"] for r in rows) and rc != 0,
           "output_tail": out[-3000:]}
    print()
    print("%s: ansible-playbook exited %d after %.1f s; its recap names %d of %d hosts; status pass %.1f s" % (
        name, rc, wall, len(recap), len(hosts), status_s))
    print(host_table(rows))
    print()
    return res


def run(args):
    vmids = args.ids
    soak.lab_up(vmids, recreate=args.recreate)
    work = tempfile.mkdtemp(prefix="dflash-fleet-")
    cp_dir = os.path.join(work, "cp")
    os.makedirs(cp_dir)
    conn = dict(soak.lab_conn_vars(), ansible_control_path_dir=cp_dir)
    hosts = {"ff-%d" % v: v for v in vmids}
    bad_host = "ff-%d" % vmids[args.bad - 1]
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    doc = {"started": started, "ids": vmids, "bad_host": bad_host, "knobs": soak.FAST, "rollouts": {}}
    try:
        src = soak.make_tree(os.path.join(work, "base"), "fleet base %s" % started)
        inv = os.path.join(work, "base.json")
        write_inventory(inv, hosts, conn, src)
        rc, out, wall = soak.playbook(inv, dict(soak.FAST, trainer_serial=8), cp_dir, forks=8, timeout=900)
        log("set-up: good release %s to all %d hosts (serial 8): rc %d, %.1f s" % (
            soak.release_id(src), len(hosts), rc, wall))
        if rc != 0:
            raise SystemExit("set-up deploy failed:\n" + out[-3000:])
        doc["setup_wall_s"] = round(wall, 2)
        for name, serial in (("serial1", 1), ("serial8", 8)):
            doc["rollouts"][name] = rollout(name, serial, hosts, vmids, bad_host, work, conn, cp_dir, started)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc["total_s"] = round(time.monotonic() - t0, 1)
    doc["machine"] = {"cpus": os.cpu_count(), "loadavg_after": os.getloadavg()}
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    for name, r in doc["rollouts"].items():
        print("%s: %s; wall %.1f s; %s" % (name, "as expected" if r["all_as_expected"] else "NOT as expected",
                                           r["wall_s"], ", ".join("%s %s" % (x["host"], x["outcome"])
                                                                  for x in r["hosts"])))
    print("written: %s" % args.output)
    return 0 if all(r["all_as_expected"] for r in doc["rollouts"].values()) else 1


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench/fleet_fault.py", description=__doc__.splitlines()[0])
    p.add_argument("--ids", type=int, nargs="+", default=IDS, help="lab containers (default 240-247)")
    p.add_argument("--bad", type=int, default=4, help="which host (1-based) gets the failing release (default 4)")
    p.add_argument("--recreate", action="store_true", help="lab.py down, then up: fresh containers")
    p.add_argument("--output", default=os.path.join(HERE, "results", "fleet_fault.json"))
    args = p.parse_args(argv)
    if not 1 <= args.bad <= len(args.ids):
        p.error("--bad must name one of the %d hosts" % len(args.ids))
    soak.ansible_playbook()  # before the lab is touched: a missing ansible-playbook says so, no traceback
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
