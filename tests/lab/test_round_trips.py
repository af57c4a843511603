"""Fewer, fatter remote calls (issue 8 item 5, issue 14 item 5), counted on lab container 225 from
the connection's own -vvv trace: a no-op deploy makes 1 remote call (the status read that takes the
lock, finds that the deploy changes nothing - same release, proved, healthy, no file to install -
and releases the lock), status at most 2, a forced restart of the current release 1 (the first read
finds the release current and starts the job in the same call: pre-flight + install + job start with
its first 10 s watch - no release call, no second start call)."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "225"
# steps every 0.2 s: the forced restart's proof (2 steps, then the 2 s hold) is a small part of the first read's
# 10 s watch (roles/trainer/vars/main.yml __trainer_job_args.wait_s), not ~5 s of it as at the 1 s default
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3", "FAKE_TRAINER_STEP_INTERVAL_S": "0.2"},
        "trainer_target_hosts": "all",
        "trainer_src": os.path.join(ROOT, "examples", "trainer")}


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    path = tmp_path_factory.mktemp("rt") / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"rt": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    res = play(str(path), "deploy.yml")
    assert res.returncode == 0, res.stdout[-3000:]
    return str(path)


def play(inv_path, playbook, **extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(["ansible-playbook", "-vvv", "-i", inv_path, playbook, "-l", "rt", "-e",
                           json.dumps(dict(FAST, **extra))], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def calls(out):
    """Remote calls: the connection's EXEC, PUT and FETCH lines."""
    return len(re.findall(r"^<[^>]+> PCT (EXEC|PUT|FETCH) ", out, re.M))


def test_no_op_deploy_makes_1_remote_call_and_frees_the_lock(inv, lab):
    res = play(inv, "deploy.yml")
    assert res.returncode == 0 and "changed=0" in res.stdout and "left running" in res.stdout, res.stdout[-3000:]
    assert calls(res.stdout) == 1, calls(res.stdout)
    # the first read released the lock: nothing is left behind for the next run
    assert lab.ct(CT, "test", "-e", "/run/dflash-trainer.deploy.lock").returncode == 1, "the no-op left the lock behind"


def test_status_makes_at_most_2_remote_calls(inv):
    res = play(inv, "playbooks/status.yml")
    assert res.returncode == 0, res.stdout[-3000:]
    assert 1 <= calls(res.stdout) <= 2, calls(res.stdout)


def test_forced_restart_is_1_call(inv):
    res = play(inv, "deploy.yml", trainer_force_restart=True)
    assert res.returncode == 0, res.stdout[-3000:]
    # a 2 s hold: the job ends, proved, within the first read's own 10 s watch; the first read's report shows the
    # proof and the role ends there - the start and watch tasks of the upload path are not even reached
    for task in ("Pre-flight, install and start the restart job", "Watch the restart job", "Release the deploy lock"):
        assert task not in res.stdout, res.stdout[-3000:]
    proof = res.stdout.split("Report the last restart job", 1)[1][:2000]
    assert re.search(r"^ok: \[rt\]", proof, re.M) and "ready: release" in proof, proof
    assert "End the deploy (nothing is left past the first read" in res.stdout, res.stdout[-3000:]
    assert calls(res.stdout) == 1, calls(res.stdout)
