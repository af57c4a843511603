"""A deploy that changes nothing ends in its first read (issue 14 item 5), on lab container 237: the
status read takes the lock, compares the files the deploy installs and the release id the
controller computed, and releases the lock in the same call - but only when nothing at all asks
for work:

- a changed environment is no no-op: the trainer restarts "because: environment changed" with the
  new file, and the next run is a no-op again (same MainPID, lock free);
- a unit disabled by hand is enabled again, without a restart;
- a lock someone else holds is still refused: a no-op never reports "left running" past a holder."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "237"
LOCK = "/run/dflash-trainer.deploy.lock"
FAST = {"trainer_target_hosts": "all", "trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2,
        "trainer_ready_timeout_s": 60, "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"},
        "trainer_src": os.path.join(ROOT, "examples", "trainer")}


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    path = tmp_path_factory.mktemp("noop") / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"n": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    res = play(str(path))
    assert res.returncode == 0, res.stdout[-3000:]
    return str(path)


def play(inv_path, **extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(["ansible-playbook", "-i", inv_path, "deploy.yml", "-e", json.dumps(dict(FAST, **extra))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def main_pid(lab):
    return lab.ct(CT, "systemctl", "show", "-p", "MainPID", "--value", "dflash-trainer").stdout.strip()


def lock_free(lab):
    return lab.ct(CT, "test", "-e", LOCK).returncode == 1


def test_a_changed_environment_restarts_then_the_next_run_is_a_no_op(lab, inv):
    before = main_pid(lab)
    res = play(inv, trainer_env=dict(FAST["trainer_env"], NOOP_TEST_KNOB="1"))
    assert res.returncode == 0, res.stdout[-3000:]
    assert "restarted because: environment changed" in res.stdout, res.stdout[-3000:]
    assert main_pid(lab) != before
    assert "NOOP_TEST_KNOB" in lab.ct(CT, "cat", "/etc/dflash-trainer/trainer.env").stdout
    pid = main_pid(lab)
    again = play(inv, trainer_env=dict(FAST["trainer_env"], NOOP_TEST_KNOB="1"))
    assert again.returncode == 0 and "left running" in again.stdout, again.stdout[-3000:]
    assert main_pid(lab) == pid and lock_free(lab)


def test_a_unit_disabled_by_hand_is_enabled_again_without_a_restart(lab, inv):
    assert play(inv).returncode == 0
    pid = main_pid(lab)
    assert lab.ct(CT, "systemctl", "disable", "dflash-trainer").returncode == 0
    res = play(inv)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "left running" in res.stdout, res.stdout[-3000:]
    assert lab.ct(CT, "systemctl", "is-enabled", "dflash-trainer").stdout.strip() == "enabled"
    assert main_pid(lab) == pid and lock_free(lab)


def test_a_lock_held_by_another_deploy_is_refused_not_reported_left_running(lab, inv):
    assert play(inv).returncode == 0
    # another deploy's lock, live (a lease of an hour): taken as trainer_lock takes it
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    took = subprocess.run(["ansible", "-i", inv, "n", "-m", "dflash.trainer.trainer_lock", "-a",
                           json.dumps({"path": LOCK, "token": "someoneelse", "owner": "ops on laptop", "lease_s": 3600})],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert took.returncode == 0, took.stdout[-2000:]
    try:
        res = play(inv)
        assert res.returncode != 0, res.stdout[-3000:]
        assert "left running" not in res.stdout and "ops on laptop" in res.stdout, res.stdout[-3000:]
        assert not lock_free(lab)  # never released by a run that did not hold it
    finally:
        subprocess.run(["ansible", "-i", inv, "n", "-m", "dflash.trainer.trainer_lock", "-a",
                        json.dumps({"path": LOCK, "token": "someoneelse", "state": "absent"})],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert lock_free(lab)
