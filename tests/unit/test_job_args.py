"""The restart job's settings are written once (roles/trainer/vars/main.yml: __trainer_job_args): the first
read's `job` (trainer_plan starts a restart of what is on the target in its own call) and the call that
starts the job after an upload (run.yml) pass the same values, and trainer_plan checks them
against trainer_restart's own options (module_utils/job/start.py: JOB_OPTIONS); every task that starts a
restart or stop job passes them whole as trainer_restart's `job` (plugin_utils/_job_spec.py) and names only
what differs for it."""
import os

import pytest
import yaml

from ansible_collections.dflash.trainer.plugins.module_utils.job import start as js
from ansible_collections.dflash.trainer.plugins.module_utils.job.options import RESTART_OPTIONS
from ansible_collections.dflash.trainer.plugins.plugin_utils._job_spec import with_job

from role_tasks import tasks

ROLE = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "trainer")


def _job_args():
    with open(os.path.join(ROLE, "vars", "main.yml")) as fh:
        return yaml.safe_load(fh)["__trainer_job_args"]


def _restart_tasks():
    """(file, args) of every trainer_restart task of the role that starts a job (a restart or a stop)."""
    found = []
    for name in sorted(os.listdir(os.path.join(ROLE, "tasks"))):
        with open(os.path.join(ROLE, "tasks", name)) as fh:
            for t in tasks(yaml.safe_load(fh)):
                args = t.get("dflash.trainer.trainer_restart")
                if args is not None and args.get("operation", "start") in ("start", "stop"):
                    found.append((name, args))
    return found


def test_every_call_that_starts_a_job_takes_the_job_settings_whole_and_writes_none_again():
    job, calls = _job_args(), _restart_tasks()
    assert {f for f, _a in calls} == {"run.yml", "stop.yml", "group.yml"}, calls
    for name, args in calls:
        assert args.get("job") == "{{ __trainer_job_args }}", name
        # what a call names beside the job is what differs for it: never a setting copied with the same value
        same = sorted(k for k in set(args) & set(job) if str(args[k]) == str(job[k]))
        assert not same, (name, same)


def test_the_first_reads_job_is_the_same_settings():
    with open(os.path.join(ROLE, "tasks", "plan.yml")) as fh:
        begin = [t["dflash.trainer.trainer_plan"] for t in tasks(yaml.safe_load(fh)) if "dflash.trainer.trainer_plan" in t]
    assert [b["job"] for b in begin] == ["{{ __trainer_job_args }}"]


def test_every_job_setting_is_an_option_of_the_restart_job():
    assert set(_job_args()) <= set(js.JOB_OPTIONS) <= set(RESTART_OPTIONS)
    assert not set(js.PLANNED) & set(js.JOB_OPTIONS)


def _plan(**kw):
    return dict(dict(release="r2", reasons=["forced"], preflight=True, min_tokps_ratio=0.9), **kw)


def test_job_params_take_the_plan_and_the_defaults():
    p = js.job_params({"unit": "t", "preflight": {"command": ["./run.sh"], "unit": "t"}, "lock_token": "tok"},
                      _plan(), "/opt/t", {"install": None, "env_content": "A=1\n", "environment_json": '{"A": "1"}'})
    assert (p["operation"], p["release"], p["reasons"], p["min_tokps_ratio"]) == ("start", "r2", ["forced"], 0.9)
    assert p["preflight"]["release_dir"] == "/opt/t/releases/r2" and p["preflight"]["timeout_s"] == 60
    assert p["environment_json"] == '{"A": "1"}' and p["env_content"] == "A=1\n"
    assert p["job_id"].startswith("tok-") and len(p["job_id"]) == len("tok-") + 8
    assert p["hold_s"] == RESTART_OPTIONS["hold_s"]["default"] and p["wait_s"] == 0
    assert js.job_params({"unit": "t", "preflight": {"command": ["x"], "unit": "t"}}, _plan(preflight=False),
                         "/opt/t", {})["preflight"] is None


@pytest.mark.parametrize("job, words", [
    ({"unit": "t", "hold_s": "long"}, "hold_s"),
    ({"unit": "t", "no_such_option": 1}, "no_such_option"),
    ({"unit": "t", "proof": {"hold_z": 1}}, "hold_z"),
])
def test_a_wrong_job_setting_starts_nothing_and_says_which(job, words):
    out = js.start_planned(None, _plan(), job, "/opt/t", {}, None)
    assert out["failed"] and out["not_started"] and out["lock_holder"] == "play" and words in out["msg"]


def test_the_job_settings_are_known_before_the_first_read():
    """trainer_plan's `job` is templated before the read, the plan and the node's view exist: nothing in it (or
    in the pre-flight settings it names) may read them."""
    with open(os.path.join(ROLE, "vars", "main.yml")) as fh:
        role_vars = yaml.safe_load(fh)
    text = yaml.safe_dump([role_vars["__trainer_job_args"], role_vars["__trainer_preflight_settings"]])
    for later in ("__trainer_node", "__trainer_plan", "__trainer_status_before", "__trainer_release"):
        assert later not in text, later


def test_a_job_spreads_under_the_tasks_own_options():
    got = with_job({"operation": "start", "job": {"unit": "t", "wait_s": 10, "preflight": {"command": ["x"]}},
                    "wait_s": 30, "release": "r1"})
    assert got == {"operation": "start", "unit": "t", "wait_s": 30, "preflight": {"command": ["x"]}, "release": "r1"}
    assert with_job({"operation": "wait", "job_id": "j"}) == {"operation": "wait", "job_id": "j"}


def test_a_stop_takes_no_start_only_setting_from_the_job():
    got = with_job({"operation": "stop", "job": {"unit": "t", "preflight": {"command": ["x"]}, "enable": True}})
    assert got == {"operation": "stop", "unit": "t"}


@pytest.mark.parametrize("job, words", [
    ({"unit": "t", "release": "r9"}, "release is no setting of the restart job"),
    ({"unit": "t", "job": {}, "nope": 1}, "job, nope are no setting of the restart job"),
    (["unit"], "job must be a dictionary of the restart job's settings, got list"),
])
def test_a_job_that_is_not_the_jobs_settings_is_refused_saying_what(job, words):
    with pytest.raises(ValueError) as exc:
        with_job({"operation": "start", "job": job})
    assert words in str(exc.value)
