# -*- coding: utf-8 -*-
"""This start's log: markers, progress, errors, reason line, incremental following."""

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl

OLD = "11111111111111111111111111111111"
NEW = "22222222222222222222222222222222"
OTHER = "33333333333333333333333333333333"


def marker(inv, release="0123456789abcdef", pid=4242):
    return tl.marker_line(inv, release, pid, "2026-11-30T04:05:06+00:00")


LOG = "\n".join([
    marker(OLD, release="aaaaaaaaaaaaaaaa"),
    "loading model",
    "step=1 loss=2.5 tok/s=1000.0 queue_target=4 queue_drafter=4",
    "step=2 loss=2.4 tok/s=1100.0 queue_target=4 queue_drafter=4",
    marker(NEW, release="bbbbbbbbbbbbbbbb"),
    "Traceback (most recent call last):",
    '  File "trainer.py", line 3, in <module>',
    "    import flash_attn",
    "ModuleNotFoundError: No module named 'flash_attn'",
    "",
]) + "\n"


def test_parse_marker():
    assert tl.parse_marker(marker(NEW)) == {
        "invocation": NEW, "release": "0123456789abcdef", "pid": "4242",
        "time": "2026-11-30T04:05:06+00:00"}
    assert tl.parse_marker("step=1 tok/s=3") is None
    assert tl.parse_marker("==> something else <==") is None


def test_this_start_picks_lines_after_our_marker_only():
    m, lines = tl.this_start(LOG, NEW)
    assert m["release"] == "bbbbbbbbbbbbbbbb"
    assert lines[0] == "Traceback (most recent call last):"
    assert not any("tok/s" in line for line in lines)  # the stale line belongs to OLD
    m, lines = tl.this_start(LOG, OLD)
    assert m["release"] == "aaaaaaaaaaaaaaaa"
    assert lines == ["loading model", "step=1 loss=2.5 tok/s=1000.0 queue_target=4 queue_drafter=4",
                     "step=2 loss=2.4 tok/s=1100.0 queue_target=4 queue_drafter=4"]
    assert tl.this_start(LOG, OTHER) == (None, [])


def test_last_marker_with_our_invocation_wins():
    text = "\n".join([marker(NEW), "first try", marker(NEW, release="cccccccccccccccc"), "second"]) + "\n"
    m, lines = tl.this_start(text, NEW)
    assert m["release"] == "cccccccccccccccc"
    assert lines == ["second"]


@pytest.mark.parametrize("lines,expected", [
    (["a", "ModuleNotFoundError: No module named 'flash_attn'", ""], "ModuleNotFoundError: No module named 'flash_attn'"),
    (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "exiting"],
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    (["[rank0]: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1", "x"],
     "[rank0]: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1"),
    (["mypkg.errors.ConfigException: bad value", "bye"], "mypkg.errors.ConfigException: bad value"),
    (["starting", "killed", "   ", ""], "killed"),
    (['    raise ValueError("a: b")', "done"], "done"),
    ([], None),
])
def test_reason_line(lines, expected):
    assert tl.reason_line(lines) == expected


def test_tail():
    assert tl.tail(["a", "b", "c"], 2) == ["b", "c"]
    assert tl.tail(["a"], 5) == ["a"]
    assert tl.tail(["a"], 0) == []


def test_analysis_progress():
    a = tl.analyze([
        "warming up",
        "step=1 loss=2.5 tok/s=1000.0 queue_target=4 queue_drafter=4",
        "step=1 loss=2.5 tok/s=1000.0",   # repeated value is not a new step
        "step: 2 tok/s: 1200.5",
        "step 3 loss=2.3 tok/s=1300.25",
    ])
    assert a.steps == [1, 2, 3]
    assert a.n_steps == 3 and a.last_step == 3 and a.max_step == 3
    assert a.tok_s == pytest.approx(1300.25)
    assert a.ready_line == "step 3 loss=2.3 tok/s=1300.25"
    assert a.ready_count == 4
    assert a.errors == []
    assert a.reason == "step 3 loss=2.3 tok/s=1300.25"


def test_analysis_steps_must_increase():
    a = tl.analyze(["step=5", "step=3", "step=4", "step=6"])
    assert a.steps == [5, 6]
    assert a.last_step == 6


@pytest.mark.parametrize("line,pattern", [
    ("Traceback (most recent call last):", r"Traceback \(most recent call last\)"),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate", r"CUDA out of memory"),
    ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275", r"NCCL error"),
    ("torch.OutOfMemoryError: oops", r"OutOfMemoryError"),
])
def test_default_error_patterns(line, pattern):
    a = tl.analyze(["step=1 tok/s=1", line])
    assert a.errors == [(pattern, line)]
    assert a.first_error == line


def test_custom_regexes():
    a = tl.analyze(["it 7 | 55 samples/s", "it 9 | 60 samples/s", "FATAL: boom"],
                   ready_regex=r"samples/s", step_regex=r"\bit (\d+)", tokps_regex=r"(\d+) samples/s",
                   error_regexes=[r"^FATAL"])
    assert a.steps == [7, 9]
    assert a.tok_s == 60.0
    assert a.errors == [("^FATAL", "FATAL: boom")]


def test_follower_incremental_partial_lines():
    f = tl.StartLog(NEW)
    f.feed(marker(OLD) + "\nstep=1 tok/s=5\n" + marker(NEW)[:20])
    assert f.marker is None
    f.feed(marker(NEW)[20:] + "\nstep=")
    assert f.marker["invocation"] == NEW
    assert f.analysis.n_steps == 0
    f.feed("1 tok/s=10\nstep=2 tok/s=11\n")
    assert f.analysis.steps == [1, 2]
    assert f.analysis.tok_s == 11.0
    f.feed("Killed")
    assert f.analysis.reason == "step=2 tok/s=11"
    f.finish()
    assert f.analysis.reason == "Killed"


def test_follower_other_marker_ends_our_start():
    f = tl.StartLog(NEW)
    f.feed("\n".join([marker(NEW), "step=1", marker(OTHER), "step=2 tok/s=1", ""]))
    assert f.ended and not f.in_start
    assert f.analysis.steps == [1]
    # the other start's throughput line is not ours; the default ready pattern takes our counter line
    assert f.analysis.ready_line == "step=1"


def test_follower_truncation_rereads_from_marker():
    f = tl.StartLog(NEW)
    f.feed(marker(NEW) + "\nstep=1 tok/s=1\nstep=2 tok/s=")
    f.truncated()                                   # copytruncate: partial line dropped
    f.feed(marker(NEW) + "\nstep=7 tok/s=3\n")       # file rewritten from its start
    assert f.analysis.steps == [7]
    f.truncated()
    f.feed("step=8 tok/s=4\n")                      # no marker after truncation: still ours
    assert f.analysis.steps == [7, 8]


def test_follower_keeps_bounded_tail():
    f = tl.StartLog(NEW, keep_lines=3)
    f.feed(marker(NEW) + "\n" + "".join("step=%d\n" % i for i in range(1, 11)))
    assert f.analysis.tail(20) == ["step=8", "step=9", "step=10"]
    assert f.analysis.n_steps == 10
    assert f.analysis.line_count == 10
