"""Every remote command bounded (plugins/module_utils/target/command.py): real hung processes, killed.

The hung nvidia-smi is the lab's stand-in (lab/fakegpu) in hang mode, run on this host behind a
wrapper shell that does not exec it (so the hung process is a grandchild: only a kill of the
whole process group gets it). Modules and the restart job's steps (drain, prove: job.cycle) run
in-process against it.
"""
import json
import os
import stat
import sys
import time

import pytest
from ansible.module_utils.testing import patch_module_args
from waiting import poll

from ansible_collections.dflash.trainer.plugins.module_utils.target import command as _run
from ansible_collections.dflash.trainer.plugins.module_utils.target.nvidia_smi import NvidiaSmiError, read_gpus
from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import (
    StepFailed, compile_regexes, drain, expectations, prove, start)
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import (
    DEFAULT_ERROR_REGEXES, DEFAULT_READY_REGEX, DEFAULT_STEP_REGEX, DEFAULT_TOKPS_REGEX)
from ansible_collections.dflash.trainer.plugins.modules import trainer_status

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKEGPU_DIR = os.path.join(ROOT, "lab", "fakegpu")
sys.path.insert(0, FAKEGPU_DIR)

import fakegpu  # noqa: E402

# run_bounded returns within timeout + 2 * KILL_WAIT_S; the rest is slack for a loaded CI box
SLACK_S = 2 * _run.KILL_WAIT_S + 0.5


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def script(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def gpu(tmp_path, monkeypatch):
    """The fakegpu state dir; hang() puts its nvidia-smi in hang mode."""
    state = tmp_path / "fakegpu"
    state.mkdir()
    monkeypatch.setenv("FAKEGPU_STATE_DIR", str(state))

    class Gpu(object):
        smi = script(tmp_path / "nvidia-smi", "#!/bin/sh\n'%s' '%s' \"$@\"\n" % (
            sys.executable, os.path.join(FAKEGPU_DIR, "nvidia-smi")))

        @staticmethod
        def hang(value="forever"):
            (state / "hang").write_text(value + "\n")

    yield Gpu
    for pid in fakegpu.hanging_pids():  # a failed test must not leave one behind either
        if alive(pid):
            os.kill(pid, 9)


def none_alive(pids):
    return not any(alive(int(pid)) for pid in pids)


def assert_none_left():
    """Every hung stand-in is dead (a SIGKILLed grandchild may take a moment to exit)."""
    assert fakegpu.hanging_pids(), "the stand-in never hung"
    poll(lambda: none_alive(fakegpu.hanging_pids()), what="hung nvidia-smi gone")


def run_module(main, args, capsys):
    start = time.monotonic()
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            main()
    return json.loads(capsys.readouterr().out), time.monotonic() - start


# --------------------------------------------------------------------------------------------
# pure parts

@pytest.mark.parametrize("argv,timeout,msg", [
    (["/usr/bin/nvidia-smi", "--query-gpu=index", "--format=csv"], 30.0, "nvidia-smi did not answer within 30 s"),
    (["systemctl", "show", "x.service", "-p", "Id"], 1.5, "systemctl show did not answer within 1.5 s"),
    (["/bin/systemctl", "start", "x"], 0.25, "systemctl start did not answer within 0.25 s"),
])
def test_timeout_message(argv, timeout, msg):
    assert _run.timeout_message(argv, timeout) == msg
    assert str(_run.CommandTimeout(argv, timeout)) == msg


def test_command_env_like_run_command():
    env = _run.command_env({"PATH": "/bin", "PYTHONPATH": "/tmp/x/ansible_modlib.zip:/opt/lib", "LANG": "x"},
                           {"LANG": "C.UTF-8"})
    assert env == {"PATH": "/bin", "PYTHONPATH": "/opt/lib", "LANG": "C.UTF-8"}
    assert "PYTHONPATH" not in _run.command_env({"PYTHONPATH": "/a/debug_dir"})


def test_runner_bound_keeps_the_deadline():
    now = [100.0]
    run = _run.Runner(30.0, deadline=110.0, clock=lambda: now[0])
    assert run.bound() == 10.0       # the deadline is nearer than the per-command bound
    now[0] = 50.0
    assert run.bound() == 30.0       # the per-command bound is nearer
    now[0] = 111.0
    assert run.bound() == _run.MIN_POLL_S  # past the deadline: one last short poll
    assert _run.Runner(5.0).bound() == 5.0
    assert _run.Runner().bound() == _run.DEFAULT_TIMEOUT_S


# --------------------------------------------------------------------------------------------
# real processes

def test_answering_command_passes_through(tmp_path):
    cmd = script(tmp_path / "cmd", "#!/bin/sh\necho out; echo err >&2; exit 3\n")
    assert _run.run_bounded([cmd], 10.0) == (3, "out\n", "err\n")


def test_hung_nvidia_smi_killed_with_its_group_within_bound(gpu):
    gpu.hang()
    start = time.monotonic()
    with pytest.raises(_run.CommandTimeout) as err:
        _run.Runner(1.0)([gpu.smi, "--query-gpu=index", "--format=csv"])
    elapsed = time.monotonic() - start
    assert str(err.value) == "nvidia-smi did not answer within 1 s"
    assert 1.0 <= elapsed <= 1.0 + SLACK_S, elapsed
    assert_none_left()  # the SIGTERM-deaf grandchild is gone, not orphaned


def test_slow_but_answering_nvidia_smi_is_not_a_hang(gpu):
    gpu.hang("0.3")
    rc, out, _err = _run.Runner(10.0)([gpu.smi, "--query-gpu=index", "--format=csv,noheader"])
    assert rc == 0 and out.splitlines()[0] == "0"


def test_a_freeze_during_a_command_is_not_counted_against_its_bound_on_a_paused_clock(tmp_path):
    """The restart job's proof runs its commands on a PausedClock: a container frozen while a command ran (the
    command frozen with it) shows as a jump of the clock; on the wall clock the command is past its bound and
    killed, on the paused clock it is waited for, and a command that hangs is still killed at its bound."""
    from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import PausedClock
    cmd = script(tmp_path / "cmd", "#!/bin/sh\nsleep 1.5; echo done\n")
    reads = [0]

    def frozen_once():  # the second reading comes 60 s late: the freeze
        reads[0] += 1
        return time.monotonic() + (60 if reads[0] >= 2 else 0)
    with pytest.raises(_run.CommandTimeout):
        _run.run_bounded([cmd], 10.0, clock=frozen_once)
    reads[0] = 0
    paused = PausedClock(frozen_once)
    assert _run.Runner(10.0, clock=paused.clock)([cmd]) == (0, "done\n", "")
    assert paused.paused_s >= 60
    hung = script(tmp_path / "hung", "#!/bin/sh\nexec sleep 60\n")
    start = time.monotonic()
    with pytest.raises(_run.CommandTimeout):
        _run.Runner(1.0, clock=PausedClock().clock)([hung])
    assert time.monotonic() - start <= 1.0 + _run.WAIT_SLICE_S + SLACK_S


def test_escaped_grandchild_holding_the_pipe_does_not_block(tmp_path):
    """A child that left the process group (setsid) keeps stdout open: we stop reading."""
    pidfile = tmp_path / "pid"
    cmd = script(tmp_path / "cmd", "#!/bin/sh\nsetsid sh -c 'echo $$ > %s; exec sleep 60' &\nsleep 60\n" % pidfile)
    start = time.monotonic()
    with pytest.raises(_run.CommandTimeout):
        _run.run_bounded([cmd], 0.5)
    assert time.monotonic() - start <= 0.5 + SLACK_S
    os.kill(int(pidfile.read_text()), 9)  # ours to clean up: it escaped on purpose


def test_read_gpus_turns_a_hang_into_nvidia_smi_error(gpu):
    gpu.hang()
    with pytest.raises(NvidiaSmiError, match=r"^nvidia-smi did not answer within 1 s$"):
        read_gpus(_run.Runner(1.0), gpu.smi)
    assert_none_left()


# --------------------------------------------------------------------------------------------
# modules

def test_the_drain_step_keeps_its_deadline_when_nvidia_smi_hangs(gpu):
    """The restart job's drain (job.steps: a Runner bounded by the drain's deadline)."""
    gpu.hang()
    began = time.monotonic()
    with pytest.raises(StepFailed) as exc:
        drain(_run.Runner(deadline=began + 1.2), gpu.smi, timeout_s=1.2)
    elapsed = time.monotonic() - began
    assert exc.value.msg.startswith("nvidia-smi did not answer within 1.")
    assert elapsed <= 1.2 + SLACK_S, elapsed
    assert_none_left()


def fake_systemctl(tmp_path, monkeypatch, active="active", hang=None):
    """A systemctl on PATH: `show` prints the unit's properties, the verb ``hang`` sleeps in a
    child (its pids in tmp_path/hung.pids)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    props = ("Id=t.service\nLoadState=loaded\nActiveState=%s\nSubState=running\nMainPID=0\n"
             "InvocationID=abc\nNRestarts=0\nNeedDaemonReload=no\n" % active)
    script(bin_dir / "systemctl", "#!/bin/sh\n"
           'if [ "$1" = "%s" ]; then echo $$ >> %s; sleep 600 & echo $! >> %s; wait; fi\n'
           'if [ "$1" = show ]; then printf "%%s" "%s"; fi\n'
           % (hang, tmp_path / "hung.pids", tmp_path / "hung.pids", props))
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    return tmp_path / "hung.pids"


def test_trainer_status_fails_saying_systemctl_hung(tmp_path, gpu, capsys, monkeypatch):
    pids = fake_systemctl(tmp_path, monkeypatch, hang="show")
    monkeypatch.setattr(_run, "DEFAULT_TIMEOUT_S", 0.5)
    out, elapsed = run_module(trainer_status.main, {"unit": "t.service", "nvidia_smi": gpu.smi}, capsys)
    assert out["failed"] is True and out["msg"] == "systemctl show did not answer within 0.5 s"
    assert elapsed <= 0.5 + SLACK_S
    hung = pids.read_text().split()
    assert len(hung) == 2  # the script and its sleep
    poll(lambda: none_alive(hung), what="hung systemctl gone")


def test_trainer_status_reports_a_hung_nvidia_smi_as_gpu_error(tmp_path, gpu, capsys, monkeypatch):
    fake_systemctl(tmp_path, monkeypatch)
    monkeypatch.setattr(_run, "DEFAULT_TIMEOUT_S", 0.5)
    gpu.hang()
    out, elapsed = run_module(trainer_status.main, {"unit": "t.service", "nvidia_smi": gpu.smi}, capsys)
    assert not out.get("failed") and out["gpu_error"] == "nvidia-smi did not answer within 0.5 s"
    assert out["active_state"] == "active"  # systemctl answered; only the GPU part is missing
    assert elapsed <= 0.5 + SLACK_S
    assert_none_left()


def test_the_start_step_fails_saying_systemctl_start_hung(tmp_path, monkeypatch):
    pids = fake_systemctl(tmp_path, monkeypatch, active="inactive", hang="start")
    began = time.monotonic()
    with pytest.raises(StepFailed) as exc:
        start(_run.Runner(), "systemctl", "t.service", start_run=_run.Runner(timeout_s=0.5))
    assert exc.value.msg == ("systemctl start did not answer within 0.5 s; "
                             "the start job may still be queued (systemctl list-jobs)")
    assert time.monotonic() - began <= 0.5 + SLACK_S
    hung = pids.read_text().split()
    assert len(hung) == 2
    poll(lambda: none_alive(hung), what="hung systemctl gone")


def test_the_proof_fails_saying_nvidia_smi_hung_within_its_deadline(tmp_path, gpu, monkeypatch):
    """The restart job's proof (job.steps: a Runner bounded by the proof's deadline)."""
    fake_systemctl(tmp_path, monkeypatch)
    gpu.hang()
    log = tmp_path / "trainer.log"
    log.write_text("")
    p = {"gpus": None, "min_mib": 1024, "min_steps": 2, "hold_s": 10.0, "stall_s": 5.0, "timeout_s": 1.2,
         "tail_lines": 20, "ready_regex": DEFAULT_READY_REGEX}
    regexes = compile_regexes(DEFAULT_READY_REGEX, DEFAULT_STEP_REGEX, DEFAULT_TOKPS_REGEX, DEFAULT_ERROR_REGEXES)
    began = time.monotonic()
    with pytest.raises(StepFailed) as exc:
        prove(_run.Runner(deadline=began + 1.2), "systemctl", gpu.smi, "t.service", str(log),
              expectations("abc", 0, p), regexes, interval_s=0.5)
    elapsed = time.monotonic() - began
    assert exc.value.msg.startswith("nvidia-smi did not answer within 1.")
    assert elapsed <= 1.2 + SLACK_S, elapsed
    assert_none_left()
