"""Stop and start as locked entry points of the role, on lab container 267 (a proved trainer running):

- playbooks/stop.yml stops the unit (inactive, every GPU drained), says what it stopped (release, pid),
  and systemd's Restart= does not bring the trainer back (polled past RestartSec + a margin); status
  then says "stopped on purpose" and exits 0;
- playbooks/start.yml starts the current release and proves it (a new invocation); a second start
  while it runs proved is a no-op that says so (same pid and invocation);
- a stop while another deploy holds the lock is refused and the trainer runs on;
- trainer_stop_disable=true disables the unit, and the next start enables it again;
- a play that runs the role twice (stop, then start) gets each run's own outcome."""
import json
import os
import subprocess
import sys

import pytest

from labkit import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "267"
UNIT = "dflash-trainer"
LOCK = "/run/dflash-trainer.deploy.lock"
RESTART_SEC = 2
FAST = {"trainer_target_hosts": "all", "trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2,
        "trainer_ready_timeout_s": 60, "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"},
        "trainer_restart_sec": RESTART_SEC, "trainer_src": os.path.join(ROOT, "examples", "trainer")}


def env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


def play(inv_path, playbook, **extra):
    res = subprocess.run(["ansible-playbook", "-i", inv_path, playbook, "-e", json.dumps(dict(FAST, **extra))],
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300, check=False)
    res.out = res.stdout + res.stderr
    return res


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    path = tmp_path_factory.mktemp("stopstart") / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"ss": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    res = play(str(path), "deploy.yml")
    assert res.returncode == 0, res.out[-3000:]
    return str(path)


def unit(lab):
    out = lab.ct(CT, "systemctl", "show", UNIT, "-p", "ActiveState", "-p", "MainPID", "-p", "InvocationID",
                 "-p", "UnitFileState").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def gpus_mib(lab):
    out = lab.ct(CT, "nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits").stdout
    return {int(i): int(m) for i, m in (line.split(",") for line in out.splitlines() if line.strip())}


def current(lab):
    return os.path.basename(lab.ct(CT, "readlink", "/opt/dflash-trainer/current").stdout.strip())


def lock_free(lab):
    return lab.ct(CT, "test", "-e", LOCK).returncode == 1


def stop_and_check(lab, inv, **extra):
    before = unit(lab)
    assert before["ActiveState"] == "active"
    res = play(inv, "playbooks/stop.yml", **extra)
    assert res.returncode == 0, res.out[-3000:]
    assert "stopped %s: release %s, pid %s" % (UNIT, current(lab), before["MainPID"]) in res.out, res.out[-3000:]
    assert unit(lab)["ActiveState"] in ("inactive", "failed")
    assert all(m <= 1024 for m in gpus_mib(lab).values()), gpus_mib(lab)
    # systemd's Restart=on-failure never brings back a unit stopped with systemctl stop: polled well past
    # RestartSec (a start would show within it)
    came_back = wait_for(lambda: unit(lab)["ActiveState"] in ("active", "activating"), timeout=RESTART_SEC + 8,
                         interval=0.5)
    assert not came_back, unit(lab)
    assert lock_free(lab)
    return before, res


def test_stop_stops_drains_says_what_it_stopped_and_stays_stopped(lab, inv):
    _before, res = stop_and_check(lab, inv)
    assert "starts again when the container boots" in res.out, res.out[-3000:]
    assert unit(lab)["UnitFileState"] == "enabled"
    status = play(inv, "playbooks/status.yml")
    assert status.returncode == 0, status.out[-3000:]
    assert "health: stopped on purpose by " in status.out, status.out[-3000:]


def test_start_proves_a_new_invocation_then_a_second_start_is_a_no_op(lab, inv):
    before = unit(lab)
    assert before["ActiveState"] != "active"
    res = play(inv, "playbooks/start.yml")
    assert res.returncode == 0, res.out[-3000:]
    assert "ready: release %s" % current(lab) in res.out, res.out[-3000:]
    started = unit(lab)
    assert started["ActiveState"] == "active" and started["InvocationID"] != before["InvocationID"]
    status = play(inv, "playbooks/status.yml")
    assert status.returncode == 0 and "stopped on purpose" not in status.out, status.out[-3000:]
    again = play(inv, "playbooks/start.yml")
    assert again.returncode == 0, again.out[-3000:]
    assert "already runs its proved release" in again.out and "left running" in again.out, again.out[-3000:]
    after = unit(lab)
    assert (after["MainPID"], after["InvocationID"]) == (started["MainPID"], started["InvocationID"])
    assert lock_free(lab)


def test_a_stop_while_another_deploy_holds_the_lock_is_refused(lab, inv):
    before = unit(lab)
    assert before["ActiveState"] == "active"
    took = subprocess.run(["ansible", "-i", inv, "ss", "-m", "dflash.trainer.trainer_lock", "-a",
                           json.dumps({"path": LOCK, "token": "someoneelse", "owner": "ops on laptop",
                                       "lease_s": 3600})],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120, check=False)
    assert took.returncode == 0, took.stdout[-2000:]
    try:
        res = play(inv, "playbooks/stop.yml")
        assert res.returncode != 0, res.out[-3000:]
        assert "ops on laptop" in res.out and "stopped %s" % UNIT not in res.out, res.out[-3000:]
        assert unit(lab)["MainPID"] == before["MainPID"] and unit(lab)["ActiveState"] == "active"
        assert not lock_free(lab)  # never released by a run that did not hold it
    finally:
        subprocess.run(["ansible", "-i", inv, "ss", "-m", "dflash.trainer.trainer_lock", "-a",
                        json.dumps({"path": LOCK, "token": "someoneelse", "state": "absent"})],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120, check=False)
    assert lock_free(lab)


def test_a_stop_with_disable_disables_the_unit_and_the_start_enables_it_again(lab, inv):
    _before, res = stop_and_check(lab, inv, trainer_stop_disable=True)
    assert "stays stopped across a reboot" in res.out, res.out[-3000:]
    assert unit(lab)["UnitFileState"] == "disabled"
    started = play(inv, "playbooks/start.yml")
    assert started.returncode == 0, started.out[-3000:]
    assert unit(lab)["ActiveState"] == "active" and unit(lab)["UnitFileState"] == "enabled"


STOP_THEN_START = """
- name: Stop, then start, in one play (the role runs twice)
  hosts: all
  gather_facts: false
  tasks:
    - name: Stop
      ansible.builtin.include_role:
        name: dflash.trainer.trainer
        tasks_from: stop
    - name: Start
      ansible.builtin.include_role:
        name: dflash.trainer.trainer
        tasks_from: start
"""


def test_stop_then_start_in_one_play_each_run_its_own(lab, inv, tmp_path):
    """The role run twice in one play, as a user would stop and start: each run's own outcome, the lock free."""
    before = unit(lab)
    assert before["ActiveState"] == "active"
    playbook = tmp_path / "stop_start.yml"
    playbook.write_text(STOP_THEN_START)
    res = play(inv, str(playbook))
    assert res.returncode == 0, res.out[-3000:]
    assert "stopped %s: release %s, pid %s" % (UNIT, current(lab), before["MainPID"]) in res.out, res.out[-3000:]
    assert "ready: release %s" % current(lab) in res.out, res.out[-3000:]
    assert "nothing was started - left running" not in res.out, res.out[-3000:]  # not the start's no-op
    after = unit(lab)
    assert after["ActiveState"] == "active" and after["InvocationID"] != before["InvocationID"]
    assert lock_free(lab)


DEPLOY_TWICE = """
- name: A new release, then the same one with its unit disabled, in one play (the role runs twice)
  hosts: all
  gather_facts: false
  tasks:
    - name: Deploy a new release (uploaded, restarted by a job that takes the lock over)
      ansible.builtin.include_role:
        name: dflash.trainer.trainer
    - name: Deploy it again, its unit disabled (no restart; the play holds the lock and frees it at the end)
      ansible.builtin.include_role:
        name: dflash.trainer.trainer
      vars:
        trainer_unit_enabled: false
"""


def test_a_second_run_in_one_play_frees_the_lock_it_holds(lab, inv, tmp_path):
    """What a run learned is forgotten at its end: the second run does not take the first run's restart job
    (which took the lock over) for its own, so it frees the lock its first read took - never left held."""
    import shutil
    src = tmp_path / "trainer"
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), src)
    (src / "second-release.txt").write_text("a release of its own\n")
    playbook = tmp_path / "deploy_twice.yml"
    playbook.write_text(DEPLOY_TWICE)
    before = current(lab)
    try:
        res = play(inv, str(playbook), trainer_src=str(src))
        assert res.returncode == 0, res.out[-3000:]
        assert current(lab) != before and "ready: release %s" % current(lab) in res.out, res.out[-3000:]
        assert unit(lab)["UnitFileState"] == "disabled" and unit(lab)["ActiveState"] == "active"
        assert lock_free(lab), lab.ct(CT, "cat", LOCK).stdout
    finally:
        again = play(inv, "deploy.yml")  # the example release again, its unit enabled
        assert again.returncode == 0, again.out[-3000:]
    assert unit(lab)["UnitFileState"] == "enabled" and lock_free(lab)
