"""The run's plan (module_utils/_plan.py), made once by the first read: entry by entry, row by row."""
import pytest

from ansible_collections.dflash.trainer.plugins.module_utils._plan import lock_holder, make_plan, restart_reasons

NO_CHANGE = {"unit_changed": False, "env_changed": False, "launcher_changed": False, "changed": False}
HEALTHY = {"ok": True, "words": "running release r1, proved 5 min ago (unit restarts 0)"}


def proved(**kw):
    """The first read of a trainer running release r1, proved and healthy."""
    status = dict(running=True, running_release="r1", current_release="r1", last_good="r1", releases=["r1", "r0"],
                  health=HEALTHY, last_job=None)
    status.update(kw)
    return status


DEPLOY_ROWS = [
    # (what the read found, intent, install) -> (restart, reasons, upload, install, no_op)
    ("same release, proved, healthy", proved(), dict(release="r1"), NO_CHANGE,
     (False, [], False, False, True)),
    ("forced", proved(), dict(release="r1", force=True), NO_CHANGE,
     (True, ["forced (trainer_force_restart)"], False, False, False)),
    ("a new release", proved(), dict(release="r2"), NO_CHANGE,
     (True, ["release switched to r2", "running release r1 is not current r2"], True, False, False)),
    ("the environment changed", proved(), dict(release="r1"), dict(NO_CHANGE, env_changed=True, changed=True),
     (True, ["environment changed"], False, False, False)),
    ("not running", proved(running=False, running_release=None), dict(release="r1"), NO_CHANGE,
     (True, ["trainer not running"], False, False, False)),
    ("running unproved", proved(last_good="r0"), dict(release="r1"), NO_CHANGE,
     (True, ["release r1 runs without a proof on record (last proved: r0; no restart job on record)"], False, False,
      False)),
    ("died after its proof", proved(health={"ok": False, "words": "died 3 min after its proof"}), dict(release="r1"),
     NO_CHANGE, (True, ["the running trainer is not the one proved: died 3 min after its proof"], False, False, False)),
    ("only the enablement changes", proved(), dict(release="r1"), dict(NO_CHANGE, enabled_changed=True, changed=True),
     (False, [], False, True, False)),
    ("the install refuses", proved(), dict(release="r1"), dict(NO_CHANGE, refused="a file we did not write"),
     (False, [], False, True, False)),
]


@pytest.mark.parametrize("name,status,intent,install,want", DEPLOY_ROWS, ids=[r[0] for r in DEPLOY_ROWS])
def test_deploy_plan(name, status, intent, install, want):
    plan = make_plan(dict(intent, entry="deploy"), status, install)
    got = (plan["restart"], plan["reasons"], plan["upload"], plan["install"], plan["no_op"])
    assert got == want, name
    assert plan["preflight"] == plan["restart"]  # every restart is pre-flighted
    assert plan["release"] == intent["release"] and plan["refused"] is None


def test_a_deploy_without_a_release_id_is_refused():
    plan = make_plan({"entry": "deploy"}, proved(), NO_CHANGE)
    assert plan["refused"] and not plan["restart"] and not plan["no_op"]


ROLLBACK_ROWS = [
    ("to the last good", proved(current_release="r2", last_good="r1", releases=["r2", "r1"]), None,
     ("r1", None, ["rollback from r2 to r1"])),
    ("to a named release", proved(current_release="r2", releases=["r2", "r1", "r0"]), "r0",
     ("r0", None, ["rollback from r2 to r0"])),
    ("current is the last good", proved(), None, ("r1", "nothing to roll back to", [])),
    ("no last good", proved(last_good=None), None, (None, "nothing to roll back to", [])),
    ("an unknown release", proved(current_release="r2"), "r9", ("r9", "nothing to roll back to", [])),
]


@pytest.mark.parametrize("name,status,target,want", ROLLBACK_ROWS, ids=[r[0] for r in ROLLBACK_ROWS])
def test_rollback_plan(name, status, target, want):
    plan = make_plan({"entry": "rollback", "rollback_release": target}, status)
    release, refused, reasons = want
    assert plan["release"] == release and plan["reasons"] == reasons, name
    assert (plan["refused"] or "").startswith(refused or "") and bool(plan["refused"]) == bool(refused)
    assert plan["restart"] == (refused is None) and plan["upload"] is False


def test_restart_plan_runs_current_and_start_leaves_a_healthy_trainer():
    restart = make_plan({"entry": "restart"}, proved())
    assert (restart["restart"], restart["release"], restart["reasons"]) == (True, "r1", ["restart requested"])
    start = make_plan({"entry": "start"}, proved())
    assert start["no_op"] and not start["restart"] and "already runs its proved release" in start["words"]
    stopped = make_plan({"entry": "start"}, proved(running=False, health={"ok": False, "words": "stopped on purpose"}))
    assert stopped["restart"] and stopped["reasons"] == ["start requested (stopped on purpose)"]
    for entry in ("restart", "start"):
        empty = make_plan({"entry": entry}, proved(current_release=None))
        assert empty["refused"].startswith("nothing is deployed") and not empty["restart"]


def test_an_unknown_entry_is_an_error():
    with pytest.raises(ValueError, match="entry must be one of"):
        make_plan({"entry": "redeploy"}, proved())


def test_who_holds_the_lock():
    assert lock_holder(make_plan({"entry": "deploy", "release": "r1"}, proved(), NO_CHANGE)) == "nobody"
    assert lock_holder(make_plan({"entry": "restart"}, proved())) == "play"
    assert lock_holder(make_plan({"entry": "restart"}, proved()), job_started=True) == "job"
    no_op = make_plan({"entry": "deploy", "release": "r1"}, proved(), NO_CHANGE)
    assert lock_holder(no_op, hold=True) == "play"  # a group member keeps it for the group's decision
    refused = make_plan({"entry": "restart"}, proved(current_release=None))
    assert lock_holder(refused) == lock_holder(refused, hold=True) == "nobody"


def test_restart_reasons_put_what_changed_first():
    assert restart_reasons(proved(), "r2", switched=True, install=dict(NO_CHANGE, unit_changed=True),
                           force=True)[:2] == ["forced (trainer_force_restart)", "release switched to r2"]


def test_a_stop_keeps_the_lock_for_its_job_whatever_runs():
    for status in (proved(), proved(running=False)):
        plan = make_plan({"entry": "stop"}, status)
        assert plan["stop"] and not plan["no_op"] and not plan["restart"] and lock_holder(plan) == "play"
