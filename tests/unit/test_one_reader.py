# -*- coding: utf-8 -*-
"""One reader for every source of a start's lines: the trainer's log (StartLog, after this start's
marker) and its own progress file (trainer_progress_path) understand the same formats - plain lines
read by the regexes, JSONL records ({"step": N, "tok_s": X}) - with the same parser
(proof.trainer_log.ProgressAnalysis), so the same lines give the same steps, tok/s, ready line and errors
wherever the trainer writes them. A log without records reads exactly as before (LogAnalysis)."""

import glob
import json
import os

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.proof import progress_file as pf
from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl
from ansible_collections.dflash.trainer.plugins.module_utils.proof.progress_elsewhere import log_shows_progress
from ansible_collections.dflash.trainer.plugins.module_utils.proof.readiness import READY, Expectations, Judge, Snapshot

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
OTHER = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
REGEXES = dict(ready_regex=tl.DEFAULT_READY_REGEX, step_regex=tl.DEFAULT_STEP_REGEX,
               tokps_regex=tl.DEFAULT_TOKPS_REGEX, error_regexes=tl.DEFAULT_ERROR_REGEXES,
               extra_regexes={"mfu": r"mfu[=:]\s*([\d.]+)"})
FIXTURES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "fixtures", "logs", "*.log")))


def record(step, tok_s=None, **more):
    values = dict(step=step, **more)
    if tok_s is not None:
        values["tok_s"] = tok_s
    return json.dumps(values)


JSONL = [
    record(1, 21500.0, loss=2.31, mfu=0.41),
    record(2, 21600.0, loss=2.20, mfu=0.42),
    record(3, "21.7K", loss=2.12, mfu=0.43),
    record(4, None, loss=2.05),                                 # a step without throughput
    record(5, 21800.0, loss=2.01, note="NCCL error: retried"),  # an error pattern in a record's text
]
PLAIN = [
    "loading model shards 1/4",
    "iter 1 | 21.5K tok/s | mfu=0.41",
    "iter 2 | 21.6K tok/s | mfu=0.42",
    "\x1b[32miter 3 | 21.7K tok/s | mfu=0.43\x1b[0m",            # colours are taken out
    "iter 4 | loss 2.05",
    "[rank0]: NCCL error: unhandled system error",
    "iter 5 | 21.8K tok/s | mfu=0.44",
]
MIXED = [
    "loading model shards 1/4",
    "iter 1 | 21.5K tok/s",                                      # plain progress before the first record
    record(1, 21500.0, mfu=0.41),
    "WARNING: step 50 of the data loader, tok/s 1 (a plain line among records)",
    record(2, 21600.0, mfu=0.42),
    '{"loss": 2.0, "note": "an object without step is a plain line"}',
    "Traceback (most recent call last):",
    record(3, 21700.0, mfu=0.43),
    "RuntimeError: NCCL timeout",
]
STREAMS = {"jsonl": JSONL, "plain": PLAIN, "mixed": MIXED}

# what the Judge (and the status, the measurement, check-log) reads of a start's lines
READ = ("steps", "n_steps", "max_step", "last_step", "went_back", "tok_s", "tokps_values", "extra_values",
        "ready_line", "ready_count", "progress_line", "progress_like_line", "progress_like_at",
        "last_progress_like_line", "line_count", "errors", "first_error", "problems", "reason", "counter")


def read(analysis):
    got = dict((name, getattr(analysis, name)) for name in READ)
    got["tail"] = analysis.tail(50)
    return got


def through_the_log(lines, **kw):
    """``lines`` as the trainer's log holds them after this start's marker (an earlier start before)."""
    follower = tl.StartLog(INV, **dict(REGEXES, **kw))
    text = "".join(line + "\n" for line in
                   [tl.marker_line(OTHER, "r0", 7, "t0"), record(99, 1.0), "iter 99 | 1 tok/s",
                    "Traceback (most recent call last):", tl.marker_line(INV, "r1", 42, "t1")] + lines)
    for i in range(0, len(text), 7):  # fed in pieces, as polls read it
        follower.feed(text[i:i + 7])
    follower.finish()
    assert follower.marker["release"] == "r1" and follower.analysis.marker == follower.marker
    return follower.analysis


def through_the_progress_file(tmp_path, lines, **kw):
    """``lines`` as the trainer's progress file holds them after the start (its earlier lines before)."""
    path = tmp_path / "progress.jsonl"
    path.write_text(record(99, 1.0) + "\niter 99 | 1 tok/s\nTraceback (most recent call last):\n")
    start = pf.progress_start(str(path))
    reader = pf.ProgressFileReader(str(path), tl.ProgressAnalysis(**dict(REGEXES, **kw)), start,
                                   trust=lambda *_args: None)
    with open(str(path), "a") as fh:
        for line in lines:
            fh.write(line + "\n")
            fh.flush()
            reader.poll()
    reader.finish()
    assert reader.source == "the start offset %d" % start["size"]
    return reader.analysis


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_same_lines_read_the_same_in_the_log_and_in_the_progress_file(tmp_path, name):
    lines = STREAMS[name]
    from_log = read(through_the_log(lines))
    from_file = read(through_the_progress_file(tmp_path, lines))
    from_lines = read(tl.ProgressAnalysis(**REGEXES).extend(lines))
    assert from_log == from_file == from_lines


def test_a_jsonl_stream_gives_its_steps_tok_s_ready_line_and_errors_wherever_it_is_written(tmp_path):
    for a in (through_the_log(JSONL), through_the_progress_file(tmp_path, JSONL)):
        assert a.records == 5 and a.steps == [1, 2, 3, 4, 5] and a.last_step == 5
        assert a.tok_s == 21800.0 and a.tokps_values == [21500.0, 21600.0, 21700.0, 21800.0]
        assert a.extra_values["mfu"] == [0.41, 0.42, 0.43]
        assert a.ready_line == JSONL[4] and a.progress_line == JSONL[4]  # shown as written, not rendered
        assert a.last_progress_like_line == JSONL[4] and a.progress_like_line == JSONL[0]
        assert a.errors == [("NCCL error", JSONL[4])] and a.first_error == JSONL[4]
        assert a.problems == [] and a.tail(2) == JSONL[3:] and a.reason == JSONL[4]


def test_a_plain_stream_gives_its_steps_tok_s_ready_line_and_errors_wherever_it_is_written(tmp_path):
    for a in (through_the_log(PLAIN), through_the_progress_file(tmp_path, PLAIN)):
        assert a.records == 0 and a.steps == [1, 2, 3, 4, 5] and a.last_step == 5
        assert a.tok_s == 21800.0 and a.tokps_values == [21500.0, 21600.0, 21700.0, 21800.0]
        assert a.ready_line == "iter 5 | 21.8K tok/s | mfu=0.44" and a.line_count == len(PLAIN)
        assert a.errors == [("NCCL error", "[rank0]: NCCL error: unhandled system error")]
        assert a.tail(4)[0] == "iter 3 | 21.7K tok/s | mfu=0.43"


def test_a_mixed_stream_takes_progress_from_its_records_and_errors_and_reason_from_every_line(tmp_path):
    for a in (through_the_log(MIXED), through_the_progress_file(tmp_path, MIXED)):
        assert a.records == 3 and a.steps == [1, 2, 3] and a.tok_s == 21700.0 and a.line_count == 3
        assert a.ready_line == MIXED[7] and a.extra_values["mfu"] == [0.41, 0.42, 0.43]
        assert a.errors == [("Traceback \\(most recent call last\\)", "Traceback (most recent call last):")]
        assert a.reason == "RuntimeError: NCCL timeout" and a.tail(len(MIXED)) == MIXED


def test_a_trainer_that_prints_jsonl_records_on_stdout_is_proved_from_its_log():
    follower = tl.StartLog(INV, **REGEXES)
    follower.feed("%s\n%s\n" % (record(40, 99999.0), tl.marker_line(INV, "r1", 42, "t")))
    assert not log_shows_progress(follower.analysis)  # the record before the marker is an earlier start's
    judge = Judge(Expectations(invocation_id=INV, gpus=[0], min_mib=1024, min_steps=2, hold_s=2, stall_s=2,
                               timeout_s=30), start=0.0)
    unit = {"ActiveState": "active", "SubState": "running", "InvocationID": INV, "NRestarts": "0", "MainPID": "42"}
    verdict = None
    for t in range(0, 8):
        follower.feed(record(t + 1, 20000.0 + t, loss=2.0) + "\n")
        verdict = judge.observe(Snapshot(now=float(t), unit=unit, gpus_mib={0: 30000}, log=follower.analysis))
        if verdict.state == READY:
            break
    assert log_shows_progress(follower.analysis)
    assert verdict.state == READY and verdict.details["release"] == "r1"
    assert verdict.details["tok_s"] == 20000.0 + t and verdict.details["matched_line"] == record(t + 1, 20000.0 + t,
                                                                                                 loss=2.0)
    marker, lines = tl.this_start(tl.marker_line(INV, "r1", 42, "t") + "\n" + record(1, 5.0) + "\n", INV)
    assert marker["release"] == "r1" and lines == [record(1, 5.0)]


@pytest.mark.parametrize("line", [
    '{"loss": 2.0, "step_time": 0.4}',        # no "step" key
    "{'step': 3, 'loss': 2.0}",               # a Python dict (HF Trainer's logs) is no JSON
    '[{"step": 3}]',                          # not an object
    '{"step": 3, "tok_s": 10',                # not whole
])
def test_only_a_json_object_with_a_step_key_is_a_record_in_the_log(line):
    a = through_the_log(["iter 1 | 10 tok/s", line, "iter 2 | 11 tok/s"])
    assert a.records == 0 and a.steps == [1, 2] and a.tok_s == 11


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_a_log_without_records_reads_exactly_as_the_plain_reader_reads_it(path):
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    marker = {"invocation": INV, "release": "r1", "pid": "42", "time": "t"}
    follower = tl.StartLog(INV, **REGEXES)
    follower.feed(tl.marker_line(INV, "r1", 42, "t") + "\n" + text).finish()
    lines = tl.LINE_END.split(text)
    if not lines[-1]:
        lines.pop()  # what follows the last line end: nothing
    plain = tl.LogAnalysis(marker=marker, **REGEXES).extend(lines)
    assert follower.analysis.records == 0
    assert read(follower.analysis) == read(plain) and list(follower.analysis.lines) == list(plain.lines)
    assert follower.analysis.marker == plain.marker == marker


@pytest.mark.parametrize("line, problem", [
    ('{"a": ' + "[" * 30000, None),                                # nested past the parser: a plain line
    ('{"step": 1' + "0" * 400 + "}", "step: 1000"),                # too large for a float: a problem
    ('{"step": 2, "tok_s": 1' + "0" * 400 + "}", "tok/s: 1000"),
])
def test_no_line_of_the_log_stops_the_reader(line, problem):
    a = through_the_log(["iter 1 | 10 tok/s", line, "iter 2 | 11 tok/s"])
    assert len(a.tail(3)) == 3
    if problem is None:
        assert a.records == 0 and a.problems == [] and a.steps == [1, 2]
    else:
        assert a.records == 1 and a.problems[0].startswith(problem) and "..." in a.problems[0].split(" in line ")[0]
