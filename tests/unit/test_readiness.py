# -*- coding: utf-8 -*-
"""The readiness judge and the drain judge, driven through snapshots on a fake clock."""

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils import _readiness as rd
from ansible_collections.dflash.trainer.plugins.module_utils import _trainer_log as tl

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

    def __init__(self, invocation=INV, preamble=""):
        self.log = tl.StartLog(invocation)
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
    assert v.reason == "no progress for 16 s (last step=7)"


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
    assert v.reason == ("not ready after 120 s: GPUs 0, 1, 2, 3, 4, 5, 6, 7 below 1024 MiB "
                        "(0, 0, 0, 0, 0, 0, 0, 0 MiB); no line matching 'tok/s' in this start's log; "
                        "no step values in this start's log")
    assert v.details["log_tail"] == ["loading model"]
    assert v.details["missing"][0].startswith("GPUs 0, 1")


def test_partial_gpus_fail_at_deadline_naming_gpus():
    sim = Sim()

    def world(t, sim):
        sim.say("step=%d loss=2.0" % (t + 1))      # progress but no tok/s line
        return None, gpus(HELD) | {5: 0, 6: 0, 7: 0}

    t, v = run_until_done(judge(), sim, 200, world)
    assert t == 120
    assert v.reason == ("not ready after 120 s: GPUs 5, 6, 7 below 1024 MiB (0, 0, 0 MiB); "
                        "no line matching 'tok/s' in this start's log")


def test_stale_ready_line_from_earlier_invocation_does_not_count():
    earlier = "".join([tl.marker_line(OLD_INV, "ffffffffffffffff", 1, "2026-11-29T00:00:00Z") + "\n"] +
                      [progress(i) + "\n" for i in range(1, 50)])
    sim = Sim(preamble=earlier).say("loading model")
    t, v = run_until_done(judge(timeout_s=30), sim, 60, lambda t, s: None)
    assert t == 30
    assert v.reason == ("not ready after 30 s: no line matching 'tok/s' in this start's log; "
                        "no step values in this start's log")
    assert v.details["log_tail"] == ["loading model"]


def test_missing_marker_is_named():
    sim = Sim(invocation=OLD_INV).say(progress(1), progress(2))   # the log only has another start
    sim.log = tl.StartLog(INV).feed(tl.marker_line(OLD_INV, REL, 1, "x") + "\n" + progress(1) + "\n")
    assert sim.log.marker is None
    v = judge(timeout_s=0).observe(sim.snap(0))
    assert v.reason == "not ready after 0 s: no start marker for invocation %s in the log" % INV


def test_slow_start_past_deadline():
    sim = Sim()

    def world(t, sim):
        if t >= 112:
            sim.say(progress(t))
        return None, None

    t, v = run_until_done(judge(hold_s=10), sim, 200, world)
    assert t == 120
    assert v.reason == "not ready after 120 s: conditions held for only 7 of 10 s"


def test_only_one_step_is_not_enough():
    sim = Sim().say(progress(1))
    t, v = run_until_done(judge(timeout_s=5), sim, 10, lambda t, s: None)
    assert v.reason == ("not ready after 5 s: only 1 of 2 increasing step values in this start's log "
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
    j = judge(hold_s=10)
    assert j.observe(sim.snap(0)).state == rd.PENDING     # hold starts at t=0
    sim.say(progress(3))
    assert j.observe(sim.snap(9.99)).state == rd.PENDING
    sim.say(progress(4))
    v = j.observe(sim.snap(10))
    assert v.state == rd.READY and v.details["seconds_to_ready"] == 10.0


def test_late_alloc_becomes_ready():
    sim = Sim()

    def world(t, sim):
        sim.say(progress(t + 1))
        return None, gpus(HELD) if t >= 30 else gpus(HELD) | {5: 0, 6: 0, 7: 0}

    t, v = run_until_done(judge(hold_s=10), sim, 200, world)
    assert (t, v.state) == (40, rd.READY)
    assert v.details["gpus_mib"][7] == HELD


def test_hold_resets_when_a_condition_drops():
    sim = Sim()

    def world(t, sim):
        sim.say(progress(t + 1))
        return None, gpus(HELD) | ({3: 0} if t == 8 else {})   # GPU 3 blips at t=8

    t, v = run_until_done(judge(hold_s=10), sim, 200, world)
    assert (t, v.state) == (19, rd.READY)


def test_selected_gpus_only():
    sim = Sim().say(progress(1), progress(2))
    j = judge(gpus=[0, 1], hold_s=0)
    sim.say(progress(3))
    j.observe(sim.snap(0, gpus_mib=gpus(0) | {0: HELD, 1: HELD}))
    sim.say(progress(4))
    v = j.observe(sim.snap(1, gpus_mib=gpus(0) | {0: HELD, 1: HELD}))
    assert v.state == rd.READY
    assert v.details["gpus_mib"] == {0: HELD, 1: HELD}


def test_unreadable_gpu_memory_blocks_ready():
    sim = Sim().say(progress(1), progress(2))
    v = judge(timeout_s=0).observe(sim.snap(0, gpus_mib=gpus() | {2: None}))
    assert v.reason == "not ready after 0 s: GPU 2 memory unreadable"


def test_next_wait_lands_on_deadline():
    j = judge(timeout_s=10)
    assert j.next_wait(0, 1.0) == 1.0
    j.start = 0.0
    assert j.next_wait(9.5, 1.0) == 0.5
    assert j.next_wait(11, 1.0) == 0.0


def test_fmt_s():
    assert [rd.fmt_s(x) for x in (0.6, 120.0, 15.34, 7, None)] == ["0.6", "120", "15", "7", "?"]


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


def test_drain_single_sample_when_consecutive_is_one():
    assert rd.DrainJudge(consecutive=1).observe(0, rows({0: 0})).state == rd.READY


# ---------------------------------------------------------------------------------------------
# module argument handling (in-process, no polling)

import json

from ansible.module_utils.testing import patch_module_args

from ansible_collections.dflash.trainer.plugins.modules import gpu_drain, trainer_ready


def run_module(main, args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            main()
    return json.loads(capsys.readouterr().out)


def test_trainer_ready_check_mode_skips(capsys):
    out = run_module(trainer_ready.main, {"unit": "t.service", "log_path": "/nonexistent", "invocation_id": INV,
                                          "_ansible_check_mode": True}, capsys)
    assert out["ready"] is None and out["skipped"] is True and not out.get("failed")


@pytest.mark.parametrize("args,msg", [
    ({"invocation_id": " "}, "invocation_id is empty"),
    ({"ready_regex": "tok/s("}, "invalid ready_regex 'tok/s('"),
    ({"error_regexes": ["["]}, "invalid error_regexes entry '['"),
])
def test_trainer_ready_bad_args(capsys, args, msg):
    base = {"unit": "t.service", "log_path": "/nonexistent", "invocation_id": INV}
    out = run_module(trainer_ready.main, dict(base, **args), capsys)
    assert out["failed"] and out["msg"].startswith(msg)


def test_trainer_ready_failure_message_has_reason_and_tail():
    msg = trainer_ready.failure_msg("trainer exited with status 1 after 0.6 s: E: x", ["a", "E: x"], 20)
    assert msg == ("trainer exited with status 1 after 0.6 s: E: x\n"
                   "last 2 lines of this start's log:\n    a\n    E: x")


def test_gpu_drain_bad_args(capsys):
    out = run_module(gpu_drain.main, {"consecutive": 0}, capsys)
    assert out["failed"] and "consecutive must be >= 1" in out["msg"]


def test_trainer_ready_log_reader_follows_appends_and_truncation(tmp_path):
    path = tmp_path / "trainer.log"
    follower = tl.StartLog(INV)
    reader = trainer_ready.LogReader(str(path), follower)
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
