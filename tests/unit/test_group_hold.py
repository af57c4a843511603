"""A trainer group's hold (plugins/plugin_utils/_group_hold.py): a member whose task ended renews its lock until
every member's task ended; its n-th arrival waits for every member's n-th; a failed renewal ends its wait (its
arrival already said); a group larger than forks is not held; a bad spec is refused with words. Real worker
processes meet through real files."""
import multiprocessing
import os
import time

import pytest

from ansible_collections.dflash.trainer.plugins.plugin_utils import _group_hold
from ansible_collections.dflash.trainer.plugins.plugin_utils._group_hold import Hold, checked, hold_for

SPEC = dict(key="t1-t2-t3", phase="watch-restart", me="g0", members=["g0", "g1", "g2"],
            lock=dict(path="/run/x.lock", token="t1", lease_s=15))


class Clock(object):
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


def test_a_member_renews_until_every_member_arrived(tmp_path):
    me, other = Hold("k", "g0", ["g0", "g1"], root=str(tmp_path)), Hold("k", "g1", ["g0", "g1"], root=str(tmp_path))
    me.arrive()
    clock, renewals = Clock(), []

    def renew():
        renewals.append(clock.now)
        if clock.now >= 10.0:
            other.arrive()  # the slowest member's task ends
        return None

    assert me.wait(renew, 3.75, clock=clock, sleep=clock.sleep) is None
    assert renewals[0] == 0.0  # at once: the member's own work just ended
    assert all(b - a <= 3.75 + _group_hold.CHECK_S + 1e-9 for a, b in zip(renewals, renewals[1:]))
    assert renewals[-1] >= 10.0 and me.pending() == []


def test_a_failed_renewal_ends_the_wait_with_its_words(tmp_path):
    hold = Hold("k", "g0", ["g0", "g1"], root=str(tmp_path))
    hold.arrive()
    clock = Clock()
    why = hold.wait(lambda: "g0: the deploy lock could not be renewed", 3.0, clock=clock, sleep=clock.sleep)
    assert why == "g0: the deploy lock could not be renewed"
    assert Hold("k", "g1", ["g0", "g1"], root=str(tmp_path))._count("g0") == 1  # pylint: disable=protected-access


def test_the_nth_arrival_waits_for_every_members_nth(tmp_path):
    """The same hold names met twice (the role run twice in one play): the second meeting waits again."""
    first = [Hold("k", m, ["g0", "g1"], root=str(tmp_path)) for m in ("g0", "g1")]
    for h in first:
        h.arrive()
    assert first[0].pending() == []
    again = Hold("k", "g0", ["g0", "g1"], root=str(tmp_path))
    again.arrive()
    assert again.pending() == ["g1"]
    Hold("k", "g1", ["g0", "g1"], root=str(tmp_path)).arrive()
    assert again.pending() == []


def _member(root, me, members, delay, out):
    time.sleep(delay)
    hold = Hold("k", me, members, root=root)
    hold.arrive()
    renewals = []
    hold.wait(lambda: renewals.append(time.monotonic()), 0.05)
    out.put((me, time.monotonic(), len(renewals)))


def test_worker_processes_meet(tmp_path):
    members = ["g0", "g1", "g2"]
    out = multiprocessing.get_context("fork").Queue()
    procs = [multiprocessing.get_context("fork").Process(target=_member, args=(str(tmp_path), m, members, d, out))
             for m, d in zip(members, (0.0, 0.0, 0.6))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    ends = {me: (at, n) for me, at, n in (out.get(timeout=5) for _p in procs)}
    assert set(ends) == set(members)
    assert ends["g0"][1] >= 2 and ends["g1"][1] >= 2  # renewed while g2 was still busy
    assert min(at for at, _n in ends.values()) >= ends["g2"][0] - 0.5  # nobody ended long before the slowest


def test_a_group_larger_than_forks_is_not_held(monkeypatch):
    monkeypatch.setattr(_group_hold, "forks", lambda: 2)
    hold, lock, warning = hold_for(SPEC)
    assert hold is None and lock is None and "forks 2" in warning and "at least 3" in warning
    monkeypatch.setattr(_group_hold, "forks", lambda: 8)
    hold, lock, warning = hold_for(SPEC)
    assert hold is not None and lock["token"] == "t1" and warning is None
    assert hold_for(None) == (None, None, None)


@pytest.mark.parametrize("bad", [
    "x", dict(SPEC, key=""), dict(SPEC, me="g9"), dict(SPEC, members="g0"), dict(SPEC, lock=dict(path="/x")),
])
def test_a_bad_spec_is_refused_with_words(bad):
    with pytest.raises(ValueError, match="group_hold"):
        checked(bad)


def test_the_phase_joins_the_key(tmp_path):
    assert checked(SPEC)[0] == "t1-t2-t3-watch-restart"
    a = Hold(checked(SPEC)[0], "g0", ["g0"], root=str(tmp_path))
    b = Hold(checked(dict(SPEC, phase="lock"))[0], "g0", ["g0"], root=str(tmp_path))
    assert a.dir != b.dir and os.path.dirname(a.dir) == os.path.dirname(b.dir)


def _lock_module(tmp_path, **args):
    """trainer_lock run as Ansible runs it on a target -> its JSON result."""
    import json  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    res = subprocess.run([sys.executable, os.path.join(root, "plugins", "modules", "trainer_lock.py"), str(path)],
                         capture_output=True, text=True, check=False,
                         env=dict(os.environ, PYTHONPATH=os.path.join(root, "collections")))
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_trainer_lock_renew_renews_only_this_plays_lock(tmp_path):
    """O(state=renew): this play's lease renewed; someone else's lock, or none, fails and is never taken."""
    from ansible_collections.dflash.trainer.plugins.module_utils.job import lock as _lock  # pylint: disable=import-outside-toplevel
    lock = str(tmp_path / "deploy.lock")
    assert _lock.acquire(lock, "t1", "me", 3600, lease_s=2).ok
    before = _lock.read_lock(lock)[0]["expires"]
    out = _lock_module(tmp_path, path=lock, token="t1", lease_s=60, state="renew")
    assert not out.get("failed") and out["lock_holder"] == "play"
    assert _lock.read_lock(lock)[0]["expires"] > before + 30
    out = _lock_module(tmp_path, path=lock, token="other", lease_s=60, state="renew")
    assert out.get("failed") and "not by this play" in out["msg"] and _lock.read_lock(lock)[0]["token"] == "t1"
    assert _lock.release(lock, "t1").ok
    out = _lock_module(tmp_path, path=lock, token="t1", lease_s=60, state="renew")
    assert out.get("failed") and "no longer held" in out["msg"] and not os.path.exists(lock)


def test_a_member_that_never_begins_or_whose_worker_died_ends_the_wait_with_words(tmp_path):
    """Never a play that waits forever: a member skipped from the task (never began) is given up after
    START_GRACE_S; one whose worker began and is gone without arriving, at once."""
    me = Hold("k", "g0", ["g0", "g1"], root=str(tmp_path))
    me.begin()
    me.arrive()
    clock = Clock()
    why = me.wait(lambda: None, 3.0, clock=clock, sleep=clock.sleep)
    assert why.startswith("g1 never began this task within 120 s") and clock.now >= _group_hold.START_GRACE_S
    other = Hold("k", "g1", ["g0", "g1"], root=str(tmp_path))
    other.begin()  # began (this process's pid), then its worker is gone
    clock = Clock()
    why = me.wait(lambda: None, 3.0, clock=clock, sleep=clock.sleep, alive=lambda pid: pid != os.getpid())
    assert why == "g1's worker (pid %d) ended without its task ending: g0's lock is not held for it any longer" % (
        os.getpid()) and clock.now < 1.0
    # alive and begun: waited for, renewing, until it arrives
    clock, renewals = Clock(), []

    def renew():
        renewals.append(clock.now)
        if clock.now >= 300.0:
            other.arrive()
        return None
    assert me.wait(renew, 3.0, clock=clock, sleep=clock.sleep, alive=lambda pid: True) is None
    assert renewals[-1] >= 300.0  # longer than the grace: a member that began is waited for as long as it works
