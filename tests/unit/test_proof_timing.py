"""The proof's verdict comes when the hold ends, not a poll interval later (module_utils/_readiness.py:
Judge.wake_at; _cycle.prove asks the waiter to wake then)."""
import math

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils import _trainer_log as tl
from ansible_collections.dflash.trainer.plugins.module_utils._cycle import compile_regexes, prove
from ansible_collections.dflash.trainer.plugins.module_utils._readiness import Expectations, Judge, Snapshot

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
