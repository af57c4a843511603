"""A container frozen during a restart's proof (container 245): a suspend-mode backup (vzdump --mode suspend)
freezes the container - the trainer and the restart job proving it stop together - and thaws it when the backup
ends. Here the freeze outlasts the proof's whole deadline (trainer_ready_timeout_s): on the wall clock the
trainer was not ready in time - a failed release, rolled back; on the proof's clock that time is not there. The
release is proved, and the proof says how long it did not run. The freeze is lxc-freeze, as vzdump's suspend
mode does."""
import json
import os
import subprocess
import sys
import time

import pytest

from labkit import wait_for

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "245"
STATE = "/var/lib/dflash-trainer/restart.json"
FREEZE_S = 40  # the fault's length: longer than the proof's deadline (30 s) and its tolerance of a late step (10 s)
FAST = {"trainer_ready_hold_s": 6, "trainer_ready_stall_s": 3, "trainer_ready_timeout_s": 30,
        "trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer"),
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3", "FAKE_TRAINER_STEP_INTERVAL_S": "0.5"}}


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT], check=True,
                   stdout=subprocess.DEVNULL)
    path = tmp_path_factory.mktemp("frozen") / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"fz": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    yield str(path)
    subprocess.run(["lxc-unfreeze", "-n", CT], check=False)


def phase(lab):
    res = lab.ct(CT, "cat", STATE)
    try:
        return json.loads(res.stdout).get("phase") if res.returncode == 0 else None
    except ValueError:
        return None


def test_a_freeze_during_the_proof_is_not_a_failed_release(lab, inv):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    log = os.path.join(os.path.dirname(inv), "deploy.out")
    with open(log, "w") as out:
        proc = subprocess.Popen(["ansible-playbook", "-i", inv, "deploy.yml", "-e", json.dumps(FAST)], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert wait_for(lambda: phase(lab) == "proving" or proc.poll() is not None, timeout=300, interval=0.1)
        assert proc.poll() is None, open(log).read()[-4000:]
        subprocess.run(["lxc-freeze", "-n", CT], check=True)
        try:
            time.sleep(FREEZE_S)  # the backup's length (the fault itself, not a wait for a condition)
        finally:
            subprocess.run(["lxc-unfreeze", "-n", CT], check=True)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    text = open(log).read()
    out = " ".join(text.split()).replace("''", "'")
    assert proc.returncode == 0, out[-5000:]
    assert "dflash-trainer ready: release " in out and "s (its container frozen), not counted" in out, out[-5000:]
    assert lab.ct(CT, "systemctl", "is-active", "dflash-trainer").stdout.strip() == "active"
