"""Paths followed through another user's link (container 421): a progress file whose directory is a
symlink alice (uid 1000) owns, pointing at a root-only directory holding a root-owned file, is refused
before any change (the resolved file and directory are root's alone: only the way as written shows
her link, which she could point at a file of hers after the check); the same for a log path."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "421"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 60,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}, "trainer_target_hosts": "all",
        "trainer_src": os.path.join(ROOT, "examples", "trainer")}
SETUP = r"""
set -e
id -u alice >/dev/null 2>&1 || useradd --uid 1000 --create-home --shell /bin/bash alice
mkdir -p /data/runs /data/logs
chmod 0755 /data /data/runs /data/logs
echo '{"step": 1, "tok_s": 10.0}' > /data/runs/progress.jsonl
chmod 0644 /data/runs/progress.jsonl
ln -sfn /data/runs /data/alice-runs
ln -sfn /data/logs /data/alice-logs
chown -h alice: /data/alice-runs /data/alice-logs
"""
STATE = ("cd /opt/dflash-trainer && echo \"$(ls releases | tr '\\n' ' ') $(readlink current)\" && "
         "systemctl show dflash-trainer -p MainPID -p InvocationID -p ActiveState --value | tr '\\n' ' ' && "
         "sha256sum /etc/dflash-trainer/trainer.env /etc/systemd/system/dflash-trainer.service && ls -A /data/logs")


def ansible_env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


def deploy(inv, tmp, **extra):
    path = tmp / "extra.json"
    path.write_text(json.dumps(dict(FAST, **extra)))
    res = subprocess.run(["ansible-playbook", "-i", str(inv), "deploy.yml", "-l", "ct", "-e", "@%s" % path],
                         cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=600, check=False)
    return res.returncode, " ".join((res.stdout + res.stderr).split())


@pytest.fixture(scope="module")
def ct(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    res = lab.ct(CT, "sh", "-c", SETUP)
    assert res.returncode == 0, res.stderr
    tmp = tmp_path_factory.mktemp("links")
    inv = tmp / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    rc, out = deploy(inv, tmp)
    assert rc == 0 and "dflash-trainer ready: release " in out, out[-4000:]
    yield inv, tmp
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "down", "--ids", CT],
                   check=False, stdout=subprocess.DEVNULL)


@pytest.mark.parametrize("variables,words", [
    ({"trainer_progress_path": "/data/alice-runs/progress.jsonl"},
     "/data/alice-runs/progress.jsonl is reached through /data/alice-runs, a symlink owned by uid 1000"),
    ({"trainer_log_path": "/data/alice-logs/trainer.log"},
     "is reached through /data/alice-logs, a symlink owned by uid 1000"),
], ids=["progress-file", "log"])
def test_a_path_through_another_users_link_is_refused_before_any_change(lab, ct, variables, words):
    inv, tmp = ct
    before = lab.ct(CT, "bash", "-c", STATE)
    assert before.returncode == 0, before.stderr
    rc, out = deploy(inv, tmp, trainer_force_restart=True, **variables)
    assert rc != 0, out[-4000:]
    assert words in out, out[-4000:]
    assert "Traceback" not in out
    assert lab.ct(CT, "bash", "-c", STATE).stdout == before.stdout
