# -*- coding: utf-8 -*-
"""The readiness judge and the drain judge, driven through snapshots on a fake clock."""

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.proof import log_file as lf
from ansible_collections.dflash.trainer.plugins.module_utils.proof import readiness as rd
from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
OLD_INV = "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a"
NEXT_INV = "9b9b9b9b9b9b9b9b9b9b9b9b9b9b9b9b"
REL = "0123456789abcdef"
HELD = 70000
T0_US = 5000000000  # unit start, monotonic µs


def unit(active="active", sub="running", inv=INV, n_restarts=0, code=0, status=0, runtime=None,
         result="success", pid=4242):
    props = {
        "ActiveState": active, "SubState": sub, "Result": result, "InvocationID": inv,
        "NRestarts": str(n_restarts), "MainPID": str(pid if sub == "running" else 0),
        "ExecMainCode": str(code), "ExecMainStatus": str(status),
        "ExecMainStartTimestampMonotonic": str(T0_US),
        "ExecMainExitTimestampMonotonic": str(T0_US + int(runtime * 1e6)) if runtime is not None else "0",
    }
    return props


def exited(status, runtime, **kw):
    kw.setdefault("active", "failed")
    kw.setdefault("sub", "failed")
    kw.setdefault("result", "exit-code" if status else "success")
    return unit(code=1, status=status, runtime=runtime, **kw)


def gpus(mib=HELD, n=8, **overrides):
    out = {i: mib for i in range(n)}
    out.update(overrides)
    return out


def progress(step):
    return "step=%d loss=2.%d tok/s=%.1f queue_target=4 queue_drafter=4" % (step, step, 1000.0 + step)


class Sim(object):
    """A trainer's observable state over time; ``snap(t)`` is one poll."""

    def __init__(self, invocation=INV, preamble="", **log_kwargs):
        self.log = tl.StartLog(invocation, **log_kwargs)
        self.log.feed(preamble + tl.marker_line(invocation, REL, 4242, "2026-11-30T04:05:06Z") + "\n")

    def say(self, *lines):
        self.log.feed("".join(line + "\n" for line in lines))
        return self

    def snap(self, t, unit_props=None, gpus_mib=None):
        return rd.Snapshot(now=float(t), unit=unit_props or unit(), gpus_mib=gpus(**{}) if gpus_mib is None
                           else gpus_mib, log=self.log.analysis)


def judge(**kw):
    kw.setdefault("timeout_s", 120.0)
    return rd.Judge(rd.Expectations(invocation_id=INV, **kw))


def run_until_done(j, sim, t_end, each_second):
    """Poll once a second from t=0; ``each_second(t, sim)`` changes the world and returns
    (unit props, gpus) or None for the defaults. Returns (t, verdict) of the first verdict."""
    for t in range(0, t_end + 1):
        state = each_second(t, sim) or (None, None)
        v = j.observe(sim.snap(t, *state))
        if v.done:
            return t, v
    raise AssertionError("still pending at t=%d: %s" % (t_end, v.reason))


# ---------------------------------------------------------------------------------------------
# FAILED at once

def test_import_error_crash():
    sim = Sim().say("Traceback (most recent call last):", '  File "trainer.py", line 3, in <module>',
                    "    import flash_attn", "ModuleNotFoundError: No module named 'flash_attn'")
    v = judge().observe(sim.snap(0, exited(1, 0.6), gpus(0)))
    assert v.state == rd.FAILED
    assert v.reason == "trainer exited with status 1 after 0.6 s: ModuleNotFoundError: No module named 'flash_attn'"
    assert v.details["log_tail"][-1] == "ModuleNotFoundError: No module named 'flash_attn'"
    assert v.details["unit"]["Result"] == "exit-code"
    assert v.details["unit"]["ExecMainStatus"] == "1"
    assert v.details["release"] == REL
    assert v.details["gpus_mib"] == gpus(0)


def test_exit_zero_is_a_failure():
    sim = Sim().say("nothing to do", "bye")
    v = judge().observe(sim.snap(0, exited(0, 12.0, active="inactive", sub="dead"), gpus(0)))
    assert v.reason == "trainer exited with status 0 after 12 s: bye"


def test_crash_after_steps_killed():
    sim = Sim()

    def world(t, sim):
        if t < 5:
            sim.say(progress(t + 1))
            return None, None
        return exited(9, 5.2, result="signal") | {"ExecMainCode": "2"}, gpus(0)

    t, v = run_until_done(judge(hold_s=30), sim, 60, world)
    assert t == 5
    assert v.reason == "trainer killed by signal KILL after 5.2 s: " + progress(5)
    assert v.details["step"] == 5
    assert v.details["log_tail"] == [progress(i) for i in range(1, 6)]


def test_auto_restart_state_is_a_failure_before_the_counter_moves():
    sim = Sim().say("RuntimeError: boom")
    v = judge().observe(sim.snap(0, exited(1, 0.6, active="activating", sub="auto-restart")))
    assert v.reason == "trainer exited with status 1 after 0.6 s: RuntimeError: boom"


def test_crash_loop_nrestarts():
    sim = Sim().say("ModuleNotFoundError: No module named 'flash_attn'")
    props = exited(1, 0.6, active="activating", sub="auto-restart", n_restarts=1)
    v = judge(n_restarts=0).observe(sim.snap(0, props))
    assert v.reason == ("trainer restarted (NRestarts 0 → 1): exited with status 1 after 0.6 s: "
                        "ModuleNotFoundError: No module named 'flash_attn' (crash loop)")


def test_crash_loop_running_again_with_new_invocation():
    # Restarted and running: our start's log still holds why it died.
    sim = Sim().say("step=1 tok/s=3", "torch.OutOfMemoryError: CUDA out of memory.")
    props = unit(inv=NEXT_INV, n_restarts=3)
    v = judge(n_restarts=2).observe(sim.snap(0, props))
    assert v.reason.startswith("trainer restarted (NRestarts 2 → 3): is not running (")  # ExecMain* reset
    assert v.reason.endswith(": torch.OutOfMemoryError: CUDA out of memory. (crash loop)")


def test_new_invocation_without_counter():
    sim = Sim().say("step=1 tok/s=3")
    v = judge().observe(sim.snap(0, unit(inv=NEXT_INV)))
    assert v.reason.startswith("trainer restarted (InvocationID %s → %s)" % (INV, NEXT_INV))


def test_baseline_restarts_are_not_a_crash_loop():
    sim = Sim().say(progress(1))
    assert judge(n_restarts=4).observe(sim.snap(0, unit(n_restarts=4))).state == rd.PENDING


@pytest.mark.parametrize("line", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.11 GiB total)",
    "[rank3]: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
])
def test_error_line_fails_while_unit_still_runs(line):
    sim = Sim().say(progress(1), progress(2), line)
    v = judge().observe(sim.snap(3))
    assert v.reason == "log shows error: " + line
    assert v.details["log_tail"][-1] == line


def test_traceback_names_the_exception_too():
    sim = Sim().say(progress(1), "Traceback (most recent call last):", '  File "x.py", line 1',
                    "ValueError: bad shape")
    v = judge().observe(sim.snap(2))
    assert v.reason == "log shows error: Traceback (most recent call last): … ValueError: bad shape"


def test_stall_during_hold():
    sim = Sim()

    def world(t, sim):
        if t <= 6:
            sim.say(progress(t + 1))   # last step=7 at t=6, then silence
        return None, None

    t, v = run_until_done(judge(hold_s=30, stall_s=15), sim, 60, world)
    assert t == 22
    assert v.reason == "no progress for 16 s (last step=7): longer than trainer_ready_stall_s=15"


def test_absent_gpu_fails_at_once():
    sim = Sim().say(progress(1))
    v = judge(gpus=[0, 9]).observe(sim.snap(0))
    assert v.reason == "GPU 9 not reported by nvidia-smi (it reports 0-7)"


# ---------------------------------------------------------------------------------------------
# FAILED at the deadline

def test_hang_fails_at_deadline_naming_everything():
    sim = Sim().say("loading model")
    j = judge()
    t, v = run_until_done(j, sim, 200, lambda t, s: (None, gpus(0)))
    assert t == 120
    assert v.reason == ("not ready after 120 s (trainer_ready_timeout_s=120): "
                        "GPUs 0, 1, 2, 3, 4, 5, 6, 7 below 1024 MiB "
                        "(0, 0, 0, 0, 0, 0, 0, 0 MiB); no line matching %r in this start's log; "
                        "no step values in this start's log" % tl.DEFAULT_READY_REGEX)
    assert v.details["log_tail"] == ["loading model"]
    assert v.details["missing"][0].startswith("GPUs 0, 1")


def test_partial_gpus_without_progress_fail_at_deadline_naming_gpus():
    sim = Sim().say("loading model", "ready: target=5 drafter=3 gpus")   # allocated 0-4, no steps

    t, v = run_until_done(judge(), sim, 200, lambda t, s: (None, gpus(HELD) | {5: 0, 6: 0, 7: 0}))
    assert t == 120
    assert v.reason == ("not ready after 120 s (trainer_ready_timeout_s=120): "
                        "GPUs 5, 6, 7 below 1024 MiB (0, 0, 0 MiB); "
                        "no line matching %r in this start's log; no step values in this start's log"
                        % tl.DEFAULT_READY_REGEX)


def test_stale_ready_line_from_earlier_invocation_does_not_count():
    earlier = "".join([tl.marker_line(OLD_INV, "ffffffffffffffff", 1, "2026-11-29T00:00:00Z") + "\n"] +
                      [progress(i) + "\n" for i in range(1, 50)])
    sim = Sim(preamble=earlier).say("loading model")
    t, v = run_until_done(judge(timeout_s=30), sim, 60, lambda t, s: None)
    assert t == 30
    assert v.reason == ("not ready after 30 s (trainer_ready_timeout_s=30): no line matching %r in this start's log; "
                        "no step values in this start's log" % tl.DEFAULT_READY_REGEX)
    assert v.details["log_tail"] == ["loading model"]


def test_missing_marker_is_named():
    sim = Sim(invocation=OLD_INV).say(progress(1), progress(2))   # the log only has another start
    sim.log = tl.StartLog(INV).feed(tl.marker_line(OLD_INV, REL, 1, "x") + "\n" + progress(1) + "\n")
    assert sim.log.marker is None
    v = judge(timeout_s=0).observe(sim.snap(0))
    assert v.reason == ("not ready after 0 s (trainer_ready_timeout_s=0): "
                        "no start marker for invocation %s in the log" % INV)


def test_slow_start_past_deadline():
    sim = Sim()

    def world(t, sim):
        if t >= 112:
            sim.say(progress(t))
        return None, None

    t, v = run_until_done(judge(hold_s=10), sim, 200, world)
    assert t == 120
    assert v.reason == ("not ready after 120 s (trainer_ready_timeout_s=120): conditions held for only 7 of 10 s "
                        "(trainer_ready_hold_s=10)")


def test_only_one_step_is_not_enough():
    sim = Sim().say(progress(1))
    t, v = run_until_done(judge(timeout_s=5), sim, 10, lambda t, s: None)
    assert v.reason == ("not ready after 5 s (trainer_ready_timeout_s=5): "
                        "only 1 of 2 increasing step values in this start's log "
                        "(last step=1)")


# ---------------------------------------------------------------------------------------------
# READY

def test_happy_path_ready_exactly_after_hold():
    sim = Sim()

    def world(t, sim):
        sim.say(progress(t + 1))
        return None, None

    j = judge(hold_s=10)
    t, v = run_until_done(j, sim, 200, world)
    # step 1 at t=0, step 2 at t=1: all conditions hold from t=1; ready at t=11.
    assert t == 11
    assert v.state == rd.READY
    assert v.details == {
        "release": REL, "invocation_id": INV, "main_pid": 4242, "gpus_mib": gpus(),
        "matched_line": progress(12), "tok_s": 1012.0, "step": 12, "seconds_to_ready": 11.0,
    }


def test_not_ready_one_tick_before_hold():
    sim = Sim().say(progress(1), progress(2))
    j = judge(hold_s=10, stall_s=10)     # polls 10 s apart: rises 9.99 s apart are within the window
    assert j.observe(sim.snap(0)).state == rd.PENDING     # hold starts at t=0
    sim.say(progress(3))
    assert j.observe(sim.snap(9.99)).state == rd.PENDING
    sim.say(progress(4))
    v = j.observe(sim.snap(10))
    assert v.state == rd.READY and v.details["seconds_to_ready"] == 10.0


def test_late_alloc_before_any_progress_waits_then_ready():
    sim = Sim().say("loading model")
    seen = []

    def world(t, sim):
        if t >= 30:
            sim.say(progress(t - 29))              # steps only once every GPU holds memory
        return None, gpus(HELD) if t >= 30 else gpus(HELD) | {5: 0, 6: 0, 7: 0}

    j = judge(hold_s=10, stall_s=5)
    for t in range(0, 30):
        seen.append(j.observe(sim.snap(t, *world(t, sim))).state)
    assert set(seen) == {rd.PENDING}                # 30 s with GPUs 5-7 empty: not failed early
    t, v = run_until_done(j, sim, 200, lambda t, s: world(t + 30, s))
    # step 1 at t=30, step 2 at t=31: the hold runs from t=31, ready at t=41
    assert (t + 30, v.state) == (41, rd.READY)
    assert v.details["gpus_mib"][7] == HELD


def test_allocation_within_the_stall_window_of_progress_is_not_left_behind():
    sim = Sim()

    def world(t, sim):
        sim.say(progress(t + 1))
        return None, gpus(HELD) if t >= 4 else gpus(HELD) | {7: 0}   # GPU 7 fills 4 s into progress

    t, v = run_until_done(judge(hold_s=10, stall_s=5), sim, 200, world)
    assert (t, v.state) == (14, rd.READY)


def test_hold_resets_when_a_condition_drops():
    sim = Sim()

    def world(t, sim):
        sim.say(progress(t + 1))
        return None, gpus(HELD) | ({3: 0} if t == 8 else {})   # GPU 3 blips at t=8

    t, v = run_until_done(judge(hold_s=10), sim, 200, world)
    assert (t, v.state) == (19, rd.READY)


def test_selected_gpus_only():
    sim = Sim().say(progress(1), progress(2))
    j = judge(gpus=[0, 1], hold_s=1, stall_s=1)
    sim.say(progress(3))
    j.observe(sim.snap(0, gpus_mib=gpus(0) | {0: HELD, 1: HELD}))
    sim.say(progress(4))
    assert j.observe(sim.snap(1, gpus_mib=gpus(0) | {0: HELD, 1: HELD})).state == rd.PENDING  # one rise in the hold
    sim.say(progress(5))
    v = j.observe(sim.snap(2, gpus_mib=gpus(0) | {0: HELD, 1: HELD}))
    assert v.state == rd.READY
    assert v.details["gpus_mib"] == {0: HELD, 1: HELD}


def test_unreadable_gpu_memory_blocks_ready():
    sim = Sim().say(progress(1), progress(2))
    v = judge(timeout_s=0).observe(sim.snap(0, gpus_mib=gpus() | {2: None}))
    assert v.reason == "not ready after 0 s (trainer_ready_timeout_s=0): GPU 2 memory unreadable"


def test_next_wait_lands_on_deadline():
    j = judge(timeout_s=10)
    assert j.next_wait(0, 1.0) == 1.0
    j.start = 0.0
    assert j.next_wait(9.5, 1.0) == 0.5
    assert j.next_wait(11, 1.0) == 0.0


def test_fmt_s():
    assert [rd.fmt_s(x) for x in (0.6, 120.0, 15.34, 7, None)] == ["0.6", "120", "15", "7", "?"]


# ---------------------------------------------------------------------------------------------
# progress through the hold (issue 7.1): held = the step counter kept rising through the window

def run_polls(j, sim, times, world):
    """Observe at each time in ``times``; ``world(t, sim)`` changes the world first and returns
    (unit props, gpus) or None. Returns [(t, verdict)] up to and including the first verdict."""
    seen = []
    for t in times:
        state = world(t, sim) or (None, None)
        v = j.observe(sim.snap(t, *state))
        seen.append((t, v))
        if v.done:
            break
    return seen


def ticks(step, end):
    n = int(round(end / step))
    return [round(i * step, 3) for i in range(n + 1)]


@pytest.mark.parametrize("interval", [1.0, 0.1, 1.7])
def test_progress_stopping_at_the_start_of_the_hold_fails_and_is_never_ready(interval):
    # The false ready of issue 7: steps 1..5 (hold from step 2), then silence while the unit
    # runs and the GPUs stay full. With the default windows: must fail, never READY.
    sim = Sim()
    rises = []

    def world(t, sim):
        n = sim.log.analysis.n_steps
        while n < 5 and n <= t:                 # step n+1 is printed at t=n
            n += 1
            sim.say(progress(n))
            rises.append(t)
        return None, None

    j = rd.Judge(rd.Expectations(invocation_id=INV))
    seen = run_polls(j, sim, ticks(interval, 60), world)
    t, v = seen[-1]
    assert rd.READY not in [v.state for _t, v in seen]
    assert v.state == rd.FAILED
    assert v.reason.startswith("no progress for ") and " s (last step=5): longer than " in v.reason
    # the stall window: 5 s, or 3 x the gap between rises this poller saw when that is longer
    window = j.stall_window_s
    assert window == pytest.approx(max(5.0, 3 * max(1.0, interval)))
    assert rises[-1] + window < t <= rises[-1] + window + interval + 1e-9     # within one poll of the stall window
    assert float(v.reason.split()[3]) == pytest.approx(t - rises[-1], abs=0.1)


def test_the_gap_to_the_verdict_counts():
    # Steps until t=5 (step 6); the hold (from t=1) would pass at t=11, six seconds after the last
    # rise: a stall of 6 s > 5 s, so t=11 fails instead of READY.
    sim = Sim()

    def world(t, sim):
        if t <= 5:
            sim.say(progress(t + 1))
        return None, None

    seen = run_polls(judge(hold_s=10, stall_s=5), sim, ticks(1, 60), world)
    assert [v.state for _t, v in seen[:-1]] == [rd.PENDING] * 11
    assert (seen[-1][0], seen[-1][1].reason) == (
        11, "no progress for 6 s (last step=6): longer than trainer_ready_stall_s=5")


def test_progress_ending_exactly_one_stall_window_before_the_verdict_is_ready():
    # The boundary of the same rule: last rise at t=6, verdict at t=11, gap 5 s = stall_s.
    sim = Sim()

    def world(t, sim):
        if t <= 6:
            sim.say(progress(t + 1))
        return None, None

    seen = run_polls(judge(hold_s=10, stall_s=5), sim, ticks(1, 60), world)
    assert (seen[-1][0], seen[-1][1].state, seen[-1][1].details["step"]) == (11, rd.READY, 7)


def test_a_late_poll_restarts_the_window_instead_of_counting_it():
    # Polls at 0, 1, 2 then none until 9: the rise seen at 9 is 7 s after the last one and
    # nothing in between shows whether the trainer stalled. Not READY at 11; the window
    # restarts at 9 and passes at 19.
    sim = Sim()

    def world(t, sim):
        sim.say(progress(int(t) + 1))
        return None, None

    j = judge(hold_s=10, stall_s=5)
    seen = run_polls(j, sim, [0, 1, 2] + list(range(9, 40)), world)
    assert [(t, v.state) for t, v in seen if v.done] == [(19, rd.READY)]
    assert j.hold_since == 9


def test_stall_before_the_hold_fails_too():
    # Steps without a tok/s line (no hold window yet), then silence: a stall is a stall.
    sim = Sim()

    def world(t, sim):
        if t <= 2:
            sim.say("step=%d loss=2.0" % (t + 1))
        return None, None

    seen = run_polls(judge(hold_s=10, stall_s=5), sim, ticks(1, 60), world)
    assert (seen[-1][0], seen[-1][1].reason) == (
        8, "no progress for 6 s (last step=3): longer than trainer_ready_stall_s=5")


def test_slow_warm_up_before_min_steps_is_not_a_stall():
    # min_steps 3: a 30 s compile between step 1 and step 2 is warm-up, judged by the deadline.
    sim = Sim()

    def world(t, sim):
        if t in (0, 30, 31, 32) or t > 32:
            sim.say(progress(t + 1))
        return None, None

    t, v = run_until_done(judge(hold_s=10, stall_s=5, min_steps=3), sim, 200, world)
    assert (t, v.state) == (41, rd.READY)      # 3 steps at t=31, held to 41


@pytest.mark.parametrize("period,interval", [(1.0, 1.0), (1.0, 1.15), (2.0, 1.0)])
def test_healthy_trainer_ready_after_hold_with_the_step_increasing(period, interval):
    # A trainer reporting every ``period`` s, polled every ``interval`` s, with the defaults.
    sim = Sim()
    expect = rd.Expectations(invocation_id=INV)
    assert (expect.hold_s, expect.stall_s) == (10, 5)

    def world(t, sim):
        while (sim.log.analysis.n_steps or 0) * period <= t:
            sim.say(progress(sim.log.analysis.n_steps + 1))
        return None, None

    j = rd.Judge(expect)
    seen = run_polls(j, sim, ticks(interval, 60), world)
    t, v = seen[-1]
    assert v.state == rd.READY
    assert t - j.hold_since >= 10
    assert v.details["step"] > j.hold_step
    assert rd.FAILED not in [v.state for _t, v in seen]


# ---------------------------------------------------------------------------------------------
# verdicts when they are clear (issue 7.2): a GPU left behind while the trainer progresses

def test_gpu_left_behind_while_steps_advance_fails_within_the_stall_window():
    sim = Sim()

    def world(t, sim):
        sim.say(progress(t + 35))                  # the trainer is already at step 35 at t=0
        return None, gpus(HELD) | {7: 100}

    t, v = run_until_done(judge(hold_s=10, stall_s=5), sim, 200, world)
    assert t == 5
    assert v.reason == ("GPU 7 holds 100 MiB while the trainer is at step 40 "
                        "(below trainer_gpu_min_mib=1024 MiB through "
                        "5 s of progress; trainer_ready_stall_s=5)")
    assert v.details["step"] == 40
    assert v.details["gpus_mib"][7] == 100


def test_every_gpu_left_behind_is_named_with_its_mib():
    sim = Sim()

    def world(t, sim):
        sim.say(progress(t + 1))
        return None, gpus(HELD) | {5: 0, 6: 12, 7: 0}

    t, v = run_until_done(judge(hold_s=4, stall_s=2.5), sim, 200, world)
    assert t == 3
    assert v.reason == ("GPU 5 holds 0 MiB, GPU 6 holds 12 MiB, GPU 7 holds 0 MiB while the trainer "
                        "is at step 4 (below trainer_gpu_min_mib=1024 MiB through 3 s of progress; "
                        "3 s = 3 x the 1 s this trainer takes between steps, at least trainer_ready_stall_s=2.5)")


def test_gpu_dropping_while_steps_advance_is_named_after_a_stall_window():
    # GPU 2 full for 20 s of progress, then empty: a blip is not a verdict, 5 s of it are.
    sim = Sim()

    def world(t, sim):
        sim.say(progress(t + 1))
        return None, gpus(HELD) | ({2: 0} if t >= 20 else {})

    j = judge(hold_s=30, stall_s=5)
    t, v = run_until_done(j, sim, 200, world)
    assert (t, v.reason) == (25, "GPU 2 holds 0 MiB while the trainer is at step 26 (below "
                                 "trainer_gpu_min_mib=1024 MiB through 5 s of progress; trainer_ready_stall_s=5)")


def test_gpu_left_behind_needs_progress_not_just_time():
    # GPU 7 empty for 60 s but only one step value: no progress, so the deadline judges.
    sim = Sim().say(progress(1))
    t, v = run_until_done(judge(hold_s=10, stall_s=5, timeout_s=60), sim, 200,
                          lambda t, s: (None, gpus(HELD) | {7: 0}))
    assert t == 60
    assert v.reason.startswith("not ready after 60 s (trainer_ready_timeout_s=60): GPU 7 below 1024 MiB (0 MiB)")


def test_gpu_left_behind_is_off_without_step_checks():
    sim = Sim()

    def world(t, sim):
        sim.say(progress(t + 1))
        return None, gpus(HELD) | {7: 0}

    t, v = run_until_done(judge(hold_s=10, stall_s=5, min_steps=0, timeout_s=30), sim, 200, world)
    assert (t, v.reason) == (30, "not ready after 30 s (trainer_ready_timeout_s=30): GPU 7 below 1024 MiB (0 MiB)")


def test_unreadable_gpu_is_not_left_behind():
    # nvidia-smi cannot read GPU 4: it may hold memory; only the deadline may judge it.
    sim = Sim()

    def world(t, sim):
        sim.say(progress(t + 1))
        return None, gpus(HELD) | {4: None}

    t, v = run_until_done(judge(hold_s=10, stall_s=5, timeout_s=30), sim, 200, world)
    assert (t, v.reason) == (30, "not ready after 30 s (trainer_ready_timeout_s=30): GPU 4 memory unreadable")


# ---------------------------------------------------------------------------------------------
# the windows: a stall window longer than the hold is refused

@pytest.mark.parametrize("hold,stall,words", [
    (10, 15, "stall_s (15 s) is longer than hold_s (10 s)"),
    (2, 2.5, "stall_s (2.5 s) is longer than hold_s (2 s)"),
    (10, 0, "stall_s (0) must be greater than 0 s"),
])
def test_judge_refuses_a_stall_window_longer_than_the_hold(hold, stall, words):
    with pytest.raises(ValueError) as e:
        judge(hold_s=hold, stall_s=stall)
    assert str(e.value).startswith(words)
    assert rd.window_problem(hold, stall).startswith(words)


@pytest.mark.parametrize("hold,stall", [(10, 5), (10, 10), (4, 2.5)])
def test_stall_window_within_the_hold_is_accepted(hold, stall):
    assert rd.window_problem(hold, stall) is None
    assert judge(hold_s=hold, stall_s=stall).expect.stall_s == stall


# ---------------------------------------------------------------------------------------------
# the early word: the log goes on showing progress the proof cannot read

MEGATRON = (" [2026-11-30 04:05:%02d.123] iteration %8d/   10000 | consumed samples: %d | elapsed time per "
            "iteration (ms): 512.3 | lm loss: 2.3 |")
OLD_STEP_REGEX = r"\bstep[=: ]\s*(\d+)"
needs_progress_like = pytest.mark.skipif(not hasattr(tl.LogAnalysis(), "progress_like_line"),
                                         reason="the log reader does not mark progress-like lines")


def megatron(n):
    return MEGATRON % (n % 60, n, 256 * n)


def lines_every(period, first_at, make, stop_after=None):
    """A world printing ``make(n)`` for n = 1, 2, ... every ``period`` s from ``first_at``."""
    def world(t, sim):
        while True:
            n = sim.printed + 1
            if t < first_at + (n - 1) * period or (stop_after is not None and n > stop_after):
                break
            sim.say(make(n))
            sim.printed = n
        return None, None
    return world


def sim_printing(**kw):
    sim = Sim(**kw)
    sim.printed = 0
    return sim


@needs_progress_like
def test_lines_neither_regex_reads_fail_within_the_stall_window_naming_both():
    # Megatron's line with a ready regex and a step regex that read none of it: the early word,
    # stall_s after the first line that looks like progress, not the deadline.
    sim = sim_printing(ready_regex=r"tok/s", step_regex=OLD_STEP_REGEX)
    t, v = run_until_done(judge(timeout_s=900), sim, 900, lines_every(0.5, 30, megatron))
    assert 30 + 5 < t <= 30 + 5 + 1 and t - 30 < 30
    assert v.reason.startswith("the log shows `[2026-11-30 04:05:")
    assert ("` but the proof read nothing from this start's log for 6 s after the first line that looks like "
            "progress: trainer_ready_regex 'tok/s' matched no line and trainer_step_regex '%s' matched nothing; "
            "set trainer_ready_regex to a regex that matches the trainer's progress line and trainer_step_regex "
            "to one whose first group is its step counter (trainer_tokps_regex reads its throughput figure) "
            "(the early word comes after trainer_ready_stall_s=5)" % OLD_STEP_REGEX) in v.reason


def test_steps_read_and_no_ready_line_fail_after_the_hold_naming_trainer_ready_regex():
    sim = sim_printing(ready_regex=r"tok/s")
    t, v = run_until_done(judge(timeout_s=900), sim, 900, lines_every(1, 30, megatron))
    assert 30 + 10 < t <= 30 + 10 + 1
    assert v.reason.startswith("the log shows `[2026-11-30 04:05:")
    assert ("(step %d read by trainer_step_regex) but trainer_ready_regex 'tok/s' matched no line for 11 s after "
            "the first line that looks like progress: set trainer_ready_regex to a regex that matches the "
            "trainer's progress line (and trainer_tokps_regex to one that reads its throughput figure, if it "
            "has one) (the early word comes after trainer_ready_hold_s=10)" % (t - 30 + 1)) in v.reason


def test_the_early_word_on_the_ready_line_waits_a_slow_trainers_stall_window():
    # one line every 8 s: the stall window is 24 s (3 x 8), longer than the hold: the word comes after it
    sim = sim_printing(ready_regex=r"tok/s")
    j = judge(timeout_s=900)
    t, v = run_until_done(j, sim, 900, lines_every(8, 240, megatron))
    assert j.stall_window_s == 24
    assert 240 + 24 < t <= 240 + 32 + 1
    assert "(the early word comes after the stall window, 24 s = 3 x the 8 s this trainer takes between steps, " \
           "at least trainer_ready_stall_s=5)" in v.reason


def test_the_early_word_with_the_ready_line_keeps_naming_the_step_regex():
    sim = sim_printing(step_regex=OLD_STEP_REGEX)
    t, v = run_until_done(judge(), sim, 200, lines_every(1, 3, lambda n: "iter %d | 21.5K tok/s | loss 2.3" % n))
    assert t == 9
    assert v.reason == ("the log shows `iter 7 | 21.5K tok/s | loss 2.3` but trainer_step_regex '%s' matched nothing "
                        "for 6 s after the first line matching trainer_ready_regex: set trainer_step_regex to a regex "
                        "whose first group is the progress counter (the early word comes after "
                        "trainer_ready_stall_s=5)" % OLD_STEP_REGEX)


@needs_progress_like
def test_other_output_after_a_progress_like_line_is_not_more_progress():
    # "Num Epochs = 3" looks like progress; compile chatter after it does not: no early word, the
    # steps that come later are read and proved
    sim = sim_printing().say("***** Running training *****", "  Num Epochs = 3")

    def world(t, sim):
        if t < 120:
            sim.say("compiling graph %d" % t)
            return None, None
        sim.say(progress(t - 119))
        return None, None

    t, v = run_until_done(judge(timeout_s=900), sim, 900, world)
    assert (t, v.state) == (131, rd.READY)


def test_a_log_that_only_grows_with_unreadable_output_fails_after_minutes_not_at_the_deadline():
    # nothing in it looks like progress and nothing is read: 300 lines over 30 moments 10 s apart
    sim = sim_printing(ready_regex=r"tok/s", step_regex=OLD_STEP_REGEX)
    t, v = run_until_done(judge(timeout_s=900), sim, 900, lines_every(1, 0, lambda n: "%6d | 2.345 | 12345" % n))
    # 30 moments 10 s apart: at 290; 300 lines: at 299
    assert (t, v.state) == (299, rd.FAILED)
    assert v.reason.startswith("this start's log grew by 300 lines over 299 s and the proof read nothing from it: "
                               "trainer_ready_regex 'tok/s' matched no line and trainer_step_regex '%s' matched "
                               "nothing; the last line: `300 | 2.345 | 12345`" % OLD_STEP_REGEX)
    assert v.reason.endswith("(the early word comes after 300 lines written over 30 moments 10 s apart)")


def test_a_burst_of_load_output_then_a_long_silent_load_is_not_unreadable_output():
    sim = sim_printing()

    def world(t, sim):
        if t == 0:
            sim.say(*["NCCL INFO ring %d" % i for i in range(2000)])
        elif t in (100, 200, 300, 400):
            sim.say("loaded %d shards" % t)
        elif t >= 500:
            sim.say(progress(t - 499))
        return None, None

    t, v = run_until_done(judge(timeout_s=900), sim, 900, world)
    assert (t, v.state) == (511, rd.READY)


def test_an_older_log_reader_without_progress_like_lines_counts_any_new_line():
    class OldAnalysis(object):
        """The log reader before it marked progress-like lines."""
        def __init__(self, analysis):
            self._analysis = analysis

        def __getattr__(self, name):
            if name in ("progress_like_line", "progress_like_at", "last_progress_like_line"):
                raise AttributeError(name)
            return getattr(self._analysis, name)

    sim = sim_printing(step_regex=OLD_STEP_REGEX)
    old = OldAnalysis(sim.log.analysis)
    assert rd.progress_signature(old) == (0,)
    j = judge()
    sim.say("iter 1 | 21.5K tok/s")
    assert j.observe(rd.Snapshot(now=0.0, unit=unit(), gpus_mib=gpus(), log=old)).state == rd.PENDING
    sim.say("compiling")                              # any line is more output for an older reader
    v = j.observe(rd.Snapshot(now=6.0, unit=unit(), gpus_mib=gpus(), log=old))
    assert v.state == rd.FAILED
    assert "matched nothing for 6 s after the first line matching trainer_ready_regex" in v.reason


# ---------------------------------------------------------------------------------------------
# slow trainers by design: a silent load of minutes, then a line every 5-10 s

def test_stall_window_follows_the_cadence_never_below_stall_s():
    assert rd.stall_window(5, []) == 5
    assert rd.stall_window(5, [1, 1, 1]) == 5
    assert rd.stall_window(5, [8]) == 24
    assert rd.stall_window(5, [10, 5]) == 15              # the low median: the faster half
    assert rd.stall_window(5, [40, 1, 1]) == 5            # one warm-up gap does not stretch it for long


@pytest.mark.parametrize("period", [5, 8, 10])
def test_a_trainer_that_loads_for_four_minutes_then_logs_every_few_seconds_is_proved(period):
    sim = sim_printing()
    j = judge(timeout_s=900)                              # the role's default deadline
    seen = run_polls(j, sim, ticks(1, 900), lines_every(period, 240, progress))
    t, v = seen[-1]
    assert v.state == rd.READY, v.reason
    assert all(v.state == rd.PENDING for _t, v in seen[:-1])
    # the hold (10 s) with two rises in it: steps 2, 3 and 4; the stall window is 3 periods
    assert t == 240 + 3 * period and j.stall_window_s == 3 * period


def test_a_trainer_whose_period_varies_between_5_and_10_s_is_proved():
    sim = sim_printing()
    times = [240, 245, 255, 260, 270, 275, 285, 290]

    def world(t, sim):
        while sim.printed < len(times) and times[sim.printed] <= t:
            sim.printed += 1
            sim.say(progress(sim.printed))
        return None, None

    seen = run_polls(judge(timeout_s=900), sim, ticks(1, 900), world)
    assert seen[-1][1].state == rd.READY and rd.FAILED not in [v.state for _t, v in seen]


def test_the_silent_load_before_the_first_step_is_never_a_stall():
    sim = sim_printing().say("loading model")
    seen = run_polls(judge(timeout_s=900), sim, ticks(1, 899), lambda t, s: None)
    assert {v.state for _t, v in seen} == {rd.PENDING}


def test_a_slow_trainer_that_hangs_fails_after_its_own_stall_window():
    sim = sim_printing()
    t, v = run_until_done(judge(timeout_s=900), sim, 900, lines_every(8, 240, progress, stop_after=2))
    # step 2 at 248; the window is 3 x 8 = 24 s: the first poll past it
    assert t == 248 + 25
    assert v.reason == ("no progress for 25 s (last step=2): longer than 24 s = 3 x the 8 s this trainer takes "
                        "between steps, at least trainer_ready_stall_s=5")


def test_one_rise_in_the_hold_is_not_enough_when_the_window_is_longer_than_the_hold():
    # steps 1, 2, 3 every 8 s, then a hang: the hold (from step 2 at 8) passes at 18 with only step 3
    # in it; READY would be a trainer that hung; the stall window (24 s) names it at 41
    sim = sim_printing()
    seen = run_polls(judge(), sim, ticks(1, 120), lines_every(8, 0, progress, stop_after=3))
    assert rd.READY not in [v.state for _t, v in seen]
    assert (seen[-1][0], seen[-1][1].reason.split(":")[0]) == (41, "no progress for 25 s (last step=3)")


def test_the_hold_that_ends_without_two_rises_says_so_at_the_deadline():
    sim = sim_printing().say(progress(1), progress(2))
    j = judge(hold_s=10, stall_s=10, timeout_s=20)
    j.observe(sim.snap(0))
    sim.say(progress(3))
    assert j.observe(sim.snap(9)).state == rd.PENDING
    v = j.observe(sim.snap(20))                       # no rise since 9: 11 s, within 3 x 9 s
    assert v.reason == ("not ready after 20 s (trainer_ready_timeout_s=20): the step counter rose 1 times during "
                        "the hold window, 2 needed (step=3)")


def test_min_steps_0_is_said_in_the_verdict():
    sim = sim_printing().say("serving 21.5K tok/s")
    j = judge(min_steps=0, hold_s=2, stall_s=2)
    assert j.observe(sim.snap(0)).state == rd.PENDING
    v = j.observe(sim.snap(2))
    assert v.state == rd.READY and v.details["step_checks"] is False
    assert v.reason == "ready (no step checks: trainer_ready_min_steps=0): serving 21.5K tok/s"


# ---------------------------------------------------------------------------------------------
# drain

def rows(mib, processes=None):
    return [{"index": i, "uuid": "GPU-%d" % i, "memory_used_mib": m,
             "processes": (processes or {}).get(i, [])} for i, m in sorted(mib.items())]


def test_drain_needs_consecutive_samples():
    d = rd.DrainJudge(max_mib=1024, consecutive=2, timeout_s=60)
    assert d.observe(0, rows({0: 5000, 1: 0})).state == rd.PENDING
    assert d.observe(1, rows({0: 0, 1: 0})).state == rd.PENDING
    assert d.observe(2, rows({0: 2000, 1: 0})).state == rd.PENDING   # blip resets the streak
    assert d.observe(3, rows({0: 1024, 1: 0})).state == rd.PENDING
    v = d.observe(4, rows({0: 3, 1: 0}))
    assert v.state == rd.READY
    assert v.details == {"samples": 5, "waited_s": 4.0, "gpus_mib": {0: 3, 1: 0}}


def test_drain_timeout_names_gpus_and_holders():
    procs = {5: [{"pid": 1234, "process_name": "python3", "used_memory_mib": 5000}],
             6: [{"pid": 48213, "process_name": None, "used_memory_mib": 5000}]}
    d = rd.DrainJudge(timeout_s=60, gpus=[5, 6, 7])
    assert d.observe(0, rows({5: 5000, 6: 5000, 7: 0}, procs)).state == rd.PENDING
    v = d.observe(60, rows({4: 9, 5: 5000, 6: 5000, 7: 0}, procs))
    assert v.state == rd.FAILED
    assert v.reason == ("GPU memory still held after 60 s: GPU 5 5000 MiB, GPU 6 5000 MiB; holders: "
                        "pid 1234 python3 (5000 MiB on GPU 5), pid 48213 [name not visible] (5000 MiB on GPU 6)")
    assert v.details["held"] == [5, 6]
    assert v.details["samples"] == 2


def test_drain_timeout_without_visible_holders():
    d = rd.DrainJudge(timeout_s=5, consecutive=1, start=0.0)
    v = d.observe(5, rows({0: 80000, 1: None}))
    assert v.reason == ("GPU memory still held after 5 s: GPU 0 80000 MiB, GPU 1 unreadable; holders: "
                        "none visible from here (inside a container the process list is often empty)")


def test_drain_absent_gpu():
    v = rd.DrainJudge(gpus=[8]).observe(0, rows({0: 0}))
    assert (v.state, v.reason) == (rd.FAILED, "GPU 8 not reported by nvidia-smi (it reports 0)")


def test_drain_allows_another_tenants_memory_on_top_of_the_limit():
    d = rd.DrainJudge(max_mib=1024, consecutive=1, timeout_s=10, gpus=[6, 7], allowance={7: 20000}, start=0.0)
    assert d.observe(0, rows({6: 0, 7: 21024})).state == rd.READY  # 20000 theirs + 1024 residue
    d = rd.DrainJudge(max_mib=1024, consecutive=1, timeout_s=10, gpus=[6, 7], allowance={7: 20000}, start=0.0)
    assert d.observe(0, rows({6: 0, 7: 21025})).state == rd.PENDING
    v = d.observe(10, rows({6: 2000, 7: 50000}))
    assert v.state == rd.FAILED
    assert v.reason.startswith("GPU memory still held after 10 s: GPU 6 2000 MiB, "
                               "GPU 7 50000 MiB (20000 of them another tenant's); holders:")
    # the allowance is per GPU: another GPU's tenant allows nothing on GPU 6
    assert rd.DrainJudge(consecutive=1, gpus=[6], allowance={7: 20000}).observe(0, rows({6: 2000})).state == rd.PENDING


def test_drain_single_sample_when_consecutive_is_one():
    assert rd.DrainJudge(consecutive=1).observe(0, rows({0: 0})).state == rd.READY


# ---------------------------------------------------------------------------------------------
# the proof's pieces (job.cycle), as the restart job uses them

from ansible_collections.dflash.trainer.plugins.modules import trainer_restart


def test_the_proofs_failure_message_has_reason_and_tail():
    from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import failure_msg
    msg = failure_msg("trainer exited with status 1 after 0.6 s: E: x", ["a", "E: x"], 20)
    assert msg == ("trainer exited with status 1 after 0.6 s: E: x\n"
                   "last 2 lines of this start's log:\n    a\n    E: x")


@pytest.mark.parametrize("args, msg", [
    (("tok/s(", ".", ".", []), "invalid ready_regex 'tok/s('"),
    ((".", "step=(", ".", []), "invalid step_regex 'step=('"),
    ((".", ".", ".", ["ok", "["]), "invalid error_regexes entry '['"),
])
def test_the_proofs_patterns_that_do_not_compile_are_named(args, msg):
    from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed, compile_regexes
    with pytest.raises(StepFailed) as exc:
        compile_regexes(*args)
    assert exc.value.msg.startswith(msg), exc.value.msg


def test_the_proofs_log_reader_follows_appends_and_truncation(tmp_path):
    path = tmp_path / "trainer.log"
    follower = tl.StartLog(INV)
    reader = lf.LogFileReader(str(path), follower)
    reader.poll()                                    # no file yet: nothing, no error
    path.write_text(tl.marker_line(INV, REL, 1, "t") + "\nstep=1 tok/s=1\n")
    reader.poll()
    with open(str(path), "a") as f:
        f.write("step=2 tok/s=2\nstep=3 tok")
    reader.poll()
    assert follower.analysis.steps == [1, 2]
    path.write_text("step=9 tok/s=9\n")              # truncated (copytruncate): still our start
    reader.poll()
    assert follower.analysis.steps == [1, 2, 9]
    assert reader.offset == len("step=9 tok/s=9\n")


def test_default_windows_agree_everywhere_and_stall_fits_in_the_hold():
    import os
    import yaml
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "roles/trainer/defaults/main.yml")) as f:
        defaults = yaml.safe_load(f)
    with open(os.path.join(root, "roles/trainer/meta/argument_specs.yml")) as f:
        specs = yaml.safe_load(f)["argument_specs"]
    doc = yaml.safe_load(trainer_restart.DOCUMENTATION)["options"]
    expect = rd.Expectations(invocation_id=INV)
    seen = {("defaults", defaults["trainer_ready_hold_s"], defaults["trainer_ready_stall_s"]),
            ("module doc", doc["hold_s"]["default"], doc["stall_s"]["default"]),
            ("Expectations", expect.hold_s, expect.stall_s)}
    for entry, spec in specs.items():
        options = spec.get("options", {})
        if "trainer_ready_hold_s" in options or "trainer_ready_stall_s" in options:
            seen.add(("argument_specs " + entry, options["trainer_ready_hold_s"]["default"],
                      options["trainer_ready_stall_s"]["default"]))
    assert len(seen) == 9        # defaults, module doc, Expectations, main, group, restart, rollback, stop, start
    assert {(hold, stall) for _where, hold, stall in seen} == {(10, 5)}, sorted(seen)
    assert rd.window_problem(expect.hold_s, expect.stall_s) is None


def test_fmt_s_up_never_shows_a_time_longer_than_a_window_as_the_window():
    assert [rd.fmt_s(x, up=True) for x in (3.04, 3.0, 3.1, 9.96, 10.2, 120.0, None)] == \
        ["3.1", "3", "3.1", "10", "11", "120", "?"]
    # the stall verdict: 3.04 s past a 3 s window
    assert float(rd.fmt_s(3.0000001, up=True)) > 3
