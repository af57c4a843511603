# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""dflash.trainer benchmark: python3 bench/run.py [--reps N] [--quick]

Runs every figure side by side in one run against lab containers 220-227 (created with
lab/lab.py at the start, removed at the end unless --keep-lab), prints a table and writes
bench/results/latest.json. See bench/README.md for what each figure means.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.append(ROOT)  # dflash_trainer, also when the checkout is not pip-installed

import benchlib as bl  # noqa: E402  pylint: disable=wrong-import-position
from dflash_trainer.programs import ProgramNotFound, program_env, require_program  # noqa: E402

PCT = "/usr/sbin/pct"
SSH_KEY = "/var/lib/dflash-lab/ssh/id_ed25519"
IDS = list(range(220, 228))
CONNECTIONS = {
    "local": "local",
    "proxmox_pct_remote": "community.proxmox.proxmox_pct_remote",
    "dflash.trainer.pct": "dflash.trainer.pct",
}
SECTIONS = ("per_task", "noop_deploy", "release", "crash", "ready", "fleet", "bigrelease")
UNIT = "dflash-trainer.service"
README_START = "<!-- bench:table:start -->"
README_END = "<!-- bench:table:end -->"


def log(msg):
    print("bench: " + msg, flush=True)


class StepError(Exception):
    pass


class Bench(object):

    def __init__(self, args):
        self.args = args
        self.work = tempfile.mkdtemp(prefix="dflash-bench-")
        self.cp_dir = os.path.join(self.work, "cp")
        os.makedirs(self.cp_dir)
        self.cache_home = os.path.join(self.work, "cache")
        with open(os.path.join(ROOT, "roles", "trainer", "defaults", "main.yml"), encoding="utf-8") as fh:
            defaults = fh.read()
        self.settings = {
            "reps": args.reps,
            "quick": args.quick,
            "tree_files": args.tree_files,
            "copy_files": args.copy_files,
            "noop_tasks": 20,
            "trainer_ready_hold_s": args.hold_s,
            "trainer_ready_stall_s": min(5.0, args.hold_s),
            "trainer_ready_interval_s": float(bl.role_default(defaults, "trainer_ready_interval_s")),
            "trainer_ready_min_steps": int(bl.role_default(defaults, "trainer_ready_min_steps")),
            "trainer_startup_s": "2.0 (stand-in default, FAKE_TRAINER_STARTUP_S)",
            "fleet": {"hosts": len(IDS), "forks": 8, "trainer_serial": 8},
            "bigrelease": {"vmid": args.big_vmid, "file_mib": args.big_mib, "dir": args.big_dir},
            "containers": IDS,
            "ansible_config": os.path.join(ROOT, "ansible.cfg"),
            "control_path_dir": self.cp_dir,
            "work_dir": self.work,
        }
        self.results = {}
        self.rows = []
        self.errors = {}
        self._write_files()

    # -- files ---------------------------------------------------------------------------------
    def _write_files(self):
        w = self.work
        for name, conn in CONNECTIONS.items():
            self._inventory(os.path.join(w, "inv-%s.yml" % name.replace(".", "_")), conn)
        p0 = [{"name": "Zero tasks", "hosts": "{{ bench_hosts }}", "gather_facts": False, "tasks": []}]
        p20 = [{"name": "Twenty no-op tasks", "hosts": "{{ bench_hosts }}", "gather_facts": False,
                "tasks": [{"name": "No-op %d" % (i + 1), "ansible.builtin.command": "true",
                           "changed_when": False} for i in range(20)]}]
        release = [{"name": "Release step only", "hosts": "{{ bench_hosts }}", "gather_facts": False,
                    "tasks": [{"name": "Release", "dflash.trainer.trainer_release": {
                        "state": "present", "src": "{{ bench_src }}", "root": "{{ bench_root }}"}}]}]
        copy = [{"name": "Copy a tree with ansible.builtin.copy", "hosts": "{{ bench_hosts }}",
                 "gather_facts": False,
                 "tasks": [{"name": "Copy", "ansible.builtin.copy": {
                     "src": "{{ bench_src }}/", "dest": "{{ bench_dest }}/", "mode": "preserve"}}]}]
        for name, doc in (("noop0", p0), ("noop20", p20), ("release", release), ("copy", copy)):
            with open(os.path.join(w, name + ".yml"), "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=1)  # JSON is YAML
        # trainer sources: good, import error, fleet (a revision file changed per deploy)
        for name in ("src-good", "src-crash", "src-fleet"):
            shutil.copytree(os.path.join(ROOT, "examples", "trainer"), os.path.join(w, name),
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "fault.env"))
        with open(os.path.join(w, "src-crash", "fault.env"), "w", encoding="utf-8") as fh:
            fh.write("FAULT=import_error\n")

    def _inventory(self, path, connection):
        hosts = {"bench-%d" % i: {"proxmox_vmid": i} for i in IDS}
        hosts["bench-%d" % self.args.big_vmid] = {"proxmox_vmid": self.args.big_vmid}
        vars_ = {
            "ansible_connection": connection,
            "ansible_host": "127.0.0.1",
            "ansible_port": 2222,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": SSH_KEY,
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_host_key_checking": False,
            # our own ControlMaster: other engineers' lab runs share 127.0.0.1:2222
            "ansible_control_path_dir": self.cp_dir,
        }
        if connection == "local":
            vars_["ansible_python_interpreter"] = sys.executable
        doc = {"all": {"hosts": hosts, "vars": vars_,
                       "children": {"bench_fleet": {"hosts": {"bench-%d" % i: {} for i in IDS}}}}}
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)

    def inv(self, name):
        return os.path.join(self.work, "inv-%s.yml" % name.replace(".", "_"))

    # -- running things ------------------------------------------------------------------------
    def ansible(self, playbook, inventory="dflash.trainer.pct", extra=None, as_json=False, vvv=False,
                forks=None, timeout=900, expect_rc=0):
        """Run ansible-playbook from the checkout; returns a dict with wall, rc, out, err, doc,
        t_start/t_end (epoch)."""
        program = ansible_playbook()
        argv = [program, "-i", self.inv(inventory), playbook]
        for key, value in (extra or {}).items():
            argv += ["-e", "%s=%s" % (key, value)]
        if forks:
            argv += ["-f", str(forks)]
        if vvv:
            argv.append("-vvv")
        env = program_env(program, dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                                        ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="0",
                                        XDG_CACHE_HOME=self.cache_home))  # the release hash cache: ours
        env.pop("ANSIBLE_STDOUT_CALLBACK", None)
        if as_json:
            env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
            env["ANSIBLE_VERBOSE_TO_STDERR"] = "1"
        t_start = time.time()
        m0 = time.monotonic()
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
        wall = time.monotonic() - m0
        t_end = time.time()
        res = {"argv": argv, "wall": wall, "rc": proc.returncode, "out": proc.stdout, "err": proc.stderr,
               "t_start": t_start, "t_end": t_end, "doc": None}
        if as_json:
            try:
                res["doc"] = bl.json_document(proc.stdout)
            except ValueError as e:
                raise StepError("no JSON from %s (rc %d): %s\n%s\n%s" % (
                    shlex.join(argv), proc.returncode, e, proc.stdout[-2000:], proc.stderr[-2000:])) from None
        if expect_rc is not None and (proc.returncode == 0) != (expect_rc == 0):
            raise StepError("%s exited %d (expected %s)\nstdout: %s\nstderr: %s" % (
                shlex.join(argv), proc.returncode, "0" if expect_rc == 0 else "failure",
                proc.stdout[-3000:], proc.stderr[-3000:]))
        return res

    @staticmethod
    def pct(vmid, *argv, check=True):
        proc = subprocess.run([PCT, "exec", str(vmid), "--"] + list(argv), capture_output=True, text=True,
                              timeout=120, check=False)
        if check and proc.returncode != 0:
            raise StepError("pct exec %s -- %s: exit %d: %s"
                            % (vmid, shlex.join(argv), proc.returncode, proc.stderr.strip()))
        return proc.stdout

    def unit_state(self, vmid):
        out = self.pct(vmid, "systemctl", "show", UNIT, "-p", "MainPID", "-p", "InvocationID",
                       "-p", "ActiveState", "-p", "NRestarts")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, vmid, *match, since=None):
        argv = ["journalctl", "-o", "json", "--no-pager"] + list(match)
        if since is not None:
            argv += ["--since", "@%d" % int(since)]
        return bl.parse_journal(self.pct(vmid, *argv))

    def deploy(self, src, target="bench-220", extra=None, **kw):
        e = {"trainer_target_hosts": target, "trainer_src": src, "trainer_ready_hold_s": self.args.hold_s,
             "trainer_ready_stall_s": min(5.0, self.args.hold_s)}
        e.update(extra or {})
        return self.ansible(os.path.join(ROOT, "deploy.yml"), extra=e, **kw)

    def row(self, **kw):
        self.rows.append(kw)

    # -- 1. per-task overhead ------------------------------------------------------------------
    def per_task(self):
        reps = self.args.reps
        raw = {name: {"t0": [], "t20": []} for name in CONNECTIONS}
        p0, p20 = os.path.join(self.work, "noop0.yml"), os.path.join(self.work, "noop20.yml")
        for rep in range(reps):
            for name in CONNECTIONS:
                for key, pb in (("t0", p0), ("t20", p20)):
                    r = self.ansible(pb, inventory=name, extra={"bench_hosts": "bench-220"})
                    raw[name][key].append(r["wall"])
                log("per-task rep %d/%d %-20s 0 tasks %.2f s, 20 tasks %.2f s" % (
                    rep + 1, reps, name, raw[name]["t0"][-1], raw[name]["t20"][-1]))
        out = {}
        for name in CONNECTIONS:
            pts = bl.paired_per_task(raw[name]["t20"], raw[name]["t0"])
            out[name] = {"t0": bl.summary(raw[name]["t0"]), "t20": bl.summary(raw[name]["t20"]),
                         "per_task": bl.summary(pts)}
            self.row(figure="1 per task", what="%s: (t20 - t0) / 20" % name, min=out[name]["per_task"]["min"],
                     median=out[name]["per_task"]["median"], target="", verdict="")
        ours = out["dflash.trainer.pct"]["per_task"]["median"]
        local = out["local"]["per_task"]["median"]
        remote = out["proxmox_pct_remote"]["per_task"]["median"]
        c1 = bl.check_max(bl.ratio(ours, local), 1.5)
        c2 = bl.check_min(bl.ratio(remote, ours), 4.0)
        out["ours_vs_local"] = c1
        out["remote_vs_ours"] = c2
        # no connection plugin can beat local: remote / local is the best speed-up any could reach
        out["remote_vs_local_ceiling"] = bl.ratio(remote, local)
        self.row(figure="1 per task", what="ours / local (medians)", min=None, median=c1["value"], unit="x",
                 target="≤ 1.5×", verdict=bl.verdict_words(c1, "x"))
        self.row(figure="1 per task", what="proxmox_pct_remote / ours (speed-up, medians)", min=None,
                 median=c2["value"], unit="x", target="≥ 4×", verdict=bl.verdict_words(c2, "x"))
        self.row(figure="1 per task", what="proxmox_pct_remote / local (ceiling for any plugin)", min=None,
                 median=out["remote_vs_local_ceiling"], unit="x", target="(report)", verdict="")
        return out

    # -- 2. no-op deploy -----------------------------------------------------------------------
    def noop_deploy(self):
        src = os.path.join(self.work, "src-good")
        first = self.deploy(src, as_json=True)
        log("first deploy (not counted): %.2f s" % first["wall"])
        walls, checks = [], []
        for rep in range(self.args.reps):
            before = self.unit_state(220)
            r = self.deploy(src, as_json=True)
            after = self.unit_state(220)
            rows = bl.task_results(r["doc"])
            totals = bl.recap_totals(r["doc"])
            # the one report after the first read says the trainer is left running (trainer_plan's report)
            untouched = [x for x in rows if x["action"] == "ansible.builtin.debug"
                         and "left running" in str(x["result"].get("msg", ""))]
            check = {
                "changed": totals.get("changed"),
                # the first read judged it (trainer_status no_op) and the role ended there
                "no_op_read": any((x["result"].get("plan") or {}).get("no_op") for x in bl.ran(rows, "dflash.trainer.trainer_plan")),
                "reported_untouched": bool(untouched) and not any(x["result"].get("skipped") for x in untouched),
                "same_main_pid": before.get("MainPID") == after.get("MainPID") != "0",
                "same_invocation": before.get("InvocationID") == after.get("InvocationID"),
                "restart_tasks": len(bl.ran(rows, bl.RESTART_ACTION)),
                "release_tasks": len(bl.ran(rows, "dflash.trainer.trainer_release")),
            }
            check["noop"] = (check["changed"] == 0 and check["no_op_read"] and check["reported_untouched"]
                             and check["same_main_pid"] and check["same_invocation"]
                             and check["restart_tasks"] == 0 and check["release_tasks"] == 0)
            if not check["noop"]:
                raise StepError("re-deploy was not a no-op: %s" % check)
            walls.append(r["wall"])
            checks.append(check)
            log("no-op deploy rep %d: %.2f s, changed=%s, restarts=0 (MainPID %s kept)" % (
                rep + 1, r["wall"], check["changed"], after.get("MainPID")))
        # counting run: default callback, so that TASK headers and PCT lines come in order
        counted = self.deploy(src, vvv=True)
        text = counted["out"] + counted["err"]
        calls = bl.count_pct_calls(text)
        by_task = bl.pct_calls_by_task(text)
        recap = bl.recap_lines(text).get("bench-220")
        if not recap or recap["changed"] != 0:
            raise StepError("the -vvv counting run changed something: %s" % recap)
        n_tasks = len(bl.task_results(r["doc"]))
        log("no-op deploy round trips (-vvv run, %.2f s): %s over %d task results" % (
            counted["wall"], calls, n_tasks))
        for name, n in by_task:
            log("    %2d  %s" % (n, name))
        out = {"wall": bl.summary(walls), "checks": checks, "first_deploy_wall": first["wall"],
               "pct_calls": calls, "pct_calls_by_task": by_task, "task_results": n_tasks,
               "vvv_run_wall": counted["wall"]}
        self.row(figure="2 no-op deploy", what="deploy.yml re-run, 0 changed, 0 restarts (wall)",
                 min=out["wall"]["min"], median=out["wall"]["median"], target="(report)", verdict="verified no-op")
        self.row(figure="2 no-op deploy", what="remote round trips (pct EXEC+PUT+FETCH, -vvv)", min=None,
                 median=calls["round_trips"], unit="n", target="(report)",
                 verdict="%d EXEC, %d PUT, %d FETCH; %d task results" % (
                     calls["EXEC"], calls["PUT"], calls["FETCH"], n_tasks))
        return out

    # -- 3. release of a generated tree --------------------------------------------------------
    def _release_run(self, src, root, host="bench-220"):
        r = self.ansible(os.path.join(self.work, "release.yml"), as_json=True,
                         extra={"bench_hosts": host, "bench_src": src, "bench_root": root})
        (task,) = bl.find_tasks(bl.task_results(r["doc"]), "dflash.trainer.trainer_release")
        res = task["result"]
        return {"task_s": task["end"] - task["start"], "wall": r["wall"], "changed": res.get("changed"),
                "transferred": res.get("transferred"), "release": res.get("release"),
                "archive_bytes": res.get("archive_bytes"), "hashed_files": res.get("hashed_files")}

    def release(self):
        n, ncopy = self.args.tree_files, self.args.copy_files
        tree = os.path.join(self.work, "tree")
        t0 = time.monotonic()
        count, size = bl.generate_tree(tree, n)
        digest = bl.tree_digest(tree)
        log("generated tree: %d files, %.1f MiB in %.1f s (digest %s)" % (
            count, size / 2**20, time.monotonic() - t0, digest[:16]))
        root = "/opt/bench-release"
        first, noop, change = [], [], []
        for rep in range(self.args.reps):
            self.pct(220, "rm", "-rf", root)
            bl.change_one_file(tree, n, version=0)  # back to the generated content
            a = self._release_run(tree, root)
            b = self._release_run(tree, root)
            changed_rel = bl.change_one_file(tree, n, version=rep + 1)
            c = self._release_run(tree, root)
            if not (a["transferred"] and not b["changed"] and c["transferred"]):
                raise StepError("release runs not as expected: first %s, no-op %s, change %s" % (a, b, c))
            first.append(a)
            noop.append(b)
            change.append(c)
            log("release rep %d: first %.2f s (archive %s B), no-op %.2f s, one file (%s) changed %.2f s" % (
                rep + 1, a["task_s"], a["archive_bytes"], b["task_s"], changed_rel, c["task_s"]))
        self.pct(220, "rm", "-rf", root)
        bl.change_one_file(tree, n, version=0)

        # ansible.builtin.copy over proxmox_pct_remote on the first files of the same tree
        sub = os.path.join(self.work, "tree-%d" % ncopy)
        bl.generate_tree(sub, ncopy)
        dest = "/opt/bench-copy"
        self.pct(220, "rm", "-rf", dest)
        r = self.ansible(os.path.join(self.work, "copy.yml"), inventory="proxmox_pct_remote", as_json=True,
                         extra={"bench_hosts": "bench-220", "bench_src": sub, "bench_dest": dest}, timeout=3600)
        (task,) = bl.find_tasks(bl.task_results(r["doc"]), "ansible.builtin.copy")
        copy_s = task["end"] - task["start"]
        got = int(self.pct(220, "sh", "-c", "find %s -type f | wc -l" % dest).strip())
        self.pct(220, "rm", "-rf", dest)
        if got != ncopy:
            raise StepError("copy left %d files of %d" % (got, ncopy))
        per_file = copy_s / ncopy
        copy_extrapolated = per_file * n
        log("copy over proxmox_pct_remote: %d files in %.1f s (%.2f s per file) -> %d files EXTRAPOLATED %.0f s" % (
            ncopy, copy_s, per_file, n, copy_extrapolated))

        s_first = bl.summary([x["task_s"] for x in first])
        s_noop = bl.summary([x["task_s"] for x in noop])
        s_change = bl.summary([x["task_s"] for x in change])
        c1 = bl.check_max(bl.ratio(s_change["median"], s_noop["median"]), 2.0)
        c2 = bl.check_min(bl.ratio(copy_extrapolated, s_first["median"]), 20.0)
        out = {"files": count, "bytes": size, "digest": digest,
               "first": s_first, "noop": s_noop, "one_file_change": s_change,
               "first_wall": bl.summary([x["wall"] for x in first]),
               "noop_wall": bl.summary([x["wall"] for x in noop]),
               "change_wall": bl.summary([x["wall"] for x in change]),
               "runs": {"first": first, "noop": noop, "change": change},
               "copy": {"connection": "community.proxmox.proxmox_pct_remote", "files_measured": ncopy,
                        "task_s": copy_s, "wall": r["wall"], "per_file_s": per_file,
                        "extrapolated_to_files": n, "extrapolated_s": copy_extrapolated,
                        "note": "measured once on %d files, extrapolated linearly per file to %d" % (ncopy, n)},
               "change_vs_noop": c1, "copy_vs_first": c2}
        what = "%d files, %.1f MiB" % (count, size / 2**20)
        self.row(figure="3 release", what="first deploy, release task (%s)" % what,
                 min=s_first["min"], median=s_first["median"], target="", verdict="")
        self.row(figure="3 release", what="no-op release task (same tree)", min=s_noop["min"],
                 median=s_noop["median"], target="", verdict="")
        self.row(figure="3 release", what="one file changed, release task", min=s_change["min"],
                 median=s_change["median"], target="≤ 2× no-op (%s)" % bl.fmt_s(2 * s_noop["median"]),
                 verdict=bl.verdict_words(bl.check_max(s_change["median"], 2 * s_noop["median"])))
        self.row(figure="3 release", what="copy over proxmox_pct_remote, EXTRAPOLATED from %d files to %d "
                 "(%.2f s/file, measured once)" % (ncopy, n, per_file), min=None, median=copy_extrapolated,
                 target="", verdict="")
        self.row(figure="3 release", what="copy (extrapolated) / our first deploy", min=None, median=c2["value"],
                 unit="x", target="≥ 20×", verdict=bl.verdict_words(c2, "x"))
        return out

    # -- 4. crash at import --------------------------------------------------------------------
    def crash(self):
        good = os.path.join(self.work, "src-good")
        bad = os.path.join(self.work, "src-crash")
        detect, rollback, walls, reasons = [], [], [], []
        for rep in range(self.args.reps):
            st = self.unit_state(220)
            if st.get("ActiveState") != "active":
                self.deploy(good)
            r = self.deploy(bad, as_json=True, expect_rc=1)
            rows = bl.task_results(r["doc"])
            task, job = bl.job_outcome(rows, "bench-220")
            if job is None or job.get("ok") is not False:
                raise StepError("the import-error deploy did not end in a failed restart job: %s" % [
                    (x["name"], x["action"], x["result"].get("failed")) for x in rows])
            msg = job.get("msg") or job.get("failure") or ""
            inv = bl.failed_invocation(job)
            if not inv:
                raise StepError("the restart job's result names no failed start: %s" % sorted(job))
            entries = self.journal(220, "-u", UNIT, since=r["t_start"] - 2)
            exit_ts, exit_msg = bl.main_exit_time(entries, inv)
            if exit_ts is None:
                raise StepError("no 'Main process exited' journal line for invocation %s" % inv)
            # the job acts on its verdict: the rollback stops the failed start first (the target's clock)
            stop_ts, stop_msg = bl.unit_stop_time(entries, exit_ts)
            if stop_ts is None:
                raise StepError("no 'Stopping/Stopped %s' journal line after the exit of %s" % (UNIT, inv))
            d = stop_ts - exit_ts
            detect.append(d)
            rollback.append(task["end"] - stop_ts)
            walls.append(r["wall"])
            reasons.append({"first_line": msg.splitlines()[0] if msg else "",
                            "has_ModuleNotFoundError": "ModuleNotFoundError" in msg,
                            "rolled_back": bool(job.get("rolled_back")) and "Rolled back" in (job.get("outcome") or ""),
                            "exit_line": exit_msg, "stop_line": stop_msg, "failed_phase": job.get("failed_phase"),
                            "playbook_exit_after_trainer_exit_s": r["t_end"] - exit_ts})
            if "ModuleNotFoundError" not in msg:
                raise StepError("failure message lacks ModuleNotFoundError: %s" % msg)
            log("crash rep %d: trainer exit -> the job stops it to roll back %.2f s; rollback + proof %.2f s; "
                "playbook %.2f s; reason: %s" % (rep + 1, d, rollback[-1], r["wall"], reasons[-1]["first_line"]))
        s = bl.summary(detect)
        c = bl.check_max(s["median"], 3.0)
        out = {"exit_to_job_stop": s, "rollback_after_failure": bl.summary(rollback),
               "playbook_wall": bl.summary(walls), "reasons": reasons, "target": c}
        self.row(figure="4 crash at import", what="trainer exit → the restart job's verdict (its rollback stops "
                 "the failed start; journal clock)", min=s["min"], median=s["median"], target="≤ 3 s",
                 verdict=bl.verdict_words(c))
        self.row(figure="4 crash at import", what="then rollback to last good + its proof (to the job's outcome "
                 "on the controller)",
                 min=out["rollback_after_failure"]["min"], median=out["rollback_after_failure"]["median"],
                 target="(report)",
                 verdict="rolled back" if all(x["rolled_back"] for x in reasons) else "NOT rolled back")
        return out

    # -- 5. ready-verdict latency --------------------------------------------------------------
    def ready(self):
        good = os.path.join(self.work, "src-good")
        hold = self.args.hold_s
        lat, details = [], []
        for rep in range(self.args.reps):
            r = self.deploy(good, as_json=True, extra={"trainer_force_restart": "true"})
            rows = bl.task_results(r["doc"])
            task, job = bl.job_outcome(rows, "bench-220")
            if not job or not job.get("ok") or not job.get("proof"):
                raise StepError("the forced restart was not proved: %s" % (job or {}).get("outcome"))
            proof = job["proof"]
            inv = proof["invocation_id"]
            entries = self.journal(220, "_SYSTEMD_INVOCATION_ID=%s" % inv)
            cond, parts = bl.ready_condition_time(entries, inv, min_steps=self.settings["trainer_ready_min_steps"])
            if cond is None:
                raise StepError("no allocation / step lines in the journal for %s: %s" % (inv, parts))
            latency = task["end"] - (cond + hold)
            lat.append(latency)
            details.append({"invocation_id": inv, "condition_at": cond, "alloc_at": parts["alloc"],
                            "step_at": parts["step"], "verdict_on_controller_at": task["end"],
                            "job_task": task["name"], "job_task_started_at": task["start"],
                            "seconds_to_ready": proof.get("seconds_to_ready"), "latency_s": latency})
            log("ready rep %d: conditions at +%.2f s after the job's task began, verdict +%.2f s → latency %.2f s "
                "(hold %.1f s)" % (rep + 1, cond - task["start"], task["end"] - task["start"], latency, hold))
        s = bl.summary(lat)
        c = bl.check_max(s["median"], 1.0)
        worst = bl.check_max(s["max"], 1.0)
        out = {"latency": s, "runs": details, "target": c, "target_on_max": worst}
        self.row(figure="5 ready verdict", what="the job's verdict on the controller − (last condition + %.0f s "
                 "hold)" % hold,
                 min=s["min"], median=s["median"], target="≤ 1 s (one poll)",
                 verdict=bl.verdict_words(c) + "; max %s: %s" % (bl.fmt_s(s["max"]), bl.verdict_words(worst)))
        return out

    # -- 6. fleet ------------------------------------------------------------------------------
    def fleet(self):
        src = os.path.join(self.work, "src-fleet")
        extra = {"trainer_serial": 8}
        rev = [0]

        def bump():
            rev[0] += 1
            with open(os.path.join(src, "BENCH_REV"), "w", encoding="utf-8") as fh:
                fh.write("%d\n" % rev[0])

        bump()
        setup = self.deploy(src, target="bench_fleet", extra=extra, forks=8, as_json=True)
        log("fleet set-up deploy to 8 (not counted): %.2f s" % setup["wall"])
        one, eight = [], []
        for rep in range(self.args.reps):
            bump()
            a = self.deploy(src, target="bench-220", extra=extra, forks=8, as_json=True)
            bump()
            b = self.deploy(src, target="bench_fleet", extra=extra, forks=8, as_json=True)
            rows = bl.task_results(b["doc"])
            proved = [i for i in IDS if (bl.job_outcome(rows, "bench-%d" % i)[1] or {}).get("ok")]
            if len(proved) != len(IDS):
                raise StepError("fleet deploy proved %d of %d trainers" % (len(proved), len(IDS)))
            one.append(a["wall"])
            eight.append(b["wall"])
            log("fleet rep %d: 1 container %.2f s, 8 containers %.2f s (%.2f×)" % (
                rep + 1, a["wall"], b["wall"], b["wall"] / a["wall"]))
        s1, s8 = bl.summary(one), bl.summary(eight)
        c = bl.check_max(bl.ratio(s8["median"], s1["median"]), 3.0)
        out = {"one": s1, "eight": s8, "ratios": bl.summary(bl.ratio(t8, t1) for t1, t8 in zip(one, eight)),
               "target": c, "note": "new release + restart + proof on each host; forks 8, -e trainer_serial=8"}
        self.row(figure="6 fleet", what="deploy new release to 1 container", min=s1["min"], median=s1["median"],
                 target="", verdict="")
        self.row(figure="6 fleet", what="deploy to 8 containers (forks 8, trainer_serial=8)", min=s8["min"],
                 median=s8["median"], target="≤ 3× one (%s)" % bl.fmt_s(3 * s1["median"]),
                 verdict=bl.verdict_words(bl.check_max(s8["median"], 3 * s1["median"])))
        self.row(figure="6 fleet", what="8 / 1 (medians)", min=None, median=c["value"], unit="x", target="≤ 3×",
                 verdict=bl.verdict_words(c, "x"))
        return out

    # -- 7. big release: a 1 GiB file in the tree --------------------------------------------
    def _noop(self, src, host, vmid):
        before = self.unit_state(vmid)
        r = self.deploy(src, target=host, as_json=True)
        after = self.unit_state(vmid)
        changed = bl.recap_totals(r["doc"]).get("changed")
        if changed != 0 or before.get("MainPID") != after.get("MainPID") or before.get("MainPID") == "0":
            raise StepError("re-deploy of %s was not a no-op: changed=%s, MainPID %s -> %s"
                            % (src, changed, before.get("MainPID"), after.get("MainPID")))
        return r["wall"]

    @staticmethod
    def _transport_floor(vmid, path):
        """Seconds to cat the file through ssh -> pct exec into a file in the container, synced: what
        no deploy over this transport can beat."""
        argv = ["ssh", "-p", "2222", "-i", SSH_KEY, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "root@127.0.0.1",
                "%s exec %d -- sh -c 'cat > /root/bench-floor && sync /root/bench-floor && wc -c < /root/bench-floor; "
                "rm -f /root/bench-floor'" % (PCT, vmid)]
        with open(path, "rb") as fh:
            t0 = time.monotonic()
            proc = subprocess.run(argv, stdin=fh, capture_output=True, text=True, timeout=600, check=False)
            took = time.monotonic() - t0
        if proc.returncode != 0 or proc.stdout.strip() != str(os.path.getsize(path)):
            raise StepError("transport floor: %s (rc %d): %s %s" % (shlex.join(argv), proc.returncode, proc.stdout,
                                                                    proc.stderr))
        return took

    def bigrelease(self):
        vmid = self.args.big_vmid
        host = "bench-%d" % vmid
        mib = self.args.big_mib
        base = tempfile.mkdtemp(prefix="dflash-bench-big-", dir=self.args.big_dir)  # never in the repo
        try:
            small = os.path.join(base, "small")
            big = os.path.join(base, "big")
            for path in (small, big):
                shutil.copytree(os.path.join(ROOT, "examples", "trainer"), path,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "fault.env"))
            os.makedirs(os.path.join(big, "weights"))
            t0 = time.monotonic()
            with open(os.path.join(big, "weights", "model.ckpt"), "wb") as fh:  # does not compress
                for _i in range(mib):
                    fh.write(os.urandom(1024 * 1024))
            log("big release: %d MiB of random bytes written in %.1f s (%s)" % (mib, time.monotonic() - t0, big))
            cache = os.path.join(self.cache_home, "dflash-trainer", "release-hashes")
            root = "/opt/bench-big-release"
            first, noop, small_noop, floor = [], [], [], []
            # deploy.yml no-ops, with and without the file: set up once (a restart each), not counted
            w_small, w_big = [], []

            def noops():  # switch (a restart) and one warm-up no-op, not counted; then the no-op counted
                for src, walls in ((small, w_small), (big, w_big)):
                    self.deploy(src, target=host)
                    self._noop(src, host, vmid)
                    walls.append(self._noop(src, host, vmid))
            noops()
            for rep in range(self.args.reps):
                self.pct(vmid, "rm", "-rf", root)
                shutil.rmtree(cache, ignore_errors=True)  # cold: the first deploy hashes the file too
                floor.append(self._transport_floor(vmid, os.path.join(big, "weights", "model.ckpt")))
                a = self._release_run(big, root, host)
                if not a["transferred"]:
                    raise StepError("big release first deploy did not transfer: %s" % a)
                first.append(a)
                self._release_run(small, root + "-small", host)  # its first deploy (a no-op after rep 1)
                for _k in range(4):  # no-ops with and without the file, interleaved
                    b = self._release_run(big, root, host)
                    c = self._release_run(small, root + "-small", host)
                    if b["changed"] or c["changed"]:
                        raise StepError("big release no-ops not as expected: with %s, without %s" % (b, c))
                    noop.append(b)
                    small_noop.append(c)
                log("big release rep %d: transport floor %.2f s, first %.2f s (archive %d B, %s files hashed), "
                    "no-ops %s s (files hashed: %s), without the file %s s" % (
                        rep + 1, floor[-1], a["task_s"], a["archive_bytes"], a["hashed_files"],
                        " ".join("%.2f" % x["task_s"] for x in noop[-4:]), sum(x["hashed_files"] for x in noop[-4:]),
                        " ".join("%.2f" % x["task_s"] for x in small_noop[-4:])))
                if rep:
                    noops()
            self.pct(vmid, "rm", "-rf", root, root + "-small")
        finally:
            shutil.rmtree(base, ignore_errors=True)
        s_floor = bl.summary(floor)
        s_first = bl.summary([x["task_s"] for x in first])
        s_noop = bl.summary([x["task_s"] for x in noop])
        s_small = bl.summary([x["task_s"] for x in small_noop])
        s_wbig, s_wsmall = bl.summary(w_big), bl.summary(w_small)
        c_first = bl.check_max(s_first["median"], 15.0)
        c_noop = bl.check_max(bl.ratio(s_wbig["median"], s_wsmall["median"]), 1.2)
        c_task = bl.check_max(bl.ratio(s_noop["median"], s_small["median"]), 1.2)
        out = {"file_mib": mib, "transport_floor": s_floor, "first": s_first, "noop": s_noop, "noop_without": s_small,
               "deploy_noop_with": s_wbig, "deploy_noop_without": s_wsmall,
               "runs": {"first": first, "noop": noop, "noop_without": small_noop,
                        "deploy_noop_with": w_big, "deploy_noop_without": w_small},
               "first_check": c_first, "deploy_noop_ratio": c_noop, "task_noop_ratio": c_task}
        what = "%d MiB file + the stand-in trainer" % mib
        self.row(figure="7 big release", what="floor: the file through ssh + pct exec into a file (cat, fsync)",
                 min=s_floor["min"], median=s_floor["median"], target="(report)", verdict="")
        self.row(figure="7 big release", what="first deploy, release task, cold hash cache (%s)" % what,
                 min=s_first["min"], median=s_first["median"], target="≤ 15 s", verdict=bl.verdict_words(c_first))
        self.row(figure="7 big release", what="no-op release task with the file", min=s_noop["min"],
                 median=s_noop["median"], target="", verdict="")
        self.row(figure="7 big release", what="no-op release task without it", min=s_small["min"],
                 median=s_small["median"], target="", verdict="")
        self.row(figure="7 big release", what="no-op release task, with / without (medians)", min=None,
                 median=c_task["value"], unit="x", target="≤ 1.2×", verdict=bl.verdict_words(c_task, "x"))
        self.row(figure="7 big release", what="deploy.yml no-op with the file (wall)", min=s_wbig["min"],
                 median=s_wbig["median"], target="", verdict="verified no-op")
        self.row(figure="7 big release", what="deploy.yml no-op without it (wall)", min=s_wsmall["min"],
                 median=s_wsmall["median"], target="", verdict="verified no-op")
        self.row(figure="7 big release", what="deploy.yml no-op, with / without (medians)", min=None,
                 median=c_noop["value"], unit="x", target="≤ 1.2×", verdict=bl.verdict_words(c_noop, "x"))
        return out

    # -- the run -------------------------------------------------------------------------------
    def run(self, sections):
        for name in sections:
            log("== %s ==" % name)
            t0 = time.monotonic()
            try:
                self.results[name] = getattr(self, name)()
            except Exception as e:  # pylint: disable=broad-except
                self.errors[name] = "%s: %s" % (type(e).__name__, e)
                log("section %s FAILED: %s" % (name, e))
                traceback.print_exc()
                self.row(figure=name, what="section failed", min=None, median=None, target="",
                         verdict="ERROR: %s" % str(e).splitlines()[0][:120])
            log("%s took %.0f s" % (name, time.monotonic() - t0))


def lab(action, ids):
    argv = [sys.executable, os.path.join(ROOT, "lab", "lab.py"), action, "--ids"] + [str(i) for i in ids]
    log(shlex.join(argv))
    subprocess.run(argv, check=True, cwd=ROOT)


def ansible_playbook():
    """ansible-playbook on PATH, else beside this Python (.venv/bin); SystemExit saying where it looked."""
    try:
        return require_program("ansible-playbook")
    except ProgramNotFound as e:
        raise SystemExit("bench: %s" % e) from None


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=None, help="repetitions of each figure (default 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 repetition, 300-file tree, 10-file copy")
    p.add_argument("--tree-files", type=int, default=None, help="files in the generated tree (default 2000)")
    p.add_argument("--copy-files", type=int, default=None,
                   help="files copied over proxmox_pct_remote, extrapolated to the tree (default 50)")
    p.add_argument("--hold-s", type=float, default=2.0, help="trainer_ready_hold_s for the bench (default 2)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=None, help="run only these sections")
    p.add_argument("--big-vmid", type=int, default=IDS[0],
                   help="container of the bigrelease section (default %d; --only bigrelease uses only it)" % IDS[0])
    p.add_argument("--big-mib", type=int, default=1024, help="size of the bigrelease section's file (default 1024)")
    p.add_argument("--big-dir", default="/var/tmp",
                   help="where the bigrelease section writes its tree, outside the checkout (default /var/tmp)")
    p.add_argument("--keep-lab", action="store_true", help="leave containers 220-227 up at the end")
    p.add_argument("--reuse-lab", action="store_true",
                   help="do not recreate containers 220-227 at the start (default: down, then up)")
    p.add_argument("--output", default=os.path.join(HERE, "results", "latest.json"))
    p.add_argument("--update-readme", action="store_true",
                   help="write the table into bench/README.md between its bench:table markers")
    args = p.parse_args(argv)
    args.reps = args.reps or (1 if args.quick else 3)
    args.tree_files = args.tree_files or (300 if args.quick else 2000)
    args.copy_files = args.copy_files or (10 if args.quick else 50)
    sections = args.only or list(SECTIONS)
    ansible_playbook()  # before the lab is touched: a missing ansible-playbook says so, no traceback

    t0 = time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    # the containers the sections need: bigrelease alone needs only its own
    ids = [args.big_vmid] if sections == ["bigrelease"] else sorted(set(IDS) | {args.big_vmid})
    if not args.reuse_lab:
        lab("down", ids)  # fresh containers: no trainer left running from an earlier run
    lab("up", ids)
    bench = Bench(args)
    log("settings: %s" % json.dumps(bench.settings, sort_keys=True))
    load_before = os.getloadavg()
    try:
        bench.run(sections)
    finally:
        if not args.keep_lab:
            try:
                lab("down", ids)
            except subprocess.CalledProcessError as e:
                log("lab down failed: %s" % e)
        shutil.rmtree(bench.work, ignore_errors=True)
    total = time.monotonic() - t0
    table = bl.format_table(bench.rows)
    doc = {
        "started": started,
        "total_s": round(total, 1),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "settings": bench.settings,
        "sections": bench.results,
        "errors": bench.errors,
        "table": bench.rows,
        "table_markdown": table,
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True, default=str)
    settings_line = ("Settings: reps=%d (min and median shown), trainer_ready_hold_s=%g, poll interval %g s, "
                     "stand-in start-up 2 s, tree %d files, copy over proxmox_pct_remote measured on %d files and "
                     "extrapolated, fleet -f 8 -e trainer_serial=8, containers %d-%d." % (
                         args.reps, args.hold_s, bench.settings["trainer_ready_interval_s"], args.tree_files,
                         args.copy_files, IDS[0], IDS[-1]))
    print()
    print(settings_line + " Total %.0f s." % total)
    print(table)
    if bench.errors:
        print("\nsections with errors: %s" % ", ".join(sorted(bench.errors)))
    if args.update_readme:
        readme = os.path.join(HERE, "README.md")
        with open(readme, encoding="utf-8") as fh:
            text = fh.read()
        body = "Last full run: %s, %d CPUs, load average %.1f before / %.1f after, %.0f s in all.\n%s\n\n%s\n" % (
            started, os.cpu_count(), load_before[0], doc["machine"]["loadavg_after"][0], total, settings_line, table)
        with open(readme, "w", encoding="utf-8") as fh:
            fh.write(bl.replace_between(text, README_START, README_END, body))
        log("table written into %s" % readme)
    print("\nwritten: %s" % args.output)
    return 1 if bench.errors else 0


if __name__ == "__main__":
    sys.exit(main())
