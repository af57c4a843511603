# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A refusal end to end: how long a user waits for a release the proof refuses early, and where the
time goes - the failed start's proof to its verdict, the rollback to the last good release, the whole
ansible-playbook run.

    python bench/refusal.py --label after [--reps 3] [--results FILE] [--keep-lab]

Container 520 (`lab.py up --fresh`), the role's default readiness settings (a 10 s hold, a 5 s stall
window) and the stand-in trainer (examples/trainer) starting in 3 s, one progress line a second; two
cases: those defaults, and the same with a 30 s throughput window after the proof (trainer_measure_s). In
each case a first deploy (not timed) proves a good release; then each repetition deploys a new release whose
progress lines the proof cannot read (LOG_STYLE=iter with trainer_step_regex set to read `step=N` only):
the proof's early word refuses it within the stall window and the restart job rolls back to the good
release. Each repetition is checked: the play failed, the job rolled back, the good release runs again
(unit active, the job's rollback proof). The figures come from the restart job's own timeline (its
state file in the container: [phase, seconds since the job began]) and the controller's clock around
ansible-playbook. The results go into bench/results/refusal.json under ``--label`` (``before``: the
code before a change, ``after``: with it), with the commit measured; bench/report.py renders them.
"""
from __future__ import annotations

import argparse
import json
import os
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

CT = "520"  # --ct: 521 for a second run at the same time (the code before a change, beside the change)
RESULTS = os.path.join(ROOT, "bench", "results", "refusal.json")
STATE = "/var/lib/dflash-trainer/restart.json"  # trainer_job_state_path's default
# the role's readiness defaults, stated so that a change of them shows in the results
SETTINGS = {"trainer_ready_hold_s": 10, "trainer_ready_stall_s": 5, "trainer_ready_timeout_s": 900,
            "trainer_env": {"FAKE_TRAINER_STARTUP_S": "3"}, "trainer_target_hosts": "all"}
# a step regex that reads `step=N` only: the bad release writes `iter N | ...`
UNREADABLE = r"\bstep[=: ]\s*(\d+)"
# the cases: the role's defaults, and a throughput window after the proof (trainer_measure_s)
CASES = (("defaults", {}), ("trainer_measure_s=30", {"trainer_measure_s": 30}))
# the figures, in the table's order: (key, what)
FIGURES = (
    ("start_to_verdict_s", "the job's start to its verdict (the refusal)"),
    ("proof_to_verdict_s", "the failed start's proof to its verdict"),
    ("rollback_s", "rollback: the verdict to the job's end (the good release proved again)"),
    ("job_s", "the restart job, whole"),
    ("run_s", "the whole ansible-playbook run"),
)


def log(msg):
    sys.stderr.write("refusal: %s\n" % msg)
    sys.stderr.flush()


def lab_facts():
    with open(os.path.join(os.environ.get("DFLASH_LAB_STATE", "/var/lib/dflash-lab"), "lab.json")) as fh:
        return json.load(fh)


def inventory(path):
    facts = lab_facts()
    conn = {"ansible_connection": "dflash.trainer.pct", "ansible_host": facts["ssh_host"],
            "ansible_port": facts["ssh_port"], "ansible_user": facts["ssh_user"],
            "ansible_ssh_private_key_file": facts["ssh_private_key"],
            "ansible_python_interpreter": "/usr/bin/python3", "ansible_pct_known_hosts_file": facts["known_hosts"]}
    with open(path, "w") as fh:
        json.dump({"all": {"hosts": {"refusal-%s" % CT: {"proxmox_vmid": int(CT)}}, "vars": conn}}, fh)
    return path


def tree(base, name, rev, **knobs):
    """A copy of the stand-in trainer with its fault.env knobs and a revision file (a new release each time)."""
    dst = os.path.join(base, name)
    subprocess.run(["cp", "-a", os.path.join(ROOT, "examples", "trainer"), dst], check=True)
    with open(os.path.join(dst, "fault.env"), "w") as fh:
        fh.write("".join("%s=%s\n" % kv for kv in sorted(knobs.items())))
    with open(os.path.join(dst, "revision"), "w") as fh:
        fh.write("%s\n" % rev)
    return dst


def deploy(inv, src, **extra):
    """(wall seconds, rc, stdout: the json callback's document, stderr) of one deploy.yml run."""
    try:
        program = require_program("ansible-playbook")
    except ProgramNotFound as e:
        raise SystemExit("refusal: %s" % e) from None
    env = program_env(program, dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                                    ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_VERBOSE_TO_STDERR="1"))
    argv = [program, "-i", inv, os.path.join(ROOT, "deploy.yml"), "-e", json.dumps(dict(SETTINGS, trainer_src=src, **extra))]
    began = time.monotonic()
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    return time.monotonic() - began, res.returncode, res.stdout, res.stderr


def task_spans(out):
    """[[task name, seconds from its start to its end]] of the run (ansible.posix.json's durations,
    skipped tasks left out): where the run's time went outside the restart job."""
    try:
        doc = bl.json_document(out)
    except ValueError:
        return []
    spans = []
    for play_ in doc.get("plays", []):
        for task in play_.get("tasks", []):
            info, hosts = task.get("task", {}), task.get("hosts", {})
            dur = info.get("duration", {})
            if dur.get("start") and dur.get("end") and hosts and not all(r.get("skipped") for r in hosts.values()):
                spans.append([info.get("name", ""), round(bl.parse_iso_utc(dur["end"]) - bl.parse_iso_utc(dur["start"]), 3)])
    return spans


def pct(*args):
    return subprocess.run(["pct", "exec", CT, "--", *args], capture_output=True, text=True, timeout=120, check=False)


def job_state():
    res = pct("cat", STATE)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def timeline_figures(timeline):
    """{figure: seconds} from the job's timeline ([phase, seconds since the job began], ...): the verdict
    is the first phase after the failed proof (rolling back, restoring, stopping failed trainer)."""
    at = {}
    for name, t in timeline:
        at.setdefault(name, t)
    verdict = next((t for name, t in timeline if name in ("rolling back", "restoring", "stopping failed trainer")),
                   None)
    if verdict is None or "proving" not in at or "finished" not in at:
        raise ValueError("no refusal in the job's timeline: %s" % timeline)
    return {"start_to_verdict_s": verdict, "proof_to_verdict_s": verdict - at["proving"],
            "rollback_s": at["finished"] - verdict, "job_s": at["finished"]}


def check(rc, out, state, good_release):
    """Problems with one repetition (empty: refused early and rolled back to the good release, proved)."""
    problems = []
    result = state.get("result") or {}
    if rc == 0:
        problems.append("the deploy did not fail")
    if not result.get("rolled_back") or result.get("rollback_release") != good_release:
        problems.append("no rollback to %s: %s" % (good_release, result.get("outcome")))
    if not result.get("rollback_proof"):
        problems.append("the rollback has no proof: %s" % result.get("outcome"))
    if "trainer_step_regex" not in (result.get("msg") or ""):
        problems.append("the refusal does not name trainer_step_regex: %s" % result.get("msg"))
    if "not ready after" in (result.get("msg") or ""):
        problems.append("refused at the deadline, not by the early word")
    if pct("systemctl", "is-active", "dflash-trainer").stdout.strip() != "active":
        problems.append("the trainer is not running after the rollback")
    if problems:
        problems.append(out[-3000:])
    return problems


def commit():
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
    # what the run measured: the collection's code (a change of the bench, its results or the docs is not one)
    dirty = git("status", "--porcelain", "--", ".", ":!bench", ":!docs", ":!*.md")
    return git("rev-parse", "--short", "HEAD") + (" (with uncommitted changes)" if dirty else "")


def median_row(reps):
    return {key: {"median": round(statistics.median(r[key] for r in reps), 2),
                  "min": round(min(r[key] for r in reps), 2)} for key, _what in FIGURES}


# derived from every repetition's own figures when the table is rendered: the rest of the run
OUTSIDE = (("outside_s", "the run outside the job: Ansible, the first read, the upload, the pre-flight"),)


def cell(case, key):
    """{median, min} of figure ``key`` of a case's results (None without them)."""
    if not case:
        return None
    if key == "outside_s":
        values = [r["run_s"] - r["job_s"] for r in case["reps"]]
        return {"median": statistics.median(values), "min": min(values)}
    return case["figures"].get(key)


def table(doc):
    """Markdown: a row per case and figure, a column per label (before, after) - median (min) - and the
    change of the medians."""
    labels = [lab for lab in ("before", "after") if lab in doc] + sorted(set(doc) - {"before", "after"})
    head = "| case | figure | %s |%s\n|---|---|%s%s\n" % (
        " | ".join(labels), " change |" if len(labels) == 2 else "", "---|" * len(labels),
        "---|" if len(labels) == 2 else "")
    rows = []
    for case, _extra in CASES:
        for key, what in FIGURES + OUTSIDE:
            cells = [cell(doc[lab]["cases"].get(case), key) for lab in labels]
            change = ""
            if len(labels) == 2:
                change = " %s |" % ("%+.1f s" % (cells[1]["median"] - cells[0]["median"]) if all(cells) else "")
            rows.append("| %s | %s | %s |%s" % (case, what, " | ".join(
                "%.1f s (%.1f)" % (c["median"], c["min"]) if c else "-" for c in cells), change))
    notes = ["%s: commit %s, container %s, %d repetitions each, ended %s, load average %.1f before / %.1f after." % (
        lab, doc[lab]["commit"], doc[lab].get("container", CT), doc[lab]["reps"], doc[lab]["when"],
        doc[lab]["load_before"], doc[lab].get("load_after", float("nan"))) for lab in labels]
    return head + "\n".join(rows) + "\n\n" + "\n".join("- " + n for n in notes) + "\n"


def run_case(base, inv, case, extra, reps):
    """The good release deployed (not timed), then ``reps`` refused releases -> the repetitions' figures."""
    wall, rc, out, err = deploy(inv, tree(base, "good-" + case, "good " + case), **extra)
    good = (job_state().get("result") or {}).get("release")
    if rc != 0 or not good:
        raise SystemExit("refusal: the good release's deploy failed:\n%s\n%s" % (out[-3000:], err[-2000:]))
    log("%s: good release %s proved in %.1f s" % (case, good, wall))
    got = []
    for i in range(reps):
        name = "bad-%s-%d" % (case, i)
        wall, rc, out, err = deploy(inv, tree(base, name, name, LOG_STYLE="iter"), trainer_step_regex=UNREADABLE, **extra)
        state = job_state()
        problems = check(rc, out + err, state, good)
        if problems:
            raise SystemExit("refusal: %s, repetition %d:\n%s" % (case, i + 1, "\n".join(problems)))
        figures = dict(timeline_figures(state["timeline"]), run_s=round(wall, 2))
        figures.update(timeline=state["timeline"], tasks=task_spans(out))
        log("%s, repetition %d: %s" % (case, i + 1, ", ".join("%s %.1f s" % (k, figures[k]) for k, _w in FIGURES)))
        got.append(figures)
    return got


def main(argv=None):
    global CT  # pylint: disable=global-statement  # the one container every helper reaches
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("--label", required=True, help="before or after (a change), the key of the results")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--results", default=RESULTS, help="the results file to add the run to (default: %(default)s)")
    p.add_argument("--ct", default=CT, help="the lab container (default: %(default)s)")
    p.add_argument("--keep-lab", action="store_true")
    args = p.parse_args(argv)
    CT = args.ct
    load, code = os.getloadavg()[0], commit()  # the code as the run starts: what it measures
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    pct("rm", "-rf", "/opt/dflash-trainer")
    cases = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-refusal-") as base:
            inv = inventory(os.path.join(base, "hosts.json"))
            for case, extra in CASES:
                reps = run_case(base, inv, case, extra, args.reps)
                cases[case] = {"settings": dict(SETTINGS, trainer_step_regex=UNREADABLE, **extra),
                               "figures": median_row(reps), "reps": reps}
    finally:
        if not args.keep_lab:
            subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "down", "--ids", CT],
                           check=False, stdout=subprocess.DEVNULL)
    # another run may have written the file meanwhile (two at once, on two containers): read it again
    doc = {}
    if os.path.exists(args.results):
        with open(args.results) as fh:
            doc = json.load(fh)
    doc[args.label] = {"commit": code, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
                       "container": CT, "reps": args.reps, "cases": cases}
    with open(args.results, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.write("\n")
    sys.stdout.write(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
