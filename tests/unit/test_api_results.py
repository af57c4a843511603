"""dflash_trainer.results: typed per-host results built from recorded ansible-runner events.

Pure: the fixtures under fixtures/runner_events are event lists (see their README); no runner, no lab.
"""
import copy
import json
import os

import pytest

from dflash_trainer import api
from dflash_trainer.__main__ import describe, main, parse_extravar
from dflash_trainer.results import HostResult, Proof, RunResult, TrainerStatus, build_run_result

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "runner_events")
GOOD, BAD = "dda2287ea665b415", "f46db2d746e6dc57"


def events(name):
    with open(os.path.join(FIXTURES, name + ".json")) as fh:
        return json.load(fh)


def build(name, rc=0, status="successful"):
    return build_run_result(events(name), rc=rc, status=status)


def test_status_recorded_from_the_lab():
    r = build("status_ok")
    assert (r.ok, r.rc, r.status, list(r.hosts)) == (True, 0, "successful", ["gpu-host"])
    h = r.hosts["gpu-host"]
    assert (h.ok, h.changed, h.failed_task, h.reason, h.restarted, h.rolled_back, h.proof) == \
        (True, False, None, None, False, False, None)
    assert h.status == TrainerStatus(
        active=False, active_state="inactive", sub_state="dead", main_pid=0, n_restarts=0, running_release=None,
        current_release=GOOD, last_good=None, drift=False, gpus_mib={i: 0 for i in range(8)},
        last_progress_line=None, tok_s=None, seconds_since_start=None)
    assert r.stats["ok"] == {"gpu-host": 4}


def test_deploy_that_restarted_and_proved():
    h = build("deploy_restarted_proved").hosts["gpu-host"]
    assert h.ok and h.changed and h.restarted and not h.rolled_back
    assert (h.failed_task, h.reason, h.log_tail) == (None, None, [])
    # the release step did not switch (same content): release == previous; mark_good does not count
    assert (h.release, h.previous_release) == (GOOD, GOOD)
    assert h.proof == Proof(
        release=GOOD, invocation_id="5944fd1aede64fa2bb6a1a0b32a7c2e6", main_pid=2604,
        gpus_mib={0: 60000, 1: 60000, 2: 60000, 3: 60000, 4: 60000, 5: 30000, 6: 30000, 7: 30000},
        matched_line="step=12 loss=7.9080 tok/s=42145.5 queue_target=10 queue_drafter=1",
        tok_s=42145.5, step=12, seconds_to_ready=14.017)
    # the last trainer_status of a deploy is the read after the stop
    assert h.status.active is False and h.status.active_state == "inactive"


def test_rescued_failure_is_not_the_reason_the_final_fail_is():
    r = build("deploy_start_failed_no_rollback", rc=2, status="failed")
    assert not r.ok and r.failed_hosts == ["gpu-host"]
    h = r.hosts["gpu-host"]
    assert not h.ok and h.failed_task == "Fail without rollback"
    assert h.reason.startswith("Unable to start unit dflash-trainer: Job for dflash-trainer.service failed")
    assert "No rollback:" in h.reason
    assert not h.restarted and not h.rolled_back and h.proof is None
    assert (h.release, h.previous_release) == (BAD, GOOD)
    assert r.stats["rescued"] == {"gpu-host": 1}


def test_failed_proof_rolled_back_and_proved_the_last_good_release():
    r = build("deploy_ready_failed_rolled_back", rc=2, status="failed")
    h = r.hosts["gpu-host"]
    assert not r.ok and not h.ok
    assert h.failed_task == "Fail the deploy, saying what failed and what runs now"
    assert h.reason.startswith("trainer exited with status 1 after 0.6 s: ModuleNotFoundError")
    assert "Rolled back: the last good release %s runs again" % GOOD in h.reason
    assert h.rolled_back and h.restarted
    assert (h.release, h.previous_release) == (GOOD, BAD)  # what current points at now, and what was rolled off
    assert h.proof.release == GOOD and h.proof.main_pid == 4242 and h.proof.step == 13  # the rollback's proof
    assert h.log_tail[-1] == "ModuleNotFoundError: No module named 'flash_attn'"  # the failed start's log
    assert h.status.current_release == BAD and h.status.last_good == GOOD


def test_rollback_without_invocation_is_recognised_by_its_keys():
    h = build("rollback_named_release").hosts["gpu-host"]
    assert h.ok and h.rolled_back and h.restarted
    assert (h.release, h.previous_release) == (GOOD, BAD)
    assert h.proof.tok_s == pytest.approx(41987.2) and h.proof.seconds_to_ready == pytest.approx(13.8)


def test_unreachable_host_and_lenient_values():
    r = build("status_two_hosts_one_unreachable", rc=4, status="failed")
    assert sorted(r.hosts) == ["lab-200", "lab-201"] and not r.ok and r.failed_hosts == ["lab-201"]
    up, down = r.hosts["lab-200"], r.hosts["lab-201"]
    assert up.ok and up.status.active and up.status.drift and up.status.main_pid == 4242
    assert up.status.gpus_mib == {0: 70000, 1: 70000}  # "70000" converted, null dropped
    assert (up.status.running_release, up.status.current_release, up.status.n_restarts) == (BAD, GOOD, 2)
    assert not down.ok and down.status is None
    assert down.failed_task == "Read the trainer's state"
    assert down.reason.startswith("Failed to connect to the host via pct: 201 is not running")


def test_no_recap_means_no_host_is_ok():
    r = build("deploy_timeout_no_recap", rc=254, status="timeout")
    h = r.hosts["gpu-host"]
    assert not r.ok and r.stats == {} and not h.ok and h.restarted
    assert h.reason == "the run ended without a play recap (runner status: timeout)"


def test_an_ok_recap_with_a_bad_runner_status_is_not_ok():
    assert not build("status_ok", rc=1, status="failed").ok
    assert build("status_ok", rc=None, status=None).ok


def test_no_host_matched_is_not_ok():
    recap = [{"event": "playbook_on_stats", "event_data": {"ok": {}, "failures": {}, "dark": {}}}]
    r = build_run_result(recap, rc=0, status="successful")
    assert r.hosts == {} and not r.ok
    assert "no host was processed" in describe(r)


@pytest.mark.parametrize("mutate", [
    lambda e: e["event_data"].pop("res"),
    lambda e: e["event_data"].update(res="not a dict"),
    lambda e: e["event_data"]["res"].update(proof=None),
    lambda e: e["event_data"]["res"].update(proof={"gpus_mib": ["x"], "step": "n/a", "tok_s": True}),
    lambda e: e.pop("event_data"),
])
def test_missing_or_malformed_keys_do_not_raise(mutate):
    evs = events("deploy_restarted_proved")
    ready = [e for e in evs if e["event_data"].get("resolved_action") == "dflash.trainer.trainer_ready"][-1]
    mutate(ready)
    r = build_run_result(evs + [None, "junk", {"event": "runner_on_ok"}], rc=0, status="successful")
    h = r.hosts["gpu-host"]
    assert h.ok
    assert h.proof is None or (h.proof.step is None and h.proof.tok_s is None and h.proof.gpus_mib is None)


def test_short_action_names_and_task_action_fallback():
    evs = copy.deepcopy(events("status_ok"))
    for e in evs:
        d = e["event_data"]
        if d.get("resolved_action") == "dflash.trainer.trainer_status":
            d.pop("resolved_action")
            d["task_action"] = "trainer_status"
    assert build_run_result(evs, rc=0, status="successful").hosts["gpu-host"].status.current_release == GOOD


def test_ignored_failures_are_not_the_reason():
    evs = events("deploy_start_failed_no_rollback")
    last_fail = [e for e in evs if e["event"] == "runner_on_failed"][-1]
    last_fail["event_data"]["ignore_errors"] = True
    h = build_run_result(evs, rc=2, status="failed").hosts["gpu-host"]
    assert h.failed_task == "Start the trainer and record this activation"


def test_failed_loop_item_gives_the_reason():
    task = {"host": "h", "task": "t", "task_action": "ansible.builtin.file"}
    evs = [
        {"event": "runner_item_on_failed", "event_data": dict(task, res={"failed": True, "msg": "item 2 broke"})},
        {"event": "runner_on_failed", "event_data": dict(task, res={
            "msg": "One or more items failed",
            "results": [{"failed": False}, {"failed": True, "msg": "item 2 broke"}]})},
        {"event": "playbook_on_stats", "event_data": {"failures": {"h": 1}}},
    ]
    h = build_run_result(evs).hosts["h"]
    assert (h.ok, h.failed_task, h.reason) == (False, "t", "item 2 broke")


def test_to_dict_is_json_ready():
    r = build("deploy_ready_failed_rolled_back", rc=2, status="failed")
    d = json.loads(json.dumps(r.to_dict()))
    assert d["hosts"]["gpu-host"]["proof"]["gpus_mib"]["0"] == 60000
    assert d["hosts"]["gpu-host"]["rolled_back"] is True and d["ok"] is False
    assert isinstance(r, RunResult) and isinstance(r.hosts["gpu-host"], HostResult)


# --- the runner call (no runner is started) -------------------------------------------------------

def test_runner_kwargs_defaults_point_at_the_checkout():
    kw = api.runner_kwargs("status", limit="gpu-host", private_data_dir="/tmp/pdd", environ={})
    root = api.REPO_ROOT
    assert kw["playbook"] == os.path.join(root, "playbooks", "status.yml")
    assert kw["project_dir"] == root and kw["private_data_dir"] == "/tmp/pdd"
    assert "inventory" not in kw  # the configured one (ansible.cfg: inventory/lab.yml)
    assert kw["envvars"] == {"ANSIBLE_CONFIG": os.path.join(root, "ansible.cfg"),
                             "ANSIBLE_COLLECTIONS_PATH": os.path.join(root, "collections"),
                             "ANSIBLE_HOST_KEY_CHECKING": "True"}
    assert kw["limit"] == "gpu-host" and kw["quiet"] is True and "timeout" not in kw
    assert api.runner_kwargs("deploy", private_data_dir="p")["playbook"] == os.path.join(root, "deploy.yml")
    for name, path in api.PLAYBOOKS.items():
        if name in ("stop", "start") and not os.path.isfile(os.path.join(root, path)):
            continue  # written beside this package (the role's stop/start entry points): tests/unit/test_api_exit_codes.py
        assert api.runner_kwargs(name, private_data_dir="p")["playbook"] == os.path.join(root, path), name
    monkeypatch_free = dict(api.PLAYBOOKS, nope=os.path.join("playbooks", "nope.yml"))
    saved = api.PLAYBOOKS
    try:
        api.PLAYBOOKS = monkeypatch_free
        with pytest.raises(FileNotFoundError, match="the playbook playbooks/nope.yml is not in the collection"):
            api.runner_kwargs("nope", private_data_dir="p")
    finally:
        api.PLAYBOOKS = saved


def test_rollback_passes_the_release(monkeypatch):
    seen = {}

    def fake_run_playbook(playbook, **kw):
        seen.update(kw, playbook=playbook)
        return RunResult(ok=True, rc=0, status="successful")

    monkeypatch.setattr(api, "run_playbook_live", fake_run_playbook)
    api.rollback("gpu-host", to=GOOD, extravars={"x": 1})
    assert seen["playbook"] == "rollback" and seen["extravars"] == {"x": 1, "trainer_rollback_release": GOOD}
    assert seen["limit"] == "gpu-host"
    api.rollback(release=GOOD, limit="gpu-host")  # the earlier keyword
    assert seen["extravars"] == {"trainer_rollback_release": GOOD}
    api.rollback(limit="gpu-host")
    assert "trainer_rollback_release" not in seen["extravars"]
    with pytest.raises(ValueError, match="name two releases"):
        api.rollback("gpu-host", to=GOOD, release=BAD)


def test_cli(monkeypatch, capsys):
    calls = []

    def run(name, **kw):  # the CLI runs every playbook through run_playbook_live (progress, --check, --diff)
        calls.append((name, kw))
        return build("deploy_ready_failed_rolled_back", rc=2, status="failed")

    monkeypatch.setattr(api, "run_playbook_live", run)
    assert main(["deploy", "-l", "gpu-host", "-e", "trainer_force_restart=true", "-e", '{"trainer_gpus": [0, 1]}']) == 1
    name, kw = calls[-1]
    assert name == "deploy" and kw["limit"] == "gpu-host"
    assert kw["extravars"] == {"trainer_force_restart": "true", "trainer_gpus": [0, 1]}
    out = capsys.readouterr().out
    assert "gpu-host: FAILED" in out and "rolled back" in out and "ModuleNotFoundError" in out
    assert main(["rollback", "-l", "gpu-host", "--release", GOOD, "--json"]) == 1
    assert calls[-1][1]["extravars"]["trainer_rollback_release"] == GOOD
    assert json.loads(capsys.readouterr().out)["hosts"]["gpu-host"]["release"] == GOOD
    with pytest.raises(SystemExit):
        main(["status", "--release", GOOD])


def test_parse_extravar():
    assert parse_extravar("a=1 b=x=y") == {"a": "1", "b": "x=y"}
    assert parse_extravar('{"a": [1]}') == {"a": [1]}
    with pytest.raises(ValueError):
        parse_extravar("novalue")


def _restart_event(result, host="gpu-host"):
    return {"event": "runner_on_ok", "event_data": {
        "host": host, "task": "Watch the restart job", "resolved_action": "dflash.trainer.trainer_restart",
        "res": {"changed": True, "finished": True, "phase": "done", "result": result}}}


def test_restart_job_result_proved():
    from dflash_trainer.results import build_host_results
    proof = {"release": "aaa", "invocation_id": "i", "main_pid": 7, "step": 12, "tok_s": 40000.0,
             "seconds_to_ready": 14.6, "gpus_mib": {"0": 60000}}
    hosts, _recap = build_host_results([_restart_event({"ok": True, "restarted": True, "release": "aaa", "proof": proof})])
    h = hosts["gpu-host"]
    assert h.restarted and not h.rolled_back and h.proof.tok_s == 40000.0 and h.proof.main_pid == 7


def test_restart_job_result_rolled_back():
    from dflash_trainer.results import build_host_results
    proof = {"release": "good", "invocation_id": "j", "main_pid": 9, "step": 12, "tok_s": 41000.0,
             "seconds_to_ready": 14.0, "gpus_mib": {"0": 60000}}
    hosts, _recap = build_host_results([_restart_event({
        "ok": False, "restarted": True, "release": "bad", "rolled_back": True, "rollback_release": "good",
        "rollback_proof": proof, "log_tail": ["Traceback", "ModuleNotFoundError: x"]})])
    h = hosts["gpu-host"]
    assert h.rolled_back and h.release == "good" and h.previous_release == "bad"
    assert h.proof.main_pid == 9 and h.log_tail[-1] == "ModuleNotFoundError: x"


def _status_event(res, host="gpu-host"):
    return {"event": "runner_on_ok", "event_data": {
        "host": host, "task": "Take the deploy lock and read the trainer's state",
        "resolved_action": "dflash.trainer.trainer_status", "res": res}}


@pytest.mark.parametrize("flag", ["no_op", "release_current"])
def test_a_deploy_that_ran_no_release_call_reports_current_as_its_release_and_previous(flag):
    """A no-op (or a forced restart of the current release) ends or skips the release call: the
    release is the one the first read found current, and nothing was switched."""
    from dflash_trainer.results import build_host_results
    res = {"changed": False, "running": True, "current_release": "aaa", "running_release": "aaa", flag: True}
    hosts, _recap = build_host_results([_status_event(res)])
    h = hosts["gpu-host"]
    assert h.release == "aaa" and h.previous_release == "aaa"


def test_a_status_read_alone_names_no_previous_release():
    from dflash_trainer.results import build_host_results
    res = {"changed": False, "running": True, "current_release": "aaa", "running_release": "aaa"}
    hosts, _recap = build_host_results([_status_event(res)])
    assert hosts["gpu-host"].previous_release is None


def test_a_status_read_carries_the_installed_configuration_and_the_rows_of_experiments():
    """trainer_status returns `config` (the installed command and environment's id) and history rows with
    `config` and `vs`; an older result without them reads as an unknown configuration."""
    row = {"release": GOOD, "config": "9e1d4470", "verdict": "proved", "median": 19800.2,
           "vs": {"release": GOOD, "config": "3fa1c2d9", "change_pct": -8.4,
                  "words": "config 9e1d4470 vs 3fa1c2d9: -8% (command or environment changed)"}}
    evs = [{"event": "runner_on_ok", "event_data": {"host": "h", "task": "read", "resolved_action":
            "dflash.trainer.trainer_status", "res": {"running": True, "config": "9e1d4470", "history": [row]}}},
           {"event": "playbook_on_stats", "event_data": {"ok": {"h": 1}}}]
    s = build_run_result(evs).hosts["h"].status
    assert s.config == "9e1d4470" and s.history == [row]
    again = RunResult.from_dict(json.loads(json.dumps(build_run_result(evs).to_dict()))).hosts["h"].status
    assert again.config == "9e1d4470" and again.history[0]["vs"]["config"] == "3fa1c2d9"
    assert TrainerStatus.from_result({"running": False}).config is None
