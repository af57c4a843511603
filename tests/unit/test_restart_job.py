"""The restart job's sequence (module_utils/job/restart.py) with fake steps: what runs, in which
order, what is marked good, when it rolls back, what it says."""
import os
import stat

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed
from ansible_collections.dflash.trainer.plugins.module_utils.target.inductor_cache import purge
from ansible_collections.dflash.trainer.plugins.module_utils.job.state import job_alive, outcome_words, read_state, write_state
from ansible_collections.dflash.trainer.plugins.module_utils.job.restart import RestartJob


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

    def prove(self, invocation_id, n_restarts, reproof=False):
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
    assert purge(str(link)) and (keep / "f").exists()
    assert not link.is_symlink() and link.is_dir() and os.listdir(str(link)) == []  # a cache of its own
    cache = tmp_path / "cache2"
    (cache / "ab").mkdir(parents=True)
    # emptied, then made again empty, root's (the test's user's) and private
    assert purge(str(cache)) and cache.is_dir() and os.listdir(str(cache)) == []
    assert stat.S_IMODE(os.lstat(str(cache)).st_mode) == 0o700
    assert purge("") is False


def test_ledger_records_each_outcome_and_the_gate_rolls_back():
    from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import entry

    class MeasuredSteps(FakeSteps):
        def __init__(self, medians, **kw):
            super(MeasuredSteps, self).__init__(**kw)
            self.medians = list(medians)

        def prove(self, invocation_id, n_restarts, reproof=False):
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


class ErrorSteps(FakeSteps):
    """FakeSteps whose ``error_in`` step raises an unexpected exception (not StepFailed) once."""

    def __init__(self, error_in, error):
        super(ErrorSteps, self).__init__()
        self.error_in, self.error = error_in, error

    def _step(self, name, value=None):
        out = super(ErrorSteps, self)._step(name, value)
        if name == self.error_in and self.n[name] == 1:
            raise self.error
        return out


@pytest.mark.parametrize("step", ["stop", "drain", "purge", "start", "prove"])
@pytest.mark.parametrize("error", [OSError(16, "Device or resource busy", "/tmp/torchinductor_root"),
                                   ValueError("bad json"), KeyError("invocation_id")])
@pytest.mark.parametrize("last_good", ["old", "new"])
def test_any_error_in_any_step_ends_in_restore_or_rollback(step, error, last_good):
    """Issue 14 item 2: whatever a step raises, the job never ends with the trainer stopped and no
    reason: a release that never started is brought back, a started one is rolled back."""
    steps = ErrorSteps(step, error)
    layout = FakeLayout(current="new", last_good=last_good)
    result = RestartJob(steps, layout).run()
    assert result["ok"] is False and result["failure"].startswith(step if step != "prove" else "proof")
    assert ("%s" % error.args[-1] if not isinstance(error, OSError) else "Device or resource busy") in result["failure"]
    assert steps.calls[-1] == "prove" and steps.n["prove"] >= 1  # something was started and proved at the end
    if last_good == "old":
        assert result.get("rolled_back") and ("switch", "old") in layout.events
    else:
        assert result.get("restored") or result["failed_phase"] in ("starting", "proving")
    assert layout.entries and layout.entries[0]["reason"]


def test_an_error_switching_current_back_is_a_recorded_failure():
    class BadLayout(FakeLayout):
        def switch(self, rid):
            raise OSError(30, "Read-only file system", "/opt/dflash-trainer/current")

    steps = FakeSteps(fail=[("prove", 1, "no progress")])
    result = RestartJob(steps, BadLayout()).run()
    assert result["ok"] is False and "Read-only file system" in result["rollback_failure"]
    assert "FAILED as well" in result["outcome"]


def test_a_bookkeeping_error_after_the_proof_keeps_the_proved_trainer():
    class BadLayout(FakeLayout):
        def mark_good(self, rid):
            raise OSError(28, "No space left on device", "/opt/dflash-trainer/last_good")

    steps = FakeSteps()
    result = RestartJob(steps, BadLayout()).run()
    assert result["ok"] is True and "No space left on device" in result["warnings"][0]
    assert steps.calls == ["stop", "drain", "purge", "start", "prove"]


class Lease(object):
    def __init__(self, lose_after_checks):
        self.left = lose_after_checks
        self.checks = 0

    def check(self):
        from ansible_collections.dflash.trainer.plugins.module_utils.job.lock import LeaseLost
        self.checks += 1
        if self.checks > self.left:
            raise LeaseLost("lock /run/x is held by bob on ci since 3 s ago, not by this play")


@pytest.mark.parametrize("lose_after,calls", [
    (0, []),  # lost before the stop: nothing is touched
    (1, ["stop", "drain", "purge"]),  # lost while stopped: it does not start the trainer for a lock it lost
])
def test_a_job_that_lost_its_lease_stops_acting(lose_after, calls):
    steps = FakeSteps()
    layout = FakeLayout()
    result = RestartJob(steps, layout, lease=Lease(lose_after)).run()
    assert result["ok"] is False and result["lease_lost"]
    assert "held by bob" in result["msg"] and "nothing more was stopped, switched or started" in result["msg"]
    assert steps.calls == calls and layout.events == []


def test_a_lease_lost_during_a_failed_proof_never_rolls_back():
    steps = FakeSteps(fail=[("prove", 1, "no progress")])
    layout = FakeLayout()
    result = RestartJob(steps, layout, lease=Lease(2)).run()  # checks: stop, start; the rollback's is the 3rd
    assert result["lease_lost"] and layout.events == [] and steps.calls == ["stop", "drain", "purge", "start", "prove"]


def test_an_interrupted_job_is_named_as_such():
    state = {"job_id": "j1", "owner": "alice", "started_at": "t", "phase": "proving", "done": False, "pid": 2 ** 22 + 7}
    assert "was interrupted in phase proving" in outcome_words(state)


def test_a_group_member_records_nothing_proved_and_its_rollback_puts_the_configuration_back():
    layout = FakeLayout(current="old", last_good="old")
    restored = []

    class Config(object):
        def kept_for(self, rid):
            return rid == "old"

        def restore(self, rid):
            restored.append(rid)
            return ["env"]

        def keep(self, rid):
            raise AssertionError("a group member keeps nothing before the group's check")

    job = RestartJob(FakeSteps(), layout, rollback=False, mark_good=False, restore_config=True, config=Config())
    result = job.run()
    assert result["ok"] and restored == ["old"]
    assert layout.entries == [] and ("good", "old") not in layout.events  # the group's check decides (operation=good)
    assert "with the configuration it was proved with (environment file restored)" in result["outcome"]
