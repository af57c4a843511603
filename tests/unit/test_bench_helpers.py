# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure helpers of bench/run.py (bench/benchlib.py): no lab needed."""
from __future__ import annotations

import json
import os
import re
import stat

import pytest

from bench import benchlib as bl


def test_tree_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    na, sa = bl.generate_tree(str(a), 60, seed=7)
    nb, sb = bl.generate_tree(str(b), 60, seed=7)
    assert (na, sa) == (nb, sb) == (60, sum(size for _rel, size in bl.tree_layout(60, seed=7)))
    assert bl.tree_digest(str(a)) == bl.tree_digest(str(b))
    c = tmp_path / "c"
    bl.generate_tree(str(c), 60, seed=8)
    assert bl.tree_digest(str(c)) != bl.tree_digest(str(a))


def test_tree_shape(tmp_path):
    layout = bl.tree_layout(200)
    assert layout[0][0] == "run.sh"
    assert all(1024 <= size <= 20 * 1024 for rel, size in layout[1:])
    assert len({rel for rel, _size in layout}) == 200
    assert max(rel.count("/") for rel, _size in layout) >= 4  # nested directories
    # a smaller tree is the first files of a larger one (the copy subset)
    assert bl.tree_layout(50) == layout[:50]
    bl.generate_tree(str(tmp_path), 20)
    assert os.stat(tmp_path / "run.sh").st_mode & stat.S_IXUSR
    for rel, size in bl.tree_layout(20):
        assert os.path.getsize(tmp_path / rel) == size


def test_change_one_file_and_back(tmp_path):
    bl.generate_tree(str(tmp_path), 30)
    original = bl.tree_digest(str(tmp_path))
    rel = bl.change_one_file(str(tmp_path), 30, version=1)
    changed = bl.tree_digest(str(tmp_path))
    assert changed != original
    assert os.path.getsize(tmp_path / rel) == dict(bl.tree_layout(30))[rel]
    bl.change_one_file(str(tmp_path), 30, version=0)
    assert bl.tree_digest(str(tmp_path)) == original


def test_per_task_arithmetic():
    assert bl.per_task(9.0, 1.0, 20) == pytest.approx(0.4)
    assert bl.paired_per_task([9.0, 11.0], [1.0, 1.0]) == pytest.approx([0.4, 0.5])
    with pytest.raises(ValueError):
        bl.per_task(1.0, 1.0, 0)
    s = bl.summary([3.0, 1.0, 2.0, None])
    assert (s["n"], s["min"], s["median"], s["max"]) == (3, 1.0, 2.0, 3.0)
    assert bl.summary([])["median"] is None
    assert bl.ratio(4.0, 2.0) == 2.0 and bl.ratio(1.0, 0) is None and bl.ratio(None, 1.0) is None


def test_checks_and_verdicts():
    ok = bl.check_max(0.5, 3.0)
    assert ok["met"] and ok["by"] == 0.0 and bl.verdict_words(ok) == "met"
    over = bl.check_max(4.0, 3.0)
    assert not over["met"] and over["by"] == pytest.approx(1.0)
    assert bl.verdict_words(over) == "MISSED by 1.00 s (1.33× the limit)"
    short = bl.check_min(2.5, 4.0)
    assert not short["met"] and short["by"] == pytest.approx(1.5)
    assert bl.verdict_words(short, "x") == "MISSED by 1.50× (2.50×, target >= 4.0×)"
    assert bl.verdict_words(bl.check_max(None, 1.0)) == "n/a"


def test_table_format():
    table = bl.format_table([
        {"figure": "1 per task", "what": "ours", "min": 0.31, "median": 0.384, "target": "", "verdict": ""},
        {"figure": "1 per task", "what": "a|b", "min": None, "median": 2.0, "unit": "x", "target": "≤ 1.5×",
         "verdict": "MISSED"},
        {"figure": "2", "what": "round trips", "min": None, "median": 24, "unit": "n", "target": "", "verdict": ""},
        {"figure": "3", "what": "copy", "min": None, "median": 4321.0, "target": "", "verdict": ""},
    ])
    lines = table.splitlines()
    assert lines[0] == "| figure | what | min | median | target | verdict |"
    assert lines[1] == "|---|---|---|---|---|---|"
    assert lines[2] == "| 1 per task | ours | 0.31 s | 0.38 s |  |  |"
    assert lines[3] == "| 1 per task | a\\|b | - | 2.00× | ≤ 1.5× | MISSED |"
    assert lines[4] == "| 2 | round trips | - | 24 |  |  |"
    assert lines[5] == "| 3 | copy | - | 4321.0 s |  |  |"


def test_parsers():
    doc = {"plays": [{"play": {}, "tasks": [{
        "task": {"name": "r : Prove", "duration": {"start": "2026-11-30T04:24:30.562648Z",
                                                   "end": "2026-11-30T04:24:37.377042Z"}},
        "hosts": {"bench-220": {"action": "dflash.trainer.trainer_restart", "failed": True, "msg": "x"}}}]}],
        "stats": {"bench-220": {"changed": 1, "ok": 2}, "bench-221": {"changed": 0, "ok": 3}}}
    rows = bl.task_results(bl.json_document("[WARNING]: noise\n" + json.dumps(doc, indent=1)))
    (row,) = bl.find_tasks(rows, "dflash.trainer.trainer_restart", "bench-220")
    assert row["end"] - row["start"] == pytest.approx(6.814394)
    assert bl.recap_totals(doc) == {"changed": 1, "ok": 5}

    vvv = ("<127.0.0.1> PCT CONNECT vmid=220 via 127.0.0.1\n<127.0.0.1> PCT EXEC ssh ...\n"
           "<127.0.0.1> PCT PUT /a TO /b\n<127.0.0.1> PCT EXEC ssh ...\nsomething PCT EXEC not at start\n")
    calls = bl.count_pct_calls(vvv)
    assert (calls["EXEC"], calls["PUT"], calls["CONNECT"], calls["round_trips"]) == (2, 1, 1, 3)

    inv = "abc"
    lines = [
        {"MESSAGE": "step=5 loss=1 tok/s=1.0", "_SYSTEMD_INVOCATION_ID": "old", "__REALTIME_TIMESTAMP": "90000000"},
        {"MESSAGE": "cuda: allocated gpu0=1MiB", "_SYSTEMD_INVOCATION_ID": inv, "__REALTIME_TIMESTAMP": "100000000"},
        {"MESSAGE": "step=1 loss=1 tok/s=1.0", "_SYSTEMD_INVOCATION_ID": inv, "__REALTIME_TIMESTAMP": "101000000"},
        {"MESSAGE": "step=2 loss=1 tok/s=1.0", "_SYSTEMD_INVOCATION_ID": inv, "__REALTIME_TIMESTAMP": "102500000"},
        {"MESSAGE": "dflash-trainer.service: Main process exited, code=exited, status=1/FAILURE",
         "UNIT": "dflash-trainer.service", "INVOCATION_ID": inv, "__REALTIME_TIMESTAMP": "103000000"},
    ]
    entries = bl.parse_journal("\n".join(json.dumps(x) for x in lines))
    cond, parts = bl.ready_condition_time(entries, inv, min_steps=2)
    assert cond == pytest.approx(102.5) and parts["alloc"] == pytest.approx(100.0)
    assert bl.ready_condition_time(entries, "other")[0] is None
    ts, msg = bl.main_exit_time(entries, inv)
    assert ts == pytest.approx(103.0) and "status=1" in msg
    assert bl.main_exit_time(entries, "old") == (None, None)


def test_calls_by_task_recap_and_readme_markers():
    text = ("TASK [r : A] ****\n<127.0.0.1> PCT CONNECT vmid=220 via h\n<127.0.0.1> PCT EXEC ssh x\n"
            "TASK [r : B (no remote call)] ***\nok: [bench-220]\n"
            "TASK [r : C] ***\n<127.0.0.1> PCT EXEC ssh y\n<127.0.0.1> PCT PUT /a TO /b\n"
            "PLAY RECAP ***\nbench-220                  : ok=14   changed=0    unreachable=0    failed=0    "
            "skipped=3    rescued=0    ignored=0\n")
    assert bl.pct_calls_by_task(text) == [("r : A", 1), ("r : C", 2)]
    assert bl.recap_lines(text) == {"bench-220": {"ok": 14, "changed": 0, "unreachable": 0, "failed": 0}}
    doc = "# t\n<!-- s -->\nold\n<!-- e -->\ntail\n"
    assert bl.replace_between(doc, "<!-- s -->", "<!-- e -->", "new\n") == "# t\n<!-- s -->\nnew\n<!-- e -->\ntail\n"


def _task(name, start, end, hosts):
    return {"task": {"name": name, "duration": {"start": start, "end": end}}, "hosts": hosts}


RESTART = "dflash.trainer.trainer_restart"


def test_the_restart_jobs_outcome_is_read_from_the_call_that_saw_it_end():
    """Sections 4-6 read what the role runs: the restart job (trainer_restart operation=start, then
    operation=wait until it ends) - its result is that of the last call that saw the job finished."""
    failed = {"ok": False, "msg": "ModuleNotFoundError: No module named 'torch'", "rolled_back": True,
              "outcome": "Rolled back: the last good release a1 runs again", "failed_phase": "proving",
              "failure_details": {"invocation_id": "inv-bad", "unit": {"InvocationID": "inv-bad"}}}
    proved = {"ok": True, "proof": {"invocation_id": "inv-good", "seconds_to_ready": 4.2}}
    doc = {"plays": [{"tasks": [
        _task("trainer : Check the inputs against the target", "2026-11-30T04:00:00Z", "2026-11-30T04:00:01Z", {
            "bench-220": {"action": "dflash.trainer.trainer_status", "no_op": False},
            "bench-221": {"action": "dflash.trainer.trainer_status", "no_op": False}}),
        _task("trainer : Pre-flight, install and start the restart job", "2026-11-30T04:00:01Z",
              "2026-11-30T04:00:11Z", {
                  "bench-220": {"action": RESTART, "started": True, "finished": False, "phase": "proving"},
                  "bench-221": {"action": RESTART, "started": True, "finished": True, "result": proved}}),
        _task("trainer : Watch the restart job", "2026-11-30T04:00:11Z", "2026-11-30T04:00:25.5Z", {
            "bench-220": {"action": RESTART, "finished": True, "result": failed, "attempts": 2},
            "bench-221": {"action": RESTART, "skipped": True}}),
    ]}]}
    rows = bl.task_results(doc)
    task, job = bl.job_outcome(rows, "bench-220")
    assert task["name"] == "trainer : Watch the restart job" and job is failed
    assert task["end"] == pytest.approx(bl.parse_iso_utc("2026-11-30T04:00:25.5Z"))
    assert bl.failed_invocation(job) == "inv-bad"
    assert bl.failed_invocation({"failure_details": {"unit": {"InvocationID": "u1"}}}) == "u1"
    assert bl.failed_invocation({"ok": False}) is None
    task, job = bl.job_outcome(rows, "bench-221")  # ended within the call that started it; the wait skipped
    assert task["name"].endswith("start the restart job") and job["proof"]["invocation_id"] == "inv-good"
    assert bl.job_outcome(rows, "bench-222") == (None, None)
    # the job still running when the play ended: no outcome
    assert bl.job_outcome(bl.task_results({"plays": [{"tasks": [doc["plays"][0]["tasks"][1]]}]}),
                          "bench-220") == (None, None)
    assert [r["host"] for r in bl.ran(rows, RESTART)] == ["bench-220", "bench-221", "bench-220"]
    assert bl.ran(rows, RESTART, "bench-221")[0]["result"]["finished"] is True
    assert len(bl.ran(rows, "dflash.trainer.trainer_status")) == 2


def test_the_jobs_stop_of_the_failed_start_is_found_after_its_exit():
    unit = "dflash-trainer.service"
    lines = [
        {"MESSAGE": "Stopping dflash-trainer.service - DFlash trainer...", "UNIT": unit,
         "__REALTIME_TIMESTAMP": "99000000"},  # the cycle's first stop (the good trainer), before the exit
        {"MESSAGE": "dflash-trainer.service: Main process exited, code=exited, status=1/FAILURE", "UNIT": unit,
         "INVOCATION_ID": "inv-bad", "__REALTIME_TIMESTAMP": "100000000"},
        {"MESSAGE": "Stopped other.service - x", "UNIT": "other.service", "__REALTIME_TIMESTAMP": "100100000"},
        {"MESSAGE": "dflash-trainer.service: Failed with result 'exit-code'.", "UNIT": unit,
         "__REALTIME_TIMESTAMP": "100200000"},
        {"MESSAGE": "Stopped dflash-trainer.service - DFlash trainer.", "UNIT": unit,
         "__REALTIME_TIMESTAMP": "100750000"},
        {"MESSAGE": "Started dflash-trainer.service - DFlash trainer.", "UNIT": unit,
         "__REALTIME_TIMESTAMP": "101000000"},
    ]
    entries = bl.parse_journal("\n".join(json.dumps(x) for x in lines))
    exit_ts, _msg = bl.main_exit_time(entries, "inv-bad")
    ts, msg = bl.unit_stop_time(entries, exit_ts)
    assert ts == pytest.approx(100.75) and msg.startswith("Stopped dflash-trainer.service")
    assert bl.unit_stop_time(entries, 101.0) == (None, None)
    assert bl.unit_stop_time(entries, 0)[0] == pytest.approx(99.0)


def test_role_defaults_are_read_not_copied():
    text = ("---\n# readiness\ntrainer_ready_min_steps: 2\ntrainer_ready_interval_s: 0.5  # a poll\n"
            "trainer_measure_s: null\n  trainer_nested: 9\n")
    assert bl.role_default(text, "trainer_ready_interval_s") == "0.5"
    assert bl.role_default(text, "trainer_ready_min_steps") == "2"
    assert bl.role_default(text, "trainer_nested") is None and bl.role_default(text, "trainer_x") is None
    real = open(os.path.join(os.path.dirname(__file__), "..", "..", "roles", "trainer", "defaults", "main.yml")).read()
    assert float(bl.role_default(real, "trainer_ready_interval_s")) > 0
    assert int(bl.role_default(real, "trainer_ready_min_steps")) >= 1


def test_the_bench_reads_only_actions_the_role_runs():
    """bench/run.py looks for tasks by action: each one it names is a module the role still calls."""
    here = os.path.dirname(__file__)
    root = os.path.join(here, "..", "..")
    bench = open(os.path.join(root, "bench", "run.py")).read() + open(os.path.join(root, "bench", "benchlib.py")).read()
    role = ""
    for dirpath, _dirs, files in os.walk(os.path.join(root, "roles", "trainer")):
        for name in files:
            if name.endswith(".yml"):
                role += open(os.path.join(dirpath, name)).read()
    named = set(re.findall(r'"(dflash\.trainer\.(?:trainer|gpu)_[a-z_]+)"', bench))  # modules, not the connection
    assert named and bl.RESTART_ACTION in named
    assert {a for a in named if a + ":" not in role} == set()
