# -*- coding: utf-8 -*-
"""Foreign output, fuzzed: the readiness and drain judges never turn garbage into "ready".

Each property drives a judge through generated polls (unit props with garbage values, GPU
readings with unreadable cells, a log with or without our marker, error lines, stale progress)
and checks every READY against an independent oracle of the documented rules:

Judge READY only when, on this poll: the unit is active/running, not restarted (NRestarts not
above the baseline, InvocationID ours or absent — and at least one of the two readable); every
expected GPU (all reported ones when none are named; at least one) reports memory at or above
min_mib; this start's log (our marker seen) has a ready line, no error line and min_steps
increasing steps; and all that held on every poll of the last hold_s seconds, during which the
step counter rose at least twice (MIN_HOLD_RISES), its last rise no older than the stall window
(stall_s, or 3 x the trainer's gap between rises when that is longer).

DrainJudge READY exactly when, on each of the last ``consecutive`` polls, every selected GPU
(all reported ones when none are named; at least one) reported memory at or below max_mib.
"""

import os
import re

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ansible_collections.dflash.trainer.plugins.module_utils.target import nvidia_smi as smi
from ansible_collections.dflash.trainer.plugins.module_utils.proof import readiness as rd
from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl

FUZZ = settings(max_examples=int(os.environ.get("DFLASH_FUZZ_EXAMPLES", "100")), deadline=None,
                derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
OTHER = "9b9b9b9b9b9b9b9b9b9b9b9b9b9b9b9b"


def marker(invocation):
    return tl.marker_line(invocation, "0123456789abcdef", 4242, "2026-11-30T04:05:06Z")


def plain_int(value):
    text = (value or "").strip()
    digits = text[1:] if text.startswith("-") else text
    return int(text) if digits and digits.isascii() and digits.isdigit() and len(digits) <= 19 else None


# ---------------------------------------------------------------------------------------------
# generated worlds

GARBAGE = st.text(max_size=8) | st.sampled_from(["[not set]", "", " active", "Active", "running ", "1_0",
                                                 "\x00", "\ufffd"])
UNIT_GOOD = {"ActiveState": "active", "SubState": "running", "InvocationID": INV, "NRestarts": "0",
             "MainPID": "4242", "Result": "success"}


@st.composite
def unit_props(draw, n_restarts):
    props = dict(UNIT_GOOD, NRestarts=str(n_restarts))
    if draw(st.integers(0, 3)) == 0:  # a quarter of the polls: something off or garbage
        key = draw(st.sampled_from(sorted(props)))
        choice = draw(st.integers(0, 2))
        if choice == 0:
            del props[key]
        elif choice == 1:
            props[key] = draw(GARBAGE)
        else:
            props[key] = draw(st.sampled_from(["failed", "inactive", "activating", "auto-restart", "dead",
                                               OTHER, str(n_restarts + 1), str(n_restarts - 1)]))
    return props


def mib_value(min_mib):
    return st.one_of(st.none(), st.integers(0, 200000), st.sampled_from([min_mib - 1, min_mib, min_mib + 0.5]),
                     st.floats(0, 200000, allow_nan=False))


LOG_LINE = st.one_of(
    st.integers(0, 40).map(lambda n: "step=%d loss=2.1 tok/s=%d.5" % (n, 900 + n)),
    st.sampled_from(["", "\x00\x00", "caf\ufffd", "warming up", "tok/s=", "Traceback (most recent call last):",
                     "RuntimeError: CUDA out of memory", "NCCL error", marker(OTHER), marker(INV)]),
)


@st.composite
def expectations(draw):
    hold_s = draw(st.sampled_from([0.5, 1.0, 3.0, 10.0, 20.0]))
    return rd.Expectations(
        invocation_id=INV, n_restarts=draw(st.integers(0, 2)),
        gpus=draw(st.none() | st.lists(st.integers(0, 5), max_size=4, unique=True)),
        min_mib=draw(st.sampled_from([0, 1, 1024, 60000])), min_steps=draw(st.integers(0, 3)),
        hold_s=hold_s, stall_s=draw(st.sampled_from([s for s in (0.5, 1.0, 5.0, 15.0) if s <= hold_s])),
        timeout_s=draw(st.sampled_from([5.0, 30.0, 120.0])))


@st.composite
def polls(draw, expect, max_polls=25):
    """[(dt, unit props, {index: MiB or None}, [new log lines])]."""
    indexes = draw(st.lists(st.integers(0, 5), min_size=0, max_size=6, unique=True))
    steady = draw(st.booleans())  # half the worlds mostly healthy, so that READY happens
    out = []
    for _poll in range(draw(st.integers(1, max_polls))):
        dt = draw(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.5, 7.0]))
        props = dict(UNIT_GOOD, NRestarts=str(expect.n_restarts)) if steady and draw(st.integers(0, 9)) else \
            draw(unit_props(expect.n_restarts))
        gpus = {i: (draw(st.integers(expect.min_mib, 200000)) if steady and draw(st.integers(0, 9))
                    else draw(mib_value(expect.min_mib))) for i in indexes}
        lines = draw(st.lists(LOG_LINE, max_size=3))
        out.append((dt, props, gpus, lines))
    return out


# ---------------------------------------------------------------------------------------------
# the oracle

def unit_ok(props, expect):
    inv = props.get("InvocationID", "")
    raw = props.get("NRestarts")
    restarts = plain_int(raw) if raw is not None else 0
    return (props.get("ActiveState") == "active" and props.get("SubState") == "running"
            and inv in ("", expect.invocation_id)
            and (restarts is None or restarts <= expect.n_restarts)
            and (inv == expect.invocation_id or restarts is not None))


def gpus_ok(gpus_mib, expect):
    indexes = list(expect.gpus) if expect.gpus is not None else list(gpus_mib)
    return bool(indexes) and all(gpus_mib.get(i) is not None and gpus_mib[i] >= expect.min_mib
                                 for i in indexes)


def log_state(follower):
    """The log as this poll shows it (frozen: the analysis object changes under later polls)."""
    a = follower.analysis
    values = []
    if follower.marker is not None:
        for line in a.lines:
            m = re.search(tl.DEFAULT_STEP_REGEX, line)
            if m:
                values.append(int(m.group(1)))
    return {"marker": follower.marker is not None, "errors": bool(a.errors), "ready": a.ready_line is not None,
            "n_steps": len([v for i, v in enumerate(values) if all(v > w for w in values[:i])]),
            "max_step": max(values) if values else None}


def conditions_hold(props, gpus_mib, log, expect):
    return (unit_ok(props, expect) and gpus_ok(gpus_mib, expect) and log["marker"] and not log["errors"]
            and log["ready"] and (expect.min_steps <= 0 or log["n_steps"] >= expect.min_steps))


def oracle_allows_ready(history, expect):
    """history: [(now, conditions hold, max step)] up to this poll (the last entry): conditions
    held on every poll of the last hold_s s; with min_steps, the step counter rose in that window
    and its last rise (above every step seen before) is no more than stall_s old."""
    now, ok, _step = history[-1]
    if not ok:
        return False
    j = len(history) - 1
    while j > 0 and history[j - 1][1]:
        j -= 1
    since, _ok, _first_step = history[j]
    if now - since < expect.hold_s:
        return False
    if expect.min_steps <= 0:
        return True
    rises, best = [], None
    for t, _ok, s in history:
        if s is not None and (best is None or s > best):
            best = s
            rises.append(t)
    # the stall window follows the trainer's cadence: never longer than 3 x its longest gap
    gaps = [b - a for a, b in zip(rises, rises[1:])]
    window = max([expect.stall_s] + [rd.STALL_CADENCE_FACTOR * g for g in gaps])
    rose_twice = len([t for t in rises if t > since]) >= rd.MIN_HOLD_RISES
    return rose_twice and now - rises[-1] <= window


def drive(expect, world, keep_lines=None):
    """Run a Judge through the polls; return [(verdict, oracle allows READY)]."""
    judge = rd.Judge(expect)
    follower = tl.StartLog(INV, keep_lines=keep_lines)
    history, out, now = [], [], 1000.0
    for dt, props, gpus_mib, lines in world:
        now += dt
        follower.feed("".join(line + "\n" for line in lines))
        verdict = judge.observe(rd.Snapshot(now=now, unit=props, gpus_mib=gpus_mib, log=follower.analysis))
        log = log_state(follower)
        history.append((now, conditions_hold(props, gpus_mib, log, expect), log["max_step"]))
        out.append((verdict, oracle_allows_ready(history, expect)))
        if verdict.done:
            break
    return out


def world_with_preamble(expect, world, preamble):
    """Our marker (or not) first, then the generated polls."""
    return [(0.0, world[0][1], world[0][2], preamble)] + world


# ---------------------------------------------------------------------------------------------
# Judge

@FUZZ
@given(st.data())
def test_judge_says_ready_only_when_the_documented_conditions_held(data):
    expect = data.draw(expectations())
    world = data.draw(polls(expect))
    world = world_with_preamble(expect, world, data.draw(st.sampled_from([[marker(INV)], [], [marker(OTHER)]])))
    out = drive(expect, world)
    event("last verdict: %s" % out[-1][0].state)
    for verdict, allowed in out:
        assert verdict.state in (rd.PENDING, rd.READY, rd.FAILED)
        if verdict.state == rd.READY:
            assert allowed, verdict.reason


@FUZZ
@given(st.data())
def test_judge_never_ready_with_an_unreadable_gpu(data):
    expect = data.draw(expectations())
    world = data.draw(polls(expect))
    reported = sorted({i for _dt, _p, g, _l in world for i in g} | set(expect.gpus or []))
    bad = data.draw(st.sampled_from(expect.gpus or reported or [0]))
    world = [(dt, p, {**g, bad: None}, lines)
             for dt, p, g, lines in world]
    world = world_with_preamble(expect, world, [marker(INV)])
    assert all(v.state != rd.READY for v, _allowed in drive(expect, world))


@FUZZ
@given(st.data())
def test_judge_never_ready_without_our_marker(data):
    """The log holds other starts' progress (tok/s, rising steps) but never our marker."""
    expect = data.draw(expectations())
    world = [(dt, p, g, [line for line in lines if line != marker(INV)])
             for dt, p, g, lines in data.draw(polls(expect))]
    world = world_with_preamble(expect, world, [marker(OTHER), "step=1 tok/s=5", "step=2 tok/s=5"])
    assert all(v.state != rd.READY for v, _allowed in drive(expect, world))


@FUZZ
@given(st.data())
def test_judge_fails_at_once_on_a_unit_not_running(data):
    """Garbage in ActiveState/SubState (or a real non-running state) is FAILED on that poll."""
    expect = data.draw(expectations())
    props = dict(UNIT_GOOD, NRestarts=str(expect.n_restarts))
    key = data.draw(st.sampled_from(["ActiveState", "SubState"]))
    value = data.draw((GARBAGE | st.sampled_from(["failed", "inactive", "activating", "auto-restart"])).filter(
        lambda v: v != UNIT_GOOD[key]))
    if value:
        props[key] = value
    else:
        del props[key]
    follower = tl.StartLog(INV).feed(marker(INV) + "\nstep=1 tok/s=3\nstep=2 tok/s=3\n")
    verdict = rd.Judge(expect).observe(rd.Snapshot(now=5.0, unit=props, gpus_mib={0: 90000},
                                                   log=follower.analysis))
    assert verdict.state == rd.FAILED and "trainer" in verdict.reason


@FUZZ
@given(expectations(), st.integers(1, 12), st.sampled_from([0.5, 1.0, 2.0]))
def test_judge_says_ready_for_a_healthy_trainer(expect, n_gpus, interval):
    """Not vacuous: a trainer that holds every GPU and logs a rising step each poll is READY once
    hold_s has passed (and agrees with the oracle)."""
    if expect.gpus is not None:
        expect.gpus = list(range(n_gpus))
    expect.stall_s = max(expect.stall_s, interval * 2)
    expect.hold_s = max(expect.hold_s, expect.stall_s)
    expect.timeout_s = 1000.0
    props = dict(UNIT_GOOD, NRestarts=str(expect.n_restarts))
    gpus = {i: max(expect.min_mib, 70000) for i in range(n_gpus)}
    world = [(interval, props, gpus, ["step=%d loss=1.0 tok/s=%d.0" % (k, 1000 + k)]) for k in range(1, 60)]
    world = world_with_preamble(expect, world, [marker(INV)])
    out = drive(expect, world)
    verdict, allowed = out[-1]
    assert verdict.state == rd.READY and allowed, verdict.reason
    polls_needed = (expect.hold_s / interval) + max(expect.min_steps, 1) + 2
    assert len(out) <= polls_needed + 1


def test_judge_unreadable_identity_is_not_ready():
    expect = rd.Expectations(invocation_id=INV, hold_s=1.0, stall_s=1.0, min_steps=0)
    props = {"ActiveState": "active", "SubState": "running", "NRestarts": "[not set]"}
    follower = tl.StartLog(INV).feed(marker(INV) + "\nstep=1 tok/s=3\n")
    judge = rd.Judge(expect)
    verdicts = [judge.observe(rd.Snapshot(now=t, unit=props, gpus_mib={0: 90000}, log=follower.analysis))
                for t in (1.0, 2.0, 3.0)]
    assert all(v.state != rd.READY for v in verdicts)


# ---------------------------------------------------------------------------------------------
# DrainJudge

@st.composite
def drain_case(draw):
    gpus = draw(st.none() | st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True))
    judge = rd.DrainJudge(max_mib=draw(st.sampled_from([0, 512, 1024])), consecutive=draw(st.integers(0, 3)),
                          timeout_s=draw(st.sampled_from([0.0, 5.0, 60.0])), gpus=gpus)
    samples = []
    for _poll in range(draw(st.integers(1, 20))):
        indexes = draw(st.lists(st.integers(0, 5), min_size=1, max_size=6, unique=True))
        rows = [{"index": i, "memory_used_mib": draw(st.none() | st.integers(0, 3000) | st.floats(0, 3000)),
                 "processes": draw(st.sampled_from([[], [{"pid": 7, "process_name": None, "used_memory_mib": None}],
                                                    [{"pid": None, "process_name": "python3", "used_memory_mib": 9}]]))}
                for i in indexes]
        samples.append((draw(st.sampled_from([0.0, 0.5, 1.0, 4.0])), rows))
    return judge, samples


def drained(rows, judge):
    mib = {r["index"]: r["memory_used_mib"] for r in rows}
    indexes = judge.gpus if judge.gpus is not None else list(mib)
    return bool(indexes) and all(mib.get(i) is not None and mib[i] <= judge.max_mib for i in indexes)


@FUZZ
@given(drain_case())
def test_drain_judge_ready_exactly_when_drained_on_consecutive_samples(case):
    judge, samples = case
    need = max(1, judge.consecutive)
    seen, now = [], 50.0
    for dt, rows in samples:
        now += dt
        verdict = judge.observe(now, rows)
        seen.append(drained(rows, judge))
        absent = judge.gpus is not None and any(i not in {r["index"] for r in rows} for i in judge.gpus)
        oracle = len(seen) >= need and all(seen[-need:])
        if absent:
            assert verdict.state == rd.FAILED and "not reported by nvidia-smi" in verdict.reason
        elif oracle:
            assert verdict.state == rd.READY, verdict.reason
        else:
            assert verdict.state != rd.READY
        if verdict.done:
            break


@FUZZ
@given(st.data())
def test_unreadable_memory_from_nvidia_smi_is_never_drained_or_ready(data):
    """End to end: nvidia-smi prints a bracketed error in a selected GPU's memory.used cell;
    read_gpus → DrainJudge and → Judge never say READY on it."""
    n = data.draw(st.integers(1, 8))
    bad = data.draw(st.integers(0, n - 1))
    error = data.draw(st.sampled_from(sorted(smi.ERROR_VALUES)))
    mib = data.draw(st.lists(st.integers(0, 90000), min_size=n, max_size=n))
    text = "".join("%d, GPU-%04d, NVIDIA H200, %s, 143771 MiB, 0 %%\n" % (
        i, i, error if i == bad else "%d MiB" % mib[i], ) for i in range(n))
    gpus, _warnings = smi.read_gpus(lambda argv: (0, text, "") if "--query-gpu" in argv[1] else (0, "", ""),
                                    "nvidia-smi")
    selected = data.draw(st.none() | st.just([bad]))
    drain = rd.DrainJudge(max_mib=10 ** 9, consecutive=1, timeout_s=3.0, gpus=selected)
    judge = rd.Judge(rd.Expectations(invocation_id=INV, gpus=selected, min_mib=0, min_steps=0, hold_s=1.0,
                                     stall_s=1.0, timeout_s=3.0))
    follower = tl.StartLog(INV).feed(marker(INV) + "\nstep=1 tok/s=3\n")
    for t in range(5):
        assert drain.observe(float(t), gpus).state != rd.READY
        assert judge.observe(rd.Snapshot(now=float(t), unit=dict(UNIT_GOOD), gpus_mib=smi.memory_by_index(gpus),
                                         log=follower.analysis)).state != rd.READY


def test_drain_judge_no_gpu_reported_is_not_drained():
    judge = rd.DrainJudge(consecutive=1, timeout_s=60.0)
    assert judge.observe(0.0, []).state != rd.READY
