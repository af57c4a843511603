"""The operator's surface without a lab: the API mirrors the CLI (one typed function per subcommand,
limit first, the CLI's options as keyword arguments), deploy --src/--force, rollback --to, stop and
start (the runner mocked), status --watch, logs -f's pacing, the inventory used (the checkout's lab
inventory only inside the checkout), the restart job's phases instead of Ansible's retries."""
import inspect
import io
import json
import os
import signal

import pytest

import dflash_trainer
from dflash_trainer import api, progress
from dflash_trainer.__main__ import main, with_ansible_output
from dflash_trainer.results import HostResult, RunResult, TrainerLog, TrainerStatus, build_run_result

ROOT = api.REPO_ROOT
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "runner_events")


def events(name):
    with open(os.path.join(FIXTURES, name + ".json")) as fh:
        return json.load(fh)


@pytest.fixture
def runs(monkeypatch):
    """Every playbook run the API starts, as (playbook, keyword arguments); the runner never starts."""
    seen = []

    def fake(playbook, **kw):
        seen.append((playbook, kw))
        return build_run_result(events("status_ok"), rc=0, status="successful")

    monkeypatch.setattr(api, "run_playbook_live", fake)
    return seen


COMMANDS = ("deploy", "restart", "rollback", "status", "history", "logs", "stop", "start")


def test_every_subcommand_is_an_exported_function_with_limit_first():
    for name in COMMANDS + ("check_log",):
        assert name in dflash_trainer.__all__ and callable(getattr(dflash_trainer, name)), name
    for name in COMMANDS:
        params = list(inspect.signature(getattr(dflash_trainer, name)).parameters.values())
        assert params[0].name == "limit" and params[0].kind == params[0].POSITIONAL_OR_KEYWORD, name
        assert all(p.kind == p.KEYWORD_ONLY for p in params[1:]), name  # no positional surprises
        assert {"extravars", "inventory", "timeout", "cancel", "on_event"} <= set(p.name for p in params), name
    deploy = inspect.signature(dflash_trainer.deploy).parameters
    assert [deploy[k].default for k in ("src", "force", "check", "diff")] == [None, False, False, False]
    assert inspect.signature(dflash_trainer.rollback).parameters["to"].default is None
    assert list(inspect.signature(dflash_trainer.check_log).parameters)[0] == "file"


def test_deploy_src_and_force(runs, tmp_path):
    api.deploy("gpu-host", src=str(tmp_path), force=True, check=True, diff=True, extravars={"a": 1})
    playbook, kw = runs[-1]
    assert playbook == "deploy" and kw["limit"] == "gpu-host" and kw["check"] and kw["diff"]
    assert kw["extravars"] == {"a": 1, "trainer_src": str(tmp_path), "trainer_force_restart": True}
    api.deploy("gpu-host")
    assert runs[-1][1]["extravars"] == {} and not runs[-1][1]["check"]


def test_cli_deploy_src_force_and_rollback_to(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "code").mkdir()
    assert main(["deploy", "-q", "-l", "gpu-host", "--src", "code", "--force", "-C", "-D"]) == 0
    playbook, kw = runs[-1]
    assert playbook == "deploy" and kw["check"] and kw["diff"]
    assert kw["extravars"] == {"trainer_src": str(tmp_path / "code"), "trainer_force_restart": True}
    for flag in ("--to", "--release"):  # --release: the earlier spelling
        assert main(["rollback", "-q", "-l", "gpu-host", flag, "abc123"]) == 0
        assert runs[-1][0] == "rollback" and runs[-1][1]["extravars"] == {"trainer_rollback_release": "abc123"}
    with pytest.raises(SystemExit):
        main(["restart", "--src", "x"])
    with pytest.raises(SystemExit):
        main(["status", "--to", "x"])


@pytest.mark.parametrize("name", ["stop", "start"])
def test_stop_and_start_run_their_playbooks(runs, capsys, name):
    assert api.PLAYBOOKS[name] == os.path.join("playbooks", name + ".yml")
    getattr(api, name)("gpu-host", extravars={"x": "1"}, check=True)
    assert runs[-1][0] == name and runs[-1][1]["limit"] == "gpu-host" and runs[-1][1]["check"]
    assert main([name, "-l", "gpu-host", "-e", "y=2"]) == 0
    playbook, kw = runs[-1]
    assert playbook == name and kw["extravars"] == {"y": "2"} and not kw["check"]
    out = capsys.readouterr().out
    assert "summary: %s" % name in out and "exit status 0" in out
    if name == "stop":
        assert main(["stop", "-q", "--disable"]) == 0 and runs[-1][1]["extravars"] == {"trainer_stop_disable": True}
    else:
        with pytest.raises(SystemExit):
            main(["start", "--disable"])


def test_history_logs_and_status_take_their_options(runs):
    api.history("h", count=7)
    assert runs[-1][0] == "history" and runs[-1][1]["extravars"] == {"trainer_history_count": 7}
    api.logs("h", lines=5, invocation="inv")
    assert runs[-1][0] == "logs" and runs[-1][1]["extravars"] == {"trainer_log_lines": 5,
                                                                  "trainer_log_invocation": "inv"}
    api.status("h", inventory="hosts.yml")
    assert runs[-1][0] == "status" and runs[-1][1]["inventory"] == "hosts.yml"


# ---- which inventory: the checkout's lab only inside the checkout ----------------------------------
def test_inside_the_checkout_its_configuration_and_lab_inventory(monkeypatch):
    kw = api.runner_kwargs("status", private_data_dir="p", environ={}, cwd=os.path.join(ROOT, "docs"))
    assert kw["project_dir"] == ROOT and kw["envvars"]["ANSIBLE_CONFIG"] == os.path.join(ROOT, "ansible.cfg")
    sources, origin = api.used_inventory(None, kw["envvars"]["ANSIBLE_CONFIG"], {})
    assert sources == [os.path.join(ROOT, "inventory", "lab.yml")]
    assert origin == "inventory = in %s" % os.path.join(ROOT, "ansible.cfg")


def test_outside_the_checkout_no_lab_default(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {"HOME": str(home)}
    kw = api.runner_kwargs("status", private_data_dir="p", environ=env, cwd=str(work))
    # the caller's directory; no configuration found there: Ansible's defaults, never the checkout's ansible.cfg
    assert kw["project_dir"] == str(work) and "ANSIBLE_CONFIG" not in kw["envvars"]
    # the playbooks and the collection are still this package's checkout
    assert kw["playbook"] == os.path.join(ROOT, "playbooks", "status.yml")
    assert kw["envvars"]["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep)[0] == os.path.join(ROOT, "collections")
    assert api.used_inventory(None, None, env) == (
        ["/etc/ansible/hosts"], "Ansible's default (no -i, no ANSIBLE_INVENTORY, no inventory = in any ansible.cfg)")
    # the caller's ansible.cfg in their directory, and its inventory
    (work / "ansible.cfg").write_text("[defaults]\ninventory = ./prod.yml\n")
    kw = api.runner_kwargs("status", private_data_dir="p", environ=env, cwd=str(work))
    assert kw["envvars"]["ANSIBLE_CONFIG"] == str(work / "ansible.cfg")
    assert api.used_inventory(None, str(work / "ansible.cfg"), env) == (
        [str(work / "prod.yml")], "inventory = in %s" % (work / "ansible.cfg"))
    # ANSIBLE_INVENTORY wins over the file, -i over both
    assert api.used_inventory(None, str(work / "ansible.cfg"), dict(env, ANSIBLE_INVENTORY="a.yml,b.yml")) == (
        ["a.yml", "b.yml"], "ANSIBLE_INVENTORY")
    assert api.used_inventory("x.yml", None, dict(env, ANSIBLE_INVENTORY="a.yml")) == (["x.yml"], "given (-i)")
    assert not api.in_checkout(str(work)) and api.in_checkout(ROOT)


def test_the_summary_names_the_inventory(monkeypatch, tmp_path, capsys):
    import ansible_runner

    class Runner:
        rc, status = 0, "successful"

    def fake_run(**kw):
        for e in events("status_ok"):
            kw["event_handler"](e)
        return Runner()

    monkeypatch.setattr(ansible_runner, "run", fake_run)
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("ANSIBLE_INVENTORY", raising=False)
    result = api.status("gpu-host", inventory=str(tmp_path / "hosts.yml"))
    assert (result.inventory, result.inventory_from) == ([str(tmp_path / "hosts.yml")], "given (-i)")
    assert result.playbook == "status" and result.elapsed_s is not None
    assert main(["status", "-q", "-i", str(tmp_path / "hosts.yml")]) == 0
    assert "; inventory %s (given (-i))" % (tmp_path / "hosts.yml") in capsys.readouterr().out


# ---- status --watch -----------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def status_result(host="h", ok=True, release="r1", tok_s=100.0, unreachable=False):
    h = HostResult(host=host, ok=ok, unreachable=unreachable,
                   status=None if unreachable else TrainerStatus(active=ok, active_state="active" if ok else "failed",
                                                                 running_release=release, tok_s=tok_s,
                                                                 health={"ok": ok, "words": "w"}))
    return RunResult(ok=ok, rc=0 if ok else 2, status="successful" if ok else "failed", hosts={host: h},
                     stats={"ok": {host: 1}})


def test_watch_status_reports_changes_only():
    reads = [status_result(tok_s=100), status_result(tok_s=101), status_result(ok=False),
             status_result(ok=False, tok_s=5), status_result(unreachable=True, ok=False), status_result()]
    clock, got, asked = Clock(), [], []

    def read(**kw):
        asked.append((clock.t, kw))
        return reads[len(asked) - 1]

    last = api.watch_status(lambda host, h, r: got.append((host, h.exit_code)), "h", interval_s=5,
                            stop=lambda: len(asked) >= len(reads) and clock.t >= 25, read=read,
                            sleep=clock.sleep, clock=clock, extravars={"a": 1})
    assert got == [("h", 0), ("h", 1), ("h", 3), ("h", 0)]  # tok/s alone is no change
    assert [round(t) for t, _kw in asked] == [0, 5, 10, 15, 20, 25]  # one read every interval_s
    assert asked[0][1]["limit"] == "h" and asked[0][1]["extravars"] == {"a": 1} and callable(asked[0][1]["cancel"])
    assert last is reads[-1]


def test_cli_status_watch_until_sigterm(monkeypatch, capsys):
    reads = [status_result(), status_result(tok_s=3), status_result(release="r2")]
    n = []

    def fake_status(limit, **kw):
        n.append(1)
        if len(n) == len(reads):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the flag
        return reads[len(n) - 1]

    monkeypatch.setattr(api, "status", fake_status)
    assert main(["status", "--watch", "0.01", "-l", "h"]) == 0  # the last read's exit code
    lines = capsys.readouterr().out.splitlines()
    assert len(n) == 3 and len(lines) == 2, lines
    assert "h: HEALTHY (exit 0) unit active/None" in lines[0] and "running r1" in lines[0]
    assert "running r2" in lines[1]
    with pytest.raises(SystemExit):
        main(["deploy", "--watch"])


# ---- logs -f: paced long polls ----------------------------------------------------------------------
def test_follow_logs_paces_its_reads_and_polls_long():
    clock, starts = Clock(), []

    def read(**kw):
        starts.append((clock.t, kw["wait_s"]))
        clock.t += 1.5  # one ansible-playbook run that found lines at once
        log = TrainerLog(invocation="i", lines=["x"], offset=len(starts), inode=1)
        return RunResult(ok=True, rc=0, status="successful", hosts={"h": HostResult(host="h", ok=True, log=log)})

    api.follow_logs(lambda host, log: None, "h", read=read, sleep=clock.sleep, clock=clock,
                    stop=lambda: len(starts) >= 4)
    assert [w for _t, w in starts] == [api.FOLLOW_WAIT_S] * 4 and api.FOLLOW_WAIT_S >= 10
    gaps = [b - a for (a, _wa), (b, _wb) in zip(starts, starts[1:])]
    assert all(g >= api.FOLLOW_EVERY_S - 1e-9 for g in gaps), gaps  # at most one run per FOLLOW_EVERY_S


# ---- progress: the restart job's phases, not Ansible's retries -----------------------------------------
def test_progress_shows_phases_and_hides_ansibles_retry_lines():
    restart = "dflash.trainer.trainer_restart"
    clock, out, err = Clock(), io.StringIO(), io.StringIO()
    p = progress.Progress(out, clock=clock)
    handle = with_ansible_output(p, stream=err)
    handle({"event": "runner_on_ok", "event_data": {"host": "h", "resolved_action": restart,
                                                    "res": {"started": True, "phase": "stopping"}}})
    for phase in ["draining", "draining", "purging", "starting"] + ["proving"] * 5:
        clock.t += 10
        handle({"event": "runner_retry", "stdout": "FAILED - RETRYING: [h]: Watch the restart job (31 retries left).",
                "event_data": {"host": "h", "resolved_action": restart, "res": {"finished": False, "phase": phase}}})
    handle({"event": "runner_retry", "stdout": "FAILED - RETRYING: [h]: Wait for x (3 retries left).",
            "event_data": {"host": "h", "task": "Wait for x", "resolved_action": "ansible.builtin.wait_for",
                           "res": {"attempts": 1, "retries": 3}}})
    assert p.lines[:6] == ["  restart job: stopping (0 s)", "  restart job: draining (10 s)",
                           "  restart job: purging (30 s)", "  restart job: starting (40 s)",
                           "  restart job: proving (50 s)", "  restart job: proving (80 s)"]  # a heartbeat each 30 s
    assert "Watch the restart job" not in err.getvalue() and "Wait for x" in err.getvalue()
    # the watch task's own lines (one task, no retries): said once, by the progress line
    handle({"event": "verbose", "stdout": "[h] restart job: done (at 9.5 s)"})
    assert p.lines[-1] == "  h: restart job: done (at 9.5 s)" and "done (at 9.5 s)" not in err.getvalue()
