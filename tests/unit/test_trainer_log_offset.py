# -*- coding: utf-8 -*-
"""Reading this start's log from its marker (the launcher's <log>.start sidecar, else a backward
scan), never from byte 0; continuation markers; the 'log was truncated or replaced' signal."""

import json
import os
import random

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.proof import log_file as lf
from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
OLD = "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a"
NEXT = "9b9b9b9b9b9b9b9b9b9b9b9b9b9b9b9b"
REL = "0123456789abcdef"
T = "2026-11-30T04:05:06+00:00"


def start(inv=INV):
    return tl.marker_line(inv, REL, 42, T) + "\n"


def cont(why, inv=INV):
    return tl.continuation_line(inv, REL, 42, T, why) + "\n"


def steps(a, b):
    return "".join("step=%d tok/s=%d.0\n" % (i, i) for i in range(a, b))


def write(path, text, sidecar_offset=None, inv=INV, inode=None):
    path.write_bytes(text.encode())
    if sidecar_offset is not None:
        record = {"invocation": inv, "offset": sidecar_offset, "inode": inode or path.stat().st_ino,
                  "dev": path.stat().st_dev}
        (path.parent / (path.name + ".start")).write_text(json.dumps(record))


def follower():
    return tl.StartLog(INV)


def test_continuation_marker_parses_and_does_not_reset_the_start():
    m = tl.parse_marker(cont("rotated"))
    assert m["invocation"] == INV and m["continued"] == "rotated" and tl.is_continuation(m)
    assert not tl.is_continuation(tl.parse_marker(start()))
    f = tl.StartLog(INV).feed(start() + steps(1, 3) + cont("truncated") + steps(3, 5))
    assert f.analysis.steps == [1, 2, 3, 4] and "continued" not in f.marker
    f = tl.StartLog(INV).feed(cont("rotated") + steps(7, 9))          # a file that begins with one
    assert f.marker["continued"] == "rotated" and f.analysis.steps == [7, 8]
    f = tl.StartLog(INV).feed(start() + steps(1, 2) + start(NEXT) + steps(2, 3))
    assert f.ended and f.analysis.steps == [1]


def test_sidecar_is_used_and_nothing_before_the_marker_is_read(tmp_path):
    log = tmp_path / "t.log"
    before = start(OLD) + steps(0, 20000)
    write(log, before + start() + steps(1, 4), sidecar_offset=len(before))
    f, where = lf.read_start(str(log), INV, follower)
    assert (where.source, where.offset, where.problem) == ("sidecar", len(before), None)
    assert where.bytes_read == len(start() + steps(1, 4))
    assert f.analysis.steps == [1, 2, 3] and f.marker["release"] == REL


@pytest.mark.parametrize("record", [
    {"invocation": OLD, "offset": 0},                 # the previous start's sidecar
    {"invocation": INV, "offset": 5},                 # not a marker there
    {"invocation": INV, "offset": 0, "inode": 1},     # another file (rotated away)
    {"invocation": INV, "offset": 10 ** 9},           # past the end
    "not json",
    None,                                             # no sidecar
])
def test_a_sidecar_that_does_not_match_falls_back_to_a_scan(tmp_path, record):
    log = tmp_path / "t.log"
    before = start(OLD) + steps(0, 500)
    write(log, before + start() + steps(1, 3))
    if record is not None:
        if isinstance(record, dict):
            record = dict({"inode": log.stat().st_ino}, **record)
        (tmp_path / "t.log.start").write_text(record if isinstance(record, str) else json.dumps(record))
    f, where = lf.read_start(str(log), INV, follower)
    assert (where.source, where.offset, where.problem) == ("scan", len(before), None)
    assert f.analysis.steps == [1, 2]


def test_marker_gone_but_sidecar_names_this_start_says_so(tmp_path):
    log = tmp_path / "t.log"
    write(log, "someone else's content\n" + steps(9, 12) + "partial", sidecar_offset=0)
    f, where = lf.read_start(str(log), INV, follower)
    assert where.source == "end" and f.marker is None
    assert where.problem.startswith("log was truncated or replaced since this start")
    assert where.offset == len("someone else's content\n" + steps(9, 12))   # the unfinished line


def test_no_marker_yet_and_no_sidecar_is_no_problem(tmp_path):
    log = tmp_path / "t.log"
    write(log, start(OLD) + steps(0, 3))
    f, where = lf.read_start(str(log), INV, follower)
    assert (where.source, where.problem, f.marker) == ("end", None, None)
    assert where.offset == log.stat().st_size and where.bytes_read == 0


def test_scan_prefers_the_start_marker_and_else_the_earliest_continuation(tmp_path):
    log = tmp_path / "t.log"
    text = start(OLD) + steps(0, 3) + start() + steps(3, 5) + cont("truncated") + steps(5, 6)
    write(log, text)
    with open(str(log), "rb") as f:
        assert lf.scan_for_start(f, len(text), INV)[0] == text.index(start())
    text = cont("rotated") + steps(0, 3) + cont("reopened") + steps(3, 5)
    write(log, text)
    with open(str(log), "rb") as f:
        assert lf.scan_for_start(f, len(text), INV)[0] == 0


def test_scan_ignores_a_marker_line_not_finished_and_a_longer_invocation(tmp_path):
    log = tmp_path / "t.log"
    text = tl.marker_line(INV + "ff", REL, 1, T) + "\n" + steps(0, 2) + start()[:-10]
    write(log, text)
    with open(str(log), "rb") as f:
        offset, aligned = lf.scan_for_start(f, len(text), INV)
    assert offset is None and aligned == text.index(start()[:-10])


@pytest.mark.parametrize("seed", range(30))
def test_scan_across_block_boundaries_agrees_with_a_forward_read(tmp_path, seed):
    rnd = random.Random(seed)
    parts = []
    for _round in range(rnd.randint(1, 12)):
        kind = rnd.random()
        if kind < 0.2:
            parts.append(start(rnd.choice([INV, OLD, NEXT])))
        elif kind < 0.3:
            parts.append(cont(rnd.choice(["rotated", "truncated"]), rnd.choice([INV, OLD])))
        else:
            parts.append(steps(0, rnd.randint(0, 4)))
    text = "".join(parts)
    log = tmp_path / "t.log"
    write(log, text)
    # the forward definition: our last start marker, else our first continuation marker
    offsets, pos = [], 0
    for line in text.splitlines(True):
        m = tl.parse_marker(line)
        if m and m["invocation"] == INV:
            offsets.append((pos, tl.is_continuation(m)))
        pos += len(line)
    starts = [o for o, c in offsets if not c]
    expected = starts[-1] if starts else (offsets[0][0] if offsets else None)
    with open(str(log), "rb") as f:
        for block in (7, 64, 1 << 20):
            assert lf.scan_for_start(f, len(text), INV, block=block)[0] == expected, block


def test_tail_read_reads_the_marker_and_the_end_only(tmp_path):
    log = tmp_path / "t.log"
    noise = "".join("warning %d: something long enough to take space in the log\n" % i for i in range(100000))
    write(log, start() + noise + steps(1, 3), sidecar_offset=0)
    f, where = lf.read_start(str(log), INV, follower, tail_bytes=64 * 1024)
    assert where.bytes_read < 80 * 1024
    assert f.marker["release"] == REL and f.analysis.last_step == 2 and f.analysis.tok_s == 2.0


def test_tail_read_widens_until_it_finds_a_progress_line(tmp_path):
    log = tmp_path / "t.log"
    noise = "".join("warning %d: something long enough to take space in the log\n" % i for i in range(20000))
    write(log, start() + steps(1, 8) + noise, sidecar_offset=0)
    f, where = lf.read_start(str(log), INV, follower, tail_bytes=4096)
    assert f.analysis.last_step == 7 and f.analysis.progress_line == "step=7 tok/s=7.0"


def test_reader_seeks_to_the_sidecar_then_follows_appends(tmp_path):
    log = tmp_path / "t.log"
    before = start(OLD) + steps(0, 1000)
    write(log, before + start() + steps(1, 2), sidecar_offset=len(before))
    f = follower()
    r = lf.LogFileReader(str(log), f)
    r.poll(now=0)
    assert r.location.source == "sidecar" and r.offset == log.stat().st_size
    with open(str(log), "a") as fh:
        fh.write(steps(2, 4))
    r.poll(now=1)
    assert f.analysis.steps == [1, 2, 3] and r.problem(1, 0) is None


def test_reader_follows_a_rotation_without_resetting_this_start(tmp_path):
    log = tmp_path / "t.log"
    write(log, start() + steps(1, 3), sidecar_offset=0)
    f = follower()
    r = lf.LogFileReader(str(log), f)
    r.poll(now=0)
    os.rename(str(log), str(log) + ".1")
    write(log, cont("rotated") + steps(3, 5), sidecar_offset=0)
    r.poll(now=1)
    assert f.analysis.steps == [1, 2, 3, 4] and "continued" not in f.marker
    assert r.problem(100, 5) is None


def test_reader_says_the_log_was_replaced_after_the_grace_and_not_before(tmp_path):
    log = tmp_path / "t.log"
    write(log, "", sidecar_offset=None)
    f = follower()
    r = lf.LogFileReader(str(log), f)
    r.poll(now=0)                       # the marker is not written yet: nothing to say
    assert r.problem(100, 5) is None
    write(log, start(OLD) + steps(0, 200))
    r.poll(now=1)
    os.unlink(str(log))
    write(log, "the user's script rewrote it\n")
    r.poll(now=2)                       # a new file, no marker of ours
    assert r.problem(6.9, 5) is None
    assert r.problem(7, 5).startswith("log was truncated or replaced since this start")
    with open(str(log), "a") as fh:     # the launcher's continuation marker arrives: all is well
        fh.write(cont("reopened") + steps(1, 2))
    r.poll(now=8)
    assert r.problem(100, 5) is None and f.analysis.steps == [1]


def test_reader_first_poll_with_a_sidecar_of_this_start_but_no_marker(tmp_path):
    log = tmp_path / "t.log"
    write(log, "rewritten\n", sidecar_offset=0)
    r = lf.LogFileReader(str(log), follower())
    r.poll(now=0)
    assert r.problem(4, 5) is None and r.problem(5, 5).startswith("log was truncated or replaced")


def test_reader_in_this_start_keeps_counting_after_a_truncation(tmp_path):
    log = tmp_path / "t.log"
    write(log, start() + steps(1, 3))
    f = follower()
    r = lf.LogFileReader(str(log), f)
    r.poll(now=0)
    write(log, steps(3, 4))             # copytruncate: no marker, still our start
    r.poll(now=1)
    assert f.analysis.steps == [1, 2, 3] and r.problem(100, 5) is None
