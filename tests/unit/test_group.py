"""A trainer group's barriers, plan and verdict (plugin_utils/_group.py), judged from what every member
registered (the trainer_group action calls them: test_group_action.py)."""
import pytest

from ansible_collections.dflash.trainer.plugins.plugin_utils._group import (
    as_one,
    barrier,
    failure_words,
    group_plan,
    not_whole,
    strays,
    verdict,
)
from ansible_collections.dflash.trainer.plugins.module_utils.job.group_check import still_proved

M = ["g0", "g1"]


def plan(**kw):
    p = dict(release="r2", current="r1", last_good="r1", restart=True, reasons=["release switched to r2"],
             upload=True, install=False, no_op=False)
    p.update(kw)
    return p


def test_a_barrier_passes_only_when_every_member_passed():
    ok = {"changed": True}
    assert not barrier(M, {"g0": ok, "g1": {"skipped": True}}, "the upload")["failed"]
    out = barrier(M, {"g0": ok, "g1": {"failed": True, "msg": "no space left\nmore"}}, "the upload")
    assert out["failed"] and out["members"] == ["g1"] and "g1: no space left" in out["words"]
    assert "1 of 2" in out["words"] and "more" not in out["words"]
    assert barrier(M, {"g0": ok, "g1": {}}, "x")["words"].endswith("g1: did not reach this phase")
    assert "unreachable" in barrier(M, {"g0": ok, "g1": {"unreachable": True, "msg": "ssh"}}, "x")["words"]
    assert barrier(M, {"g0": ok}, "x")["members"] == ["g1"]
    left = barrier(M, {"g0": ok, "g1": ok}, "x", alive=["g0"])
    assert left["failed"] and "g1: left the run" in left["words"]


def test_a_members_watch_that_saw_it_die_fails_the_barrier_with_its_words():
    up = {"health": {"ok": True, "words": "running"}, "watched_s": 60.0}
    died = {"health": {"ok": False, "words": "restarted by systemd (NRestarts 1)"}, "watched_s": 12.5}
    assert not barrier(M, {"g0": up, "g1": up}, "the watch", health=True)["failed"]
    assert not barrier(M, {"g0": up, "g1": died}, "the first read")["failed"]  # health is the watch's alone
    out = barrier(M, {"g0": up, "g1": died}, "the watch (trainer_watch_s=60)", health=True)
    assert out["failed"] and out["members"] == ["g1"]
    assert out["words"] == ("trainer group: the watch (trainer_watch_s=60) failed on 1 of 2 members - g1: did not "
                            "stay up for 12.5 s after the group's proof: restarted by systemd (NRestarts 1)")


def test_the_group_restarts_as_one_when_any_member_must():
    one = group_plan("dist", M, {"g0": plan(restart=False, reasons=[], current="r2", upload=False),
                                 "g1": plan(reasons=["trainer not running"], current="r2", upload=False)}, M)
    assert one["restart"] and list(one["reasons"]) == ["g1"] and one["release"] == "r2" and one["upload"] == []
    calm = group_plan("dist", M, dict((m, plan(restart=False, reasons=[], current="r2", upload=False)) for m in M), M)
    assert calm["no_op"] and not calm["restart"] and calm["rollback_release"] == "r1"
    mixed = group_plan("dist", M, {"g0": plan(reasons=[], current="r2"), "g1": plan(reasons=[], current="r1")}, M)
    assert mixed["restart"] and all("different releases" in r[-1] for r in mixed["reasons"].values())
    install = group_plan("dist", M, {"g0": plan(reasons=[], current="r2", install=True),
                                     "g1": plan(reasons=[], current="r2")}, M)
    assert install["reasons"] == {"g0": ["install changes"]}


def test_the_group_is_refused_when_incomplete_or_split():
    out = group_plan("dist", M, {"g0": plan(), "g1": plan()}, ["g0"])
    assert out["refused"].startswith("trainer group dist is deployed as one: g1 is not in this run")
    split = group_plan("dist", M, {"g0": plan(), "g1": plan(release="r3")}, M)
    assert "different releases (r2, r3)" in split["refused"]


def test_the_rollback_target_is_the_last_good_every_member_agrees_on():
    assert group_plan("d", M, {"g0": plan(), "g1": plan(last_good="r0")}, M)["rollback_release"] is None
    assert group_plan("d", M, {"g0": plan(), "g1": plan()}, M)["rollback_release"] == "r1"


def test_the_verdict_needs_every_member_proved():
    good = {"result": {"ok": True}}
    assert verdict(M, {"g0": good, "g1": good})["ok"]
    out = verdict(M, {"g0": good, "g1": {"result": {"ok": False, "msg": "exited 1\nTraceback"}}})
    assert not out["ok"] and out["failed"] == ["g1"] and "g1: exited 1" in out["words"]
    assert verdict(M, {"g0": good, "g1": {"failed": True, "msg": "not started"}})["failed"] == ["g1"]


def test_every_members_registered_result_is_judged():
    results = {"g0": {"changed": True}, "g1": {"failed": True, "msg": "boom"}}
    assert barrier(M, results, "the x", alive=["g0", "g1"])["members"] == ["g1"]
    assert group_plan("dist", M, {"g0": plan(), "g1": plan()}, M)["release"] == "r2"


def test_a_member_is_deployed_only_with_its_group():
    from ansible_collections.dflash.trainer.plugins.plugin_utils._validate import group_problems
    v = {"trainer_group": "dist", "groups": {"dist": ["g0", "g1"]}, "inventory_hostname": "g1"}
    assert group_problems(v, "main") == []
    assert group_problems(dict(v, trainer_group=""), "restart") == []
    (p,) = group_problems(v, "restart")
    assert p.variable == "trainer_group" and "a restart of one member is refused" in str(p)
    assert "\n    ansible-playbook dflash.trainer.deploy -l dist" in str(p)  # the fix: a line of its own
    assert "names no inventory group" in str(group_problems(dict(v, trainer_group="nope"), "main")[0])
    assert "this host is not in" in str(group_problems(dict(v, inventory_hostname="g9"), "main")[0])


def test_whole_says_which_member_is_outside_the_run():
    assert strays("dist", M, {}) is None and not_whole("dist", M, M) is None
    assert "g1 is not in this run" in not_whole("dist", M, ["g0"])


def test_a_failed_restart_says_what_the_rollback_left():
    restart = verdict(M, {"g0": {"result": {"ok": True}}, "g1": {"result": {"ok": False, "msg": "exited 1"}}})
    back = verdict(M, {"g0": {"result": {"ok": True}}, "g1": {"result": {"ok": True}}})
    assert failure_words(restart, "r1", back) == (
        "trainer group: 1 of 2 members failed their proof - g1: exited 1. Every member was put back on release r1 "
        "and proved again (trainer group: every member (g0, g1) proved).")
    half = verdict(M, {"g0": {"failed": True, "msg": "not started"}, "g1": {"result": {"ok": True}}})
    words = failure_words(restart, "r1", half)
    assert "Every member was put back" not in words
    assert "The rollback to release r1 failed too" in words and "g0: not started" in words
    assert "no member's rollback job ended" in failure_words(restart, "r1", None)
    assert failure_words(restart, None).endswith("every member was stopped.")


def test_the_verdict_needs_every_member_still_running_what_was_proved_at_the_check():
    jobs = {m: {"result": {"ok": True}} for m in ("a", "b")}
    checks = {"a": {"still": {"ok": True}}, "b": {"still": {"ok": False, "msg": "the main pid 42 proved is gone"}}}
    v = verdict(["a", "b"], jobs, checks)
    assert not v["ok"] and v["failed"] == ["b"]
    assert "b: proved by its own job, then at the group's check: the main pid 42 proved is gone" in v["words"]
    assert verdict(["a", "b"], jobs, {m: {"still": {"ok": True}} for m in "ab"})["ok"]
    assert not verdict(["a", "b"], jobs, {"a": {"still": {"ok": True}}})["ok"]  # a member not checked
    # a job that failed is named as such: its check never ran
    jobs["a"] = {"result": {"ok": False, "msg": "proof failed"}}
    assert verdict(["a", "b"], jobs, {"a": {"skipped": True}, "b": {"skipped": True}})["failed"] == ["a"]


@pytest.mark.parametrize("unit, gpus, step, why", [
    ({"ActiveState": "active", "MainPID": "42", "InvocationID": "i1"}, {0: 5000, 1: 5000}, 9, None),
    ({"ActiveState": "active", "MainPID": "42", "InvocationID": "i1"}, {0: 5000, 1: 5000}, None, None),
    ({"ActiveState": "activating", "SubState": "auto-restart", "MainPID": "0"}, {}, None, "its unit is activating"),
    ({"ActiveState": "active", "MainPID": "77", "InvocationID": "i2", "NRestarts": "1"}, {0: 5000, 1: 5000}, 9,
     "the main pid 42 proved is gone: the unit runs pid 77 now"),
    ({"ActiveState": "active", "MainPID": "42", "InvocationID": "i1"}, {0: 5000, 1: 3}, 9, "GPU 1 no longer held"),
    ({"ActiveState": "active", "MainPID": "42", "InvocationID": "i1"}, {0: 5000, 1: 5000}, 7, "no progress since"),
])
def test_a_member_still_runs_what_its_job_proved_or_says_why_not(unit, gpus, step, why):
    proof = {"main_pid": 42, "invocation_id": "i1", "gpus_mib": {"0": 6000, "1": 6000}, "step": 7}
    said = still_proved(proof, unit, gpus, 1024, step=step)
    assert said is None if why is None else why in said


def test_a_host_of_the_group_whose_own_trainer_group_is_empty_refuses_the_group():
    from ansible_collections.dflash.trainer.plugins.plugin_utils._group import strays
    assert strays("tg", ["a", "b"], {"a": "tg", "b": "tg"}) is None
    words = strays("tg", ["a", "b"], {"a": "tg", "b": ""})
    assert "b is in its inventory group but its trainer_group is empty" in words and "nothing was changed" in words


def _read(release="r2", last_good="r2", ok=True, words="running r2, proved"):
    return {"running_release": release, "last_good": last_good, "health": {"ok": ok, "words": words}}


def test_status_says_whether_the_group_runs_as_one_proved_job():
    one = as_one("tg", M, {"g0": _read(), "g1": _read()}, M)
    words = "trainer group tg: proved as one - release r2 on every member (g0, g1)"
    assert one == {"ok": True, "members": [], "words": words}
    died = as_one("tg", M, {"g0": _read(), "g1": _read(ok=False, words="died 12 s after its proof")}, M)
    assert died["ok"] is False and died["members"] == ["g1"] and "g1: died 12 s after its proof" in died["words"]
    two = as_one("tg", M, {"g0": _read(), "g1": _read(release="r1", last_good="r1")}, M)
    assert two["ok"] is False and two["words"] == "trainer group tg: not proved as one - g0: runs r2; g1: runs r1"
    gone = as_one("tg", M, {"g0": _read(), "g1": {"unreachable": True, "msg": "ssh: no route"}}, M)
    assert gone["words"] == "trainer group tg: not proved as one - g1: unreachable: ssh: no route"
    drift = as_one("tg", M, {"g0": _read(), "g1": _read(last_good="r1")}, M)
    assert drift["members"] == ["g1"] and "g1: runs r2, its last good release is r1" in drift["words"]


def test_status_of_some_members_judges_nothing_and_says_how_to_read_them_all():
    part = as_one("tg", M, {"g0": _read()}, ["g0"])
    assert part["ok"] is None and part["members"] == ["g1"]
    assert part["words"] == "trainer group tg: not judged as one - g1 not read in this run (read every member: -l tg)"
    assert as_one("tg", M, {"g0": _read(), "g1": _read()}, M)["ok"] is True


def test_each_member_carries_the_groups_plan_out_with_its_own_part():
    from ansible_collections.dflash.trainer.plugins.plugin_utils._group import member_plan
    group = group_plan("dist", M, {"g0": plan(restart=False, reasons=[], current="r2", upload=True),
                                   "g1": plan(reasons=["trainer not running"], current="r2", upload=False)}, M)
    g0, g1 = member_plan(group, "g0", lock_token="tok", digits="12345678"), member_plan(group, "g1")
    assert (g0["upload_here"], g1["upload_here"]) == (True, False)
    assert g1["reasons_here"] == ["trainer not running"] and g0["reasons_here"] == ["trainer group dist restarts"]
    assert g0["job_ids"] == {"restart": "tok-restart-12345678", "rollback": "tok-rollback-12345678"}
    assert not g0["says"] and g0["restart"] and g0["release"] == "r2"
    checked = member_plan(group, "g0", check_mode=True)
    assert checked["says"] and checked["words"].startswith("would restart trainer group dist on r2: ")
    calm = member_plan(group_plan("dist", M, dict((m, plan(restart=False, reasons=[], current="r2", upload=False))
                                                  for m in M), M), "g0")
    assert calm["says"] and calm["words"] == "trainer group dist left running: release r2 on every member"


def test_after_the_restart_the_verdict_says_what_follows():
    from ansible_collections.dflash.trainer.plugins.plugin_utils._group import after_job
    good = verdict(M, {"g0": {"result": {"ok": True}}, "g1": {"result": {"ok": True}}})
    bad = verdict(M, {"g0": {"result": {"ok": True}}, "g1": {"result": {"ok": False, "msg": "exited 1"}}})
    ok = after_job("restart", good, "r1", watch_s="60")
    assert ok["good"] and ok["report"] and ok["watch"] and not (ok["rollback"] or ok["stop"] or ok["fail"])
    assert not after_job("restart", good, "r1", watch_s=0)["watch"]
    back = after_job("restart", bad, "r1")
    assert back["rollback"] and not (back["good"] or back["report"] or back["stop"] or back["fail"])
    assert back["members"] == ["g1"] and "failed" not in back  # a registered result's `failed` fails its task
    stop = after_job("restart", bad, None)
    assert stop["stop"] and stop["fail"] and not stop["rollback"]
    assert stop["failure"] == failure_words(bad, None)
    rolled = after_job("rollback", good, "r1", restart=back["restart"])
    assert rolled["good"] and rolled["fail"] and not (rolled["report"] or rolled["watch"] or rolled["stop"])
    assert rolled["failure"] == failure_words(bad, "r1", good)
    worse = after_job("rollback", bad, "r1", restart=back["restart"])
    assert not worse["good"] and worse["fail"] and "The rollback to release r1 failed too" in worse["failure"]


def test_a_groups_status_is_judged_from_every_members_registered_read():
    """trainer_status with group: every member's read, as it registered it, judged as one job (as_one)."""
    from ansible_collections.dflash.trainer.plugins.action.trainer_status import judge_group
    whole = judge_group({"name": "tg", "members": M, "read": "st", "in_run": M},
                        {"g0": {"st": _read()}, "g1": {"st": _read()}})
    assert whole["group_status"]["ok"] is True and whole["group_failed"] is False
    assert whole["ansible_facts"]["__trainer_group_status"] == whole["group_status"]
    part = judge_group({"name": "tg", "members": M, "read": "st", "in_run": ["g0"]}, {"g0": {"st": _read()}})
    assert part["group_status"]["ok"] is None and part["group_status"]["members"] == ["g1"]
