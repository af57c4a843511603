"""The restart job's sequence (module_utils/_restart_job.py) with fake steps: what runs, in which
order, what is marked good, when it rolls back, what it says."""
import os

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils._cycle import StepFailed, purge
from ansible_collections.dflash.trainer.plugins.module_utils._restart_job import (
    RestartJob,
    job_alive,
    outcome_words,
    read_state,
    write_state,
)


class FakeSteps(object):
    def __init__(self, fail=()):
        self.fail = list(fail)  # (call number of a step name, message)
        self.calls = []
        self.n = {}

    def _step(self, name, value=None):
        self.n[name] = self.n.get(name, 0) + 1
        self.calls.append(name)
        if (name, self.n[name]) in [(f[0], f[1]) for f in self.fail]:
            msg = [f[2] for f in self.fail if (f[0], f[1]) == (name, self.n[name])][0]
            raise StepFailed(msg, log_tail=["boom"])
        return value

    def stop(self):
        return self._step("stop", {})

    def drain(self):
        return self._step("drain", {})

    def purge(self):
        return self._step("purge", True)

    def start(self):
        return self._step("start", {"invocation_id": "inv%d" % (self.n.get("start", 0) + 1), "n_restarts": 0})

    def prove(self, invocation_id, n_restarts):
        return self._step("prove", {"main_pid": 42, "step": 7, "tok_s": 1000.0, "invocation_id": invocation_id})

    def unit_state(self):
        return "dflash-trainer is stopped (inactive/dead)"


class FakeLayout(object):
    def __init__(self, current="new", last_good="old"):
        self.cur, self.good, self.events, self.entries = current, last_good, [], []

    def current(self):
        return self.cur

    def last_good(self):
        return self.good

    def switch(self, rid):
        self.events.append(("switch", rid))
        self.cur = rid

    def mark_good(self, rid):
        self.events.append(("good", rid))
        self.good = rid

    def ledger(self):
        return list(self.entries)

    def record(self, entries):
        self.entries.extend(entries)


def test_success_marks_good_and_says_ready():
    steps, layout, phases = FakeSteps(), FakeLayout(), []
    res = RestartJob(steps, layout, on_phase=lambda name, **kw: phases.append(name)).run()
    assert res["ok"] and res["restarted"] and not res["rolled_back"]
    assert steps.calls == ["stop", "drain", "purge", "start", "prove"]
    assert layout.events == [("good", "new")]
    assert phases == ["stopping", "draining", "purging", "starting", "proving", "done"]
    assert res["outcome"].startswith("ready: release new proved (pid 42")


def test_no_purge_when_off():
    steps = FakeSteps()
    RestartJob(steps, FakeLayout(), purge=False).run()
    assert "purge" not in steps.calls


def test_failed_proof_rolls_back_to_last_good_and_proves_it():
    steps, layout = FakeSteps(fail=[("prove", 1, "trainer exited with status 1")]), FakeLayout()
    res = RestartJob(steps, layout, releases_dir="/opt/x/releases", log_path="/w/t.log").run()
    assert not res["ok"] and res["rolled_back"] and res["rollback_release"] == "old"
    assert res["failure"] == "trainer exited with status 1" and res["failed_phase"] == "proving"
    assert layout.events == [("switch", "old")]  # the failed release is never marked good
    assert steps.calls == ["stop", "drain", "purge", "start", "prove"] * 2
    assert "Rolled back: the last good release old runs again" in res["outcome"]
    assert "/opt/x/releases" in res["outcome"] and "/w/t.log" in res["outcome"]


def test_drain_failure_before_any_start_rolls_back_too():
    steps, layout = FakeSteps(fail=[("drain", 1, "GPU memory still held after 60 s")]), FakeLayout()
    res = RestartJob(steps, layout).run()
    assert not res["ok"] and not res["restarted"] and res["failed_phase"] == "draining"
    assert res["rolled_back"]


def test_failed_rollback_says_both():
    steps = FakeSteps(fail=[("prove", 1, "first"), ("prove", 2, "second reason\nmore")])
    res = RestartJob(steps, FakeLayout()).run()
    assert not res["ok"] and res["rollback_failure"].startswith("second")
    assert "Rollback to release old FAILED as well: second reason" in res["outcome"]
    assert "is stopped" in res["outcome"]


@pytest.mark.parametrize("last_good", [None, "new"])
def test_no_good_release_stops_the_failed_trainer(last_good):
    steps, layout = FakeSteps(fail=[("prove", 1, "no progress")]), FakeLayout(last_good=last_good)
    res = RestartJob(steps, layout).run()
    assert not res["ok"] and not res["rolled_back"] and layout.events == []
    assert steps.calls[-1] == "stop"
    assert res["outcome"].startswith("No rollback: no other release")


def test_rollback_off():
    steps = FakeSteps(fail=[("prove", 1, "x")])
    res = RestartJob(steps, FakeLayout(), rollback=False).run()
    assert not res["rolled_back"] and "trainer_rollback is off" in res["outcome"]


def test_state_file_roundtrip_and_liveness(tmp_path):
    path = str(tmp_path / "d" / "restart.json")
    assert read_state(path) is None
    write_state(path, {"job_id": "j1", "pid": os.getpid(), "phase": "proving", "done": False, "owner": "me",
                       "started_at": "t"})
    state = read_state(path)
    assert state["phase"] == "proving" and job_alive(state)
    assert "is in phase proving" in outcome_words(state)
    assert not job_alive(dict(state, pid=2 ** 22 + 12345))
    assert not job_alive(dict(state, pid_start="1"))  # a reused pid is not the job
    state.update(done=True, result={"outcome": "ready: release x"})
    assert "ended: ready: release x" in outcome_words(state) and not job_alive(state)
    with open(path, "w") as fh:
        fh.write("{garbage")
    assert read_state(path) is None


def test_purge_never_follows_a_symlink(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "f").write_text("x")
    link = tmp_path / "cache"
    link.symlink_to(keep)
    assert purge(str(link)) and (keep / "f").exists() and not link.exists()
    cache = tmp_path / "cache2"
    (cache / "ab").mkdir(parents=True)
    assert purge(str(cache)) and not cache.exists()
    assert purge(str(cache)) is False and purge("") is False


def test_ledger_records_each_outcome_and_the_gate_rolls_back():
    from ansible_collections.dflash.trainer.plugins.module_utils._throughput import entry

    class MeasuredSteps(FakeSteps):
        def __init__(self, medians, **kw):
            super(MeasuredSteps, self).__init__(**kw)
            self.medians = list(medians)

        def prove(self, invocation_id, n_restarts):
            proof = super(MeasuredSteps, self).prove(invocation_id, n_restarts)
            proof["figures"] = {"tok_s": {"median": self.medians.pop(0), "p10": 1.0, "p90": 2.0, "n": 9,
                                          "window_s": 10.0}}
            return proof

    layout = FakeLayout(current="new", last_good="old")
    layout.entries.append(entry("old", "proved", {"tok_s": {"median": 21500.0, "n": 50}}, "git 1111111", now=1.0))
    res = RestartJob(MeasuredSteps([12400.0, 21400.0]), layout, source="git 2222222", min_tokps_ratio=0.9).run()
    assert not res["ok"] and res["rolled_back"] and res["failure"].startswith("throughput gate: 12.4K tok/s is 58%")
    assert res["comparison"]["previous_release"] == "old" and res["comparison"]["change_pct"] == -42.3
    assert [(e["release"], e["verdict"]) for e in layout.entries[1:]] == [("new", "rolled back"), ("old", "proved")]
    assert layout.entries[1]["figures"]["tok_s"]["median"] == 12400.0 and layout.entries[2]["source"] == "git 1111111"
    assert ("good", "new") not in layout.events

    layout = FakeLayout(current="new", last_good="old")
    layout.entries.append(entry("old", "proved", {"tok_s": {"median": 21500.0, "n": 50}}, "git 1111111", now=1.0))
    res = RestartJob(MeasuredSteps([21900.0]), layout, source="git 3333333", min_tokps_ratio=0.9).run()
    assert res["ok"] and layout.entries[-1]["verdict"] == "proved" and layout.entries[-1]["source"] == "git 3333333"
    assert res["comparison"]["words"].startswith("release new (git 3333333): 21.9K tok/s (median of 9 samples over 10 s)")
    assert "previous old: 21.5K (+2%)" in res["comparison"]["words"]


def test_failed_start_is_recorded_too():
    layout = FakeLayout(last_good=None)
    RestartJob(FakeSteps(fail=[("prove", 1, "no progress for 6 s")]), layout).run()
    assert [(e["release"], e["verdict"], e["reason"]) for e in layout.entries] == [("new", "failed", "no progress for 6 s")]


def test_a_drain_that_fails_with_nothing_to_roll_back_to_restores_the_release_that_ran():
    # another tenant's memory on a trainer GPU: the drain gate fails after the stop; the release
    # that ran beside it is started again (drain gate noted, not enforced) instead of left stopped
    steps = FakeSteps(fail=[("drain", 1, "GPU memory still held after 60 s: GPU 7 20000 MiB"),
                            ("drain", 2, "GPU memory still held after 60 s: GPU 7 20000 MiB")])
    layout = FakeLayout(current="cur", last_good="cur")
    res = RestartJob(steps, layout).run()
    assert not res["ok"] and res["restored"] and res["failed_phase"] == "draining"
    assert steps.calls == ["stop", "drain", "stop", "drain", "purge", "start", "prove"]
    assert res["outcome"].startswith("Restored: release cur runs again and is proved ready")
    assert "restore drain gate: GPU memory still held" in res["outcome"]
    assert layout.events == []


def test_the_rollback_does_not_strand_the_last_good_release_on_a_drain_failure():
    steps = FakeSteps(fail=[("drain", 1, "held"), ("drain", 2, "held")])
    res = RestartJob(steps, FakeLayout(current="new", last_good="old")).run()
    assert res["rolled_back"] and "rollback_proof" in res and steps.calls[-2:] == ["start", "prove"]
    assert res["warnings"] == ["rollback drain gate: held; started anyway (it ran beside that memory before)"]
