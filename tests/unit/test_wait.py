# -*- coding: utf-8 -*-
"""The one waiter (module_utils/job/wait.py) and the loops that use it, each on a fake clock: no test
here sleeps or reads the wall clock."""
import errno
import fcntl
import json

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.job import lock as _lock
from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed, compile_regexes, prove
from ansible_collections.dflash.trainer.plugins.module_utils.proof.readiness import Expectations
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import marker_line
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import (
    DONE,
    FAILED,
    TIMEOUT,
    PausedClock,
    done,
    failed,
    next_sleep,
    poll_until,
    waiting,
)
from ansible_collections.dflash.trainer.plugins.module_utils.plan import first_read as _begin
from ansible_collections.dflash.trainer.plugins.module_utils.plan import status as _status
from ansible_collections.dflash.trainer.plugins.module_utils.job import start as _job_start
from ansible_collections.dflash.trainer.plugins.module_utils.job.state import outcome_words


class Clock(object):
    """A fake monotonic clock; ``sleep`` advances it (plus ``lag`` per sleep: a slow poll) and
    records what was asked."""

    def __init__(self, t=100.0, lag=0.0):
        self.t, self.lag, self.slept = t, lag, []
        self.on_sleep = None

    def __call__(self):
        return self.t

    def sleep(self, s):
        assert s >= 0, "slept a negative time"
        self.slept.append(s)
        self.t += s + self.lag
        if self.on_sleep:
            self.on_sleep(self.t)


def counter(values):
    """observe(): the next value each call (the last one repeats)."""
    values = list(values)
    seen = []

    def observe():
        seen.append(values.pop(0) if len(values) > 1 else values[0])
        return seen[-1]
    observe.seen = seen
    return observe


def at_least(n):
    return lambda x, _elapsed: done(x, "got %s" % x) if x >= n else waiting("%s of %s" % (x, n))


# --- the waiter ---------------------------------------------------------------------------------

def test_done_at_the_first_observation_does_not_sleep():
    clock = Clock()
    out = poll_until(counter([5]), at_least(3), 10, 1, clock=clock, sleep=clock.sleep)
    assert (out.state, out.value, out.words, out.polls, out.elapsed) == (DONE, 5, "got 5", 1, 0)
    assert out.ok and not out.timed_out and clock.slept == []


def test_it_sleeps_the_interval_and_lands_on_the_deadline_never_past_it():
    clock = Clock()
    out = poll_until(counter([0]), at_least(1), 2.5, 1, clock=clock, sleep=clock.sleep)
    assert out.state == TIMEOUT and out.timed_out and not out.ok
    assert clock.slept == [1, 1, 0.5] and out.elapsed == 2.5 and out.polls == 4
    assert out.words == "0 of 1" and out.snapshot == 0  # the judge's last words and snapshot


def test_a_judge_that_decides_at_the_deadline_wins_over_the_timeout():
    def judge(x, elapsed):
        return failed("gave up after %g s" % elapsed) if elapsed >= 3 else waiting("not yet")
    clock = Clock()
    out = poll_until(counter([0]), judge, 3, 1, clock=clock, sleep=clock.sleep)
    assert (out.state, out.words) == (FAILED, "gave up after 3 s")


def test_the_judge_and_the_deadline_see_the_same_elapsed_seconds():
    seen = []

    def judge(x, elapsed):
        seen.append(elapsed)
        return waiting()
    clock = Clock(lag=0.3)  # each poll takes 0.3 s more than the sleep
    out = poll_until(counter([0]), judge, 2, 1, clock=clock, sleep=clock.sleep)
    assert out.state == TIMEOUT and seen[-1] == out.elapsed >= 2
    assert clock.slept == [1, pytest.approx(0.7)]  # never sleeps past the deadline from where it is


def test_a_clock_jump_past_the_deadline_ends_the_wait_at_the_next_round():
    clock = Clock()

    def sleep(s):
        clock.sleep(s)
        clock.t += 3600  # the process was stopped (SIGSTOP, a suspended VM): monotonic time went on
    out = poll_until(counter([0]), at_least(1), 60, 1, clock=clock, sleep=sleep)
    assert out.state == TIMEOUT and out.polls == 2 and clock.slept == [1]


def test_a_judge_can_ask_for_a_shorter_wait_and_move_the_deadline():
    def judge(x, elapsed):
        if x == 0:
            return waiting("soon", wake_at=0.25)
        if x == 1:
            return waiting("now", wake_at=0.1)  # already passed: look again at once
        return waiting("later", wake_at=elapsed + 0.5, deadline=4)
    clock = Clock()
    out = poll_until(counter(range(100)), judge, 2, 1, clock=clock, sleep=clock.sleep)
    assert out.state == TIMEOUT and out.elapsed == 4 and out.words == "later"
    assert clock.slept == [0.25, 0.0] + [0.5] * 7 + [0.25]


def test_no_deadline_waits_for_the_judge():
    clock = Clock()
    out = poll_until(counter(range(100)), at_least(50), None, 10, clock=clock, sleep=clock.sleep)
    assert out.state == DONE and out.value == 50 and out.elapsed == 500


@pytest.mark.parametrize("timeout", [0, -5])
def test_a_zero_or_negative_deadline_observes_once(timeout):
    clock = Clock()
    out = poll_until(counter([0]), at_least(1), timeout, 1, clock=clock, sleep=clock.sleep)
    assert out.state == TIMEOUT and out.polls == 1 and clock.slept == []


def test_on_wait_is_told_before_each_sleep_with_the_judges_words():
    told = []
    clock = Clock()
    out = poll_until(counter([0, 1, 2]), at_least(2), 10, 1, clock=clock, sleep=clock.sleep,
                     on_wait=lambda verdict, elapsed: told.append((verdict.words, elapsed)))
    assert out.value == 2 and told == [("0 of 2", 0), ("1 of 2", 1)]


def test_a_snapshot_in_hand_means_the_first_observation_comes_one_interval_later():
    clock = Clock()
    observe = counter([1])
    out = poll_until(observe, at_least(1), 10, 2, clock=clock, sleep=clock.sleep, first=0)
    assert out.value == 1 and clock.slept == [2] and out.polls == 1
    out = poll_until(observe, at_least(1), 0, 2, clock=clock, sleep=clock.sleep, first=0)
    assert (out.state, out.snapshot, out.polls) == (TIMEOUT, 0, 0)


def test_next_sleep():
    assert next_sleep(0, 1) == 1
    assert next_sleep(9.5, 1, deadline=10) == 0.5
    assert next_sleep(11, 1, deadline=10) == 0
    assert next_sleep(3, 1, deadline=10, wake_at=3.2) == pytest.approx(0.2)


def test_an_observation_that_raises_ends_the_wait_with_it():
    def observe():
        raise OSError("gone")
    with pytest.raises(OSError):
        poll_until(observe, at_least(1), 10, 1, clock=Clock(), sleep=Clock().sleep)


# --- the lock: its guard and the wait for a holder ---------------------------------------------------

def test_a_busy_guard_raises_at_its_deadline_on_the_injected_clock(tmp_path):
    path = str(tmp_path / "deploy.lock")
    clock = Clock()
    with open(path + ".guard", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        with pytest.raises(OSError) as err:
            with _lock.guard(path, wait_s=0.2, clock=clock, sleep=clock.sleep):
                raise AssertionError("the guard was taken while another holds it")
    assert err.value.errno == errno.EAGAIN and "still busy after 0.2 s" in str(err.value)
    assert sum(clock.slept) == pytest.approx(0.2) and max(clock.slept) == pytest.approx(0.005)
    with _lock.guard(path, wait_s=0.2, clock=clock, sleep=clock.sleep):  # free again: no wait
        pass


def test_the_lock_wait_is_told_by_the_outcome():
    refused = _lock.Outcome(_lock.REFUSE, False, "another deploy holds it")
    assert _lock._not_refused(refused, 0).state == "waiting"
    for out in (_lock.Outcome(_lock.TAKE, True, "taken"), _lock.Outcome(_lock.ERROR, False, "EIO")):
        assert _lock._not_refused(out, 0).value is out


# --- the restart job: started, watched, waited for ----------------------------------------------------

def job_state(path, **state):
    with open(path, "w") as fh:
        json.dump(state, fh)


def test_job_recorded_and_job_ended_judges():
    assert _job_start.job_recorded("j1")({"job_id": "j1", "phase": "stop"}, 0).state == DONE
    assert _job_start.job_recorded("j1")({"job_id": "j0"}, 0).state == "waiting"
    ended = _job_start.job_ended("j1")
    assert ended(({"job_id": "j1", "done": True}, False), 0).state == DONE
    died = ended(({"job_id": "j1", "phase": "proving"}, False), 0)
    assert (died.state, died.words) == (FAILED, "restart job j1 died in phase proving without an outcome")
    running = ended(({"job_id": "j1", "phase": "proving", "waiting": "holding (3 s of 300)"}, True), 0)
    assert running.words == "proving, holding (3 s of 300)"
    assert ended(({"job_id": "j0", "phase": "x"}, True), 0).words == "not started"
    assert ended((None, False), 0).words == "not started"


class FakeModule(object):
    def __init__(self, **params):
        self.params = params

    def exit_json(self, **kw):
        raise SystemExit(dict(kw, failed=False))

    def fail_json(self, **kw):
        raise SystemExit(dict(kw, failed=True))


def test_the_watch_of_the_restart_job_reports_its_phase_at_its_deadline(tmp_path, monkeypatch):
    path = str(tmp_path / "restart.json")
    job_state(path, job_id="j1", phase="proving", pid=1, waiting="holding")
    monkeypatch.setattr(_job_start, "job_alive", lambda state: True)
    clock = Clock()
    ok, fields = _job_start.wait_for_job(dict(state_path=path, job_id="j1", wait_s=1), clock=clock, sleep=clock.sleep)
    assert ok and fields == dict(changed=False, finished=False, phase="proving, holding",
                                 job=outcome_words(json.load(open(path))), timeline=[], waiting="holding")
    # a look every JOB_POLL_S (0.02 s: the outcome reaches the controller within it)
    assert sum(clock.slept) == pytest.approx(1.0) and max(clock.slept) == pytest.approx(_job_start.JOB_POLL_S)

    def finish(_t):
        job_state(path, job_id="j1", phase="done", done=True, result={"ok": True, "msg": "proved"})
    clock.on_sleep = finish
    ok, fields = _job_start.wait_for_job(dict(state_path=path, job_id="j1", wait_s=30), clock=clock, sleep=clock.sleep)
    assert ok and fields["finished"]

    job_state(path, job_id="j1", phase="stopping", pid=1)
    monkeypatch.setattr(_job_start, "job_alive", lambda state: False)
    ok, fields = _job_start.wait_for_job(dict(state_path=path, job_id="j1", wait_s=30), clock=clock, sleep=clock.sleep)
    assert not ok and fields["msg"] == "restart job j1 died in phase stopping without an outcome (state %s)" % path


def test_a_watch_that_has_seen_some_phases_comes_back_at_the_next_one(tmp_path, monkeypatch):
    path = str(tmp_path / "restart.json")
    timeline = [["stopping", 0.1], ["draining", 1.2]]
    job_state(path, job_id="j1", phase="draining", pid=1, timeline=timeline)
    monkeypatch.setattr(_job_start, "job_alive", lambda state: True)
    clock = Clock()
    start = clock.t

    def next_phase(t):
        if t - start >= 3:
            job_state(path, job_id="j1", phase="starting", pid=1, timeline=timeline + [["starting", 4.0]])
    clock.on_sleep = next_phase
    ok, fields = _job_start.wait_for_job(dict(state_path=path, job_id="j1", wait_s=10, seen=2), clock=clock,
                                         sleep=clock.sleep)
    assert ok and not fields["finished"] and fields["timeline"][-1] == ["starting", 4.0]
    assert 3 <= sum(clock.slept) < 3.1  # back at the new phase, not at the end of wait_s
    # seen covers every phase so far: the call waits out wait_s
    clock.slept[:] = []
    clock.on_sleep = None
    ok, fields = _job_start.wait_for_job(dict(state_path=path, job_id="j1", wait_s=10, seen=3), clock=clock,
                                         sleep=clock.sleep)
    assert ok and not fields["finished"] and sum(clock.slept) == pytest.approx(10.0)


def test_status_waits_for_an_interrupted_plays_job_then_says_what_it_did(tmp_path, monkeypatch):
    path = str(tmp_path / "restart.json")
    job = dict(job_id="j1", phase="proving", pid=1, owner="alice", started_at="t")
    job_state(path, **job)
    monkeypatch.setattr(_begin, "job_alive", lambda state: not state.get("done"))
    clock = Clock()
    words = _begin.wait_for_job(path, job, 0, clock=clock, sleep=clock.sleep)
    assert words == "waited for " + _begin.outcome_words(job) and clock.slept == []

    def finish(t):
        if t >= 102:
            job_state(path, **dict(job, done=True, result={"ok": True, "msg": "proved"}))
    clock.on_sleep = finish
    words = _begin.wait_for_job(path, job, 1800, clock=clock, sleep=clock.sleep)
    assert clock.slept == [0.5] * 4 and words == "waited for " + _begin.outcome_words(
        json.load(open(path)))
    assert _begin.job_over("j1")(({"job_id": "j2"}, True), 0).state == DONE  # another job on record


def test_the_watch_after_the_proof_ends_when_the_unit_cannot_be_read():
    clock = Clock()
    running = {"ActiveState": "active", "SubState": "running", "InvocationID": "a", "MainPID": "5"}
    props, seconds = _status.watch(lambda: (1, "", "bus error"), running, 30, clock=clock, sleep=clock.sleep)
    assert props is running and seconds == 1.0
    props, seconds = _status.watch(lambda: (1, "", ""), running, 0, clock=clock, sleep=clock.sleep)
    assert props is running and seconds == 0.0 and clock.slept == [1]


# --- the proof (job.cycle.prove) on a fake trainer ---------------------------------------------------

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
HEADER = "index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]"


class FakeTrainer(object):
    """systemctl show and nvidia-smi of a trainer that logs one step a second from t0 + ``steps_from``."""

    def __init__(self, clock, log, steps_from=2.0, error_at=None, exits_after=0.3, mib=30000):
        self.clock, self.log, self.steps_from, self.error_at = clock, log, steps_from, error_at
        self.exits_after, self.mib, self.t0, self.steps = exits_after, mib, clock(), 0
        self.dead_at = None
        log.write_text(marker_line(INV, "r1", 4242, "t") + "\nloading\n")
        clock.on_sleep = self.advance

    def advance(self, t):
        with open(str(self.log), "a") as fh:
            if self.error_at is not None and t - self.t0 >= self.error_at and self.dead_at is None:
                fh.write("RuntimeError: CUDA out of memory\n")
                self.dead_at = t + self.exits_after
                return
            while self.dead_at is None and t - self.t0 >= self.steps_from + self.steps:
                self.steps += 1
                fh.write("step=%d loss=2.0 tok/s=%.1f\n" % (self.steps, 1000.0 + self.steps))

    def __call__(self, argv):
        if "show" in argv:
            dead = self.dead_at is not None and self.clock() >= self.dead_at
            return 0, "\n".join([
                "ActiveState=%s" % ("failed" if dead else "active"), "SubState=%s" % ("failed" if dead else "running"),
                "Result=%s" % ("exit-code" if dead else "success"), "InvocationID=%s" % INV, "NRestarts=0",
                "MainPID=%d" % (0 if dead else 4242), "ExecMainCode=%d" % (1 if dead else 0),
                "ExecMainStatus=%d" % (1 if dead else 0)]) + "\n", ""
        return 0, "%s\n0, GPU-a, NVIDIA H200, %d MiB, 143771 MiB, 0 %%\n" % (HEADER, self.mib), ""


REGEXES = compile_regexes(r"step=\d+", r"step=(\d+)", r"tok/s=([\d.]+)", [r"Error:"])


def expect(**kw):
    base = dict(invocation_id=INV, gpus=[0], min_mib=1024, min_steps=2, hold_s=4, stall_s=3, timeout_s=30)
    base.update(kw)
    return Expectations(**base)


def test_the_proof_holds_then_measures_and_ticks_what_it_waits_for(tmp_path):
    clock = Clock()
    run = FakeTrainer(clock, tmp_path / "trainer.log")
    said = []
    proof = prove(run, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"), expect(), REGEXES,
                  clock=clock, sleep=clock.sleep, measure_s=8, tick=lambda waiting=None: said.append(waiting))
    assert proof["main_pid"] == 4242 and proof["figures"]["tok_s"]["n"] >= 7
    assert said[0].startswith("waiting for: ") and said[0].endswith("(0 s of 30)")
    assert said[-1] == "measuring throughput" and set(clock.slept) == {1.0}
    # step 1 at t=2, step 2 at t=3: ready at t=7 (held 4 s), then measure_s 8 - hold_s 4 = 4 s more
    assert clock.t - 100 == 11


def frozen_once(clock, trainer, at_sleep, seconds):
    """The clock's sleep, with the container frozen for ``seconds`` during sleep number ``at_sleep``: the trainer
    stands still with it (its own time shifts: its next step comes half a second after the thaw, when the prover
    has looked once), and the sleep returns that much late."""
    count = [0]

    def sleep(s):
        count[0] += 1
        if count[0] == at_sleep:
            clock.t += seconds
            trainer.t0 += seconds + 0.5
        clock.sleep(s)
    return sleep


def test_a_paused_clock_takes_out_only_the_time_the_waiter_did_not_run():
    clock = Clock()
    paused = PausedClock(clock, clock.sleep, late_s=10)
    paused.clock()
    paused.sleep(1)
    assert paused.clock() == 101 and paused.paused_s == 0
    clock.lag = 9.5  # a busy machine: a sleep late, within late_s
    paused.sleep(1)
    assert paused.clock() == 111.5 - 0 and paused.paused_s == 0
    clock.lag = 60  # frozen in a sleep
    paused.sleep(1)
    assert paused.clock() == clock() - 60 and paused.paused_s == 60
    clock.lag = 0
    clock.t += 30  # frozen while it worked (a command): no sleep between the readings
    assert paused.clock() == clock() - 90 and paused.paused_s == 90
    clock.t += 5  # a command that took 5 s: its own time
    assert paused.paused_s == 90 and paused.clock() == clock() - 90


def test_a_container_frozen_during_the_proof_is_no_stall_the_proofs_clock_stops_with_it(tmp_path):
    """A suspend-mode backup freezes the container: the trainer and the job proving it stop together. On the wall
    clock the trainer made no step for a minute (a stall); on the proof's clock (PausedClock) that minute is not
    there, and the proof says how long it did not run."""
    clock = Clock()
    run = FakeTrainer(clock, tmp_path / "trainer.log")
    with pytest.raises(StepFailed) as err:  # on the wall clock: judged a stall
        prove(run, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"), expect(timeout_s=120),
              REGEXES, clock=clock, sleep=frozen_once(clock, run, 4, 60))
    assert err.value.msg.startswith("no progress for 61 s (last step=2)"), err.value.msg
    clock = Clock()
    run = FakeTrainer(clock, tmp_path / "trainer2.log")
    paused = PausedClock(clock, frozen_once(clock, run, 4, 60))
    proof = prove(run, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer2.log"), expect(timeout_s=120),
                  REGEXES, paused=paused)
    assert proof["main_pid"] == 4242 and proof["paused_s"] == 60
    assert run.steps >= 4  # it went on stepping after the thaw
    # frozen while the job waited for a command (nvidia-smi, frozen with it): the same
    clock = Clock()
    run = FakeTrainer(clock, tmp_path / "trainer3.log")
    calls = [0]

    def frozen_in_a_command(argv):
        calls[0] += 1
        if calls[0] == 7:
            clock.t += 60
            run.t0 += 60.5
        return run(argv)
    paused = PausedClock(clock, clock.sleep)
    proof = prove(frozen_in_a_command, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer3.log"),
                  expect(timeout_s=120), REGEXES, paused=paused)
    assert proof["main_pid"] == 4242 and proof["paused_s"] == 60


def test_the_proof_fails_at_its_deadline_saying_what_was_missing(tmp_path):
    clock = Clock()
    run = FakeTrainer(clock, tmp_path / "trainer.log", mib=10)
    with pytest.raises(StepFailed) as err:
        prove(run, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"), expect(timeout_s=2.5),
              REGEXES, clock=clock, sleep=clock.sleep)
    assert err.value.msg.startswith("not ready after 2.5 s (trainer_ready_timeout_s=2.5): ") and clock.slept == [1, 1, 0.5]


def test_an_error_line_waits_for_the_exit_so_the_verdict_carries_it(tmp_path):
    clock = Clock()
    run = FakeTrainer(clock, tmp_path / "trainer.log", error_at=5, exits_after=0.3)
    with pytest.raises(StepFailed) as err:
        prove(run, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"), expect(), REGEXES,
              clock=clock, sleep=clock.sleep)
    assert "RuntimeError: CUDA out of memory" in err.value.msg and err.value.details["ready"] is False
    assert clock.slept[-3:] == [0.1, 0.1, 0.1]  # the grace: polled every 0.1 s until the exit
    assert err.value.details["unit"]["ActiveState"] == "failed"


def test_a_failure_during_the_measurement_says_so(tmp_path):
    clock = Clock()
    run = FakeTrainer(clock, tmp_path / "trainer.log", error_at=10, exits_after=0)
    with pytest.raises(StepFailed) as err:
        prove(run, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"), expect(), REGEXES,
              clock=clock, sleep=clock.sleep, measure_s=20)
    assert err.value.msg.startswith("after it was proved ready, during the throughput measurement: ")
