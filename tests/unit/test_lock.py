"""Deploy lock: decisions (pure), each race path against a tmp dir, 8 real processes racing,
and the module in-process."""
import errno
import fcntl
import functools
import json
import multiprocessing
import os
import time

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.dflash.trainer.plugins.module_utils.job import lock as _lock
from ansible_collections.dflash.trainer.plugins.module_utils.job.lock import (
    ERROR, KEEP, NONE, NOT_OURS, REFUSE, RELEASE, STALE, TAKE, acquire, decide, owner_record,
    parse_record, peek, read_lock, refusal_message, release)
from ansible_collections.dflash.trainer.plugins.modules import trainer_lock
from waiting import poll

NOW = 1_000_000.0
HOUR = 3600


@pytest.mark.parametrize("record,token,expected", [
    ({"token": "t1", "owner": "a", "since": NOW - 10}, "t1", KEEP),
    ({"token": "t1", "owner": "a", "since": NOW - 10}, "t2", REFUSE),
    ({"token": "t1", "owner": "a", "since": NOW - 7200}, "t2", STALE),
    (None, "t2", STALE),
    # a recent heartbeat keeps an old lock alive; an expiry ends a young one
    ({"token": "t1", "owner": "a", "since": NOW - 7200, "heartbeat": NOW - 60}, "t2", REFUSE),
    ({"token": "t1", "owner": "a", "since": NOW - 10, "expires": NOW - 1}, "t2", STALE),
    ({"token": "t1", "owner": "a", "since": NOW - 10, "expires": NOW + 60}, "t2", REFUSE),
    ({"token": "t1", "owner": "a", "since": NOW - 10, "expires": NOW - 1}, "t1", KEEP),
])
def test_decide(record, token, expected):
    assert decide(record, token, NOW, HOUR) == expected


@pytest.mark.parametrize("text", ["", "{", "[]", '{"token": "x"}', '{"since": "yesterday"}',
                                  '{"since": true}', None, "\udcff"])
def test_unreadable_records(text):
    assert parse_record(text) is None


def test_record_round_trip_liveness_fields_and_message():
    rec = parse_record(owner_record("t", "alice on laptop", NOW - 42))
    assert rec == {"token": "t", "owner": "alice on laptop", "since": NOW - 42,
                   "taken_at": "1970-01-12T13:45:58Z"}
    msg = refusal_message("/run/x.lock", rec, NOW)
    assert "alice on laptop since 42 s ago" in msg and "/run/x.lock" in msg
    rec = parse_record(owner_record("t", "o", NOW, heartbeat=NOW + 5, expires=NOW + 60))
    assert (rec["heartbeat"], rec["expires"]) == (NOW + 5, NOW + 60)
    assert "expires" not in parse_record('{"since": 1, "expires": "soon", "heartbeat": null}')


# --------------------------------------------------------------------------------------------
# against a tmp dir

@pytest.fixture
def lock(tmp_path):
    return str(tmp_path / "deploy.lock")


def plant(path, text, age_s=2 * HOUR):
    """An existing lock directory with ``text`` as its record (None: no record), ``age_s`` old."""
    os.mkdir(path)
    if text is not None:
        with open(os.path.join(path, "owner.json"), "w") as fh:
            fh.write(text)
    past = time.time() - age_s
    os.utime(path, (past, past))


def holder(path):
    return read_lock(path)[0]


def test_take_keep_refuse_release(lock):
    out = acquire(lock, "t1", "alice", HOUR)
    assert (out.action, out.ok, out.changed) == (TAKE, True, True)
    assert os.path.isdir(lock) and holder(lock)["token"] == "t1" and holder(lock)["owner"] == "alice"
    assert acquire(lock, "t1", "alice", HOUR).action == KEEP
    out = acquire(lock, "t2", "bob", HOUR)
    assert (out.action, out.ok) == (REFUSE, False) and "alice since 0 s ago" in out.msg
    out = release(lock, "t2")
    assert (out.action, out.ok) == (NOT_OURS, False) and "held by alice" in out.msg
    assert holder(lock)["token"] == "t1"  # left in place
    out = release(lock, "t1")
    assert (out.action, out.ok, out.changed) == (RELEASE, True, True) and not os.path.exists(lock)
    out = release(lock, "t1")
    assert (out.action, out.ok, out.changed) == (NONE, True, False) and "was not held" in out.msg
    assert sorted(os.listdir(os.path.dirname(lock))) == ["deploy.lock.guard"]  # no debris


def test_stale_takeover(lock):
    plant(lock, owner_record("old", "carol", time.time() - 2 * HOUR))
    out = acquire(lock, "t1", "alice", HOUR)
    assert (out.action, out.owner()) == (STALE, "carol") and holder(lock)["token"] == "t1"


@pytest.mark.parametrize("text", ["{garbage", "", None])
def test_unreadable_lock_taken_over_when_old_refused_when_young(lock, text):
    plant(lock, text, age_s=60)
    out = acquire(lock, "t1", "alice", HOUR)
    assert out.action == STALE and holder(lock)["token"] == "t1"
    release(lock, "t1")
    plant(lock, text, age_s=0)
    out = acquire(lock, "t1", "alice", HOUR)
    assert out.action == REFUSE and "a deploy that is just starting" in out.msg


def test_a_file_where_the_lock_directory_should_be(lock):
    with open(lock, "w") as fh:
        fh.write("junk")
    past = time.time() - 60
    os.utime(lock, (past, past))
    assert read_lock(lock)[2] is True
    assert acquire(lock, "t1", "alice", HOUR).action == STALE and os.path.isdir(lock)


def test_leftovers_of_a_killed_contender_are_swept(lock):
    os.mkdir(lock + ".new-1-2")
    os.mkdir(lock + ".aside-3-4")
    assert acquire(lock, "t1", "alice", HOUR).action == TAKE
    assert sorted(os.listdir(os.path.dirname(lock))) == ["deploy.lock", "deploy.lock.guard"]


def interfere_after_first_read(monkeypatch, action):
    """Run ``action`` once, right after the lock is first read (another actor, outside the guard)."""
    real = _lock.read_lock
    calls = []

    def read(path):
        result = real(path)
        if not calls:
            calls.append(path)
            action()
        return result

    monkeypatch.setattr(_lock, "read_lock", read)
    return calls


def test_lock_vanishing_between_read_and_takeover(lock, monkeypatch):
    plant(lock, owner_record("old", "carol", time.time() - 2 * HOUR))
    interfere_after_first_read(monkeypatch, lambda: _lock._remove(lock))
    out = acquire(lock, "t1", "alice", HOUR)
    assert out.action == TAKE and holder(lock)["token"] == "t1"


def test_stale_record_replaced_between_read_and_takeover(lock, monkeypatch):
    """Only a lock that still holds the stale record we read is taken over."""
    plant(lock, owner_record("old", "carol", time.time() - 2 * HOUR))

    def dave_takes_it():
        with open(os.path.join(lock, "owner.json"), "w") as fh:
            fh.write(owner_record("dave", "dave", time.time()))

    interfere_after_first_read(monkeypatch, dave_takes_it)
    out = acquire(lock, "t1", "alice", HOUR)
    assert out.action == REFUSE and "dave since 0 s ago" in out.msg
    assert holder(lock)["token"] == "dave"  # put back, intact


def test_lock_vanishing_between_read_and_release(lock, monkeypatch):
    acquire(lock, "t1", "alice", HOUR)
    interfere_after_first_read(monkeypatch, lambda: _lock._remove(lock))
    out = release(lock, "t1")
    assert (out.action, out.ok) == (NONE, True) and "removed by someone else" in out.msg


def test_lock_taken_over_between_read_and_release(lock, monkeypatch):
    acquire(lock, "t1", "alice", HOUR)

    def dave_takes_it():
        with open(os.path.join(lock, "owner.json"), "w") as fh:
            fh.write(owner_record("dave", "dave", time.time()))

    interfere_after_first_read(monkeypatch, dave_takes_it)
    out = release(lock, "t1")
    assert (out.action, out.ok) == (NOT_OURS, False) and "held by dave" in out.msg
    assert holder(lock)["token"] == "dave"


def test_unreadable_lock_is_not_released(lock):
    plant(lock, "{garbage")
    out = release(lock, "t1")
    assert (out.action, out.ok) == (NOT_OURS, False) and "unreadable owner record" in out.msg
    assert os.path.isdir(lock)


def test_release_io_error_is_reported_not_done(lock, monkeypatch):
    acquire(lock, "t1", "alice", HOUR)

    def busy(src, dst):
        raise OSError(errno.EBUSY, "Device or resource busy", src)

    monkeypatch.setattr(_lock.os, "rename", busy)
    out = release(lock, "t1")
    assert (out.action, out.ok, out.changed) == (ERROR, False, False)
    assert out.msg.startswith("Unable to release lock %s: [Errno 16] Device or resource busy" % lock)


def test_busy_guard_is_an_error_not_a_hang(lock, monkeypatch):
    monkeypatch.setattr(_lock, "GUARD_WAIT_S", 0.2)
    now, slept = [0.0], []

    def sleep(s):  # a fake clock: the wait ends at its deadline, never on the wall clock
        slept.append(s)
        now[0] += s
    monkeypatch.setattr(_lock, "guard", functools.partial(_lock.guard, clock=lambda: now[0], sleep=sleep))
    with open(lock + ".guard", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        out = acquire(lock, "t1", "alice", HOUR)
    assert out.action == ERROR and "still busy after 0.2 s" in out.msg
    assert now[0] == pytest.approx(0.2) and max(slept) == pytest.approx(0.005)
    assert acquire(lock, "t1", "alice", HOUR).action == TAKE  # free again


def test_peek_changes_nothing(lock):
    assert peek(lock, "t1", HOUR).action == TAKE and not os.path.exists(lock)
    plant(lock, owner_record("old", "carol", time.time() - 2 * HOUR))
    assert peek(lock, "t1", HOUR).action == STALE and holder(lock)["token"] == "old"


# --------------------------------------------------------------------------------------------
# 8 real processes

CONTENDERS = 8


def _contend(path, index, barrier, results):
    barrier.wait()
    out = acquire(path, "token-%d" % index, "contender %d" % index, HOUR)
    results.put((index, out.action, out.msg))


def race(path):
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(CONTENDERS), ctx.Queue()
    procs = [ctx.Process(target=_contend, args=(path, i, barrier, results)) for i in range(CONTENDERS)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _p in procs]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * CONTENDERS  # no traceback in any of them
    return outcomes


@pytest.mark.parametrize("start", ["stale", "garbage", "free"])
def test_eight_contenders_exactly_one_wins(lock, start):
    for _round in range(5):
        if start == "stale":
            plant(lock, owner_record("old", "carol", time.time() - 2 * HOUR))
        elif start == "garbage":
            plant(lock, "{garbage", age_s=60)
        outcomes = race(lock)
        winners = [(i, action) for i, action, _msg in outcomes if action in (TAKE, STALE)]
        assert len(winners) == 1, outcomes
        index, action = winners[0]
        assert action == (TAKE if start == "free" else STALE)
        assert holder(lock)["token"] == "token-%d" % index
        losers = [(action, msg) for i, action, msg in outcomes if i != index]
        assert all(action == REFUSE and "contender %d since" % index in msg for action, msg in losers), losers
        assert release(lock, "token-%d" % index).action == RELEASE


# --------------------------------------------------------------------------------------------
# the module

@pytest.fixture
def warnings(monkeypatch):
    """The module's warnings (captured at the call: how they are reported depends on global
    state other tests change)."""
    seen = []
    monkeypatch.setattr(trainer_lock.AnsibleModule, "warn", lambda self, msg: seen.append(msg))
    return seen


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            trainer_lock.main()
    return json.loads(capsys.readouterr().out)


def test_module(lock, capsys, warnings):
    out = run_module({"path": lock, "token": "t1", "owner": "alice"}, capsys)
    assert (out["changed"], out["action"]) == (True, TAKE)
    out = run_module({"path": lock, "token": "t2", "owner": "bob"}, capsys)
    assert out["failed"] and out["action"] == REFUSE and out["owner"] == "alice"
    out = run_module({"path": lock, "token": "t2", "state": "absent"}, capsys)
    assert out["failed"] and out["action"] == NOT_OURS and "held by alice" in out["msg"]
    out = run_module({"path": lock, "token": "t1", "state": "absent", "_ansible_check_mode": True}, capsys)
    assert (out["changed"], out["action"]) == (True, RELEASE) and os.path.isdir(lock)
    out = run_module({"path": lock, "token": "t1", "state": "absent"}, capsys)
    assert (out["changed"], out["action"]) == (True, RELEASE) and not os.path.exists(lock)
    out = run_module({"path": lock, "token": "t1", "state": "absent"}, capsys)
    assert (out["changed"], out["action"]) == (False, NONE)
    assert warnings == ["lock %s was not held (already released or removed)" % lock]


def test_module_stale_and_check_mode(lock, capsys):
    plant(lock, owner_record("old", "carol", time.time() - 2 * HOUR))
    out = run_module({"path": lock, "token": "t1", "_ansible_check_mode": True}, capsys)
    assert (out["changed"], out["action"]) == (True, STALE) and holder(lock)["token"] == "old"
    out = run_module({"path": lock, "token": "t1", "owner": "alice"}, capsys)
    assert (out["action"], out["previous_owner"]) == (STALE, "carol")


def test_lease_expires_a_dead_holder_and_the_refusal_says_when(tmp_path):
    from ansible_collections.dflash.trainer.plugins.module_utils.job import lock as lk
    path = str(tmp_path / "deploy.lock")
    now = [1000.0]
    assert lk.acquire(path, "a", "alice", 3600, clock=lambda: now[0], lease_s=45, mono_clock=lambda: now[0] - 900).ok
    now[0] += 10
    out = lk.acquire(path, "b", "bob", 3600, clock=lambda: now[0], lease_s=45, mono_clock=lambda: now[0] - 900)
    assert not out.ok and "its lease ends in 35 s" in out.msg and "alice" in out.msg
    assert lk.heartbeat(path, "a", 45, clock=lambda: now[0], mono_clock=lambda: now[0] - 900, job="a-1").ok  # renewed: 45 s from now
    now[0] += 40
    assert not lk.acquire(path, "b", "bob", 3600, clock=lambda: now[0], lease_s=45, mono_clock=lambda: now[0] - 900).ok
    now[0] += 6  # past the renewed lease: the holder is gone
    out = lk.acquire(path, "b", "bob", 3600, clock=lambda: now[0], lease_s=45, mono_clock=lambda: now[0] - 900)
    assert out.ok and out.action == lk.STALE
    assert not lk.heartbeat(path, "a", 45, clock=lambda: now[0], mono_clock=lambda: now[0] - 900).ok  # the old holder learns it lost it


def test_a_wall_clock_step_neither_ends_nor_extends_a_lease(tmp_path):
    """Leases are judged on CLOCK_MONOTONIC within one boot: NTP stepping the wall clock an hour
    forward does not hand a live holder's lock to someone else, nor does a step back keep a dead
    holder's lock."""
    from ansible_collections.dflash.trainer.plugins.module_utils.job import lock as lk
    path = str(tmp_path / "deploy.lock")
    wall, mono = [1000.0], [50.0]
    assert lk.acquire(path, "a", "alice", 3600, clock=lambda: wall[0], lease_s=45, mono_clock=lambda: mono[0]).ok
    wall[0] += 3600  # the wall clock jumps an hour; 10 s really pass
    mono[0] += 10
    out = lk.acquire(path, "b", "bob", 3600, clock=lambda: wall[0], lease_s=45, mono_clock=lambda: mono[0])
    assert not out.ok and "its lease ends in 35 s" in out.msg
    wall[0] -= 7200  # stepped back; 40 s really pass
    mono[0] += 40
    out = lk.acquire(path, "b", "bob", 3600, clock=lambda: wall[0], lease_s=45, mono_clock=lambda: mono[0])
    assert out.ok and out.action == lk.STALE


def test_a_lease_from_another_boot_is_judged_on_the_wall_clock():
    from ansible_collections.dflash.trainer.plugins.module_utils.job import lock as lk
    rec = {"token": "a", "owner": "x", "since": 0, "expires": 100, "mono_end": 10 ** 9, "boot": "other-boot"}
    assert lk.decide(rec, "b", 101, 3600, mono=5, boot="this-boot") == lk.STALE
    assert lk.decide(rec, "b", 99, 3600, mono=5, boot="this-boot") == lk.REFUSE
    assert lk.decide(dict(rec, boot="this-boot"), "b", 101, 3600, mono=5, boot="this-boot") == lk.REFUSE


def test_the_lease_keeper_renews_while_work_runs_and_notices_a_loss(tmp_path):
    from ansible_collections.dflash.trainer.plugins.module_utils.job import lock as lk
    path = str(tmp_path / "deploy.lock")
    assert lk.acquire(path, "a", "alice", 3600, lease_s=30).ok
    calls = []

    def renew(p, token, lease_s, **extra):
        calls.append(extra)
        return lk.heartbeat(p, token, lease_s, **extra)

    with lk.LeaseKeeper(path, "a", 30, every_s=0.01, renew_fn=renew, job="j1") as keeper:
        poll(lambda: len(calls) >= 3, timeout=5, what="three renewals")
        assert calls[0] == {"job": "j1"}
        keeper.check()  # still ours
        assert lk.read_lock(path)[0]["job"] == "j1"
        # someone takes the lock over (our lease was judged over)
        lk.release(path, "a")
        assert lk.acquire(path, "b", "bob", 3600, lease_s=30).ok
        poll(lambda: keeper.lost is not None, timeout=5, what="the keeper noticing the loss")
        try:
            keeper.check()
            raise AssertionError("check() did not raise")
        except lk.LeaseLost as exc:
            assert "bob" in exc.msg
    assert lk.read_lock(path)[0]["owner"] == "bob"  # the keeper never wrote over the new holder's record


def test_a_play_side_keeper_stops_renewing_once_its_session_is_gone(tmp_path):
    """A module of a killed play keeps running in the container, but nobody reads its output any
    more: its keeper lets the lease lapse (item 1: a dead play's lock frees within one lease),
    while the detached job's keeper renews regardless."""
    from ansible_collections.dflash.trainer.plugins.module_utils.job import lock as lk
    path = str(tmp_path / "deploy.lock")
    assert lk.acquire(path, "a", "alice", 3600, lease_s=30).ok
    read = [True]
    calls = {"play": 0, "job": 0}

    def renewer(who):
        def renew(p, token, lease_s, **extra):
            calls[who] += 1
            return lk.heartbeat(p, token, lease_s, **extra)
        return renew

    with lk.LeaseKeeper(path, "a", 30, every_s=0.01, renew_fn=renewer("play"), while_attached=True,
                        attached=lambda: read[0]) as play, \
            lk.LeaseKeeper(path, "a", 30, every_s=0.01, renew_fn=renewer("job")):
        poll(lambda: calls["play"] >= 3, timeout=5, what="the play's keeper renewing while attached")
        read[0] = False  # the connection died with the play
        poll(lambda: play.detached, timeout=5, what="the play's keeper noticing nobody reads its output")
        after = calls["play"]
        seen = calls["job"]
        poll(lambda: calls["job"] >= seen + 3, timeout=5, what="the job's keeper renewing on")
        assert calls["play"] == after and play.lost is None


def test_output_read_is_false_once_the_reader_is_gone():
    from ansible_collections.dflash.trainer.plugins.module_utils.job import lock as lk
    r, w = os.pipe()
    try:
        assert lk.output_read(w) is True
        assert os.read(r, 10) == b"\n"  # a blank line: Ansible skips it before the module's JSON
        os.close(r)
        assert lk.output_read(w) is False  # EPIPE
    finally:
        os.close(w)


def test_acquire_waiting_tries_again_until_the_holder_lets_go(tmp_path):
    from ansible_collections.dflash.trainer.plugins.module_utils.job import lock as _lock
    path = str(tmp_path / "deploy.lock")
    assert _lock.acquire(path, "alice-token", "alice", 3600, lease_s=60).ok
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s
        if now[0] >= 2.5:  # alice lets go after 2.5 s
            _lock.release(path, "alice-token")

    out = _lock.acquire_waiting(path, "bob-token", "bob", 3600, lease_s=60, wait_s=10,
                                monotonic=lambda: now[0], sleep=sleep)
    assert out.ok and out.action == _lock.TAKE and slept == [1.0, 1.0, 1.0]
    refused = _lock.acquire_waiting(path, "carol-token", "carol", 3600, lease_s=60, wait_s=0,
                                    monotonic=lambda: now[0], sleep=sleep)
    assert not refused.ok and refused.action == _lock.REFUSE and "bob" in refused.msg
