# -*- coding: utf-8 -*-
"""systemctl show parsing and what the properties mean."""

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.target import systemd as sd

CRASHED = """\
Id=dflash-trainer.service
LoadState=loaded
ActiveState=failed
SubState=failed
Result=exit-code
MainPID=0
ExecMainPID=4242
InvocationID=6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70
NRestarts=0
ExecMainCode=1
ExecMainStatus=1
ExecMainStartTimestamp=Mon 2026-11-30 04:05:06 UTC
ExecMainStartTimestampMonotonic=1000000000
ExecMainExitTimestamp=Mon 2026-11-30 04:05:06 UTC
ExecMainExitTimestampMonotonic=1000600000
NeedDaemonReload=no
ExecStart={ path=/usr/local/bin/dflash-trainer-launch ; argv[]=/usr/local/bin/dflash-trainer-launch ./run.sh ;
 ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }
Description={weird description without a closing brace
"""


def test_argv():
    assert sd.show_argv("dflash-trainer.service", ("ActiveState", "NRestarts")) == [
        "systemctl", "show", "dflash-trainer.service", "--no-pager", "-p", "ActiveState,NRestarts"]
    assert sd.start_argv("u.service", systemctl="/bin/systemctl") == ["/bin/systemctl", "start", "u.service"]
    assert "InvocationID" in sd.show_argv("u")[-1].split(",")


def test_parse_show():
    props = sd.parse_show(CRASHED)
    assert props["ActiveState"] == "failed"
    assert props["InvocationID"] == "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
    assert props["ExecStart"].startswith("{ path=/usr/local/bin/dflash-trainer-launch")
    assert props["ExecStart"].endswith("}")
    assert props["Description"] == "{weird description without a closing brace"
    assert sd.parse_show(CRASHED.splitlines()) == props
    assert sd.parse_show("") == {}
    assert sd.parse_show("Environment=A=1 B=2\n") == {"Environment": "A=1 B=2"}


@pytest.mark.parametrize("code,status,expected", [
    ("1", "1", "exited with status 1"),
    ("1", "0", "exited with status 0"),
    ("2", "9", "killed by signal KILL"),
    ("2", "15", "killed by signal TERM"),
    ("3", "11", "dumped core (signal SEGV)"),
    ("0", "0", None),
    ("", "", None),
])
def test_exit_description(code, status, expected):
    assert sd.exit_description({"ExecMainCode": code, "ExecMainStatus": status}) == expected


def test_runtime():
    props = sd.parse_show(CRASHED)
    assert sd.runtime_s(props) == pytest.approx(0.6)
    running = dict(props, ExecMainExitTimestampMonotonic="0")
    assert sd.runtime_s(running) is None
    assert sd.runtime_s(running, now_monotonic_s=1012.5) == pytest.approx(12.5)
    assert sd.runtime_s({}) is None


def test_state_helpers():
    assert sd.is_running({"ActiveState": "active", "SubState": "running"})
    assert not sd.is_running({"ActiveState": "activating", "SubState": "auto-restart"})
    assert sd.is_active({"ActiveState": "activating"})
    assert not sd.is_active({"ActiveState": "failed"})
    assert sd.needs_daemon_reload({"NeedDaemonReload": "yes"})
    assert not sd.needs_daemon_reload({"NeedDaemonReload": "no"})
    assert sd.int_prop({"NRestarts": "[not set]"}, "NRestarts", 7) == 7
    assert sd.pick(sd.parse_show(CRASHED))["ExecMainStatus"] == "1"


@pytest.mark.parametrize("props,allow,expected", [
    ({"LoadState": "loaded", "ActiveState": "inactive"}, False, ("start", None)),
    ({"LoadState": "loaded", "ActiveState": "failed"}, False, ("start", None)),
    ({"LoadState": "loaded", "ActiveState": "active"}, False,
     ("fail", "unit t.service is already active; stop it first")),
    ({"LoadState": "loaded", "ActiveState": "activating"}, False,
     ("fail", "unit t.service is already activating; stop it first")),
    ({"LoadState": "loaded", "ActiveState": "active"}, True,
     ("keep", "unit t.service is already active; left running")),
    ({"LoadState": "loaded", "ActiveState": "inactive", "NeedDaemonReload": "yes"}, False,
     ("fail", "unit t.service: unit file changed on disk; daemon-reload first")),
    ({"LoadState": "not-found", "ActiveState": "inactive"}, False,
     ("fail", "unit t.service cannot be started (LoadState=not-found)")),
])
def test_start_decision(props, allow, expected):
    assert sd.start_decision("t.service", props, allow) == expected


@pytest.mark.parametrize("before,after,baseline", [
    ("0", "0", 0),
    ("3", "0", 0),   # explicit start reset the counter
    ("3", "1", 0),   # reset, then one restart already: 1 > 0 is caught
    ("2", "2", 2),   # no reset
    ("2", "3", 2),   # no reset, restart already happened: 3 > 2 is caught
])
def test_restart_baseline(before, after, baseline):
    assert sd.restart_baseline({"NRestarts": before}, {"NRestarts": after}) == baseline


# ---------------------------------------------------------------------------------------------
# the start step (module_utils/job/cycle.start, run by the restart job) against a fake systemctl
# (show reads a file, start flips it to running)

import stat

from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed, start
from ansible_collections.dflash.trainer.plugins.module_utils.target.command import Runner

STOPPED = "ActiveState=inactive\nSubState=dead\nLoadState=loaded\nNRestarts=3\nInvocationID=\nNeedDaemonReload=no\n"
RUNNING = ("ActiveState=active\nSubState=running\nLoadState=loaded\nNRestarts=0\nMainPID=4242\n"
           "InvocationID=6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70\nNeedDaemonReload=no\n"
           "ExecMainStartTimestamp=Mon 2026-11-30 04:05:06 UTC\n")


@pytest.fixture
def fake_systemctl(tmp_path):
    state = tmp_path / "show.txt"
    running = tmp_path / "running.txt"
    running.write_text(RUNNING)
    script = tmp_path / "systemctl"
    script.write_text('#!/bin/sh\necho "$@" >> %s/calls\n'
                      'case "$1" in show) cat %s ;; start) cp %s %s ;; esac\n' % (tmp_path, state, running, state))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return state


def run_start(tmp_path, allow_running=False):
    return start(Runner(), str(tmp_path / "systemctl"), "t.service", allow_running)


def test_start_starts_and_records(fake_systemctl, tmp_path):
    fake_systemctl.write_text(STOPPED)
    out = run_start(tmp_path)
    assert out["started"] is True
    assert out["invocation_id"] == "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
    assert out["main_pid"] == 4242
    assert out["n_restarts"] == 0          # 3 before, 0 after: the start reset the counter
    assert out["started_at"] == "Mon 2026-11-30 04:05:06 UTC"
    # the start limit is reset first: a deliberate start is not a crash loop
    assert (tmp_path / "calls").read_text().splitlines()[1:3] == ["reset-failed t.service", "start t.service"]


@pytest.mark.parametrize("show,expected", [
    (RUNNING, "unit t.service is already active; stop it first"),
    (STOPPED.replace("NeedDaemonReload=no", "NeedDaemonReload=yes"),
     "unit t.service: unit file changed on disk; daemon-reload first"),
])
def test_start_refuses(fake_systemctl, tmp_path, show, expected):
    fake_systemctl.write_text(show)
    with pytest.raises(StepFailed) as exc:
        run_start(tmp_path)
    assert exc.value.msg == expected
    assert "start t.service" not in (tmp_path / "calls").read_text().splitlines()


def test_start_allow_running_keeps(fake_systemctl, tmp_path):
    fake_systemctl.write_text(RUNNING)
    out = run_start(tmp_path, allow_running=True)
    assert out["started"] is False
    assert out["invocation_id"] == "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
