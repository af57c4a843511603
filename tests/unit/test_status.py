"""trainer_status's decisions and data shaping (module_utils/plan/status.py), and trainer_plan's own
(module_utils/plan/first_read.py: what the run may write, the lock): pure functions of the facts the module
gathers, driven here with plain data, fake /proc trees and a fake clock."""
import os

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.plan.decide import make_plan

from ansible_collections.dflash.trainer.plugins.module_utils.plan import first_read as b
from ansible_collections.dflash.trainer.plugins.module_utils.job import state as js
from ansible_collections.dflash.trainer.plugins.module_utils.release import root as rr
from ansible_collections.dflash.trainer.plugins.module_utils.plan import status as s
from ansible_collections.dflash.trainer.plugins.module_utils.job.lock import Outcome
from ansible_collections.dflash.trainer.plugins.module_utils.proof.log_tail import LogChunk
from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import entry
from ansible_collections.dflash.trainer.plugins.module_utils.proof.log_file import StartLocation
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import StartLog, marker_line
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import DONE, WAITING

RUNNING = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "MainPID": "4242",
           "InvocationID": "inv", "NRestarts": "2", "Result": "success", "FragmentPath": "/etc/systemd/system/t.service",
           "Description": "T, managed by dflash.trainer", "ExecMainStartTimestamp": "Mon 2026-11-30 04:05:06 UTC"}
STOPPED = {"LoadState": "loaded", "ActiveState": "failed", "SubState": "failed", "MainPID": "0", "InvocationID": "",
           "NRestarts": "0", "Result": "exit-code", "ExecMainCode": "1", "ExecMainStatus": "3"}


class Clock(object):
    def __init__(self):
        self.t, self.slept = 0.0, []

    def __call__(self):
        return self.t

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.t += seconds


# ---- the request --------------------------------------------------------------------------------

@pytest.mark.parametrize("lines, offset, wanted", [
    (0, None, False),
    (5, None, True),
    (0, 0, True),      # following from byte 0 is a request too
    (-1, 10, True),
    (-1, None, False),
])
def test_wants_log(lines, offset, wanted):
    assert s.wants_log({"log_lines": lines, "log_offset": offset}) is wanted


# ---- O(owned) -----------------------------------------------------------------------------------

def absent(path, _kind):
    return {"path": path, "real": path, "exists": False}


def foreign(path, _kind):
    return {"path": path, "real": path, "exists": True, "type": "file", "size": 6, "head": "hello\n"}


@pytest.mark.parametrize("owned, expected", [
    ([], []),
    (None, []),
    ([{"variable": "trainer_log_path", "kind": "log", "path": "/var/log/t/t.log"}], []),
    ([{"variable": "v", "kind": "nope", "path": "/var/log/t.log"}],
     ["v: the role passed an unknown kind 'nope' or a relative path"]),
    ([{"variable": "v", "kind": "log", "path": "rel/t.log"}],
     ["v: the role passed an unknown kind 'log' or a relative path"]),
    ([{"variable": "v", "kind": "log", "path": None}],
     ["v: the role passed an unknown kind 'log' or a relative path"]),
    ([{"variable": "a", "kind": "log", "path": "/var/log/t/t.log"},
      {"variable": "b", "kind": "env", "path": "/var/log/t/t.log"}],
     ["b: /var/log/t/t.log resolves to /var/log/t/t.log, the same file as a"]),
])
def test_ownership_problems_of_absent_paths(owned, expected):
    assert b.ownership_problems(owned, look=absent) == expected


def test_ownership_problems_looks_at_each_path_and_stops_at_a_bad_item():
    seen = []

    def look(path, kind):
        seen.append((path, kind))
        return foreign(path, kind)

    path = "/etc/dflash-trainer/env"
    got = b.ownership_problems([{"variable": "trainer_env_file", "kind": "env", "path": path}], look=look)
    assert seen == [(path, "env")]
    assert len(got) == 1 and got[0].startswith("trainer_env_file: %s exists and was not written by dflash.trainer" % path)
    seen.clear()
    got = b.ownership_problems([{"variable": "x", "kind": "bogus", "path": "/a"},
                                {"variable": "y", "kind": "env", "path": "/b"}], look=look)
    assert got == ["x: the role passed an unknown kind 'bogus' or a relative path"] and seen == []


@pytest.mark.parametrize("refused, expected", [
    (["a: why"], "refused before any change on the target (1 problem):\n"
                 "- a: why; accepted: a path that is absent or holds what dflash.trainer wrote there"),
    (["a: one", "b: two"], "refused before any change on the target (2 problems):\n"
                           "- a: one; accepted: a path that is absent or holds what dflash.trainer wrote there\n"
                           "- b: two; accepted: a path that is absent or holds what dflash.trainer wrote there"),
])
def test_refusal_message(refused, expected):
    assert b.refusal_message(refused) == expected


# ---- the lock and the restart job ---------------------------------------------------------------

JOB = {"job_id": "j1", "phase": "proving", "pid": 7, "owner": "alice", "started_at": "t"}


@pytest.mark.parametrize("out, state, alive, attached", [
    (Outcome("refuse", False, "held", {"owner": "alice", "job": "j1"}), JOB, True, True),
    (Outcome("refuse", False, "held", {"owner": "alice", "job": "j1"}), JOB, False, False),   # the job died
    (Outcome("refuse", False, "held", {"owner": "alice", "job": "j0"}), JOB, True, False),    # another job
    (Outcome("refuse", False, "held", {"owner": "alice"}), JOB, True, False),                 # a play holds it
    (Outcome("refuse", False, "held", None), JOB, True, False),
    (Outcome("refuse", False, "held", {"owner": "alice", "job": "j1"}), None, True, False),   # no state on record
    (Outcome("error", False, "broken", {"owner": "alice", "job": "j1"}), JOB, True, False),   # not a refusal
    (Outcome("take", True, "taken", {"owner": "me", "job": "j1"}), JOB, True, False),
])
def test_lock_holder_job(out, state, alive, attached):
    asked = []

    def is_alive(st):
        asked.append(st)
        return alive
    got = b.lock_holder_job(out, state, is_alive)
    assert got == (state if attached else None)
    assert asked in ([], [state])


@pytest.mark.parametrize("out, expected", [
    (Outcome("refuse", False, "held by bob", {"owner": "bob"}),
     {"msg": "held by bob", "action": "refuse", "lock_refused": True, "owner": "bob"}),
    (Outcome("refuse", False, "held", None),
     {"msg": "held", "action": "refuse", "lock_refused": True, "owner": "unknown"}),
    (Outcome("error", False, "cannot create", {"owner": "bob"}),
     {"msg": "cannot create", "action": "error", "lock_refused": True}),
])
def test_lock_refusal(out, expected):
    assert b.lock_refusal(out) == expected


@pytest.mark.parametrize("out, attached, expected", [
    (Outcome("take", True, "taken"), None, {"action": "take", "msg": "taken"}),
    (Outcome("keep", True, "kept"), "", {"action": "keep", "msg": "kept"}),
    (Outcome("take", True, "taken"), "waited for x", {"action": "take", "msg": "taken", "attached": "waited for x"}),
    (Outcome("stale", True, "taken over", {"owner": "bob"}), None,
     {"action": "stale", "msg": "taken over", "previous_owner": "bob"}),
])
def test_lock_taken(out, attached, expected):
    assert b.lock_taken(out, attached) == expected


@pytest.mark.parametrize("observed, state", [
    (({"job_id": "j1", "phase": "proving"}, True), WAITING),
    (({"job_id": "j1", "phase": "proving"}, False), DONE),      # died
    (({"job_id": "j1", "done": True}, True), DONE),
    (({"job_id": "j2"}, True), DONE),                           # another job on record
    (({}, False), DONE),
])
def test_job_over(observed, state):
    verdict = b.job_over("j1")(observed, 3.0)
    assert verdict.state == state
    if state == DONE:
        assert verdict.value is observed[0]
    else:
        assert verdict.words == "restart job j1 to end"


@pytest.mark.parametrize("state, alive, job_id, end", [
    ({"job_id": "j1", "phase": "proving"}, True, "j1", None),
    ({"job_id": "j1", "phase": "proving"}, False, "j1", js.DIED),
    ({"job_id": "j1", "done": True}, True, "j1", js.ENDED),
    ({"job_id": "j2"}, True, "j1", js.NOT_ON_RECORD),
    ({}, False, "j1", js.NOT_ON_RECORD),
    ({"job_id": "j1"}, True, None, js.NOT_ON_RECORD),             # an id None is an id: not j1's
])
def test_job_end_is_the_one_judge_of_a_job_that_ended(state, alive, job_id, end):
    assert js.job_end(state, alive, job_id) == end


def test_job_end_without_an_id_judges_the_job_on_record():
    assert js.job_end({"job_id": "j1", "done": True}, False) == js.ENDED
    assert js.job_end({"job_id": "j1"}, False) == js.DIED
    assert js.job_end({"job_id": "j1"}, True) is None
    assert js.job_end(None, False) == js.NOT_ON_RECORD


def test_job_summary():
    assert s.job_summary(None, False) is None
    got = s.job_summary(dict(JOB, phase="done", done=True, result={"ok": True, "msg": "proved"}), False)
    assert {k: v for k, v in got.items() if k != "words"} == {
        "job_id": "j1", "phase": "done", "done": True, "alive": False, "ok": True}
    assert got["words"].startswith("restart job j1 (alice, started t)")
    got = s.job_summary({"job_id": "j2", "phase": "stopping"}, True)
    assert (got["done"], got["alive"], got["ok"]) == (False, True, None)


# ---- the unit -----------------------------------------------------------------------------------

def test_unit_fields_of_a_running_unit():
    got = s.unit_fields(RUNNING, 3600.12345, "r1")
    assert got == {
        "changed": False, "load_state": "loaded", "fragment_path": "/etc/systemd/system/t.service",
        "description": "T, managed by dflash.trainer", "active_state": "active", "sub_state": "running",
        "running": True, "main_pid": 4242, "invocation_id": "inv", "n_restarts": 2, "result": "success",
        "started_at": "Mon 2026-11-30 04:05:06 UTC", "seconds_since_start": 3600.123, "exit": None,
        "running_release": "r1", "running_release_source": "environ", "drift": False, "gpus_mib": None, "gpus": None}


@pytest.mark.parametrize("props, seconds, release, expect", [
    (RUNNING, None, None, {"seconds_since_start": None, "running_release": None, "running_release_source": None}),
    (RUNNING, 0.0, "", {"seconds_since_start": 0.0, "running_release": None, "running_release_source": None}),
    ({}, None, None, {"load_state": "", "running": False, "main_pid": 0, "invocation_id": "", "n_restarts": 0}),
    (STOPPED, 12.5, None, {"running": False, "main_pid": 0, "seconds_since_start": 12.5}),
])
def test_unit_fields_table(props, seconds, release, expect):
    got = s.unit_fields(props, seconds, release)
    assert {k: got[k] for k in expect} == expect


def test_unit_fields_says_how_a_stopped_unit_ended():
    got = s.unit_fields(STOPPED, None)
    assert got["exit"] and "3" in got["exit"]
    assert s.unit_fields(RUNNING, None)["exit"] is None


@pytest.mark.parametrize("props, state", [
    ({"ActiveState": "active", "SubState": "running", "InvocationID": "a"}, WAITING),
    ({"ActiveState": "active", "SubState": "running", "InvocationID": "b"}, DONE),   # systemd started another
    ({"ActiveState": "activating", "SubState": "auto-restart", "InvocationID": "a"}, DONE),
    ({"ActiveState": "inactive", "SubState": "dead", "InvocationID": "a"}, DONE),
])
def test_start_ended(props, state):
    assert s.start_ended("a")((True, props), 0).state == state
    assert s.start_ended("a")((False, props), 0).state == DONE   # the unit cannot be read: stop watching


def test_watch_follows_the_unit_until_this_start_ends():
    clock = Clock()
    reads = iter([(0, "ActiveState=active\nSubState=running\nInvocationID=a\n", ""),
                  (0, "ActiveState=active\nSubState=running\nInvocationID=b\n", "")])
    first = {"ActiveState": "active", "SubState": "running", "InvocationID": "a"}
    props, seconds = s.watch(lambda: next(reads), first, 30, clock=clock, sleep=clock.sleep)
    assert props["InvocationID"] == "b" and seconds == 2.0 and clock.slept == [1.0, 1.0]


# ---- the running release ------------------------------------------------------------------------

@pytest.mark.parametrize("blob, value", [
    (b"A=1\0DFLASH_RELEASE=r1\0B=2\0", "r1"),
    (b"DFLASH_RELEASE=\0", ""),
    (b"XDFLASH_RELEASE=r1\0", None),
    (b"DFLASH_RELEASE_X=r1\0", None),
    (b"DFLASH_RELEASE=a=b\0", "a=b"),
    (b"DFLASH_RELEASE=\xff\0", "\ufffd"),
    (b"", None),
])
def test_environ_value(blob, value):
    assert s.environ_value(blob, "DFLASH_RELEASE") == value


def fake_proc(root, tree):
    """``tree``: {pid: (environ bytes or None, [children] or None)} as a /proc under ``root``."""
    for pid, (environ, children) in tree.items():
        d = root / str(pid)
        (d / "task" / str(pid)).mkdir(parents=True)
        if environ is not None:
            (d / "environ").write_bytes(environ)
        if children is not None:
            (d / "task" / str(pid) / "children").write_text(" ".join(str(c) for c in children) + " ")
    return str(root)


@pytest.mark.parametrize("tree, depth, release", [
    ({1: (b"DFLASH_RELEASE=r1\0", [2])}, 3, "r1"),
    ({1: (b"PATH=/bin\0", [2]), 2: (b"DFLASH_RELEASE=r2\0", [])}, 3, "r2"),         # the launcher's child
    ({1: (None, [2, 3]), 2: (b"", [4]), 3: (b"DFLASH_RELEASE=r3\0", []),
      4: (b"DFLASH_RELEASE=r4\0", [])}, 3, "r3"),                                   # breadth first
    ({1: (None, [2, 3]), 2: (b"DFLASH_RELEASE=r2\0", []), 3: (b"", [4]),
      4: (b"DFLASH_RELEASE=deep\0", [])}, 3, "r2"),                                # a child before a grandchild
    ({1: (b"", [2]), 2: (b"", [3]), 3: (b"DFLASH_RELEASE=deep\0", [])}, 1, None),   # below the depth
    ({1: (b"", [2]), 2: (b"", [3]), 3: (b"DFLASH_RELEASE=deep\0", [])}, 2, "deep"),
    ({1: (b"DFLASH_RELEASE=\0", [2]), 2: (b"DFLASH_RELEASE=r2\0", None)}, 3, "r2"),  # empty is no answer
    ({1: (b"", None)}, 3, None),
    ({}, 3, None),                                                                   # the process is gone
])
def test_release_from_proc(tmp_path, tree, depth, release):
    assert s.release_from_proc(1, depth=depth, proc=fake_proc(tmp_path, tree)) == release


def test_release_from_proc_ignores_garbage_children(tmp_path):
    proc = fake_proc(tmp_path, {1: (b"", None)})
    (tmp_path / "1" / "task" / "1" / "children").write_text("2 x\n")
    assert s.release_from_proc(1, proc=proc) is None


# ---- the log ------------------------------------------------------------------------------------

def follower(text, invocation="inv"):
    f = StartLog(invocation, keep_lines=50)
    f.feed(text)
    f.finish()
    return f


LOG = marker_line("inv", "r1", 1, "t") + "\nstep=3 loss=1.9 tok/s=100.5\nnoise\n"


@pytest.mark.parametrize("text, problem, running, running_release, expect", [
    (LOG, None, True, None,
     {"log_release": "r1", "last_progress_line": "step=3 loss=1.9 tok/s=100.5", "tok_s": 100.5, "step": 3,
      "running_release": "r1", "running_release_source": "log marker"}),
    (LOG, None, True, "r0",   # the environment told it: the marker does not override
     {"log_release": "r1", "last_progress_line": "step=3 loss=1.9 tok/s=100.5", "tok_s": 100.5, "step": 3}),
    (LOG, None, False, None,  # not running: no running release
     {"log_release": "r1", "last_progress_line": "step=3 loss=1.9 tok/s=100.5", "tok_s": 100.5, "step": 3}),
    ("step=1\n", "log was truncated or replaced since this start", True, None,
     {"log_release": None, "last_progress_line": None, "tok_s": None, "step": None,
      "log_problem": "log was truncated or replaced since this start"}),
])
def test_log_fields(text, problem, running, running_release, expect):
    where = StartLocation(0, "sidecar", len(text), 1, problem=problem)
    assert s.log_fields(follower(text), where, running, running_release) == expect


def test_log_fields_of_a_log_not_read():
    assert s.log_fields(None, None, True, None) == {"log_release": None, "last_progress_line": None,
                                                    "tok_s": None, "step": None}


def test_read_log_reads_this_start(tmp_path):
    path = tmp_path / "t.log"
    path.write_text(marker_line("old", "r0", 1, "t") + "\nstep=9 tok/s=5\n" + LOG)
    f, where = s.read_log(str(path), "inv")
    assert f.marker["release"] == "r1" and f.analysis.last_step == 3 and where.problem is None


@pytest.mark.parametrize("chunk, state", [
    (LogChunk("inv", lines=["a"]), DONE),
    (LogChunk("inv", ended=True), DONE),
    (LogChunk("inv"), WAITING),
])
def test_log_arrived(chunk, state):
    assert s.log_arrived(chunk, 0).state == state


def test_read_log_chunk_without_a_start_says_so(tmp_path):
    p = dict(log_path=str(tmp_path / "t.log"), log_invocation=None, log_lines=5, log_offset=None, log_inode=None,
             log_wait_s=0)
    got = s.read_log_chunk(p, "")
    assert got["problem"] == "no start of the trainer recorded in %s" % p["log_path"] and got["lines"] == []


def test_read_log_chunk_returns_the_last_lines_without_waiting(tmp_path):
    path = tmp_path / "t.log"
    path.write_text(LOG)
    clock = Clock()
    p = dict(log_path=str(path), log_invocation=None, log_lines=1, log_offset=None, log_inode=None, log_wait_s=5)
    got = s.read_log_chunk(p, "inv", clock=clock, sleep=clock.sleep)
    assert got["lines"] == ["noise"] and got["release"] == "r1" and clock.slept == []   # log_wait_s: only when following


# ---- the release root ---------------------------------------------------------------------------

@pytest.mark.parametrize("link, last_good, running, expect", [
    ("/opt/t/releases/r1", "r0\n", "r1", {"current_release": "r1", "last_good": "r0", "drift": False}),
    ("releases/r2/", "r0", "r1", {"current_release": "r2", "last_good": "r0", "drift": True}),
    ("/opt/t/releases/r2", "  \n", None, {"current_release": "r2", "last_good": None, "drift": False}),
    (None, None, "r1", {"current_release": None, "last_good": None, "drift": False}),
    ("/opt/t/releases/r2", None, "", {"current_release": "r2", "last_good": None, "drift": False}),
])
def test_release_fields(link, last_good, running, expect):
    assert s.release_fields(link, last_good, running) == expect


def test_read_release_marks(tmp_path):
    assert rr.read_release_marks(str(tmp_path)) == (None, None)
    (tmp_path / "releases" / "r1").mkdir(parents=True)
    os.symlink("releases/r1", str(tmp_path / "current"))
    (tmp_path / "last_good").write_text("r0\n")
    assert rr.read_release_marks(str(tmp_path)) == ("releases/r1", "r0\n")
    (tmp_path / "other").mkdir()
    os.unlink(str(tmp_path / "current"))
    (tmp_path / "current").mkdir()                 # not a symlink: no current release
    (tmp_path / "last_good").unlink()
    (tmp_path / "last_good").mkdir()               # not a file: no last_good
    assert rr.read_release_marks(str(tmp_path)) == (None, None)


NOW = 1_000_000.0


def status(**kw):
    out = {"running": True, "n_restarts": 0, "active_state": "active", "sub_state": "running",
           "running_release": "r1", "log_release": None, "current_release": None}
    out.update(kw)
    return out


@pytest.mark.parametrize("st, seconds, release, ok, words", [
    (status(), 600.0, "r1", True, "running release r1, proved 2 min ago (unit restarts: 0)"),
    (status(running_release=None, log_release="r1", current_release="r2"), 600.0, "r1", True, None),
    (status(running_release=None, current_release="r2"), 600.0, "r2", False,
     "running release r2 has no proof on record (unit restarts: 0)"),
    (status(), 10.0, "r1", False, None),   # started after the proof: systemd brought it back
    (status(), None, "r1", True, None),    # runtime unknown: the start is not held against it
    (status(running=False, active_state="failed", sub_state="failed", n_restarts=3), None, "r1", False,
     "not running (failed/failed) (unit restarts: 3), last release r1"),
])
def test_status_health(st, seconds, release, ok, words):
    ledger = [entry("r1", "proved", now=NOW - 120)]
    got = s.status_health(ledger, st, seconds, NOW)
    assert got["release"] == release and got["ok"] is ok
    if words:
        assert got["words"] == words
    if release == "r1":
        assert got["seconds_since_proof"] == 120.0


def test_status_health_says_a_later_start_was_not_proved():
    got = s.status_health([entry("r1", "proved", now=NOW - 120)], status(), 10.0, NOW)
    assert got["words"].startswith("restarted 1") and got["words"].endswith("after its proof, not proved since"
                                                                            " (unit restarts: 0)")


# ---- the GPUs -----------------------------------------------------------------------------------

def test_gpu_fields():
    gpus = [{"index": 0, "name": "H200", "memory_used_mib": 30000, "memory_total_mib": 143771, "uuid": "GPU-0",
             "processes": [{"pid": 1}]},
            {"index": 1, "name": "H200", "memory_used_mib": None, "memory_total_mib": 143771}]
    assert s.gpu_fields(gpus) == {
        "gpus_mib": {0: 30000, 1: None},
        "gpus": [{"index": 0, "uuid": "GPU-0", "name": "H200", "memory_used_mib": 30000, "memory_total_mib": 143771},
                 {"index": 1, "uuid": None, "name": "H200", "memory_used_mib": None, "memory_total_mib": 143771}]}
    assert s.gpu_fields([]) == {"gpus_mib": {}, "gpus": []}


# --- the first read's plan (plan.decide.make_plan): a deploy that changes nothing is a no-op ------------------

def _proved(**kw):
    status = dict(running=True, running_release="r1", current_release="r1", last_good="r1",
                  health=dict(ok=True, words="proved 3 s ago"), last_job=None)
    status.update(kw)
    return status


NO_CHANGE = dict(changed=False, unit_changed=False, env_changed=False, launcher_changed=False, enabled_changed=False)


def test_a_deploy_of_the_running_proved_release_with_nothing_to_install_is_a_no_op():
    assert make_plan(dict(entry="deploy", release="r1"), _proved(), NO_CHANGE)["no_op"]


@pytest.mark.parametrize("status, release, force, install, words", [
    (_proved(), "r2", False, NO_CHANGE, "release switched to r2"),
    (_proved(), "r1", True, NO_CHANGE, "forced"),
    (_proved(), "r1", False, dict(NO_CHANGE, env_changed=True), "environment changed"),
    (_proved(running=False), "r1", False, NO_CHANGE, "trainer not running"),
    (_proved(running_release="r0"), "r1", False, NO_CHANGE, "running release r0 is not current r1"),
    (_proved(last_good="r0"), "r1", False, NO_CHANGE, "runs without a proof on record"),
    (_proved(health=dict(ok=False, words="restarted 18 s after its proof")), "r1", False, NO_CHANGE,
     "not the one proved: restarted 18 s after its proof"),
    (_proved(), "", False, NO_CHANGE, "no release id"),
    (_proved(), "r1", False, dict(NO_CHANGE, enabled_changed=True, changed=True), None),
    (_proved(), "r1", False, dict(NO_CHANGE, refused="refused before any change"), None),
])
def test_anything_that_asks_for_work_is_no_no_op(status, release, force, install, words):
    plan = make_plan(dict(entry="deploy", release=release, force=force), status, install)
    assert not plan["no_op"], plan
    if words is None:  # only the install has work: no restart
        assert plan["install"] and not plan["restart"]
    else:
        assert any(words in r for r in plan["reasons"] + [plan["refused"] or ""]), plan
