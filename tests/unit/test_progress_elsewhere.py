# -*- coding: utf-8 -*-
"""Where the trainer writes its progress when its log shows none (proof.progress_elsewhere), and the
Judge's word on it: named while the proof waits, the verdict by FAIL_AFTER_S (not the deadline)."""
import stat
import types

from ansible_collections.dflash.trainer.plugins.module_utils.proof import progress_elsewhere as pe
from ansible_collections.dflash.trainer.plugins.module_utils.proof import readiness as rd
from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"


def test_writes_reads_the_access_mode_of_fdinfo():
    assert pe.writes("pos:\t0\nflags:\t0100001\nmnt_id:\t20\n")       # O_WRONLY|O_LARGEFILE
    assert pe.writes("pos:\t0\nflags:\t02102\n")                       # O_RDWR|O_APPEND|...
    assert not pe.writes("pos:\t0\nflags:\t0100000\n")                 # O_RDONLY
    assert not pe.writes("flags:\tzz\n") and not pe.writes("")


class FakeProc(object):
    """/proc of some processes: {pid: {fd: (target, flags)}}."""

    def __init__(self, procs):
        self.procs = procs

    def listdir(self, path):
        pid = int(path.split("/")[2])
        if pid not in self.procs:
            raise OSError(2, "gone")
        return [str(fd) for fd in self.procs[pid]]

    def readlink(self, path):
        parts = path.split("/")
        return self.procs[int(parts[2])][int(parts[4])][0]

    def read(self, path):
        parts = path.split("/")
        return "pos:\t0\nflags:\t%s\n" % self.procs[int(parts[2])][int(parts[4])][1]


PROCS = FakeProc({
    10: {0: ("/dev/null", "0100000"), 1: ("pipe:[123]", "01"), 2: ("/workspace/trainer.log", "02001"),
         3: ("/workspace/own/train.log", "0102001"), 4: ("/data/shards/0.bin", "0100000")},
    11: {5: ("/workspace/own/metrics.jsonl", "0100001"), 6: ("/tmp/x (deleted)", "01"),
         7: ("/proc/self/status", "01")},
    12: {},
})


def test_written_files_are_the_regular_paths_open_for_writing():
    got = pe.written_files({10, 11, 12, 99}, listdir=PROCS.listdir, readlink=PROCS.readlink, read=PROCS.read)
    assert got == {"/workspace/trainer.log", "/workspace/own/train.log", "/workspace/own/metrics.jsonl"}


def test_progress_line_is_the_last_line_that_reads_as_progress():
    assert pe.progress_line("loading shards\n2026 INFO step=5 loss=2.1 tok/s=40000\nsaved\n") == \
        "2026 INFO step=5 loss=2.1 tok/s=40000"
    assert pe.progress_line('{"step": 7, "tok_s": 41000.0}\n') == '{"step": 7, "tok_s": 41000.0}'
    assert pe.progress_line("loading shards 3\nwarming up\n") is None


def st(size, uid=0, mode=0o644, kind=stat.S_IFREG):
    return types.SimpleNamespace(st_size=size, st_uid=uid, st_mode=kind | mode)


def test_a_root_file_that_grows_with_progress_lines_is_found_on_the_second_look():
    sizes = {"/workspace/own/train.log": 100, "/workspace/own/metrics.jsonl": 50, "/workspace/trainer.log": 10}
    owners = {"/workspace/own/metrics.jsonl": 1000}

    def stat_path(path):
        if path in sizes:
            return st(sizes[path], uid=owners.get(path, 0))
        return st(0, mode=0o755, kind=stat.S_IFDIR)
    tails = {"/workspace/own/train.log": "x INFO train: step=3 loss=2.0 tok/s=41000\n",
             "/workspace/own/metrics.jsonl": '{"step": 3}\n', "/workspace/trainer.log": "step=1\n"}
    f = pe.Finder(exclude=["/workspace/trainer.log"])
    look = dict(listdir=PROCS.listdir, readlink=PROCS.readlink, read=PROCS.read, stat_path=stat_path,
                tail=tails.get)
    assert f.look({10, 11}, **look) is None  # the first look only notes the sizes
    for path in sizes:
        sizes[path] += 500
    # the log is the proof's own (excluded); the JSONL file belongs to uid 1000 (another user's: never named)
    assert f.look({10, 11}, **look) == ("/workspace/own/train.log", "x INFO train: step=3 loss=2.0 tok/s=41000")


def test_a_file_that_does_not_grow_or_shows_no_progress_is_not_named():
    sizes = {"/workspace/own/train.log": 100}

    def stat_path(path):
        return st(sizes[path]) if path in sizes else st(0, mode=0o755, kind=stat.S_IFDIR)
    f = pe.Finder()
    look = dict(listdir=PROCS.listdir, readlink=PROCS.readlink, read=PROCS.read, stat_path=stat_path,
                tail=lambda p: "loading checkpoint shard 3 of 8\n")
    f.look({10}, **look)
    assert f.look({10}, **look) is None  # not grown
    sizes["/workspace/own/train.log"] = 900
    assert f.look({10}, **look) is None  # grown, but loading: nothing that reads as progress


def test_cgroup_pids_reads_the_units_control_group():
    files = {"/sys/fs/cgroup/system.slice/dflash-trainer.service/cgroup.procs": "10\n11\n"}
    assert pe.cgroup_pids("/system.slice/dflash-trainer.service", read=lambda p: files.get(p, "")) == {10, 11}
    assert pe.cgroup_pids("", read=lambda p: "1\n") == set()


# -- the Judge -------------------------------------------------------------------------------------
FOUND = ("/workspace/own/train.log", "INFO train: step=3 tok/s=41000")


def snap(log, t, elsewhere=FOUND):
    unit = {"ActiveState": "active", "SubState": "running", "InvocationID": INV, "NRestarts": "0", "MainPID": "7"}
    return rd.Snapshot(now=float(t), unit=unit, gpus_mib={i: 70000 for i in range(8)}, log=log.analysis,
                       elsewhere=elsewhere)


def started(*lines):
    log = tl.StartLog(INV)
    log.feed(tl.marker_line(INV, "r1", 7, "2026-11-30T04:05:06Z") + "\n" + "".join(l + "\n" for l in lines))
    return log


def test_progress_elsewhere_is_named_while_waiting_and_fails_at_fail_after_s_with_the_setting():
    log = started("training; progress is logged to /workspace/own/train.log")
    j = rd.Judge(rd.Expectations(invocation_id=INV, timeout_s=900.0), start=0.0)
    v = j.observe(snap(log, 30))
    assert not v.done and "prove from it with:\n    -e trainer_progress_path=/workspace/own/train.log" in v.reason
    v = j.observe(snap(log, pe.FAIL_AFTER_S - 1))
    assert not v.done
    v = j.observe(snap(log, pe.FAIL_AFTER_S))
    assert v.done and v.state == rd.FAILED
    assert v.reason.startswith("no progress in this start's log after 90 s: the trainer writes its progress to "
                               "/workspace/own/train.log, not to this start's log")
    assert v.reason.endswith("-e trainer_progress_path=/workspace/own/train.log")


def test_a_log_that_shows_progress_is_judged_as_ever_and_nothing_found_waits_for_the_deadline():
    log = started("step=1 loss=2.0 tok/s=100")
    j = rd.Judge(rd.Expectations(invocation_id=INV, timeout_s=900.0, hold_s=1000.0, stall_s=1000.0), start=0.0)
    assert "trainer_progress_path" not in j.observe(snap(log, 95)).reason
    loading = started("loading model")
    j = rd.Judge(rd.Expectations(invocation_id=INV, timeout_s=120.0), start=0.0)
    assert not j.observe(snap(loading, 100, elsewhere=None)).done  # merely loading: the whole timeout
    v = rd.Judge(rd.Expectations(invocation_id=INV, timeout_s=60.0), start=0.0).observe(snap(loading, 60))
    assert v.done and v.reason.startswith("not ready after 60 s") and "trainer_progress_path=" in v.reason
