# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure helpers of bench/soak.py and bench/fleet_fault.py (verdicts, leak diffing): no lab needed."""
from __future__ import annotations

import copy

import pytest

from bench import fleet_fault as ff
from bench import soak

GOOD_ID, BAD_ID, OLD_ID = "a" * 16, "b" * 16, "c" * 16
UNIT_CG = ["/", "/system.slice/dflash-trainer.service"]


def proc(pid, args, cgroup=None, ppid=1):
    return {"pid": pid, "ppid": ppid, "args": args, "cgroup": cgroup or ["/", "/system.slice/other.service"]}


def gpu(index, holders, used=None):
    return {"index": index, "used_mib": sum(m for _p, m in holders) if used is None else used,
            "processes": [{"pid": p, "name": "/usr/bin/python3.11", "used_mib": m} for p, m in holders]}


BASELINE = {
    "procs": [proc(1, "/sbin/init", ["/", "/init.scope"]), proc(19, "/lib/systemd/systemd-journald"),
              proc(34, "/lib/systemd/systemd-logind")],
    "mounts": ["/", "/proc", "/sys"],
    "tmp": {"ansible_remote": [], "tmp_ansible": [], "release_tmp": [],
            "tmp_all": [".X11-unix", "systemd-private-x-systemd-logind.service-y"]},
    "releases": [],
}


def healthy(running=GOOD_ID, job=None, releases=None):
    """A probe of a container whose trainer runs ``running``, nothing leaked."""
    rel = releases or [running]
    return {
        "procs": copy.deepcopy(BASELINE["procs"]) + [
            proc(250, "/usr/bin/python3 /usr/local/lib/dflash-trainer/launch --root /opt/dflash-trainer", UNIT_CG),
            proc(254, "python3 /opt/dflash-trainer/releases/%s/trainer.py" % running, UNIT_CG, ppid=250)],
        "unit": {"ActiveState": "active", "SubState": "running", "MainPID": "250", "InvocationID": "inv1"},
        "running": running, "current": running, "last_good": running,
        "gpus": [gpu(i, [(254, 60000)]) for i in range(8)],
        "mounts": list(BASELINE["mounts"]),
        "tmp": {"ansible_remote": [], "tmp_ansible": [], "release_tmp": [],
                "tmp_all": BASELINE["tmp"]["tmp_all"] + ["torchinductor_root"]},
        "releases": sorted(rel), "newest": rel, "job": job, "lock": False,
    }


def proved_job(job_id="j2", release=GOOD_ID):
    return {"job_id": job_id, "done": True, "phase": "done",
            "result": {"ok": True, "release": release, "proof": {"step": 5}, "outcome": "ready: release %s" % release}}


IMPORT_ERROR = "trainer exited with status 1 after 0.1 s: ModuleNotFoundError: No module named 'flash_attn'"


def rolled_back_job(job_id="j2", release=BAD_ID, to=GOOD_ID, failure=IMPORT_ERROR):
    return {"job_id": job_id, "done": True, "phase": "done",
            "result": {"ok": False, "release": release, "failure": failure, "msg": failure, "rolled_back": True,
                       "rollback_release": to, "rollback_proof": {"step": 4},
                       "outcome": "Rolled back: the last good release %s runs again" % to}}


# -- schedule --------------------------------------------------------------------------------

def test_two_rounds_cover_every_fault_twice_and_start_good():
    kinds = soak.schedule(24)
    assert kinds[0] == soak.GOOD and len(soak.ROUND) == 12
    for fault in soak.FAULTS:
        assert kinds.count(fault) == 2
    assert kinds.count(soak.GOOD) == 4
    assert soak.schedule(100)[:12] == soak.ROUND


def test_fault_env_makes_every_cycle_a_new_release():
    assert soak.fault_env(soak.GOOD, 3) is None
    a, b = soak.fault_env("stall", 8), soak.fault_env("stall", 20)
    assert a != b and "FAULT=stall\nSTALL_AFTER_STEPS=2\n" in a
    assert soak.fault_env("exit0", 1).endswith("FAULT=exit0\n")


# -- verdicts --------------------------------------------------------------------------------

def test_good_release_proved_is_right():
    job = proved_job()
    assert soak.judge_cycle(soak.GOOD, 0, job, healthy(job=job), "j1", GOOD_ID, OLD_ID) == []


def test_fault_rolled_back_with_its_reason_is_right():
    job = rolled_back_job()
    assert soak.judge_cycle("import_error", 2, job, healthy(job=job), "j1", BAD_ID, GOOD_ID) == []


@pytest.mark.parametrize("mutate,words", [
    (lambda rc, job, pr: (0, job, pr), "exited 0"),
    (lambda rc, job, pr: (rc, dict(job, job_id="j1"), pr), "no new restart job"),
    (lambda rc, job, pr: (rc, dict(job, result=dict(job["result"], failure="not ready after 15 s")), pr),
     "does not match"),
    (lambda rc, job, pr: (rc, dict(job, result=dict(job["result"], rolled_back=False)), pr), "not rolled back"),
    (lambda rc, job, pr: (rc, job, dict(pr, running=BAD_ID)), "running release is " + BAD_ID),
    (lambda rc, job, pr: (rc, job, dict(pr, unit=dict(pr["unit"], ActiveState="inactive", MainPID="0"))),
     "unit inactive"),
    (lambda rc, job, pr: (rc, job, dict(pr, lock=True)), "deploy lock left"),
    (lambda rc, job, pr: (rc, dict(job, done=False, phase="rollback proving"), pr), "not done"),
])
def test_wrong_fault_verdicts_are_caught(mutate, words):
    job = rolled_back_job()
    rc, job, pr = mutate(2, job, healthy(job=job))
    problems = soak.judge_cycle("import_error", rc, job, pr, "j1", BAD_ID, GOOD_ID)
    assert any(words in p for p in problems), problems


def test_good_release_failing_or_not_running_is_wrong():
    job = rolled_back_job(release=GOOD_ID, to=OLD_ID)
    problems = soak.judge_cycle(soak.GOOD, 2, job, healthy(running=OLD_ID, job=job), "j1", GOOD_ID, OLD_ID)
    assert any("exited 2" in p for p in problems)
    assert any("not proved" in p for p in problems)
    assert any("running release is %s" % OLD_ID in p for p in problems)


# -- leaks -----------------------------------------------------------------------------------

def test_a_clean_container_has_no_leak():
    report = soak.leak_report(BASELINE, healthy())
    assert soak.leak_count(report) == 0, report


def test_processes_outside_the_unit_are_leaks():
    pr = healthy()
    pr["procs"].append(proc(900, "python3 /opt/dflash-trainer/releases/%s/trainer.py" % BAD_ID))  # a stray trainer
    pr["procs"].append(proc(901, "/usr/bin/python3 /root/.ansible/tmp/x/AnsiballZ_trainer_restart.py"))
    pr["procs"].append(proc(902, "sleep 3600"))
    procs = soak.leak_report(BASELINE, pr)["processes"]
    assert any(p.startswith("900 ") and "outside" in p for p in procs)
    assert any(p.startswith("901 ") for p in procs)
    assert any("sleep 3600" in p and "new since the baseline" in p for p in procs)
    assert len(procs) == 3


def test_a_second_copy_of_a_baseline_process_is_a_leak():
    pr = healthy()
    pr["procs"].append(proc(77, "/lib/systemd/systemd-logind"))
    assert soak.leak_report(BASELINE, pr)["processes"] == ["1 x /lib/systemd/systemd-logind (new since the baseline)"]


def test_gpu_memory_not_held_by_the_unit_is_a_leak():
    pr = healthy()
    pr["procs"].append(proc(900, "python3 -c worker"))
    pr["gpus"][7] = gpu(7, [(900, 30000)])  # an escaped child
    pr["gpus"][6] = gpu(6, [(254, 30000)], used=31000)  # 1000 MiB of a dead holder
    gpus = soak.leak_report(BASELINE, pr)["gpu_holders"]
    assert gpus == ["GPU 6: 1000 MiB used by no live process",
                    "GPU 7: pid 900 (/usr/bin/python3.11) holds 30000 MiB"]


def test_mounts_and_temp_files_are_leaks():
    pr = healthy()
    pr["mounts"] += ["/workspace", "/proc"]
    pr["tmp"] = {"ansible_remote": ["ansible-tmp-1-2"], "tmp_ansible": ["/tmp/ansible_x"],
                 "release_tmp": ["/opt/dflash-trainer/releases/.tmp-abc-1"],
                 "tmp_all": pr["tmp"]["tmp_all"] + ["ansible_x", "stray.txt"]}
    report = soak.leak_report(BASELINE, pr)
    assert sorted(report["mounts"]) == ["/proc", "/workspace"]
    assert report["temp_files"] == ["/root/.ansible/tmp/ansible-tmp-1-2", "/tmp/ansible_x",
                                    "/opt/dflash-trainer/releases/.tmp-abc-1", "/tmp/stray.txt"]


def test_releases_beyond_keep_but_the_protected_last_good():
    ids = ["%016d" % i for i in range(7)]
    pr = healthy(running=ids[0])
    pr.update(releases=sorted(ids[:5]), newest=ids[:5])
    assert soak.leak_report(BASELINE, pr, keep=5)["releases"] == []
    # the newest five all failed: the last good one (current again) is a 6th, kept on purpose
    pr.update(running=ids[5], current=ids[5], last_good=ids[5], releases=sorted(ids[:6]), newest=ids[:6])
    assert soak.leak_report(BASELINE, pr, keep=5)["releases"] == []
    pr.update(releases=sorted(ids), newest=ids)
    assert "7 releases kept, at most 6 expected" in soak.leak_report(BASELINE, pr, keep=5)["releases"][0]


def test_lock_left_is_a_leak():
    assert soak.leak_report(BASELINE, dict(healthy(), lock=True))["lock"] == [soak.LOCK_PATH]


# -- figures ---------------------------------------------------------------------------------

def test_figures_table():
    cycles = [{"kind": soak.GOOD, "wall_s": 14.0, "problems": []}, {"kind": soak.GOOD, "wall_s": 16.0, "problems": []},
              {"kind": "stall", "wall_s": 20.0, "problems": ["x"]}]
    doc = {"cycles": cycles, "per_kind": soak.median_by_kind(cycles), "wrong_verdicts": 1, "median_cycle_s": 16.0,
           "max_cycle_s": 20.0, "leaks": 0, "max_releases": 3,
           "leak_checks": [{"after_cycle": 3, "report": soak.leak_report(BASELINE, healthy())}]}
    assert doc["per_kind"][soak.GOOD] == {"n": 2, "median_s": 15.0, "max_s": 16.0}
    text = soak.figures_table(doc)
    assert "| good | 2 | 0 | 15.0 | 16.0 |" in text and "| stall | 1 | 1 | 20.0 | 20.0 |" in text
    assert "leaks found: 0" in text


# -- fleet -----------------------------------------------------------------------------------

HOSTS = ["h%d" % i for i in range(1, 9)]


def test_expected_outcomes_serial_1_stops_at_the_bad_host():
    exp = ff.expected_outcomes(HOSTS, "h4", 1)
    assert [exp[h] for h in HOSTS] == ["proved"] * 3 + ["rolled back"] + ["untouched"] * 4


def test_expected_outcomes_one_batch_and_two_batches():
    assert [ff.expected_outcomes(HOSTS, "h4", 8)[h] for h in HOSTS] == ["proved"] * 3 + ["rolled back"] + ["proved"] * 4
    assert [ff.expected_outcomes(HOSTS, "h4", 2)[h] for h in HOSTS] == (
        ["proved"] * 3 + ["rolled back"] + ["untouched"] * 4)


def test_classify_host():
    before = healthy(running=OLD_ID, job={"job_id": "j1", "done": True, "result": {"ok": True}})
    assert ff.classify_host(before, copy.deepcopy(before), GOOD_ID) == "untouched"
    assert ff.classify_host(before, healthy(running=GOOD_ID, job=proved_job()), GOOD_ID) == "proved"
    rolled = healthy(running=OLD_ID, job=rolled_back_job(release=BAD_ID, to=OLD_ID))
    assert ff.classify_host(before, rolled, BAD_ID) == "rolled back"
    stopped = copy.deepcopy(before)
    stopped["unit"].update(ActiveState="inactive", MainPID="0")
    assert ff.classify_host(before, stopped, GOOD_ID).startswith("WRONG: unit inactive")
    restarted = copy.deepcopy(before)
    restarted["unit"]["InvocationID"] = "inv2"
    assert "yet the trainer was restarted" in ff.classify_host(before, restarted, GOOD_ID)
    wrong_release = healthy(running=OLD_ID, job=proved_job())
    assert "proved, but runs" in ff.classify_host(before, wrong_release, GOOD_ID)
