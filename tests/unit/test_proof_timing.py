"""The proof's verdict comes when the hold ends, not a poll interval later (module_utils/proof/readiness.py:
Judge.wake_at; job.cycle.prove asks the waiter to wake then); with the log read between the observations
(the restart job's), the hold begins when the log showed its step, and a stall is timed by the same reads."""
import math

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl
from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed, compile_regexes, prove
from ansible_collections.dflash.trainer.plugins.module_utils.proof.readiness import Expectations, Judge, Snapshot, read_at

INV = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
HEADER = "index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]"
REGEXES = compile_regexes(tl.DEFAULT_READY_REGEX, tl.DEFAULT_STEP_REGEX, tl.DEFAULT_TOKPS_REGEX,
                          list(tl.DEFAULT_ERROR_REGEXES))


class Trainer(object):
    """A fake clock and the trainer it drives: the marker at 0, then a step every ``step_s`` from
    ``first_s`` on, written to the log as the clock passes them; systemctl show and nvidia-smi
    answer a running unit holding 30000 MiB; ``polls`` counts the observations."""

    def __init__(self, log, first_s=0.3, step_s=0.25):
        self.t, self.log, self.first_s, self.step_s, self.steps, self.polls = 0.0, log, first_s, step_s, 0, 0
        log.write_text(tl.marker_line(INV, "r1", 4242, "t") + "\n")

    def clock(self):
        return self.t

    def sleep(self, s):
        self.t += s
        with open(str(self.log), "a") as fh:
            while self.t >= self.first_s + self.steps * self.step_s:
                self.steps += 1
                fh.write("step=%d loss=2.0 tok/s=2000.0\n" % self.steps)

    def __call__(self, argv):
        if "show" in argv:
            self.polls += 1
            return 0, ("ActiveState=active\nSubState=running\nInvocationID=%s\nNRestarts=0\nMainPID=4242\n"
                       "Result=success\nExecMainCode=0\nExecMainStatus=0\n" % INV), ""
        return 0, "%s\n0, GPU-a, NVIDIA H200, 30000 MiB, 143771 MiB, 0 %%\n" % HEADER, ""


def _expect(**kw):
    base = dict(invocation_id=INV, gpus=[0], min_mib=1024, min_steps=2, hold_s=2, stall_s=2, timeout_s=60)
    base.update(kw)
    return Expectations(**base)


@pytest.mark.parametrize("interval_s", [0.3, 0.5, 0.7, 1.0])
def test_the_verdict_comes_when_the_hold_ends(tmp_path, interval_s):
    trainer = Trainer(tmp_path / "trainer.log")
    proof = prove(trainer, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"),
                  _expect(interval_s=interval_s), REGEXES, interval_s=interval_s, clock=trainer.clock,
                  sleep=trainer.sleep)
    assert proof["step"] >= 2
    # the hold began at the first poll that saw every condition (two steps: the second comes 0.55 s
    # in), and the verdict came at its end - not at the next poll after it
    polls_to_hold = math.ceil(0.55 / interval_s)
    hold_began = polls_to_hold * interval_s
    assert trainer.t == pytest.approx(hold_began + 2.0)
    assert trainer.polls == 1 + polls_to_hold + math.ceil(2.0 / interval_s - 1e-9)


def test_a_hold_end_already_passed_does_not_make_the_waiter_spin():
    """Held long enough but the counter has not risen often enough: the next poll waits the interval
    (wake_at is the deadline again, never a time already gone)."""
    judge = Judge(_expect())
    follower = tl.StartLog(INV, step_regex=tl.DEFAULT_STEP_REGEX)
    follower.feed(tl.marker_line(INV, "r1", 4242, "t") + "\nstep=1 loss=2.0 tok/s=2000.0\nstep=2 loss=2.0 tok/s=1.0\n")
    unit = {"ActiveState": "active", "SubState": "running", "Result": "success", "InvocationID": INV,
            "NRestarts": "0", "MainPID": "4242"}
    assert judge.wake_at is None
    judge.observe(Snapshot(now=0.0, unit=unit, gpus_mib={0: 30000}, log=follower.analysis))
    assert judge.hold_since == 0.0 and judge.wake_at == 2.0  # the hold's end, before the deadline (60)
    judge.observe(Snapshot(now=2.5, unit=unit, gpus_mib={0: 30000}, log=follower.analysis))  # no rise: not ready
    assert judge.wake_at == 60.0


class StuckTrainer(Trainer):
    """A Trainer whose steps stop after ``last`` (the lab's "stuck at iter 5")."""

    def __init__(self, log, last, **kw):
        super().__init__(log, **kw)
        self.last = last

    def sleep(self, s):
        self.t += s
        with open(str(self.log), "a") as fh:
            while self.steps < self.last and self.t >= self.first_s + self.steps * self.step_s:
                self.steps += 1
                fh.write("step=%d loss=2.0 tok/s=2000.0\n" % self.steps)


def test_with_the_log_read_between_observations_the_hold_begins_when_the_log_shows_the_step(tmp_path):
    """The restart job reads the log every 0.1 s between its observations of the unit and the GPUs
    (every 0.5 s): the second step (0.55 s in) is read at 0.6, the hold begins then, not at the
    observation at 1.0 - and the unit and the GPUs are still observed only every 0.5 s, and at the
    hold's end."""
    trainer = Trainer(tmp_path / "trainer.log")
    proof = prove(trainer, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"),
                  _expect(), REGEXES, interval_s=0.5, clock=trainer.clock, sleep=trainer.sleep, log_interval_s=0.1)
    assert proof["step"] >= 2
    assert trainer.t == pytest.approx(0.6 + 2.0)
    assert trainer.polls == 7  # 0, 0.5, 1.0, 1.5, 2.0, 2.5 and the hold's end (2.6)


@pytest.mark.parametrize("first_s", [0.3, 0.33, 0.41, 0.47, 0.52, 0.58])
def test_a_trainer_stuck_inside_the_hold_is_never_proved(tmp_path, first_s):
    """The lab's case - hold 4 s, stall 3 s, the steps stop at 5 (0.75 s after the second) - whatever the
    steps' phase against the observations: the hold's start and the last rise are timed by the same
    reads of the log (0.1 s apart), so the stall is seen before the hold could end."""
    trainer = StuckTrainer(tmp_path / "trainer.log", last=5, first_s=first_s)
    with pytest.raises(StepFailed) as err:
        prove(trainer, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"),
              _expect(hold_s=4, stall_s=3), REGEXES, interval_s=0.5, clock=trainer.clock, sleep=trainer.sleep,
              log_interval_s=0.1)
    assert "no progress for 3." in err.value.msg and "(last step=5)" in err.value.msg


@pytest.mark.parametrize("log_interval_s, read_s", [(None, 0.5), (0.1, 0.1)])
def test_a_proof_never_comes_later_than_the_stall_window_after_the_last_step_plus_one_read(tmp_path, log_interval_s,
                                                                                           read_s):
    """READY says the trainer made progress within the stall window: the last step it saw was written
    at most the stall window plus one read of the log (0.5 s when the log is read with each
    observation only; 0.1 s with the restart job's reads) before the verdict - over the phases and
    the step counts at which a trainer can get stuck inside the hold."""
    for i, first_s in enumerate([0.3 + 0.037 * k for k in range(8)]):
        for last in (4, 5, 6, 7, 8):
            trainer = StuckTrainer(tmp_path / ("trainer-%d-%d.log" % (i, last)), last=last, first_s=first_s)
            try:
                proof = prove(trainer, "systemctl", "nvidia-smi", "t.service", str(trainer.log),
                              _expect(hold_s=4, stall_s=3), REGEXES, interval_s=0.5, clock=trainer.clock,
                              sleep=trainer.sleep, log_interval_s=log_interval_s)
            except StepFailed:
                continue
            last_written = first_s + (proof["step"] - 1) * trainer.step_s
            assert trainer.t - last_written <= 3 + read_s + 1e-6, (first_s, last, trainer.t, proof["step"])


def test_an_error_line_read_between_observations_is_judged_at_once(tmp_path):
    trainer = Trainer(tmp_path / "trainer.log")
    with open(str(tmp_path / "trainer.log"), "a") as fh:
        fh.write("Traceback (most recent call last):\n")
    with pytest.raises(StepFailed) as err:
        prove(trainer, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"), _expect(), REGEXES,
              interval_s=0.5, clock=trainer.clock, sleep=trainer.sleep, log_interval_s=0.1)
    assert "log shows error: Traceback" in err.value.msg


@pytest.mark.parametrize("seen, before, now, at", [
    (None, 1.0, 1.5, 1.5),   # nothing known: now
    (1.2, 1.0, 1.5, 1.2),    # read between the two observations
    (1.0, 1.0, 1.5, 1.5),    # not after the observation before: that one would have seen it
    (0.4, 1.0, 1.5, 1.5),
    (1.6, 1.0, 1.5, 1.5),    # after now: not a time of this observation
    (1.2, None, 1.5, 1.5),   # the first observation: nothing before it to place the read after
])
def test_read_at_places_a_read_between_the_observations(seen, before, now, at):
    assert read_at(seen, before, now) == at


def test_the_hold_begins_at_the_log_read_only_when_the_unit_and_gpus_held_before():
    """GPUs below min_mib at the observation before: nothing says when they filled, so the hold
    begins at this observation; with them held, it begins when the log showed its conditions."""
    follower = tl.StartLog(INV, step_regex=tl.DEFAULT_STEP_REGEX)
    unit = {"ActiveState": "active", "SubState": "running", "Result": "success", "InvocationID": INV,
            "NRestarts": "0", "MainPID": "4242"}
    follower.feed(tl.marker_line(INV, "r1", 4242, "t") + "\nstep=1 loss=2.0 tok/s=2000.0\n")
    for gpus_before, hold_since in (({0: 10}, 1.0), ({0: 30000}, 0.7)):
        judge = Judge(_expect())
        judge.observe(Snapshot(now=0.5, unit=unit, gpus_mib=gpus_before, log=follower.analysis))
        analysis = tl.StartLog(INV, step_regex=tl.DEFAULT_STEP_REGEX)
        analysis.feed(tl.marker_line(INV, "r1", 4242, "t") + "\nstep=1 loss=2.0 tok/s=2000.0\n"
                      "step=2 loss=2.0 tok/s=2000.0\n")
        judge.observe(Snapshot(now=1.0, unit=unit, gpus_mib={0: 30000}, log=analysis.analysis, step_seen_at=0.7,
                               log_ready_at=0.7))
        assert judge.hold_since == hold_since
        assert judge.progress_at == 0.7  # the rise, timed by the read either way
