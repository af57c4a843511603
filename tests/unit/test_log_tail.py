"""proof.log_tail: the last lines of one start's log and the lines appended since an offset (logs -n, -f)."""
from __future__ import annotations

import json
import os

from ansible_collections.dflash.trainer.plugins.module_utils.proof.log_tail import default_invocation, read_log_lines
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import continuation_line, marker_line


def marker(inv, release="r1"):
    return marker_line(inv, release, 42, "2026-01-01T00:00:00Z") + "\n"


def write(path, text, mode="a"):
    with open(path, mode) as f:
        f.write(text)


def sidecar(path, inv, offset):
    st = os.stat(path)
    record = {"invocation": inv, "offset": offset, "dev": st.st_dev, "inode": st.st_ino}
    write(path + ".start", json.dumps(record), "w")


def steps(a, b):
    return "".join("step=%d tok/s=100\n" % i for i in range(a, b))


def test_last_lines_of_this_start_only(tmp_path):
    log = str(tmp_path / "trainer.log")
    write(log, marker("old") + steps(0, 50))
    at = os.path.getsize(log)
    write(log, marker("new", "r2") + steps(0, 30) + "partial line without newline")
    sidecar(log, "new", at)
    c = read_log_lines(log, "new", lines=5)
    assert c.found and c.release == "r2" and not c.ended and c.problem is None
    assert c.lines == ["step=%d tok/s=100" % i for i in range(25, 30)]
    assert c.offset == os.path.getsize(log) - len("partial line without newline")
    # fewer lines in the start than asked: all of them, never the earlier start's
    assert read_log_lines(log, "new", lines=500).lines == ["step=%d tok/s=100" % i for i in range(30)]
    # an earlier start, named: its own last lines, ended by the later start
    old = read_log_lines(log, "old", lines=3)
    assert old.lines == ["step=47 tok/s=100", "step=48 tok/s=100", "step=49 tok/s=100"] and old.ended


def test_window_at_the_end_is_all_that_is_read(tmp_path):
    log = str(tmp_path / "trainer.log")
    write(log, marker("inv") + steps(0, 5000))
    c = read_log_lines(log, "inv", lines=3, max_bytes=200)
    assert c.lines == ["step=4997 tok/s=100", "step=4998 tok/s=100", "step=4999 tok/s=100"]
    # an ended start longer than the window is read forward from its marker
    write(log, marker("later"))
    c = read_log_lines(log, "inv", lines=2, max_bytes=200)
    assert c.lines == ["step=4998 tok/s=100", "step=4999 tok/s=100"] and c.ended


def test_follow_returns_only_new_complete_lines(tmp_path):
    log = str(tmp_path / "trainer.log")
    write(log, marker("inv") + steps(0, 3))
    c = read_log_lines(log, "inv", lines=2)
    assert c.lines == ["step=1 tok/s=100", "step=2 tok/s=100"]
    c = read_log_lines(log, "inv", offset=c.offset, inode=c.inode)
    assert c.lines == [] and not c.ended
    write(log, "step=3 tok/s=100\nstep=4 to")
    c = read_log_lines(log, "inv", offset=c.offset, inode=c.inode)
    assert c.lines == ["step=3 tok/s=100"]
    write(log, "k/s=100\n")
    c = read_log_lines(log, "inv", offset=c.offset, inode=c.inode)
    assert c.lines == ["step=4 tok/s=100"]
    write(log, marker("next") + steps(0, 2))  # a new start ends this one
    c2 = read_log_lines(log, "inv", offset=c.offset, inode=c.inode)
    assert c2.lines == [] and c2.ended and c2.offset == c.offset


def test_follow_across_rotation(tmp_path):
    log = str(tmp_path / "trainer.log")
    write(log, marker("inv") + steps(0, 3))
    c = read_log_lines(log, "inv", lines=1)
    write(log, "step=3 tok/s=100\n")  # written before the launcher rotated
    os.rename(log, log + ".1")
    write(log, continuation_line("inv", "r1", 42, "t", "rotated") + "\n" + steps(4, 6))
    c = read_log_lines(log, "inv", offset=c.offset, inode=c.inode)
    assert c.lines[0] == "step=3 tok/s=100" and "continued=rotated" in c.lines[1]
    assert c.lines[2:] == ["step=4 tok/s=100", "step=5 tok/s=100"]
    assert c.inode == os.stat(log).st_ino and c.offset == os.path.getsize(log)


def test_missing_log_or_start(tmp_path):
    log = str(tmp_path / "trainer.log")
    assert read_log_lines(log, "inv").problem == "no log at %s" % log
    write(log, marker("other") + steps(0, 2))
    c = read_log_lines(log, "inv")
    assert not c.found and c.lines == [] and "no start of invocation inv" in c.problem
    assert default_invocation("unit-inv", log) == "unit-inv"
    assert default_invocation("", log) is None
    sidecar(log, "other", 0)
    assert default_invocation("", log) == "other"
