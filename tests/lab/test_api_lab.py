"""dflash_trainer against the lab: the real playbooks through ansible-runner, typed results back.

Deploys the stand-in trainer (examples/trainer) to gpu-host (container 200), deploys it again
(nothing may change or restart), then reads the status through the API and through the CLI.
"""
import json
import os
import subprocess
import sys

import pytest

import dflash_trainer

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOST = "gpu-host"
EXTRAVARS = {"trainer_src": os.path.join(ROOT, "examples", "trainer")}


def explain(result):
    return json.dumps(result.to_dict(), indent=1, default=str)


@pytest.fixture(scope="module")
def deployed(lab):
    """Deploy (restarting and proving only when needed) and return its RunResult."""
    result = dflash_trainer.deploy(limit=HOST, extravars=EXTRAVARS, timeout=900)
    assert result.ok, explain(result)
    return result


def test_deploy_is_typed_and_proved_when_it_restarts(deployed):
    assert list(deployed.hosts) == [HOST] and deployed.rc == 0 and deployed.status == "successful"
    h = deployed.hosts[HOST]
    assert h.ok and h.failed_task is None and h.reason is None and not h.rolled_back
    assert h.release and len(h.release) == 16
    if h.restarted:
        assert h.proof is not None and h.proof.release == h.release
        assert h.proof.main_pid > 0 and h.proof.step >= 1 and h.proof.tok_s > 0
        assert sorted(h.proof.gpus_mib) == list(range(8)) and min(h.proof.gpus_mib.values()) >= 1024


def test_second_deploy_changes_nothing(deployed):
    again = dflash_trainer.deploy(limit=HOST, extravars=EXTRAVARS, timeout=600)
    assert again.ok, explain(again)
    h = again.hosts[HOST]
    assert h.release == deployed.hosts[HOST].release == h.previous_release
    assert not h.restarted and h.proof is None and not h.changed, explain(again)


def test_status_reports_the_running_release(deployed):
    result = dflash_trainer.status(limit=HOST)
    assert result.ok, explain(result)
    s = result.hosts[HOST].status
    release = deployed.hosts[HOST].release
    assert s is not None, explain(result)
    assert s.active and s.active_state == "active" and s.sub_state == "running" and s.main_pid > 0
    assert s.running_release == s.current_release == release and s.drift is False
    assert s.last_good == release
    assert sorted(s.gpus_mib) == list(range(8)) and min(s.gpus_mib.values()) >= 1024
    assert s.seconds_since_start > 0 and s.last_progress_line and "step=" in s.last_progress_line


def test_cli_status_json(deployed):
    proc = subprocess.run([sys.executable, "-m", "dflash_trainer", "status", "-l", HOST, "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["hosts"][HOST]["status"]["running_release"] == deployed.hosts[HOST].release
