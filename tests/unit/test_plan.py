"""The run's plan (module_utils/plan/decide.py), made once by the first read: entry by entry, row by row."""
import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.plan.decide import lock_holder, make_plan, restart_reasons

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


# -- how long the play watches the run's job (job_budget_s, watch_retries, job_wait_s) ----------------

from ansible_collections.dflash.trainer.plugins.module_utils.plan.decide import (  # noqa: E402
    DEFAULT_JOB_WAIT_S,
    job_budget_s,
    job_wait_s,
    last_lock_holder,
    last_ran,
    min_tokps_ratio,
    restart_done,
    watch_retries,
)

ROLE = dict(stop_timeout_s=30, drain_timeout_s=60, ready_timeout_s=900, measure_s=None, min_tokps_ratio=0.9)

BUDGET_ROWS = [
    # (entry, settings) -> (budget, retries): a restart job goes through stop + 30 + drain + 120 + proof
    # (+ measure) twice (its rollback), + 60; a stop job through stop + 30 + drain + 60
    ("restart, the role's defaults", "restart", ROLE, 2 * (30 + 30 + 60 + 120 + 900) + 60, 2340 // 10 + 2),
    ("deploy, with a throughput window", "deploy", dict(ROLE, measure_s=120.5), 2581, 261),
    ("rollback, strings as -e gives them", "rollback", dict(ROLE, stop_timeout_s="45", ready_timeout_s="10.5"),
     591, 62),
    ("stop", "stop", ROLE, 30 + 30 + 60 + 60, 20),
    ("stop, a fraction rounds up", "stop", dict(ROLE, drain_timeout_s=0.5), 121, 15),
    ("nothing set", "restart", {}, 2 * (30 + 120) + 60, 38),
    ("a negative or unreadable setting counts as 0", "stop", dict(ROLE, stop_timeout_s=-5, drain_timeout_s="x"),
     90, 11),
]


@pytest.mark.parametrize("name,entry,settings,budget,retries", BUDGET_ROWS, ids=[r[0] for r in BUDGET_ROWS])
def test_the_jobs_budget(name, entry, settings, budget, retries):
    assert job_budget_s(entry, settings) == budget, name
    assert watch_retries(budget) == retries, name


def test_the_plan_carries_the_budget_and_the_gate():
    plan = make_plan({"entry": "restart"}, proved(), settings=ROLE)
    assert (plan["job_budget_s"], plan["watch_retries"], plan["min_tokps_ratio"]) == (2340, 236, 0.9)
    stop = make_plan({"entry": "stop"}, proved(), settings=ROLE)
    assert (stop["job_budget_s"], stop["watch_retries"]) == (180, 20)
    forced = make_plan({"entry": "deploy", "release": "r1", "force": True}, proved(), NO_CHANGE, settings=ROLE)
    assert forced["min_tokps_ratio"] == 0.0 and forced["restart"]   # a forced deploy accepts a slower release
    assert "job_budget_s" not in make_plan({"entry": "restart"}, proved())  # a standalone caller without settings


def test_how_long_the_first_read_waits_for_an_earlier_job():
    assert job_wait_s({"entry": "deploy"}, ROLE) == job_budget_s("restart", ROLE)
    assert job_wait_s({"entry": "stop"}, ROLE) == job_budget_s("restart", ROLE)  # it waits for a restart job
    assert job_wait_s({"entry": "deploy", "hold": True}, ROLE) == 0  # a group's member: the group is refused
    assert job_wait_s({"entry": "deploy"}, None) == DEFAULT_JOB_WAIT_S
    assert min_tokps_ratio({"entry": "restart"}, {}) == 0.0


# -- who answers: the latest call that ran (last_ran, last_lock_holder) --------------------------------

SKIPPED = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}

HOLDER_ROWS = [
    # [group stop, group relock, job start, first read] -> holder
    ("a no-op: the first read freed it", [{}, {}, {}, {"lock_holder": "nobody"}], "nobody"),
    ("the job took it", [{}, {}, {"started": True, "lock_holder": "job"}, {"lock_holder": "play"}], "job"),
    ("the job was skipped (check mode)", [{}, {}, SKIPPED, {"lock_holder": "play"}], "play"),
    ("the start call failed without an answer", [{}, {}, {"failed": True, "msg": "x"}, {"lock_holder": "play"}],
     "unknown"),
    ("a group took it back", [SKIPPED, {"changed": True, "lock_holder": "play"}, {"lock_holder": "play"},
                              {"lock_holder": "play"}], "play"),
    ("a group's stop job took it", [{"lock_holder": "job"}, {"lock_holder": "play"}, {"lock_holder": "play"},
                                    {"lock_holder": "play"}], "job"),
    ("a relock that did not answer", [{}, {"unreachable": True}, {"lock_holder": "play"}, {"lock_holder": "play"}],
     "unknown"),
    ("the first read said nothing", [{}, {}, {}, {"failed": True}], "play"),
    ("nothing ran", [{}, {}, {}, {}], "play"),
]


@pytest.mark.parametrize("name,results,holder", HOLDER_ROWS, ids=[r[0] for r in HOLDER_ROWS])
def test_who_holds_the_lock_at_the_runs_end(name, results, holder):
    assert last_lock_holder(results) == holder, name


def test_the_jobs_outcome_is_the_latest_call_that_ran():
    start = {"started": True, "finished": True, "result": {"ok": True}}
    watch = {"finished": True, "result": {"ok": False}}
    assert last_ran([SKIPPED, start]) is start          # the job ended within the call that started it
    assert last_ran([watch, start]) is watch
    assert last_ran([SKIPPED, SKIPPED]) == {} and last_ran([]) == {}


# -- a deploy's restart that ended proved within the first read: nothing left past it ------------------------------

def _first_read(**job):
    base = dict(started=True, finished=True, failed=False, lock_holder="job", result={"ok": True, "proof": {}})
    base.update(job)
    return {"plan": {"restart": True}, "job_start": base}


@pytest.mark.parametrize("name, first_read, watch_s, want", [
    ("proved within the read", _first_read(), 0, True),
    ("proved, watch after it", _first_read(), 30, False),
    ("proved, watch given as text", _first_read(), "0", True),
    ("the job still runs (the watch follows)", _first_read(finished=False, result=None), 0, False),
    ("the job failed (rolled back: the role fails the run)", _first_read(failed=True, result={"ok": False}), 0, False),
    ("ended, not ok", _first_read(result={"ok": False}), 0, False),
    ("never started (refused pre-flight)", _first_read(started=False, not_started=True, finished=False), 0, False),
    ("no job in the read (an upload follows)", {"plan": {"restart": True}}, 0, False),
    ("the read was skipped", {"skipped": True}, 0, False),
    ("nothing registered", None, 0, False),
    ("a watch that is not a number", _first_read(), "soon", False),
])
def test_restart_done(name, first_read, watch_s, want):
    assert restart_done(first_read, watch_s) is want, name


SETTINGS = {"stop_timeout_s": 60, "drain_timeout_s": 60, "ready_timeout_s": 600, "measure_s": 0, "min_tokps_ratio": 0}
STEPS = ("run_job", "start_job", "node_view_before", "node_view_after", "watch", "would_restart", "untouched",
         "install_unit", "done", "end", "would_stop")
STEP_ROWS = [
    # (entry, intent, read, install, settings) -> the steps that are true
    ("a deploy that changes nothing", dict(entry="deploy", release="r1"), proved(), NO_CHANGE, {}, {"end"}),
    ("a new release", dict(entry="deploy", release="r2"), proved(), NO_CHANGE, {}, {"run_job", "start_job"}),
    ("a new release, watched, the node's view read", dict(entry="deploy", release="r2"), proved(), NO_CHANGE,
     dict(watch_s=60, gpu_host_view=True),
     {"run_job", "start_job", "node_view_before", "node_view_after", "watch"}),
    ("a new release in check mode", dict(entry="deploy", release="r2"), proved(), NO_CHANGE,
     dict(check_mode=True, watch_s=60, gpu_host_view=True), {"would_restart"}),
    ("only the enablement changes", dict(entry="deploy", release="r1"), proved(),
     dict(NO_CHANGE, enabled_changed=True, changed=True), {}, {"untouched", "install_unit"}),
    ("only the enablement changes, check mode", dict(entry="deploy", release="r1"), proved(),
     dict(NO_CHANGE, enabled_changed=True, changed=True), dict(check_mode=True), {"untouched"}),
    ("a restart is never watched (trainer_watch_s is a deploy's)", dict(entry="restart"), proved(), None,
     dict(watch_s=60), {"run_job", "start_job"}),
    ("a stop: the node's view before it, none after", dict(entry="stop"), proved(), None, dict(gpu_host_view=True),
     {"run_job", "start_job", "node_view_before"}),
    ("a stop in check mode", dict(entry="stop"), proved(), None, dict(check_mode=True), {"would_stop"}),
    ("a refused rollback", dict(entry="rollback"), proved(), None, dict(gpu_host_view=True), set()),
]


@pytest.mark.parametrize("name,intent,status,install,settings,want", STEP_ROWS, ids=[r[0] for r in STEP_ROWS])
def test_the_steps_past_the_first_read(name, intent, status, install, settings, want):
    plan = make_plan(intent, status, install, settings=dict(SETTINGS, **settings))
    assert {s for s in STEPS if plan[s] is True} == want, name
    assert all(isinstance(plan[s], bool) for s in STEPS)  # a `when:` reads each as it is


def test_the_job_a_run_starts_is_a_restart_or_a_stop_with_its_reasons():
    stop = make_plan({"entry": "stop", "disable": True}, proved(), settings=SETTINGS)
    assert (stop["job_operation"], stop["reasons"], stop["disable"], stop["restart"]) == (
        "stop", ["stop requested"], True, False)
    assert make_plan({"entry": "stop"}, proved(), settings=SETTINGS)["disable"] is False
    for intent in ({"entry": "restart"}, {"entry": "deploy", "release": "r2"}, {"entry": "start"}):
        plan = make_plan(intent, proved(), NO_CHANGE, settings=SETTINGS)
        assert plan["job_operation"] == "start" and plan["disable"] is False, intent


def test_the_steps_without_settings_are_booleans_too():
    plan = make_plan({"entry": "restart"}, proved())
    assert plan["run_job"] is True and plan["watch"] is False and plan["node_view_before"] is False


def test_the_first_reads_report():
    from ansible_collections.dflash.trainer.plugins.module_utils.plan.first_read import read_report
    read = dict(proved(), main_pid=42, seconds_since_start=7)
    no_op = make_plan({"entry": "deploy", "release": "r1"}, read, NO_CHANGE, settings=SETTINGS)
    assert read_report("deploy", no_op, read, "t") == ["t left running: release r1 unchanged, pid 42, up 7 s"]
    enable = make_plan({"entry": "deploy", "release": "r1"}, read, dict(NO_CHANGE, enabled_changed=True, changed=True),
                       settings=SETTINGS)
    assert read_report("deploy", enable, read, "t") == ["t left running: release r1 unchanged, pid 42, up 7 s"]
    stop = make_plan({"entry": "stop", "disable": True}, dict(read, active_state="active", running_release="r1"),
                     settings=dict(SETTINGS, check_mode=True))
    assert read_report("stop", stop, dict(read, active_state="active", running_release="r1"), "t") == [
        "would stop t (active, pid 42, release r1) and disable it"]
    check = make_plan({"entry": "deploy", "release": "r2"}, read, NO_CHANGE, settings=dict(SETTINGS, check_mode=True))
    assert read_report("deploy", check, read, "t") == [
        "would restart t: release switched to r2; running release r1 is not current r2"]
    assert read_report("deploy", make_plan({"entry": "deploy", "release": "r2"}, read, NO_CHANGE, settings=SETTINGS),
                       read, "t") == []
    start = make_plan({"entry": "start"}, read, settings=SETTINGS)
    assert read_report("start", start, read, "t") == [
        "t already runs its proved release: %s (pid 42); nothing was started - left running (a restart: "
        "playbooks/restart.yml)" % HEALTHY["words"]]
