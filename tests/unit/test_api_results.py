"""dflash_trainer.results: typed per-host results built from recorded ansible-runner events.

Pure: the fixtures under fixtures/runner_events are event lists (see their README); no runner, no lab.
"""
import copy
import json
import os

import pytest

from dflash_trainer import api
from dflash_trainer.__main__ import describe, main, parse_extravar
from dflash_trainer.results import HostResult, RunResult, TrainerStatus, build_run_result

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "runner_events")


def events(name):
    with open(os.path.join(FIXTURES, name + ".json")) as fh:
        return json.load(fh)


def plan(name, host="gpu-host"):
    """The run's plan as trainer_plan returned it: the fixture's own word for the release the run brings."""
    for e in events(name):
        d = e["event_data"]
        if e["event"] == "runner_on_ok" and d.get("host") == host and \
                d.get("resolved_action") == "dflash.trainer.trainer_plan":
            return d["res"]["plan"]
    raise AssertionError("%s: no trainer_plan result for %s" % (name, host))


# the releases of the recorded runs (record.py): the stand-in trainer, a second release of it, one whose
# trainer fails at import
FIRST = plan("deploy_first_proved")["release"]
SECOND = plan("deploy_restarted_proved")["release"]
BAD = plan("deploy_ready_failed_rolled_back")["release"]


def build(name, rc=0, status="successful"):
    return build_run_result(events(name), rc=rc, status=status)


def assert_proved(h, release):
    p = h.proof
    assert p is not None and p.release == release and p.main_pid > 0 and p.step >= 1 and p.tok_s > 0, p
    assert len(p.invocation_id) == 32 and p.seconds_to_ready > 0 and "tok/s=" in p.matched_line
    assert sorted(p.gpus_mib) == list(range(8)) and min(p.gpus_mib.values()) >= 1024


def test_status_recorded_from_the_lab():
    r = build("status_ok")
    assert (r.ok, r.rc, r.status, list(r.hosts)) == (True, 0, "successful", ["gpu-host"])
    h = r.hosts["gpu-host"]
    assert (h.ok, h.changed, h.failed_task, h.reason, h.restarted, h.rolled_back, h.proof) == \
        (True, False, None, None, False, False, None)
    s = h.status
    assert s.active and (s.active_state, s.sub_state) == ("active", "running") and s.main_pid > 0
    assert s.running_release == s.current_release == s.last_good == FIRST and s.drift is False
    assert sorted(s.gpus_mib) == list(range(8)) and min(s.gpus_mib.values()) >= 1024
    assert "tok/s=" in s.last_progress_line and s.tok_s > 0 and s.health["ok"] is True
    assert h.verdict("status") == "healthy" and r.stats["failures"] == {}


def test_first_deploy_restarted_and_proved():
    h = build("deploy_first_proved").hosts["gpu-host"]
    assert h.ok and h.changed and h.restarted and not h.rolled_back
    assert (h.failed_task, h.reason, h.log_tail) == (None, None, [])
    assert (h.release, h.previous_release) == (FIRST, None)  # nothing was current before
    assert_proved(h, FIRST)
    assert "trainer not running" in h.reasons and h.outcome.startswith("ready: release %s proved" % FIRST)
    assert h.verdict("deploy") == "proved" and h.elapsed_s > 0


def test_deploy_of_a_new_release_restarted_proved_and_compared():
    h = build("deploy_restarted_proved").hosts["gpu-host"]
    assert h.ok and h.restarted and not h.rolled_back
    assert (h.release, h.previous_release) == (SECOND, FIRST)
    assert_proved(h, SECOND)
    assert h.reasons[0] == "release switched to %s" % SECOND
    assert h.comparison["previous_release"] == FIRST and h.comparison["words"].startswith("release %s" % SECOND)
    assert h.config and h.config == h.previous_config  # the same command and environment
    assert h.figures["tok_s"]["n"] >= 1


def test_a_deploy_that_changes_nothing():
    r = build("deploy_no_op")
    h = r.hosts["gpu-host"]
    assert h.ok and not h.changed and not h.restarted and h.proof is None and h.reasons == []
    assert (h.release, h.previous_release) == (FIRST, FIRST)  # the release current points at, not switched
    assert h.verdict("deploy") == "unchanged" and r.exit_code == 0


def test_failed_proof_rolled_back_and_proved_the_last_good_release():
    r = build("deploy_ready_failed_rolled_back", rc=2, status="failed")
    h = r.hosts["gpu-host"]
    assert not r.ok and not h.ok and not h.refused
    assert h.failed_task == "Fail, saying what failed and what runs now"
    assert h.reason.startswith("trainer exited with status 1 after ") and \
        "ModuleNotFoundError: No module named 'flash_attn'" in h.reason
    assert h.rolled_back and h.restarted
    assert (h.release, h.previous_release) == (SECOND, BAD)  # what current points at now, and what was rolled off
    assert_proved(h, SECOND)  # the rollback's proof
    assert h.log_tail[-1] == "ModuleNotFoundError: No module named 'flash_attn'"  # the failed start's log
    assert h.status.current_release == h.status.last_good == SECOND  # the read before the restart


def test_a_failed_start_with_no_release_to_roll_back_to():
    r = build("deploy_start_failed_no_rollback", rc=2, status="failed")
    assert not r.ok and r.failed_hosts == ["spare-host"]
    h = r.hosts["spare-host"]
    assert h.failed_task == "Fail, saying what failed and what runs now"
    assert h.reason.startswith("trainer exited with status 1 after ") and "flash_attn" in h.reason
    assert h.outcome.startswith("No rollback: no other release")
    assert not h.rolled_back and h.proof is None and h.log_tail[-1].endswith("No module named 'flash_attn'")
    assert (h.release, h.previous_release) == (BAD, None)
    assert r.stats["rescued"] == {} and h.exit_code == 1


def test_rollback_to_a_named_release():
    h = build("rollback_named_release").hosts["gpu-host"]
    assert h.ok and h.rolled_back and h.restarted
    assert (h.release, h.previous_release) == (FIRST, SECOND)
    assert_proved(h, FIRST)
    assert h.reasons == ["rollback from %s to %s" % (SECOND, FIRST)]


def test_stop_start_and_the_status_between():
    stop = build("stop_ok").hosts["gpu-host"]
    assert stop.ok and stop.changed and not stop.restarted and stop.proof is None
    assert stop.outcome.startswith("stopped dflash-trainer: release %s" % FIRST) and "GPUs drained" in stop.outcome
    stopped = build("status_stopped").hosts["gpu-host"]
    assert stopped.ok and not stopped.status.active and stopped.verdict("status") == "stopped"
    start = build("start_proved").hosts["gpu-host"]
    assert start.ok and start.restarted and (start.release, start.previous_release) == (FIRST, FIRST)
    assert_proved(start, FIRST)
    assert start.reasons[0].startswith("start requested (stopped on purpose by ")


def test_status_of_two_hosts_one_not_running():
    r = build("status_two_hosts_one_unhealthy", rc=2, status="failed")
    assert sorted(r.hosts) == ["gpu-host", "spare-host"] and not r.ok and r.failed_hosts == ["spare-host"]
    up, down = r.hosts["gpu-host"], r.hosts["spare-host"]
    assert up.ok and up.status.active and up.status.running_release == FIRST
    assert not down.ok and not down.unreachable and down.status.active is False
    assert down.failed_task == "Fail unless the trainer runs its proved release healthily"
    assert down.reason.startswith("dflash-trainer is not running its proved release healthily: not running")
    assert down.verdict("status") == "unhealthy" and r.exit_code == 1


def test_unreachable_host():
    r = build("status_two_hosts_one_unreachable", rc=4, status="failed")
    assert sorted(r.hosts) == ["gone-host", "gpu-host"] and not r.ok and r.failed_hosts == ["gone-host"]
    up, down = r.hosts["gpu-host"], r.hosts["gone-host"]
    assert up.ok and up.status.active and sorted(up.status.gpus_mib) == list(range(8))
    assert not down.ok and down.unreachable and down.status is None and not down.refused
    assert "no container" in down.reason, down.reason
    assert r.exit_code == 3


def test_no_recap_means_no_host_is_ok():
    r = build("deploy_timeout_no_recap", rc=254, status="timeout")
    h = r.hosts["gpu-host"]
    assert not r.ok and r.stats == {} and not h.ok and r.exit_code == 1
    assert h.reason == "the run ended without a play recap (runner status: timeout)"
    assert h.reasons and not h.restarted and h.proof is None  # the job was started; its outcome was not seen


def test_an_ok_recap_with_a_bad_runner_status_is_not_ok():
    assert not build("status_ok", rc=1, status="failed").ok
    assert build("status_ok", rc=None, status=None).ok


def test_no_host_matched_is_not_ok():
    recap = [{"event": "playbook_on_stats", "event_data": {"ok": {}, "failures": {}, "dark": {}}}]
    r = build_run_result(recap, rc=0, status="successful")
    assert r.hosts == {} and not r.ok
    assert "no host was processed" in describe(r)


def _job_events(evs):
    """The events of the restart job's calls that saw it end (each carries its result)."""
    found = [e for e in evs if e["event_data"].get("resolved_action") == "dflash.trainer.trainer_restart"
             and e["event_data"].get("res", {}).get("finished")]
    assert found
    return found


@pytest.mark.parametrize("mutate", [
    lambda e: e["event_data"].pop("res"),
    lambda e: e["event_data"].update(res="not a dict"),
    lambda e: e["event_data"]["res"].update(result="not a dict"),
    lambda e: e["event_data"]["res"]["result"].update(proof=None),
    lambda e: e["event_data"]["res"]["result"].update(proof={"gpus_mib": ["x"], "step": "n/a", "tok_s": True}),
    lambda e: e.pop("event_data"),
])
def test_missing_or_malformed_keys_do_not_raise(mutate):
    evs = events("deploy_restarted_proved")
    for job in _job_events(evs):  # the call that started the job and the watch, when the job ended within the first
        mutate(job)
    r = build_run_result(evs + [None, "junk", {"event": "runner_on_ok"}], rc=0, status="successful")
    h = r.hosts["gpu-host"]
    assert h.ok
    assert h.proof is None or (h.proof.step is None and h.proof.tok_s is None and h.proof.gpus_mib is None)


def test_short_action_names_and_task_action_fallback():
    evs = copy.deepcopy(events("status_ok"))
    seen = 0
    for e in evs:
        d = e["event_data"]
        if d.get("resolved_action") == "dflash.trainer.trainer_status":
            d.pop("resolved_action")
            d["task_action"] = "trainer_status"
            seen += 1
    assert seen
    assert build_run_result(evs, rc=0, status="successful").hosts["gpu-host"].status.current_release == FIRST


def test_ignored_failures_are_not_the_reason():
    evs = events("deploy_ready_failed_rolled_back")
    last_fail = [e for e in evs if e["event"] == "runner_on_failed"][-1]
    last_fail["event_data"]["ignore_errors"] = True
    h = build_run_result(evs, rc=2, status="failed").hosts["gpu-host"]
    assert not h.ok and h.failed_task is None and h.reason is None  # the recap still counts a failure


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


def test_shapes_the_role_no_longer_produces_are_not_read():
    """The standalone proof and start modules, a release rollback and a lock refused by the status read
    are gone from the collection: their results say nothing of the run."""
    proof = {"release": "r", "main_pid": 7, "step": 3, "tok_s": 1.0}
    evs = [{"event": "runner_on_ok", "event_data": {"host": "h", "task": "t", "resolved_action": action, "res": res}}
           for action, res in (("dflash.trainer.trainer_ready", {"ready": True, "proof": proof}),
                               ("dflash.trainer.trainer_start", {"changed": True, "started": True}),
                               ("dflash.trainer.trainer_release", {"changed": True, "switched": True,
                                                                   "release": "r", "previous": "p"}))]
    evs.append({"event": "runner_on_failed", "event_data": {"host": "h", "task": "read", "resolved_action":
                "dflash.trainer.trainer_status", "res": {"lock_refused": True, "msg": "held"}}})
    h = build_run_result(evs + [{"event": "playbook_on_stats", "event_data": {"failures": {"h": 1}}}]).hosts["h"]
    assert h.proof is None and not h.restarted and not h.rolled_back and not h.refused
    assert h.previous_release is None and h.exit_code == 1  # no switch was read from the release module


def test_to_dict_is_json_ready():
    r = build("deploy_ready_failed_rolled_back", rc=2, status="failed")
    d = json.loads(json.dumps(r.to_dict()))
    assert d["hosts"]["gpu-host"]["proof"]["gpus_mib"]["0"] >= 1024
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
    api.rollback("gpu-host", to=SECOND, extravars={"x": 1})
    assert seen["playbook"] == "rollback" and seen["extravars"] == {"x": 1, "trainer_rollback_release": SECOND}
    assert seen["limit"] == "gpu-host"
    api.rollback(release=SECOND, limit="gpu-host")  # the earlier keyword
    assert seen["extravars"] == {"trainer_rollback_release": SECOND}
    api.rollback(limit="gpu-host")
    assert "trainer_rollback_release" not in seen["extravars"]
    with pytest.raises(ValueError, match="name two releases"):
        api.rollback("gpu-host", to=SECOND, release=BAD)


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
    assert main(["rollback", "-l", "gpu-host", "--release", SECOND, "--json"]) == 1
    assert calls[-1][1]["extravars"]["trainer_rollback_release"] == SECOND
    assert json.loads(capsys.readouterr().out)["hosts"]["gpu-host"]["release"] == SECOND
    with pytest.raises(SystemExit):
        main(["status", "--release", SECOND])


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


def _begin_event(res, host="gpu-host"):
    return {"event": "runner_on_ok", "event_data": {
        "host": host, "task": "Take the deploy lock, read the trainer's state and the GPUs, and plan the run",
        "resolved_action": "dflash.trainer.trainer_plan", "res": res}}


@pytest.mark.parametrize("no_op", [True, False])
def test_a_deploy_that_uploads_nothing_reports_current_as_its_release_and_previous(no_op):
    """A no-op (or a forced restart of the current release: no upload) runs no release call: the
    release is the one the first read found current, and nothing was switched."""
    from dflash_trainer.results import build_host_results
    res = {"changed": False, "running": True, "current_release": "aaa", "running_release": "aaa",
           "plan": {"entry": "deploy", "release": "aaa", "no_op": no_op, "upload": False, "restart": not no_op}}
    hosts, _recap = build_host_results([_begin_event(res)])
    h = hosts["gpu-host"]
    assert h.release == "aaa" and h.previous_release == "aaa"


def test_a_status_read_alone_names_no_previous_release():
    from dflash_trainer.results import build_host_results
    res = {"changed": False, "running": True, "current_release": "aaa", "running_release": "aaa"}
    hosts, _recap = build_host_results([{"event": "runner_on_ok", "event_data": {
        "host": "gpu-host", "task": "read", "resolved_action": "dflash.trainer.trainer_status", "res": res}}])
    assert hosts["gpu-host"].previous_release is None


def test_a_status_read_carries_the_installed_configuration_and_the_rows_of_experiments():
    """trainer_status returns `config` (the installed command and environment's id) and history rows with
    `config` and `vs`; an older result without them reads as an unknown configuration."""
    row = {"release": SECOND, "config": "9e1d4470", "verdict": "proved", "median": 19800.2,
           "vs": {"release": SECOND, "config": "3fa1c2d9", "change_pct": -8.4,
                  "words": "config 9e1d4470 vs 3fa1c2d9: -8% (command or environment changed)"}}
    evs = [{"event": "runner_on_ok", "event_data": {"host": "h", "task": "read", "resolved_action":
            "dflash.trainer.trainer_status", "res": {"running": True, "config": "9e1d4470", "history": [row]}}},
           {"event": "playbook_on_stats", "event_data": {"ok": {"h": 1}}}]
    s = build_run_result(evs).hosts["h"].status
    assert s.config == "9e1d4470" and s.history == [row]
    again = RunResult.from_dict(json.loads(json.dumps(build_run_result(evs).to_dict()))).hosts["h"].status
    assert again.config == "9e1d4470" and again.history[0]["vs"]["config"] == "3fa1c2d9"
    assert TrainerStatus.from_result({"running": False}).config is None


def test_a_trainer_groups_status_as_a_whole_is_read_and_described():
    words = "trainer group tg: not proved as one - g1: runs r1"
    fact = {"__trainer_group_status": {"ok": False, "words": words, "members": ["g1"]}}
    judged = {"host": "g0", "task": "Judge the trainer group as a whole", "resolved_action": "ansible.builtin.set_fact",
              "res": {"ansible_facts": fact}}
    evs = [{"event": "runner_on_ok", "event_data": judged},
           {"event": "playbook_on_stats", "event_data": {"ok": {"g0": 1}}}]
    h = build_run_result(evs).hosts["g0"]
    assert h.group == {"ok": False, "words": words, "members": ["g1"]}
    assert "  " + words in describe(build_run_result(evs)).splitlines()
    assert HostResult.from_dict(json.loads(json.dumps(h.to_dict()))).group == h.group


def _status_run(host, read_res, verdict_res, fail_msg=None):
    """The events of playbooks/status.yml on one host, of the role's tasks as they are now: the read (which checks the
    inputs first), status's verdict (a trainer_status result with group_status, reading nothing), the show, the fail."""
    def ev(name, task, action, res):
        return {"event": name, "event_data": {"host": host, "task": task, "resolved_action": action, "res": res}}
    evs = [ev("runner_on_ok", "Read the trainer's state", "dflash.trainer.trainer_status", read_res),
           ev("runner_on_ok", "Judge the trainer and its group", "dflash.trainer.trainer_status", verdict_res),
           ev("runner_on_ok", "Show the trainer's state", "ansible.builtin.debug", {"msg": verdict_res["lines"]})]
    fail = "Fail unless the trainer runs its proved release healthily"
    if fail_msg is None:
        evs.append(ev("runner_on_skipped", fail, "ansible.builtin.fail", {"skipped": True}))
    else:
        evs.append(ev("runner_on_failed", fail, "ansible.builtin.fail", {"failed": True, "msg": fail_msg}))
    evs.append({"event": "playbook_on_stats", "event_data": {"ok": {host: 3}, "failures": {host: 1} if fail_msg else {}}})
    return evs


def test_status_read_with_its_own_check_and_its_verdict_the_api_reads_the_read_and_the_group():
    """Status's verdict task (a trainer_status result carrying group_status - null for a host of no group) is no read:
    the status is the read's; a member's group is the fact the verdict sets; the one fail task's message is the
    reason; a read refused by its own input check (input_refused) is a refusal, exit 2, any other failed read 1."""
    read = {"running": True, "active_state": "active", "running_release": "r1", "current_release": "r1",
            "last_good": "r1", "health": {"ok": True, "words": "running release r1"}, "as_expected": True,
            "in_group": False, "changed": False}
    alone = {"ok": True, "failure": None, "lines": ["unit u: active/running", "health: running release r1"],
             "group_status": None, "group_failed": False, "changed": False}
    h = build_run_result(_status_run("h", read, alone)).hosts["h"]
    assert h.ok and h.exit_code == 0 and h.verdict("status") == "healthy"
    assert h.status.running_release == "r1" and h.status.health["ok"] is True and h.group is None
    words = "trainer group tg: not proved as one - g1: runs r0"
    group = {"ok": False, "words": words, "members": ["g1"]}
    member = dict(alone, ok=False, failure=words, lines=alone["lines"] + [words], group_status=group,
                  group_failed=True, ansible_facts={"__trainer_group_status": group})
    g = build_run_result(_status_run("g0", dict(read, in_group=True), member, fail_msg=words)).hosts["g0"]
    assert not g.ok and g.exit_code == 1 and not g.refused and g.verdict("status") == "unhealthy"
    assert (g.failed_task, g.reason) == ("Fail unless the trainer runs its proved release healthily", words)
    assert g.group == group and g.status.running_release == "r1"
    refused = {"failed": True, "changed": False, "input_refused": True, "problems": ["trainer_root: ..."],
               "msg": "Refused before anything changed: trainer_root is a relative path"}
    evs = [{"event": "runner_on_failed", "event_data": {
        "host": "h", "task": "Read the trainer's state", "resolved_action": "dflash.trainer.trainer_status",
        "res": refused}}, {"event": "playbook_on_stats", "event_data": {"failures": {"h": 1}}}]
    r = build_run_result(evs).hosts["h"]
    assert r.refused and r.exit_code == 2 and r.verdict("status") == "refused" and r.reason == refused["msg"]
    del evs[0]["event_data"]["res"]["input_refused"]  # a read that failed on the target
    r = build_run_result(evs).hosts["h"]
    assert not r.refused and r.exit_code == 1
