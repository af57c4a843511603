"""The CLI that shows its work (issue 9 items 4-6), without the lab: --json round-trips into the
typed result, progress lines from runner events, --check/--diff reach ansible-playbook, logs and
logs -f (a fake reader), the summary table, diffs collected from results, the module's long poll."""
from __future__ import annotations

import io
import json
import os
import signal

import pytest

from dflash_trainer import api, progress
from dflash_trainer.__main__ import Stop, main
from dflash_trainer.results import RunResult, TrainerLog, build_run_result

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "runner_events")


def events(name):
    with open(os.path.join(FIXTURES, name + ".json")) as fh:
        return json.load(fh)


def ok_stats(*hosts):
    return {"event": "playbook_on_stats", "event_data": {
        "ok": {h: 3 for h in hosts}, "changed": {}, "failures": {}, "dark": {}, "skipped": {}, "rescued": {},
        "ignored": {}, "processed": {h: 1 for h in hosts}}}


def log_event(host, lines, offset=100, inode=7, ended=False, invocation="inv1"):
    return {"event": "runner_on_ok", "event_data": {
        "host": host, "task": "Read the trainer's log", "resolved_action": "dflash.trainer.trainer_status",
        "res": {"changed": False, "running": True, "log": {
            "invocation": invocation, "release": "r1", "lines": lines, "offset": offset, "inode": inode,
            "ended": ended, "found": True, "problem": None}}}}


@pytest.mark.parametrize("name", sorted(n[:-5] for n in os.listdir(FIXTURES) if n.endswith(".json")))
def test_json_round_trips_into_the_typed_result(name):
    result = build_run_result(events(name), rc=0, status="successful")
    text = json.dumps(result.to_dict(), indent=2, sort_keys=True)  # what --json prints
    back = RunResult.from_dict(json.loads(text))
    assert back == result
    for host, h in json.loads(text)["hosts"].items():  # every JSON key is a field of the typed result
        assert set(h) == set(back.hosts[host].__dataclass_fields__) | {"exit_code", "summary"}  # + the derived
        assert h["exit_code"] == back.hosts[host].exit_code and h["summary"] == back.hosts[host].summary()
    assert json.loads(text)["exit_code"] == back.exit_code


def test_json_of_a_log_and_diffs_round_trips():
    evs = [log_event("gpu-host", ["step=1", "step=2"]),
           {"event": "runner_on_ok", "event_data": {"host": "gpu-host", "task": "Upload the code",
                                                    "resolved_action": "dflash.trainer.trainer_release",
                                                    "res": {"changed": True, "diff": {"prepared": "release a → b\n"}}}},
           ok_stats("gpu-host")]
    result = build_run_result(evs, rc=0, status="successful")
    h = result.hosts["gpu-host"]
    assert h.log == TrainerLog(invocation="inv1", release="r1", lines=["step=1", "step=2"], offset=100, inode=7,
                               found=True)
    assert h.diffs == [{"task": "Upload the code", "prepared": "release a → b\n"}]
    assert RunResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_diffs_of_loops_and_lists():
    item = {"diff": [{"before": "a\n", "after": "b\n", "before_header": "/x"}, {"prepared": ""}]}
    loop = {"results": [{"diff": {"prepared": "dup"}}], "diff": {"prepared": "dup"}}
    evs = [{"event": "runner_item_on_ok", "event_data": {"host": "h", "task": "t", "res": item}},
           {"event": "runner_on_ok", "event_data": {"host": "h", "task": "t", "res": loop}},
           ok_stats("h")]
    h = build_run_result(evs, rc=0, status="successful").hosts["h"]
    assert h.diffs == [{"task": "t", "before": "a\n", "after": "b\n", "before_header": "/x"}]
    text = progress.diffs_text(build_run_result(evs, rc=0, status="successful"))
    assert text.splitlines() == ["--- h: t", "--- /x", "+++ after", "@@ -1 +1 @@", "-a", "+b"]


# ---- progress while a play runs -------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_progress_says_the_watch_tasks_own_phase_lines():
    out, clock = io.StringIO(), Clock()
    p = progress.Progress(out, clock=clock)
    p({"event": "verbose", "stdout": "[gpu-host] restart job: draining (at 1.2 s)\r\n"})
    p({"event": "verbose", "stdout": "[gpu-host] restart job: proving: GPUs held 3/8"})
    p({"event": "verbose", "stdout": "some other line of Ansible's"})
    assert p.lines == ["  gpu-host: restart job: draining (at 1.2 s)", "  gpu-host: restart job: proving: GPUs held 3/8"]


def test_progress_says_each_step_and_the_restart_jobs_phase():
    out, clock = io.StringIO(), Clock()
    p = progress.Progress(out, clock=clock)
    restart = "dflash.trainer.trainer_restart"
    p({"event": "playbook_on_task_start", "event_data": {"task": "Upload the code as an immutable release"}})
    clock.t += 3
    p({"event": "runner_on_ok", "event_data": {"host": "h", "resolved_action": restart,
                                               "res": {"started": True, "phase": "stopping"}}})
    p({"event": "playbook_on_task_start", "event_data": {"task": "Watch the restart job"}})
    clock.t += 30
    p({"event": "runner_retry", "event_data": {"host": "h", "resolved_action": restart,
                                               "res": {"finished": False, "phase": "proving"}}})
    clock.t += 12
    p({"event": "runner_on_ok", "event_data": {"host": "h", "resolved_action": restart,
                                               "res": {"finished": True, "phase": "done"}}})
    p({"event": "runner_retry", "event_data": {"host": "h", "task": "Wait for it", "resolved_action": "x",
                                               "res": {"attempts": 2, "retries": 5}}})
    p({"event": "runner_on_failed", "event_data": {"host": "h", "res": {"msg": "boom\nmore"}}})
    p({"event": "runner_on_failed", "event_data": {"host": "h", "ignore_errors": True, "res": {"msg": "ignored"}}})
    assert p.lines == ["step: Upload the code as an immutable release", "  restart job: stopping (0 s)",
                       "step: Watch the restart job", "  restart job: proving (30 s)",
                       "  restart job: done (42 s)", "  still waiting: Wait for it (attempt 2 of 5)",
                       "  failed on h: boom"]
    assert out.getvalue().splitlines()[0] == "[   0s] step: Upload the code as an immutable release"
    assert out.getvalue().splitlines()[3] == "[  33s]   restart job: proving (30 s)"


def test_summary_block_per_host():
    import re
    result = build_run_result(events("deploy_restarted_proved"), rc=0, status="successful")
    result.playbook, result.elapsed_s = "deploy", 64.0
    result.inventory, result.inventory_from = ["/srv/inv.yml"], "given (-i)"
    result.config = "/srv/ansible.cfg"
    plan = [e["event_data"]["res"]["plan"] for e in events("deploy_restarted_proved")
            if e["event_data"].get("resolved_action") == "dflash.trainer.trainer_plan"][0]
    new, old = plan["release"], plan["current"]  # the recorded run's releases
    lines = progress.summary(result).splitlines()
    assert lines[0] == "summary: deploy, 64 s; inventory /srv/inv.yml (given (-i)); Ansible configuration /srv/ansible.cfg"
    assert re.match(r"^gpu-host: PROVED \(exit 0\) in [\d.]+ s$", lines[1]), lines  # the host's first to last event
    assert lines[2] == "  release %s (was %s), source its content (trainer_src is not a git checkout)" % (new, old)
    assert re.match(r"^  config [0-9a-f]{8}$", lines[3]), lines  # the same configuration as the release before
    assert re.match(r"^  tok/s \d+ vs \d+ before \([+-]\d+\.\d%%\) \(release %s, config [0-9a-f]{8}\)$" % old,
                    lines[4]), lines
    assert lines[5] == "  restarted because: release switched to %s; running release %s is not current %s" % (
        new, old, new)
    assert re.match(r"^  proved ready: release %s, step \d+, [\d.]+ s to ready$" % new, lines[6]), lines
    assert lines[-1] == "exit status 0: healthy / proved"
    failed = build_run_result(events("deploy_ready_failed_rolled_back"), rc=2, status="failed")
    failed.playbook = "deploy"
    text = progress.summary(failed)
    assert "gpu-host: FAILED, ROLLED BACK (exit 1)" in text
    assert "  rolled back to %s (from %s)" % (failed.hosts["gpu-host"].release,
                                              failed.hosts["gpu-host"].previous_release) in text
    assert "  failed (proving): trainer exited with status 1 after " in text
    assert text.splitlines()[-1].startswith("exit status 1: the trainer is unhealthy or the proof failed")
    refused = build_run_result(events("deploy_preflight_refused"), rc=2, status="failed")
    refused.playbook = "deploy"
    text = progress.summary(refused)
    assert re.search(r"^gpu-host: REFUSED \(exit 2\) in [\d.]+ s$", text, re.M) and "rolled back" not in text
    assert ("  refused before any change: pre-flight refused the release (the running trainer is untouched): "
            "trainer_preflight_command exited with status 1: ModuleNotFoundError") in text


# ---- --check / --diff reach ansible-playbook; events reach the handler; cancel -------------------
def test_run_playbook_live_passes_check_diff_cancel_and_events(monkeypatch, tmp_path):
    import ansible_runner
    seen = {}

    class Runner:
        rc, status = 0, "successful"

    def fake_run(**kw):
        seen.update(kw)
        for e in events("status_ok"):
            kw["event_handler"](e)
        return Runner()

    monkeypatch.setattr(ansible_runner, "run", fake_run)
    got = []

    def cancel():
        return False
    result = api.run_playbook_live("status", check=True, diff=True, on_event=got.append, cancel=cancel,
                                   private_data_dir=str(tmp_path))
    assert seen["cmdline"] == "--check --diff" and seen["cancel_callback"] is cancel
    assert result.ok and len(got) == len(events("status_ok"))
    api.run_playbook_live("status", diff=True, private_data_dir=str(tmp_path))
    assert seen["cmdline"] == "--diff"
    seen.clear()
    api.run_playbook_live("status", private_data_dir=str(tmp_path))
    assert "cmdline" not in seen and "cancel_callback" not in seen


def test_cli_check_diff_progress_and_summary(monkeypatch, capsys):
    seen = {}

    def fake(name, **kw):
        seen.update(kw, name=name)
        evs = [{"event": "playbook_on_task_start", "event_data": {"task": "Upload the code"}},
               {"event": "runner_on_ok", "event_data": {"host": "gpu-host", "task": "Upload the code",
                "resolved_action": "dflash.trainer.trainer_release", "res": {"changed": True, "diff": {
                    "prepared": "release a → b: 0 added, 0 removed, 1 modified\nM trainer.py (16 B → 17 B)\n"}}}}]
        for e in evs:
            if kw["on_event"] is not None:
                kw["on_event"](e)
        return build_run_result(events("deploy_restarted_proved") + evs, rc=0, status="successful")

    monkeypatch.setattr(api, "run_playbook_live", fake)
    assert main(["deploy", "-l", "gpu-host", "--check", "--diff", "-e", 'msg="two words" n=1']) == 0
    assert seen["check"] is True and seen["diff"] is True and seen["name"] == "deploy"
    assert seen["extravars"] == {"msg": "two words", "n": "1"}
    out, err = capsys.readouterr()
    assert "step: Upload the code" in err
    assert "--- gpu-host: Upload the code\nrelease a → b: 0 added, 0 removed, 1 modified\nM trainer.py (16 B → 17 B)" in out
    assert "\ngpu-host: PROVED (exit 0)" in out and out.rstrip().endswith("exit status 0: healthy / proved")
    # -q: no progress; --json: the RunResult only
    assert main(["deploy", "-q", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "step:" not in err and seen["on_event"] is None
    assert RunResult.from_dict(json.loads(out)).hosts["gpu-host"].diffs[0]["task"] == "Upload the code"
    with pytest.raises(SystemExit):
        main(["status", "-f"])
    with pytest.raises(SystemExit):
        main(["deploy", "-n", "3"])


# ---- logs and logs -f -----------------------------------------------------------------------------
def test_cli_logs_prints_the_lines(monkeypatch, capsys):
    seen = {}

    def fake_logs(**kw):
        seen.update(kw)
        return build_run_result([log_event("gpu-host", ["step=%d" % i for i in range(20)]), ok_stats("gpu-host")],
                                rc=0, status="successful")

    monkeypatch.setattr(api, "logs", fake_logs)
    assert main(["logs", "-l", "gpu-host", "--start", "abc"]) == 0
    assert seen["lines"] == 20 and seen["invocation"] == "abc" and seen["limit"] == "gpu-host"
    assert capsys.readouterr().out.splitlines() == ["step=%d" % i for i in range(20)]
    assert main(["logs", "-n", "5", "--json"]) == 0
    assert seen["lines"] == 5
    assert json.loads(capsys.readouterr().out.splitlines()[0])["lines"][:2] == ["step=0", "step=1"]


def test_logs_extravars():
    assert api.logs_extravars({"a": 1}, 5) == {"a": 1, "trainer_log_lines": 5}
    pos = {"h1": TrainerLog(invocation="i1", offset=10, inode=3), "h2": None, "h3": TrainerLog(offset=0)}
    assert api.logs_extravars(None, 20, "inv", pos, 2) == {
        "trainer_log_lines": 20, "trainer_log_invocation": "inv", "trainer_log_wait_s": 2,
        "trainer_log_follow": {"h1": {"offset": 10, "inode": 3, "invocation": "i1"}}}


def test_follow_logs_prints_new_lines_follows_a_new_start_and_stops():
    reads, printed = [], []
    batches = [
        [log_event("h", ["a", "b"], offset=10)],
        [log_event("h", [], offset=10)],
        [log_event("h", ["c"], offset=12)],
        [log_event("h", [], offset=12, ended=True)],
        [log_event("h", ["new start line"], offset=50, invocation="inv2")],
        [log_event("h", ["d"], offset=52, invocation="inv2")],
    ]

    def read(**kw):
        reads.append(json.loads(json.dumps(api.logs_extravars(kw["extravars"], kw["lines"], kw["invocation"],
                                                              kw["positions"], kw["wait_s"]))))
        return build_run_result(batches[len(reads) - 1] + [ok_stats("h")], rc=0, status="successful")

    def stop():
        return len(reads) >= len(batches)
    result = api.follow_logs(lambda host, log: printed.extend(log.lines), limit="h", lines=2, wait_s=2,
                             stop=stop, read=read)
    assert result.ok and printed == ["a", "b", "c", "new start line", "d"]
    assert "trainer_log_follow" not in reads[0]
    assert reads[1]["trainer_log_follow"] == {"h": {"offset": 10, "inode": 7, "invocation": "inv1"}}
    assert reads[1]["trainer_log_wait_s"] == 2
    assert "trainer_log_follow" not in reads[4]  # the ended start: the new one from its last lines
    assert reads[5]["trainer_log_follow"]["h"]["invocation"] == "inv2"


def test_follow_logs_ends_on_a_failed_run():
    def read(**kw):
        return build_run_result([], rc=2, status="failed")
    assert not api.follow_logs(lambda *a: None, read=read).ok


def test_cli_logs_follow_stopped_by_sigterm(monkeypatch, capsys):
    n = []

    def fake_follow(on_lines, stop, **kw):
        on_lines("gpu-host", TrainerLog(lines=["x"]))
        os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the flag
        n.append(stop())
        return RunResult(ok=True, rc=0, status="canceled")

    monkeypatch.setattr(api, "follow_logs", fake_follow)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["logs", "-f", "-l", "gpu-host"]) == 0
    assert n == [True] and capsys.readouterr().out == "x\n"
    assert signal.getsignal(signal.SIGTERM) == before  # handlers restored


def test_stop_second_signal_interrupts():
    s = Stop()
    s.handle(signal.SIGINT, None)
    assert s()
    with pytest.raises(KeyboardInterrupt):
        s.handle(signal.SIGINT, None)


# ---- the module's long poll (trainer_status log_offset + log_wait_s) ------------------------------
def test_status_long_poll_waits_for_lines(tmp_path):
    from ansible_collections.dflash.trainer.plugins.module_utils.plan import status as mod
    from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import marker_line
    log = tmp_path / "trainer.log"
    log.write_text(marker_line("inv", "r1", 1, "t") + "\nstep=1\n")
    p = dict(log_path=str(log), log_invocation=None, log_lines=5, log_offset=None, log_inode=None, log_wait_s=3)
    first = mod.read_log_chunk(p, "inv")
    assert first["lines"] == ["step=1"] and first["release"] == "r1"
    clock, sleeps, written = Clock(), [], []

    def sleep(s):
        sleeps.append(s)
        clock.t += s
        if len(sleeps) == 4 and not written:
            written.append(1)
            with open(str(log), "a") as f:
                f.write("step=2\n")

    p.update(log_offset=first["offset"], log_inode=first["inode"])
    got = mod.read_log_chunk(p, "inv", clock=clock, sleep=sleep)
    assert got["lines"] == ["step=2"] and len(sleeps) == 4
    sleeps.clear()
    p.update(log_offset=got["offset"])
    got = mod.read_log_chunk(p, "inv", clock=clock, sleep=sleep)
    assert got["lines"] == [] and sum(sleeps) == pytest.approx(3.0)
    assert mod.read_log_chunk(dict(p, log_path=str(tmp_path / "none")), "")["problem"].startswith("no start")


# ---- subcommands: their own --help and flags, --version, -v -------------------------------------
def help_of(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv + ["--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def flags(text):
    import re
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+|-[a-zA-Z])\b", text))


def test_each_subcommand_help_shows_only_its_own_flags(capsys):
    deploy = flags(help_of(["deploy"], capsys))
    assert {"-l", "-i", "-e", "-C", "-D", "--json", "-q", "-v", "--timeout"} <= deploy
    assert not deploy & {"-n", "-f", "--plot", "--release", "--start", "--follow", "--explain"}
    rollback = flags(help_of(["rollback"], capsys))
    assert "--release" in rollback and "--plot" not in rollback
    status = flags(help_of(["status"], capsys))
    assert not status & {"-C", "-D", "-n", "--release", "--plot"}
    history = help_of(["history"], capsys)
    logs = help_of(["logs"], capsys)
    # -n: releases for history, lines for logs - each says only its own meaning
    assert "-n RELEASES" in history and "lines" not in history.split("-n RELEASES")[1].split("\n")[0]
    assert "-n LINES" in logs and "--plot" not in logs and "--explain" in logs and "--follow" in logs
    top = help_of([], capsys)
    for name in ("deploy", "status", "restart", "rollback", "history", "logs", "check-log"):
        assert name in top
    assert "--limit" not in top and "--plot" not in top


def test_version(capsys):
    import yaml
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out.strip()
    with open(os.path.join(api.REPO_ROOT, "galaxy.yml")) as fh:
        version = yaml.safe_load(fh)["version"]
    from importlib import metadata
    assert out.startswith("dflash-trainer %s (collection dflash.trainer %s at " % (metadata.version("dflash-trainer"),
                                                                                   version)), out


def test_verbose_reaches_ansible_and_prints_its_output(monkeypatch, capsys):
    seen = {}

    def fake(name, **kw):
        seen["verbosity"] = os.environ.get("ANSIBLE_VERBOSITY")
        if kw["on_event"] is not None:
            kw["on_event"]({"event": "runner_on_ok", "stdout": "ok: [gpu-host] => {\"changed\": false}",
                            "event_data": {"host": "gpu-host"}})
        return build_run_result(events("status_ok"), rc=0, status="successful")

    monkeypatch.setattr(api, "run_playbook_live", fake)
    monkeypatch.delenv("ANSIBLE_VERBOSITY", raising=False)
    assert main(["status", "-vv", "-q"]) == 0
    assert seen["verbosity"] == "2" and "ANSIBLE_VERBOSITY" not in os.environ
    assert 'ok: [gpu-host] => {"changed": false}' in capsys.readouterr().err
    assert main(["status", "-q"]) == 0
    assert seen["verbosity"] is None


def test_options_before_the_subcommand_still_work(monkeypatch, capsys):
    seen = {}

    def fake(name, **kw):
        seen.update(kw, name=name)
        return build_run_result(events("status_ok"), rc=0, status="successful")

    monkeypatch.setattr(api, "run_playbook_live", fake)
    assert main(["-l", "gpu-host", "-e", "a=1", "status", "-e", "b=2", "-q"]) == 0
    assert seen["limit"] == "gpu-host" and seen["extravars"] == {"a": "1", "b": "2"}
    with pytest.raises(SystemExit) as e:
        main(["-C", "status"])
    assert e.value.code == 2 and "--check does not go with status" in capsys.readouterr().err


def test_an_option_of_another_subcommand_is_named(capsys):
    with pytest.raises(SystemExit) as e:
        main(["deploy", "-f"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: dflash-trainer deploy")
    assert "options that only go with logs: -f (see dflash-trainer logs --help)" in err


def test_e_reads_like_ansible_playbook():
    from dflash_trainer.__main__ import parse_extravar
    assert parse_extravar(r"trainer_step_regex=step:\s*(\d+)") == {"trainer_step_regex": r"step:\s*(\d+)"}
    assert parse_extravar('msg="two words" n=1') == {"msg": "two words", "n": "1"}
    with pytest.raises(ValueError):
        parse_extravar("a=1 novalue")


def test_a_host_after_the_command_is_the_limit(monkeypatch, capsys):
    """`dflash-trainer status gpu-host` (what a first run types) is `status -l gpu-host`; both at once,
    different, is refused naming them."""
    seen = {}

    def fake(limit, **kw):
        seen["limit"] = limit
        return api.RunResult(ok=True, rc=0, status="successful", playbook="status")
    monkeypatch.setattr(api, "status", fake)
    main(["status", "gpu-host", "-q"])
    assert seen["limit"] == "gpu-host"
    main(["status", "-l", "gpu-host", "gpu-host", "-q"])
    assert seen["limit"] == "gpu-host"
    with pytest.raises(SystemExit) as e:
        main(["status", "gpu-host", "-l", "other"])
    assert e.value.code == 2 and "the host pattern is given twice (gpu-host and -l other)" in capsys.readouterr().err


def test_the_history_header_lines_up_with_its_columns():
    """`dflash-trainer history` prints the status module's lines under its own header: the same columns."""
    from ansible_collections.dflash.trainer.plugins.module_utils.proof import throughput as t
    from dflash_trainer.__main__ import HISTORY_HEADER, describe_host
    from dflash_trainer.results import HostResult, TrainerStatus

    assert HISTORY_HEADER == t.HISTORY_HEADER
    entries = [t.entry("b2c0ffee00000002", t.PROVED, {"tok_s": {"median": 21000.0, "p10": 20000.0, "p90": 22000.0,
                                                                "n": 9}}, "git 1234567", now=1, config="aaaa0001")]
    status = TrainerStatus(history=t.history_rows(entries))
    out = describe_host(HostResult(host="gpu-host", ok=True, status=status))
    header = next(line for line in out if "RELEASE" in line)
    row = next(line for line in out if "b2c0ffee00000002" in line)
    for col, value in (("RELEASE", "b2c0ffee00000002"), ("CONFIG", "aaaa0001"), ("WHEN", "1970-01-01T00:00:01Z"),
                       ("VERDICT", "proved"), ("TOK/S", "21.0K"), ("SOURCE", "git 1234567")):
        assert row.index(value) == header.index(col), col
