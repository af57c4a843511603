"""Figures and progress as people write them (issue 15, items 1 and 2): the number parser
(proof.throughput.parse_figure / read_figure), the default tok/s and step regexes over a table of
real-looking lines, tqdm's carriage-return updates, counters that wrap or go back, and the judge's
early word when the step regex reads nothing."""
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.dflash.trainer.plugins.module_utils.job import cycle as cy
from ansible_collections.dflash.trainer.plugins.module_utils.proof import readiness as rd
from ansible_collections.dflash.trainer.plugins.module_utils.proof import throughput as t
from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
OLD_STEP_REGEX = r"\bstep[=: ]\s*(\d+)"
OLD_TOKPS_REGEX = r"tok/s[=: ]\s*([0-9.]+)"


# --- the number ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,value", [
    ("12.4K", 12400.0), ("12.4k", 12400.0), ("21.5K", 21500.0), ("1.2M", 1200000.0), ("3G", 3e9),
    ("12,400", 12400.0), ("1,234,567.5", 1234567.5), ("12_400", 12400.0), ("1.2e4", 12000.0),
    ("4.1E+3", 4100.0), ("41250.3", 41250.3), ("0", 0.0), (".5", 0.5), ("-3", -3.0), (" 7 ", 7.0),
])
def test_parse_figure_reads_what_people_write(text, value):
    assert t.parse_figure(text) == value


@pytest.mark.parametrize("text", [
    "12.4.5", "12,40", "1,2345", "12,", "nan", "inf", "", "K", "12.4m", "12.4 K", "12.4KB", "1e999", "0x10", None,
])
def test_parse_figure_refuses_what_is_not_a_figure(text):
    with pytest.raises(ValueError):
        t.parse_figure(text)


@pytest.mark.parametrize("regex,line,value,problem", [
    # the old default regex on a suffixed figure: refused, not stored as 12.4
    (OLD_TOKPS_REGEX, "step=5 tok/s=12.4K", None, "read '12.4' where the line shows '12.4K'"),
    (r"(\d+) samples/s", "12,400 samples/s", None, "read '400', the end of a longer figure"),
    (r"q_hs=(\d+)", "q_hs=7,500 x", None, "read '7' where the line shows '7,500'"),
    (r"q_hs=(\d+)", "q_hs=7, x=2", 7.0, None),
    (r"q_hs=([\d.]+[KM]?)", "q_hs=1.5M", 1.5e6, None),
    (r"q=(\S+)", "q=12.4.5", None, "'12.4.5' is not a number"),
    (r"(?:a=(\d+)|b=(\d+))", "b=9", 9.0, None),       # the first group that took part
    (r"tok/s", "tok/s", None, "'tok/s' is not a number"),  # no group: the whole match
])
def test_read_figure_never_stores_another_number(regex, line, value, problem):
    assert t.read_figure(re.search(regex, line)) == (value, problem)


# --- the default regexes over real-looking lines ------------------------------------------------

LINES = [
    # line, step, tok/s, ready (the default ready pattern also takes a line of the training counter
    # while no throughput line was seen: the [N/M] and tqdm lines below are ready when alone)
    ("step=3 loss=2.1043 tok/s=41250.3 queue_target=9 queue_drafter=2", 3, 41250.3, True),
    ("step=5 tok/s=12.4K", 5, 12400.0, True),
    ("iter 5 | 21.5K tok/s | loss 2.31", 5, 21500.0, True),
    ("12.4K tok/s", None, 12400.0, True),
    ("tokens/s: 12,400", None, 12400.0, True),
    ("throughput 1.2e4 tok/s", None, 12000.0, True),
    ("step 1,200 | 1.2M tokens per second", 1200, 1.2e6, True),
    ("global_step=7 lr=3e-4 tok/sec: 980", 7, 980.0, True),
    ("Iteration 12: loss 3.2, 4100 tokens/s", 12, 4100.0, True),
    ("it=9 toks/s=1.5K", 9, 1500.0, True),
    ("Epoch 1 [5/100] loss 2.1", 5, None, True),
    ("Step: [6/100] loss 2.1", 6, None, True),
    ("batch 33/1000 tok/s 4,500", 33, 4500.0, True),
    (" 45%|####5     | 45/100 [00:10<00:12,  4.51it/s, loss=2.1, tok/s=12.4K]", 45, 12400.0, True),
    ("7it [00:01,  4.51it/s]", 7, None, True),
    ("[12:00:01] INFO step 8 tok/s=41.2K", 8, 41200.0, True),
    ("tok/s=41250.3 (ema 41000 tok/s)", None, 41250.3, True),
    ("loss 2.31 tokens/s 12400", None, 12400.0, True),
    # what must not be read as a step or a figure
    ("2024/01/05 12:00:01 INFO training started", None, None, False),
    ("step_time=0.3 steps/s=4.1 4.51it/s", None, None, False),
    ("batch_size=32 num_steps=1000 max_iters: 5000", None, None, False),
    ("tok/s/gpu=5000", None, None, True),
    ("avg tokens/sample: 512", None, None, False),
    ("step 1.5 of warmup", None, None, False),
    (tl.marker_line(INV, "0123456789abcdef", 7, "2026-11-30T04:05:06Z"), None, None, False),
]


@pytest.mark.parametrize("line,step,tok_s,ready", LINES)
def test_default_regexes_read_real_looking_lines(line, step, tok_s, ready):
    a = tl.analyze([line])
    assert a.last_step == step
    assert a.tok_s == tok_s
    assert (a.ready_line is not None) == ready
    assert a.problems == []


def test_a_figure_that_cannot_be_read_is_reported_not_stored():
    a = tl.analyze(["step=1 tok/s=12.4K", "step=2 tok/s=12.5K"], tokps_regex=OLD_TOKPS_REGEX,
                   extra_regexes={"q": r"q=(\d+)"})
    assert a.tokps_values == [None, None] and a.tok_s is None
    assert a.problems[0] == "tok/s: read '12.4' where the line shows '12.4K' in line 'step=1 tok/s=12.4K'"
    summary = t.summarize(a.tokps_values, 10)
    assert summary["n"] == 0 and summary["unreadable"] == 2 and summary["median"] is None
    words = t.compare({"tok_s": summary}, [], "r1")["words"]
    assert "[2 tok/s figures could not be read]" in words


def test_the_measurement_keeps_tok_s_from_suffixed_figures():
    """tok/s=12.4K is 12400 in the figures the ledger keeps (it was 12.4)."""
    a = tl.analyze(["step=%d tok/s=12.%dK q_target=1.5K" % (i, i) for i in range(1, 6)],
                   extra_regexes={"q_target": r"q_target=(\S+)"})
    figures = cy.measured(a, [], now=100.0, window_s=10.0)
    assert figures["tok_s"]["median"] == 12300.0 and figures["tok_s"]["n"] == 5
    assert figures["q_target"]["median"] == 1500.0
    assert "unreadable" not in figures["tok_s"]


# --- Hypothesis: format a float as people do, read it back --------------------------------------

def _formats(value, digits):
    plain = "%.*f" % (digits, value)
    yield plain, float(plain)
    grouped = "{:,.{}f}".format(value, digits)
    yield grouped, float(grouped.replace(",", ""))
    underscored = "{:_.{}f}".format(value, digits)
    yield underscored, float(underscored.replace("_", ""))
    sci = "%.*e" % (digits, value)
    yield sci, float(sci)
    for suffix, mult in (("K", 1e3), ("M", 1e6), ("G", 1e9)):
        shown = "%.*f" % (digits, value / mult)
        yield shown + suffix, float(shown) * mult


@settings(max_examples=300, deadline=None)
@given(value=st.floats(min_value=0, max_value=1e12, allow_nan=False), digits=st.integers(0, 3))
def test_round_trip_a_formatted_figure(value, digits):
    for text, expected in _formats(value, digits):
        assert t.parse_figure(text) == expected, text


@settings(max_examples=200, deadline=None)
@given(value=st.floats(min_value=0, max_value=1e9, allow_nan=False), digits=st.integers(0, 2),
       step=st.integers(0, 10 ** 7), where=st.sampled_from(["after", "before", "tokens"]))
def test_round_trip_through_a_log_line(value, digits, step, where):
    """A figure written in a line with a step counter and other numbers is read back as written."""
    for text, expected in _formats(value, digits):
        if where == "after":
            line = "step=%d loss=2.0312 tok/s=%s queue_target=9" % (step, text)
        elif where == "before":
            line = "iter %d | %s tok/s | loss 2.0312" % (step, text)
        else:
            line = "global_step: {:,} | tokens/s: {} | lr 3e-4".format(step, text)
        a = tl.analyze([line])
        assert (a.tok_s, a.last_step, a.problems) == (expected, step, []), line


# --- tqdm: carriage-return updates are lines ----------------------------------------------------

def _bar(n, total=100, tokps="12.4K"):
    return "\rtraining: %3d%%|##        | %d/%d [00:%02d<00:10, 4.51it/s, loss=2.1, tok/s=%s]" % (
        n * 100 // total, n, total, n % 60, tokps)


@pytest.mark.parametrize("chunk", [1, 7, 64, 10 ** 6])
def test_tqdm_updates_are_read_as_they_come_in_any_chunking(chunk):
    text = tl.marker_line(INV, "r", 7, "t") + "\n" + "loading\n" + "".join(_bar(n) for n in range(1, 6))
    follower = tl.StartLog(INV)
    for i in range(0, len(text), chunk):
        follower.feed(text[i:i + chunk])
    a = follower.analysis
    # the last redraw waits for the next one (its end), as a line waits for its newline
    assert a.steps == [1, 2, 3, 4] and a.tok_s == 12400.0
    follower.finish()
    assert a.steps == [1, 2, 3, 4, 5] and a.line_count == 7   # loading, an empty segment, 5 bars


def test_crlf_is_one_line_end_even_across_chunks():
    follower = tl.StartLog(INV).feed(tl.marker_line(INV, "r", 7, "t") + "\r\nstep=1 tok/s=1\r")
    follower.feed("\nstep=2 tok/s=2\r\n")
    a = follower.analysis
    assert follower.marker is not None and list(a.lines) == ["step=1 tok/s=1", "step=2 tok/s=2"]


def test_an_epoch_bar_that_starts_again_keeps_counting_and_an_eval_bar_is_another_counter():
    a = tl.analyze([_bar(n, 3) for n in (1, 2, 3)] + [_bar(1, 20), _bar(20, 20)] + [_bar(n, 3) for n in (0, 1, 2)])
    assert a.steps == [1, 2, 3, 4, 5] and a.went_back is None and a.last_step == 2


def test_a_counter_that_goes_back_is_named_until_it_passes_its_high():
    a = tl.analyze(["step=%d" % n for n in (1, 2, 3, 4, 5, 6, 1, 2)])
    assert a.went_back == (6, 1) and a.max_step == 6 and a.last_step == 2
    a.extend(["step=%d" % n for n in (3, 4, 5, 6, 7)])
    assert a.went_back is None and a.max_step == 7


# --- the judge: an early word when the step regex reads nothing, a step that goes back ----------

def _unit():
    return {"ActiveState": "active", "SubState": "running", "Result": "success", "InvocationID": INV,
            "NRestarts": "0", "MainPID": "4242"}


def _run(lines_at, expect, until=400.0, interval=1.0, step_regex=tl.DEFAULT_STEP_REGEX):
    """Poll every ``interval`` s; ``lines_at(t)`` -> lines written in (t - interval, t]. (t, verdict)."""
    follower = tl.StartLog(INV, step_regex=step_regex)
    follower.feed(tl.marker_line(INV, "0123456789abcdef", 4242, "t") + "\n")
    judge = rd.Judge(expect)
    now = 0.0
    while now <= until:
        follower.feed("".join(line + "\n" for line in lines_at(now)))
        verdict = judge.observe(rd.Snapshot(now=now, unit=_unit(), gpus_mib={0: 70000}, log=follower.analysis))
        if verdict.done:
            return now, verdict
        now += interval
    raise AssertionError("no verdict by %s s" % until)


def _expect(**kw):
    kw.setdefault("hold_s", 10.0)
    kw.setdefault("stall_s", 5.0)
    return rd.Expectations(invocation_id=INV, **kw)


def _iter_lines(stuck_at=None, first_at=3.0):
    def lines_at(now):
        if now < first_at:
            return ["loading model"] if now == 0 else []
        n = int(now - first_at) + 1
        return ["iter %d | 21.5K tok/s | loss 2.3" % (min(n, stuck_at) if stuck_at else n)]
    return lines_at


def test_a_healthy_iter_trainer_is_proved_with_the_default_regexes():
    t_ready, v = _run(_iter_lines(), _expect())
    assert v.state == rd.READY and v.details["tok_s"] == 21500.0 and t_ready <= 3 + 10 + 2


def test_a_step_regex_that_reads_nothing_fails_within_the_stall_window_naming_it():
    """The issue's case: iter N lines with the old step regex: refused at stall_s + a poll after
    the first ready line, not at the 300 s deadline, with what to set."""
    t_fail, v = _run(_iter_lines(), _expect(timeout_s=300.0), step_regex=OLD_STEP_REGEX)
    assert v.state == rd.FAILED and 3 + 5 < t_fail <= 3 + 5 + 1
    assert v.reason.startswith("the log shows `iter ")
    assert ("but trainer_step_regex '%s' matched nothing for 6 s after the first line matching "
            "trainer_ready_regex: set trainer_step_regex" % OLD_STEP_REGEX) in v.reason


def test_the_default_step_regex_is_named_by_what_it_reads():
    def lines(now):
        return ["update %d | 21.5K tok/s" % int(now)] if now >= 1 else []
    _t, v = _run(lines, _expect())
    assert "trainer_step_regex (the default: step, global_step, iter" in v.reason and "matched nothing" in v.reason


def test_a_step_regex_that_reads_no_whole_number_says_so():
    def lines(now):
        return ["step=%d.5 tok/s=3" % int(now)] if now >= 1 else []
    _t, v = _run(lines, _expect(), step_regex=r"step=(\S+)")
    assert "read no whole step number (step: '1.5' is not a whole number in line 'step=1.5 tok/s=3')" in v.reason


def test_a_silent_log_after_the_ready_line_waits_for_the_deadline():
    """A trainer that printed one throughput line and is compiling: the log does not grow, so the
    step regex is not blamed; the deadline judges."""
    def lines(now):
        return ["warmup 21.5K tok/s"] if now == 1 else []
    t_fail, v = _run(lines, _expect(timeout_s=60.0))
    assert t_fail == 60 and v.reason.startswith("not ready after 60 s") and "no step values" in v.reason


def test_stuck_at_iter_5_fails_within_the_stall_window():
    t_fail, v = _run(_iter_lines(stuck_at=5), _expect())
    # iter 5 is read at t=7; stall_s 5 later (plus a poll) it fails
    assert v.state == rd.FAILED and v.reason.startswith("no progress for 6 s (last step=5)") and t_fail == 13


def test_a_step_that_goes_back_is_named_a_restart_inside():
    def lines_at(now):
        n = int(now) + 1
        return ["step=%d tok/s=3" % (n if n <= 6 else min(n - 6, 3))]
    _t, v = _run(lines_at, _expect())
    assert v.state == rd.FAILED
    assert v.reason.startswith("step went from 6 back to 1: the trainer restarted inside (no progress past step 6 for")


def test_the_stand_in_trainers_format_is_still_proved():
    def lines(now):
        return ["step=%d loss=2.1 tok/s=41250.3 queue_target=9 queue_drafter=2" % (now + 1)]
    _t, v = _run(lines, _expect())
    assert v.state == rd.READY and v.details["tok_s"] == 41250.3 and "figure_problems" not in v.details


def test_figure_problems_reach_the_proof():
    def lines(now):
        return ["step=%d tok/s=12.4K" % (now + 1)]
    follower_regex = OLD_TOKPS_REGEX
    follower = tl.StartLog(INV, tokps_regex=follower_regex)
    follower.feed(tl.marker_line(INV, "r", 1, "t") + "\n")
    judge = rd.Judge(_expect(hold_s=2.0, stall_s=2.0))
    for now in range(0, 10):
        follower.feed("".join(x + "\n" for x in lines(now)))
        v = judge.observe(rd.Snapshot(now=float(now), unit=_unit(), gpus_mib={0: 70000}, log=follower.analysis))
        if v.done:
            break
    assert v.state == rd.READY and v.details["tok_s"] is None
    assert v.details["figure_problems"][0].startswith("tok/s: read '12.4' where the line shows '12.4K'")
