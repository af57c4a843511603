# -*- coding: utf-8 -*-
"""The trainer's own progress file (trainer_progress_path): read from where it ended right before
the start (inode, size, fingerprint), read again from byte 0 when replaced, truncated or rewritten;
JSONL records per line; never written; the Judge's view joining it to the launcher's log."""

import hashlib
import json
import os
import stat

import pytest
import yaml

from ansible_collections.dflash.trainer.plugins.module_utils.proof import progress_file as pf
from ansible_collections.dflash.trainer.plugins.plugin_utils import _validate as validate
from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed, compile_regexes, prove
from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl
from ansible_collections.dflash.trainer.plugins.module_utils.proof.readiness import READY, Expectations, Judge, Snapshot

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
REGEXES = dict(ready_regex=tl.DEFAULT_READY_REGEX, step_regex=tl.DEFAULT_STEP_REGEX,
               tokps_regex=tl.DEFAULT_TOKPS_REGEX, error_regexes=tl.DEFAULT_ERROR_REGEXES)


def trusted(*_args):
    return None  # the tests' files belong to whoever runs the tests; trust_problem is tested apart


def reader(path, start=None, **kw):
    return pf.ProgressFileReader(str(path), tl.ProgressAnalysis(**dict(REGEXES, **kw)), start, trust=trusted)


def append(path, text):
    with open(str(path), "a") as fh:
        fh.write(text)


def log_lines(a, b):
    return "".join("2026-12-01 10:00:%02d INFO train: step %d loss 2.1 tok/s %d.0\n" % (i, i, 1000 + i)
                   for i in range(a, b))


def digest(path):
    with open(str(path), "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


# --- records -------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, expected", [
    ('{"step": 5, "tok_s": 1234.5}', {"step": 5, "tok_s": 1234.5}),
    ('  {"step": 0}  \n', {"step": 0}),
    ('{"loss": 2.0}', None),                    # an object without "step": an ordinary line
    ('[{"step": 1}]', None),                    # not an object
    ('{"step": 1', None),                       # not JSON
    ("{'step': 1}", None),                      # a Python dict repr (HF's logs) is not JSON
    ("step 5 tok/s 100", None),
])
def test_a_jsonl_record_is_a_json_object_with_a_step_key(line, expected):
    assert tl.json_record(line) == expected


def test_jsonl_records_give_steps_tok_s_and_the_ready_line():
    a = tl.ProgressAnalysis(**REGEXES)
    for i in range(1, 4):
        a.add(json.dumps({"step": i, "tok_s": 1000.0 + i, "loss": 2.0}))
    assert a.steps == [1, 2, 3] and a.tok_s == 1003.0 and a.tokps_values == [1001.0, 1002.0, 1003.0]
    assert a.ready_line == json.dumps({"step": 3, "tok_s": 1003.0, "loss": 2.0}) and a.records == 3
    assert a.line_count == 3 and a.problems == []


def test_a_record_without_tok_s_counts_a_step_but_is_no_throughput_line():
    a = tl.ProgressAnalysis(**REGEXES)
    a.add('{"step": 1}')
    a.add('{"step": 2, "tok_s": null}')
    assert a.steps == [1, 2] and a.ready_line is None and a.tok_s is None and a.tokps_values == []


def test_unreadable_record_values_are_problems_not_progress():
    a = tl.ProgressAnalysis(**REGEXES)
    a.add('{"step": 1.5, "tok_s": "fast"}')
    a.add('{"step": true}')
    a.add('{"step": -3}')
    assert a.steps == [] and a.tok_s is None and a.ready_line is None
    assert len(a.problems) == 4
    assert a.problems[0].startswith("step: 1.5 is not a whole number")
    assert a.problems[1].startswith('tok/s: "fast" is not a number')


def test_a_figure_written_as_text_is_read_like_the_logs():
    a = tl.ProgressAnalysis(**REGEXES)
    a.add('{"step": "7", "tok_s": "12.4K"}')
    assert a.steps == [7] and a.tok_s == 12400.0


def test_once_a_file_has_records_progress_comes_from_them_and_other_lines_are_tail_and_errors():
    a = tl.ProgressAnalysis(extra_regexes={"mfu": r"mfu=([\d.]+)"}, **REGEXES)
    a.add("step 7 tok/s 99 mfu=0.5")            # a plain line before the first record
    assert a.steps == [7] and a.tok_s == 99 and a.extra_values["mfu"] == [0.5]
    a.add('{"step": 1, "tok_s": 10, "mfu": 0.31}')
    a.add("WARNING: step 50 of the data loader, tok/s 1 (a plain line among records)")
    a.add('{"step": 2, "tok_s": 20, "mfu": 0.33}')
    assert a.steps == [1, 2] and a.tok_s == 20 and a.extra_values["mfu"] == [0.31, 0.33]
    assert a.ready_line == '{"step": 2, "tok_s": 20, "mfu": 0.33}' and a.records == 2
    assert a.tail(2) == ["WARNING: step 50 of the data loader, tok/s 1 (a plain line among records)",
                         '{"step": 2, "tok_s": 20, "mfu": 0.33}']


def test_error_patterns_are_read_in_records_too():
    a = tl.ProgressAnalysis(**REGEXES)
    a.add('{"step": 4, "error": "CUDA out of memory"}')
    assert a.errors and a.errors[0][0] == "CUDA out of memory"


# --- where this start begins ---------------------------------------------------------------------

def test_progress_start_of_a_missing_file_and_of_a_file(tmp_path):
    path = tmp_path / "train.log"
    assert pf.progress_start(str(path)) == {"exists": False}
    path.write_text(log_lines(1, 4))
    s = pf.progress_start(str(path))
    st = os.stat(str(path))
    assert (s["inode"], s["dev"], s["size"], s["regular"]) == (st.st_ino, st.st_dev, st.st_size, True)
    assert s["tail_len"] == st.st_size and s["tail_sha256"] == digest(path)


def test_the_reader_reads_this_start_only_and_what_is_appended(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(log_lines(1, 50))  # the previous run's lines: steps 1..49, tok/s lines
    r = reader(path, pf.progress_start(str(path)))
    r.poll()
    assert r.analysis.line_count == 0 and r.analysis.ready_line is None
    assert r.source == "the start offset %d" % os.path.getsize(str(path))
    append(path, log_lines(1, 3))
    r.poll()
    assert r.analysis.steps == [1, 2] and r.analysis.line_count == 2 and r.resets == 0


def test_a_partial_line_waits_for_its_newline_and_finish_takes_it(tmp_path):
    path = tmp_path / "p.jsonl"
    r = reader(path, pf.progress_start(str(path)))
    append(path, '{"step": 1, "tok')
    r.poll()
    assert r.analysis.line_count == 0
    append(path, '_s": 5}\n{"step": 2, "tok_s": 6}')
    r.poll()
    assert r.analysis.steps == [1]
    r.finish()
    assert r.analysis.steps == [1, 2] and r.analysis.tok_s == 6


def test_a_file_created_after_the_start_is_read_from_byte_0(tmp_path):
    path = tmp_path / "train.log"
    r = reader(path, pf.progress_start(str(path)))
    r.poll()
    assert r.source is None and r.analysis.line_count == 0
    path.write_text(log_lines(1, 3))
    r.poll()
    assert r.analysis.steps == [1, 2] and r.source == "byte 0 (there was no such file before the start)"


def test_a_file_replaced_before_the_first_read_is_read_from_byte_0(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(log_lines(1, 50))
    start = pf.progress_start(str(path))
    new = tmp_path / "train.log.new"
    new.write_text(log_lines(1, 60))  # bigger than the old file: size alone would not tell
    os.replace(str(new), str(path))
    r = reader(path, start)
    r.poll()
    assert r.source == "byte 0 (the file was replaced since the start)" and r.analysis.steps == list(range(1, 60))


def test_a_file_truncated_below_the_offset_is_read_from_byte_0(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(log_lines(1, 50))
    start = pf.progress_start(str(path))
    with open(str(path), "w") as fh:  # the trainer opens its log with mode "w"
        fh.write(log_lines(1, 3))
    r = reader(path, start)
    r.poll()
    assert r.source == "byte 0 (the file was truncated since the start)" and r.analysis.steps == [1, 2]


def test_a_file_truncated_and_written_past_the_offset_is_read_from_byte_0(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(log_lines(1, 5))
    start = pf.progress_start(str(path))
    with open(str(path), "w") as fh:  # same inode, larger than before: only the fingerprint tells
        fh.write(log_lines(1, 20).replace("loss 2.1", "loss 3.3"))
    r = reader(path, start)
    r.poll()
    assert r.source == "byte 0 (the file was rewritten since the start)" and r.analysis.steps == list(range(1, 20))


def test_a_truncation_between_polls_goes_on_from_byte_0_in_the_same_analysis(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("old line\n")
    r = reader(path, pf.progress_start(str(path)))
    append(path, log_lines(1, 10))
    r.poll()
    assert r.analysis.steps == list(range(1, 10))
    with open(str(path), "w") as fh:  # truncated, then more than before: offset alone would miss it
        fh.write(log_lines(10, 30))
    r.poll()
    assert r.resets == 1 and r.analysis.steps == list(range(1, 30))


def test_the_trainers_own_rotation_is_read_to_its_end_then_the_new_file_from_0(tmp_path):
    path = tmp_path / "train.log"
    r = reader(path, pf.progress_start(str(path)))
    path.write_text(log_lines(1, 4))
    r.poll()
    append(path, log_lines(4, 6))        # written after our last poll, before the rotation
    os.rename(str(path), str(path) + ".1")  # RotatingFileHandler: rename, then a new file
    path.write_text(log_lines(6, 8))
    r.poll()
    assert r.analysis.steps == list(range(1, 8)) and r.resets == 1


def test_a_closed_reader_goes_on_where_it_ended(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(log_lines(1, 3))
    r = reader(path)
    r.poll().close()
    append(path, log_lines(3, 5))
    r.poll()
    assert r.analysis.steps == [1, 2, 3, 4] and r.resets == 0
    r.close()
    os.unlink(str(path))
    path.write_text(log_lines(5, 6))     # another file while it was closed: read from byte 0
    r.poll()
    assert r.analysis.steps == [1, 2, 3, 4, 5] and r.resets == 1


def test_reading_never_changes_the_file(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(log_lines(1, 30))
    before = (digest(path), os.stat(str(path)).st_mtime_ns, os.stat(str(path)).st_size)
    r = reader(path, pf.progress_start(str(path)))
    for _poll in range(3):
        r.poll()
    r.finish()
    assert (digest(path), os.stat(str(path)).st_mtime_ns, os.stat(str(path)).st_size) == before


def test_a_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(str(path))
    assert pf.progress_start(str(path)) == {"exists": True, "regular": False}
    r = pf.ProgressFileReader(str(path), tl.ProgressAnalysis(**REGEXES), None)
    r.poll()
    assert r.problem == "the progress file %s is not a regular file" % path


# --- whose file it is ----------------------------------------------------------------------------

def st(uid=0, mode=0o644, kind=stat.S_IFREG):
    return os.stat_result((kind | mode, 1, 1, 1, uid, 0, 10, 0, 0, 0))


def test_only_a_file_only_root_can_write_in_a_directory_only_root_can_write_proves_progress():
    root_dir = st(mode=0o755, kind=stat.S_IFDIR)
    assert pf.trust_problem("/w/train.log", st(), root_dir) is None
    assert "owned by uid 1000" in pf.trust_problem("/w/train.log", st(uid=1000), root_dir)
    assert "mode 0664" in pf.trust_problem("/w/train.log", st(mode=0o664), root_dir)
    assert "mode 0666" in pf.trust_problem("/w/train.log", st(mode=0o666), root_dir)
    tmp = st(mode=0o1777, kind=stat.S_IFDIR)
    assert "could be swapped" in pf.trust_problem("/tmp/train.log", st(), tmp)
    assert "uid 1000" in pf.trust_problem("/home/u/train.log", st(), st(uid=1000, mode=0o755, kind=stat.S_IFDIR))


def test_a_file_refused_by_trust_is_not_read(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(log_lines(1, 3))
    r = pf.ProgressFileReader(str(path), tl.ProgressAnalysis(**REGEXES), None,
                              trust=lambda p, _st, _parent: "the progress file %s is owned by uid 1000" % p)
    r.poll()
    assert r.analysis.line_count == 0 and r.problem.endswith("owned by uid 1000")


# --- the Judge's view ----------------------------------------------------------------------------

def follower(text):
    f = tl.StartLog(INV, **REGEXES)
    f.feed(text)
    return f


def test_the_view_takes_the_marker_from_the_launchers_log_and_progress_from_the_file():
    f = follower("Traceback (most recent call last):\n" + tl.marker_line(INV, "r1", 42, "t") + "\nstarting\n")
    a = tl.ProgressAnalysis(**REGEXES).extend(["step 1 tok/s 10", "step 2 tok/s 11"])
    view = pf.ProgressView(f, a)
    assert view.marker["release"] == "r1" and view.steps == [1, 2] and view.tok_s == 11
    assert view.ready_line == "step 2 tok/s 11" and view.line_count == 2
    assert view.errors == [] and view.tail(5) == ["starting"]  # the stale Traceback was an earlier start's


def test_the_view_reads_errors_from_both_and_prefers_a_reason_line():
    f = follower(tl.marker_line(INV, "r1", 42, "t") + "\nonly line on stdout\n")
    a = tl.ProgressAnalysis(**REGEXES).extend([
        "step 1 tok/s 10", "Traceback (most recent call last):", '  File "train.py", line 3',
        "RuntimeError: NCCL timeout"])
    view = pf.ProgressView(f, a)
    assert view.first_error == "Traceback (most recent call last):"
    assert view.reason == "RuntimeError: NCCL timeout"
    f.feed("Traceback (most recent call last):\nValueError: bad batch\n")
    assert view.reason == "ValueError: bad batch" and len(view.errors) == 2


def test_the_judge_proves_a_trainer_from_its_progress_file():
    f = follower(tl.marker_line(INV, "r1", 42, "t") + "\none line on stdout\n")
    a = tl.ProgressAnalysis(**REGEXES)
    view = pf.ProgressView(f, a)
    judge = Judge(Expectations(invocation_id=INV, gpus=[0], min_mib=1024, min_steps=2, hold_s=2, stall_s=2,
                               timeout_s=30), start=0.0)
    unit = {"ActiveState": "active", "SubState": "running", "InvocationID": INV, "NRestarts": "0", "MainPID": "42"}
    verdict = None
    for t in range(0, 6):
        a.add(json.dumps({"step": t + 1, "tok_s": 100.0 + t}))
        verdict = judge.observe(Snapshot(now=float(t), unit=unit, gpus_mib={0: 30000}, log=view))
        if verdict.state == READY:
            break
    assert verdict.state == READY and verdict.details["release"] == "r1"
    assert verdict.details["tok_s"] == 100.0 + t and verdict.details["matched_line"].startswith('{"step"')


def test_without_the_marker_the_progress_file_proves_nothing():
    f = follower("no marker of ours\n")
    a = tl.ProgressAnalysis(**REGEXES).extend(['{"step": %d, "tok_s": 5}' % i for i in range(1, 9)])
    judge = Judge(Expectations(invocation_id=INV, gpus=[0], min_mib=1024, min_steps=2, hold_s=1, stall_s=1,
                               timeout_s=3), start=0.0)
    unit = {"ActiveState": "active", "SubState": "running", "InvocationID": INV, "NRestarts": "0", "MainPID": "42"}
    verdicts = [judge.observe(Snapshot(now=float(t), unit=unit, gpus_mib={0: 30000}, log=pf.ProgressView(f, a)))
                for t in range(4)]
    assert verdicts[-1].reason.startswith("not ready after 3 s")
    assert "no start marker for invocation %s" % INV in verdicts[-1].reason


# --- never a file the collection writes ----------------------------------------------------------

def params(tmp_path, **kw):
    p = dict(log_path=str(tmp_path / "trainer.log"), env_file=str(tmp_path / "etc" / "trainer.env"),
             state_path=str(tmp_path / "state.json"), lock_path=str(tmp_path / "deploy.lock"),
             root=str(tmp_path / "root"),
             install={"launcher_path": str(tmp_path / "launch"), "unit_path": str(tmp_path / "t.service"),
                      "env_path": str(tmp_path / "etc" / "trainer.env")})
    p.update(kw)
    return p


def test_the_progress_file_may_be_any_file_but_one_the_collection_writes(tmp_path):
    assert pf.collision(params(tmp_path, progress_path="")) is None
    assert pf.collision(params(tmp_path, progress_path=str(tmp_path / "own" / "train.log"))) is None
    for path, words in ((tmp_path / "trainer.log", "the trainer's log"),
                        (tmp_path / "trainer.log.start", "start-marker record"),
                        (tmp_path / "trainer.log.2", "a rotation of the trainer's log"),
                        (tmp_path / "etc" / "trainer.env", "the environment file"),
                        (tmp_path / "state.json", "the restart job's state"),
                        (tmp_path / "deploy.lock.guard", "guard"),
                        (tmp_path / "launch", "the launcher"),
                        (tmp_path / "t.service", "the unit file"),
                        (tmp_path / "root" / "ledger.json", "lies in the release root")):
        why = pf.collision(params(tmp_path, progress_path=str(path)))
        assert why and words in why, (path, why)
    assert pf.collision(params(tmp_path, progress_path=str(tmp_path / "trainer.log.old"))) is None


def test_a_symlink_to_a_file_the_collection_writes_is_refused_by_where_it_resolves(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "trainer.env").write_text("HF_TOKEN=x\n")
    (tmp_path / "own").mkdir()
    link = tmp_path / "own" / "train.log"
    os.symlink(str(tmp_path / "etc" / "trainer.env"), str(link))
    why = pf.collision(params(tmp_path, progress_path=str(link)))
    assert why.startswith("progress_path %s (it resolves to %s) is the environment file" % (
        link, tmp_path / "etc" / "trainer.env"))


# --- the proof (job.cycle.prove) of a trainer that writes its progress to its own file -------------

HEADER = "index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]"


class Clock(object):
    def __init__(self):
        self.t, self.on_sleep = 100.0, None

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s
        if self.on_sleep:
            self.on_sleep(self.t)


class OwnFileTrainer(object):
    """A trainer whose launcher log holds the marker and one line; it logs one step a second to
    its own file (plain lines, or JSONL), or a traceback there at ``error_at``."""

    def __init__(self, clock, log, own, jsonl=False, error_at=None):
        self.clock, self.own, self.jsonl, self.error_at = clock, own, jsonl, error_at
        self.t0, self.steps, self.dead = clock(), 0, False
        log.write_text(tl.marker_line(INV, "r1", 4242, "t") + "\nlogging to %s\n" % own)
        clock.on_sleep = self.advance

    def advance(self, t):
        with open(str(self.own), "a") as fh:
            if self.error_at is not None and t - self.t0 >= self.error_at and not self.dead:
                fh.write("Traceback (most recent call last):\n  File \"train.py\", line 9\n"
                         "RuntimeError: NCCL communicator was aborted\n")
                self.dead = True
            while not self.dead and t - self.t0 >= 1 + self.steps:
                self.steps += 1
                if self.jsonl:
                    fh.write(json.dumps({"step": self.steps, "tok_s": 2000.0 + self.steps}) + "\n")
                else:
                    fh.write("2026-12-01 INFO step %d loss 2.0 tok/s %.1f\n" % (self.steps, 2000.0 + self.steps))

    def __call__(self, argv):
        if "show" in argv:
            state = ("failed", "failed", 0) if self.dead else ("active", "running", 4242)
            return 0, ("ActiveState=%s\nSubState=%s\nInvocationID=%s\nNRestarts=0\nMainPID=%d\nResult=success\n"
                       "ExecMainCode=%d\nExecMainStatus=%d\n" % (state[0], state[1], INV, state[2],
                                                                 1 if self.dead else 0, 1 if self.dead else 0)), ""
        return 0, "%s\n0, GPU-a, NVIDIA H200, 30000 MiB, 143771 MiB, 0 %%\n" % HEADER, ""


def proof_expect(**kw):
    base = dict(invocation_id=INV, gpus=[0], min_mib=1024, min_steps=2, hold_s=3, stall_s=2, timeout_s=20,
                ready_regex=tl.DEFAULT_READY_REGEX)
    base.update(kw)
    return Expectations(**base)


PROOF_REGEXES = compile_regexes(tl.DEFAULT_READY_REGEX, tl.DEFAULT_STEP_REGEX, tl.DEFAULT_TOKPS_REGEX,
                                list(tl.DEFAULT_ERROR_REGEXES))


@pytest.fixture
def trusting(monkeypatch):
    monkeypatch.setattr(pf, "trust_problem", trusted)


@pytest.mark.parametrize("jsonl", [False, True])
def test_a_trainer_logging_to_its_own_file_is_proved_from_it_and_not_from_its_stale_lines(tmp_path, trusting, jsonl):
    own = tmp_path / "own.log"
    own.write_text("".join("2026-11-30 INFO step %d loss 2.0 tok/s 9999.0\n" % i for i in range(1, 200)))
    start = pf.progress_start(str(own))  # right before the start: the stale lines end here
    clock = Clock()
    run = OwnFileTrainer(clock, tmp_path / "trainer.log", own, jsonl=jsonl)
    proof = prove(run, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"), proof_expect(),
                  PROOF_REGEXES, clock=clock, sleep=clock.sleep, progress_path=str(own), progress_from=start)
    assert proof["release"] == "r1" and proof["main_pid"] == 4242
    assert 2000 < proof["tok_s"] < 2100 and proof["step"] < 20  # never the stale 9999 tok/s, step 199
    assert proof["progress_file"]["read_from"] == "the start offset %d" % start["size"]
    assert proof["progress_file"]["records"] == (proof["progress_file"]["lines"] if jsonl else 0)


def test_without_the_progress_file_the_same_trainer_is_refused_at_the_deadline(tmp_path):
    own = tmp_path / "own.log"
    clock = Clock()
    run = OwnFileTrainer(clock, tmp_path / "trainer.log", own)
    with pytest.raises(StepFailed) as err:
        prove(run, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"), proof_expect(timeout_s=5),
              PROOF_REGEXES, clock=clock, sleep=clock.sleep)
    assert err.value.msg.startswith("not ready after 5 s") and "no line matching" in err.value.msg


def test_an_error_in_the_progress_file_fails_the_proof_with_its_reason_and_tail(tmp_path, trusting):
    own = tmp_path / "own.log"
    clock = Clock()
    run = OwnFileTrainer(clock, tmp_path / "trainer.log", own, error_at=3)
    with pytest.raises(StepFailed) as err:
        prove(run, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"), proof_expect(),
              PROOF_REGEXES, clock=clock, sleep=clock.sleep, progress_path=str(own),
              progress_from=pf.progress_start(str(own)))
    msg = err.value.msg
    # the exit reason: the launcher's log has no reason line, the progress file has
    assert msg.startswith("trainer exited with status 1: RuntimeError: NCCL communicator was aborted\n")
    assert "last 2 lines of this start's log:\n    ==> dflash" not in msg  # the marker is not a line of the start
    assert "logging to %s" % own in msg  # the launcher's tail
    assert "lines of the progress file %s (read from byte 0 (there was no such file before the start))" % own in msg
    assert err.value.details["progress_tail"][-1] == "RuntimeError: NCCL communicator was aborted"


def test_a_progress_file_another_user_may_write_fails_the_proof_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(pf, "trust_problem", lambda p, _st, _d: "the progress file %s is owned by uid 1000" % p)
    own = tmp_path / "own.log"
    own.write_text("")
    clock = Clock()
    run = OwnFileTrainer(clock, tmp_path / "trainer.log", own)
    with pytest.raises(StepFailed) as err:
        prove(run, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"), proof_expect(),
              PROOF_REGEXES, clock=clock, sleep=clock.sleep, progress_path=str(own),
              progress_from=pf.progress_start(str(own)))
    assert err.value.msg.startswith("the progress file %s is owned by uid 1000" % own) and clock.t < 102


# --- refused on the controller, before any change, naming the variable ---------------------------


def progress_problems(value, **changes):
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "roles", "trainer", "defaults", "main.yml")) as fh:
        d = yaml.safe_load(fh)
    d["trainer_src"] = os.path.join(here, "..", "..", "examples", "trainer")
    d.update(changes, trainer_progress_path=value)
    return [str(p) for p in validate.check(d) if p.variable == "trainer_progress_path"]


def test_the_default_is_off_and_a_file_of_the_trainers_own_passes():
    assert progress_problems("") == []
    assert progress_problems("/workspace/own/train.log") == []
    assert progress_problems("/workspace/trainer.log.old") == []


@pytest.mark.parametrize("value, words", [
    ("/workspace/trainer.log", "is the same file as trainer_log_path"),
    ("/workspace/trainer.log.1", "is a rotation of trainer_log_path"),
    ("/workspace/trainer.log.start", "is the start-marker record of trainer_log_path"),
    ("/etc/dflash-trainer/trainer.env", "is the same file as trainer_env_file"),
    ("/usr/local/lib/dflash-trainer/launch", "is the same file as trainer_launcher_path"),
    ("/run/dflash-trainer.deploy.lock", "is the same file as trainer_lock_path"),
    ("/run/dflash-trainer.deploy.lock.guard", "is the same file as trainer_lock_path (its guard)"),
    ("/var/lib/dflash-trainer/restart.json", "is the same file as trainer_job_state_path"),
    ("/etc/systemd/system/dflash-trainer.service", "is the same file as trainer_unit_name (its unit file)"),
    ("/opt/dflash-trainer/ledger.json", "lies inside trainer_root /opt/dflash-trainer"),
    ("/opt/dflash-trainer/current/train.log", "lies inside trainer_root"),
    ("relative/train.log", "is a relative path"),
    ("/proc/self/fd/1", "lies in a kernel file system"),
])
def test_a_path_the_collection_writes_is_refused_naming_the_variable(value, words):
    got = progress_problems(value)
    assert len(got) == 1 and got[0].startswith("trainer_progress_path: " + words), got
    assert "accepted: empty (progress from trainer_log_path)" in got[0]


def test_the_metrics_file_is_refused_too():
    got = progress_problems("/var/lib/node_exporter/textfile_collector/t.prom",
                            trainer_metrics_path="/var/lib/node_exporter/textfile_collector/t.prom")
    assert got and "is the same file as trainer_metrics_path" in got[0]


def test_an_existing_progress_file_another_user_may_write_is_refused_before_anything_is_stopped(tmp_path):
    (tmp_path / "own").mkdir()
    own = tmp_path / "own" / "train.log"
    own.write_text("")

    def refuse(p, st_, _parent):
        return "the progress file %s is owned by uid %d" % (p, 1000 if st_ else 0)

    assert pf.collision(params(tmp_path, progress_path=str(own)), trust=refuse) == (
        "the progress file %s is owned by uid 1000" % own)
    assert pf.collision(params(tmp_path, progress_path=str(tmp_path / "own" / "later.log")), trust=refuse) is None
