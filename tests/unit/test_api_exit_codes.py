"""Exit codes a script can branch on - RunResult.exit_code, HostResult.exit_code, the CLI's exit
status - derived from the runner's structured events (fixtures/runner_events: recorded and
synthetic), never from printed text:
0 healthy / proved; 1 unhealthy or the proof failed (rolled back or not); 2 refused before any
change; 3 a host unreachable; 4 Ansible could not be started."""
import copy
import json
import os

import pytest

from dflash_trainer import api, programs
from dflash_trainer.__main__ import build_parser, main
from dflash_trainer.results import EXIT_CODES, RunResult, build_run_result

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "runner_events")


def events(name):
    with open(os.path.join(FIXTURES, name + ".json")) as fh:
        return json.load(fh)


def current(name, host="gpu-host"):
    """What current pointed at when the run began (its plan, as trainer_plan returned it)."""
    return [e["event_data"]["res"]["plan"]["current"] for e in events(name)
            if e["event_data"].get("resolved_action") == "dflash.trainer.trainer_plan" and
            e["event"] == "runner_on_ok" and e["event_data"].get("host") == host][0]


def ok_stats(*hosts, failures=(), dark=()):
    return {"event": "playbook_on_stats", "event_data": {
        "ok": {h: 2 for h in hosts}, "failures": {h: 1 for h in failures}, "dark": {h: 1 for h in dark},
        "processed": {h: 1 for h in hosts}}}


def event(kind, host, action, res, task="t"):
    return {"event": kind, "event_data": {"host": host, "task": task, "resolved_action": action, "res": res}}


CASES = [  # (fixture, ansible-runner's rc and status for it, the exit code)
    ("status_ok", 0, "successful", 0),
    ("status_stopped", 0, "successful", 0),  # stopped on purpose: not unhealthy
    ("deploy_first_proved", 0, "successful", 0),
    ("deploy_restarted_proved", 0, "successful", 0),
    ("deploy_no_op", 0, "successful", 0),
    ("rollback_named_release", 0, "successful", 0),
    ("stop_ok", 0, "successful", 0),
    ("start_proved", 0, "successful", 0),
    ("deploy_ready_failed_rolled_back", 2, "failed", 1),  # the proof failed, rolled back
    ("deploy_start_failed_no_rollback", 2, "failed", 1),  # the proof failed, nothing to roll back to
    ("status_two_hosts_one_unhealthy", 2, "failed", 1),  # one trainer not running
    ("deploy_timeout_no_recap", 254, "timeout", 1),  # stopped by the runner's timeout in the middle
    ("deploy_preflight_refused", 2, "failed", 2),  # trainer_restart: not_started, preflight_refused
    ("deploy_lock_held", 2, "failed", 2),  # trainer_plan: lock_refused
    ("deploy_bad_input", 2, "failed", 2),  # trainer_validate failed
    ("status_two_hosts_one_unreachable", 4, "failed", 3),
]


@pytest.mark.parametrize("name,rc,status,code", CASES, ids=[c[0] for c in CASES])
def test_exit_code_of_each_recorded_outcome(name, rc, status, code):
    result = build_run_result(events(name), rc=rc, status=status)
    assert result.exit_code == code, (name, result)
    assert RunResult.from_dict(json.loads(json.dumps(result.to_dict()))).exit_code == code
    assert json.loads(json.dumps(result.to_dict()))["exit_code"] == code


@pytest.mark.parametrize("name,rc,status,code", CASES, ids=[c[0] for c in CASES])
def test_the_cli_exits_with_the_same_code(monkeypatch, capsys, name, rc, status, code):
    monkeypatch.setattr(api, "run_playbook_live", lambda playbook, **kw: build_run_result(events(name), rc=rc,
                                                                                          status=status))
    assert main(["deploy", "-q"]) == code
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == "exit status %d: %s" % (code, EXIT_CODES[code])
    assert main(["deploy", "-q", "--json"]) == code
    assert json.loads(capsys.readouterr().out)["exit_code"] == code


def test_refusals_are_read_from_the_modules_flags():
    refused = build_run_result(events("deploy_preflight_refused"), rc=2, status="failed").hosts["gpu-host"]
    # the release was uploaded beside the running one; the job never started: current is where it was
    assert refused.refused and not refused.rolled_back and not refused.restarted and not refused.unreachable
    running = current("deploy_preflight_refused")
    assert (refused.release, refused.previous_release) == (running, running)
    # the watch of a job that never started fails with the start call's reason (nothing was watched)
    assert refused.failed_task.startswith("Watch the restart job") and refused.reason.startswith(
        "pre-flight refused the release (the running trainer is untouched): trainer_preflight_command exited")
    lock = build_run_result(events("deploy_lock_held"), rc=2, status="failed").hosts["gpu-host"]
    assert lock.refused and lock.reason.startswith("another deploy holds /run/dflash-trainer.deploy.lock: ")
    bad = build_run_result(events("deploy_bad_input"), rc=2, status="failed").hosts["gpu-host"]
    assert bad.refused and "trainer_ready_stall_s: is longer than trainer_ready_hold_s" in bad.reason
    # the same failure without the module's flag is a failure, not a refusal
    evs = copy.deepcopy(events("deploy_preflight_refused"))
    for e in evs:
        res = e.get("event_data", {}).get("res", {})
        res.pop("not_started", None)
        res.pop("preflight_refused", None)
    assert build_run_result(evs, rc=2, status="failed").exit_code == 1
    evs = copy.deepcopy(events("deploy_lock_held"))
    for e in evs:
        e.get("event_data", {}).get("res", {}).pop("lock_refused", None)
    assert build_run_result(evs, rc=2, status="failed").exit_code == 1


def test_a_failed_start_after_a_refusal_was_rescued_is_judged_by_the_first_failure():
    """The first failure decides: a refusal first is 2 (what follows is its rescue); a failure after
    the change began is 1 even when an assert fails later."""
    host = "h"
    after = [event("runner_on_ok", host, "dflash.trainer.trainer_restart", {"started": True, "finished": False}),
             event("runner_on_failed", host, "dflash.trainer.trainer_restart", {"msg": "the job failed"}),
             event("runner_on_failed", host, "ansible.builtin.assert", {"msg": "assertion failed"}),
             ok_stats(host, failures=[host])]
    assert build_run_result(after, rc=2, status="failed").exit_code == 1


def test_no_host_matched_by_the_target_guard_is_refused():
    guard = [event("runner_on_failed", "lab-201", "ansible.builtin.assert",
                   {"msg": "no host matched the pattern 'trainer_hosts' within --limit 'lab-201'", "assertion": "x"},
                   task="Fail when no host matches the play's pattern within the limit"),
             ok_stats("lab-201", failures=["lab-201"])]
    result = build_run_result(guard, rc=2, status="failed")
    assert result.hosts["lab-201"].refused and result.exit_code == 2


def test_status_of_an_unhealthy_trainer_is_1():
    evs = [event("runner_on_ok", "h", "dflash.trainer.trainer_status",
                 {"running": False, "active_state": "failed", "health": {"ok": False, "words": "died after its proof"}}),
           event("runner_on_failed", "h", "ansible.builtin.fail", {"msg": "dflash-trainer is not running its proved "
                                                                   "release healthily: died after its proof"}),
           ok_stats("h", failures=["h"])]
    result = build_run_result(evs, rc=2, status="failed")
    assert result.exit_code == 1 and result.hosts["h"].verdict("status") == "unhealthy"


def test_several_hosts_a_failure_wins_over_unreachable_over_refused():
    fail = event("runner_on_failed", "a", "ansible.builtin.fail", {"msg": "proof failed"})
    down = {"event": "runner_on_unreachable", "event_data": {"host": "b", "task": "t", "res": {"msg": "gone"}}}
    refuse = event("runner_on_failed", "c", "dflash.trainer.trainer_validate", {"msg": "bad"})
    up = event("runner_on_ok", "d", "ansible.builtin.debug", {})

    def run(*evs, **stats):
        return build_run_result(list(evs) + [ok_stats("a", "b", "c", "d", **stats)], rc=2, status="failed")

    assert run(fail, down, refuse, up, failures=["a", "c"], dark=["b"]).exit_code == 1
    assert run(down, refuse, up, failures=["c"], dark=["b"]).exit_code == 3
    assert run(refuse, up, failures=["c"]).exit_code == 2
    both = run(fail, down, refuse, up, failures=["a", "c"], dark=["b"])
    assert [both.hosts[h].exit_code for h in "abcd"] == [1, 3, 2, 0]


def test_runs_without_hosts():
    # Ansible could not be started at all
    assert RunResult(ok=False, rc=None, status="failed", started=False).exit_code == 4
    # ansible-playbook ended before any play (a vault error, a playbook it could not read)
    assert RunResult(ok=False, rc=1, status="failed").exit_code == 4
    # it refused its input: a limit matching nothing, bad options
    assert RunResult(ok=False, rc=1, status="failed", refused=True).exit_code == 2
    # a recap without hosts: the play matched none
    assert build_run_result([ok_stats()], rc=0, status="successful").exit_code == 2
    # stopped (Ctrl-C, --timeout) before any host answered
    assert RunResult(ok=False, rc=None, status="canceled").exit_code == 1
    assert RunResult(ok=False, rc=None, status="timeout").exit_code == 1


def test_refused_before_play_reads_ansible_playbooks_rc_and_its_no_hosts_error():
    assert api.refused_before_play(1, ["[WARNING]: Could not match supplied host pattern, ignoring: typo",
                                       "[ERROR]: Specified inventory, host pattern and/or --limit leaves us with no "
                                       "hosts to target."])
    assert api.refused_before_play(5, []) and api.refused_before_play(4, [])
    assert not api.refused_before_play(1, ["ERROR! Attempting to decrypt but no vault secrets found"])


def test_could_not_start_ansible_is_4_in_the_api_and_the_cli(monkeypatch, capsys):
    def missing(name, *a, **kw):
        raise programs.ProgramNotFound("%s not found: not on PATH" % name)

    monkeypatch.setattr(api, "require_program", missing)
    result = api.deploy("gpu-host")
    assert result.exit_code == 4 and not result.started and result.playbook == "deploy"
    assert result.reason == "the run could not start: ansible-playbook not found: not on PATH"
    assert main(["status", "-l", "gpu-host", "-q"]) == 4
    assert "exit status 4: Ansible could not be started" in capsys.readouterr().out


def test_each_subcommands_help_documents_the_exit_codes(capsys):
    parser = build_parser()
    for name, sub in parser.commands.items():
        epilog = sub.epilog
        assert epilog.startswith("exit status: 0 "), name
        if name == "check-log":
            assert "1 when it would fail, 2 on bad input" in epilog
            continue
        for code in ("1 ", "2 refused before any change", "3 a host unreachable", "4 Ansible could not be started"):
            assert code in epilog, (name, code)
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert "3 a host unreachable" in " ".join(capsys.readouterr().out.split()), name


def test_status_of_a_trainer_stopped_on_purpose_says_stopped_not_healthy():
    from dflash_trainer.results import HostResult, TrainerStatus
    stopped = TrainerStatus.from_result({"health": {"ok": False, "words": "stopped on purpose by ops at 12:00",
                                                    "stopped": {"release": "r1", "pid": 42}}})
    running = TrainerStatus.from_result({"health": {"ok": True, "words": "ok"}})
    assert HostResult(host="h", ok=True, status=stopped).verdict("status") == "stopped"
    assert HostResult(host="h", ok=True, status=running).verdict("status") == "healthy"
