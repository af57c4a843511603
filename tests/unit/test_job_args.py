"""The restart job's settings are written once (roles/trainer/vars/main.yml: __trainer_job_args): the first
read's `job` (trainer_begin starts a restart of what is on the target in its own call) and the call that
starts the job after an upload (restart_and_prove.yml) pass the same values, and trainer_begin checks them
against trainer_restart's own options (module_utils/_job_start.py: JOB_OPTIONS)."""
import os

import pytest
import yaml

from ansible_collections.dflash.trainer.plugins.module_utils import _job_start as js
from ansible_collections.dflash.trainer.plugins.module_utils._restart_options import RESTART_OPTIONS

from role_tasks import tasks

ROLE = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "trainer")
# what differs on purpose: the node's view is read only on the path with its own start call, the pre-flight's
# release is the plan's (known after the read)
APART = {"preflight", "gpu_foreign_mib"}


def _job_args():
    with open(os.path.join(ROLE, "vars", "main.yml")) as fh:
        return yaml.safe_load(fh)["__trainer_job_args"]


def _start_task_args():
    with open(os.path.join(ROLE, "tasks", "restart_and_prove.yml")) as fh:
        found = [t["dflash.trainer.trainer_restart"] for t in tasks(yaml.safe_load(fh))
                 if (t.get("dflash.trainer.trainer_restart") or {}).get("state") == "start"]
    assert len(found) == 1
    return found[0]


def test_the_start_call_passes_every_job_setting_with_the_same_value():
    job, start = _job_args(), _start_task_args()
    assert set(job) == set(start) - set(js.PLANNED) - {"job_id"}
    for name in set(job) - APART:
        assert str(job[name]) == str(start[name]), name


def test_every_job_setting_is_an_option_of_the_restart_job():
    assert set(_job_args()) <= set(js.JOB_OPTIONS) <= set(RESTART_OPTIONS)
    assert not set(js.PLANNED) & set(js.JOB_OPTIONS)


def _plan(**kw):
    return dict(dict(release="r2", reasons=["forced"], preflight=True, min_tokps_ratio=0.9), **kw)


def test_job_params_take_the_plan_and_the_defaults():
    p = js.job_params({"unit": "t", "preflight": {"command": ["./run.sh"], "unit": "t"}, "lock_token": "tok"},
                      _plan(), "/opt/t", {"install": None, "env_content": "A=1\n", "environment_json": '{"A": "1"}'})
    assert (p["state"], p["release"], p["reasons"], p["min_tokps_ratio"]) == ("start", "r2", ["forced"], 0.9)
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
    """trainer_begin's `job` is templated before the read, the plan and the node's view exist: nothing in it (or
    in the pre-flight settings it names) may read them."""
    with open(os.path.join(ROLE, "vars", "main.yml")) as fh:
        role_vars = yaml.safe_load(fh)
    text = yaml.safe_dump([role_vars["__trainer_job_args"], role_vars["__trainer_preflight_settings"]])
    for later in ("__trainer_node", "__trainer_plan", "__trainer_status_before", "__trainer_release"):
        assert later not in text, later
