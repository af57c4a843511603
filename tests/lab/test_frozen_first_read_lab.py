"""A deploy into a frozen container (container 541) fails at its first contact, naming the freeze: pct exec
waits in a frozen container until it thaws (a suspend-mode backup, vzdump --mode suspend, freezes it for the
backup's length; lxc-freeze here, as vzdump does). The first read's call, not in the container after a few
seconds, asks the node for the container's freezer state and fails with the freeze and the remedy - well within
the connection's timeout - and its input was never sent, so nothing runs when the container thaws: the trainer
is the one that ran before, nothing of the deploy is there. Thawed, the same deploy is proved.

A read-only status while it is frozen fails the same way (logs and history read as status does). A deploy whose
first read reaches the container at once asks the node nothing (no call of its own)."""
import json
import os
import subprocess
import sys
import time

import pytest

from labkit import holds

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "541"
BOUND_S = 60  # the failure's bound: the first check comes after 5 s; pct_command_timeout is far longer
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 60,
        "trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer"),
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}}


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT], check=True,
                   stdout=subprocess.DEVNULL)
    path = tmp_path_factory.mktemp("frozen-first") / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"fz": {"proxmox_vmid": int(CT)}}, "vars": dict(
        lab.conn_vars(), ansible_pct_command_timeout=600)}}))
    yield str(path)
    subprocess.run(["lxc-unfreeze", "-n", CT], check=False)


def deploy(inv_path, *extra, playbook="deploy.yml"):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run(["ansible-playbook", "-i", inv_path, playbook, "-e", json.dumps(FAST), *extra], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=900, check=False)
    return res, " ".join((res.stdout + res.stderr).split()).replace("''", "'")


def state(lab):
    """What a deploy changes: the trainer's main PID and the ledger (releases, current, last good)."""
    pid = lab.ct(CT, "systemctl", "show", "-p", "MainPID", "--value", "dflash-trainer").stdout.strip()
    ledger = lab.ct(CT, "cat", "/opt/dflash-trainer/ledger.json").stdout
    releases = lab.ct(CT, "ls", "/opt/dflash-trainer/releases").stdout.split()
    return pid, ledger, releases


def test_a_frozen_container_fails_the_first_read_naming_the_freeze_and_nothing_changes(lab, inv):
    res, out = deploy(inv)
    assert res.returncode == 0, out[-5000:]
    verbose = deploy(inv, "-vvv")[1]  # reached at once: the node is not asked
    assert "PCT EXEC" in verbose and "PCT FROZEN?" not in verbose, verbose[-3000:]
    before = state(lab)
    assert before[0] not in ("", "0"), before
    subprocess.run(["lxc-freeze", "-n", CT], check=True)
    try:
        t0 = time.monotonic()
        res, out = deploy(inv, "-e", "trainer_force_restart=true")
        took = time.monotonic() - t0
        # a read-only status (as logs and history: the same read) names it the same way
        t1 = time.monotonic()
        status, status_out = deploy(inv, playbook="playbooks/status.yml")
        status_took = time.monotonic() - t1
    finally:
        subprocess.run(["lxc-unfreeze", "-n", CT], check=True)
    assert res.returncode != 0 and took < BOUND_S, (took, out[-5000:])
    assert "UNREACHABLE" in out and "container %s is frozen on 127.0.0.1 (/sys/fs/cgroup/" % CT in out, out[-5000:]
    assert "nothing was run in it" in out and "`pct resume %s` or `lxc-unfreeze -n %s` on the node" % (CT, CT) in out
    assert status.returncode != 0 and status_took < BOUND_S, (status_took, status_out[-5000:])
    assert "UNREACHABLE" in status_out and "container %s is frozen on 127.0.0.1" % CT in status_out, status_out[-5000:]
    # thawed, the call that waited in it has nothing to run: the trainer and the ledger stay as they were
    assert holds(lambda: state(lab) == before, 5), (state(lab), before)
    res, out = deploy(inv, "-e", "trainer_force_restart=true")
    assert res.returncode == 0 and "dflash-trainer ready: release " in out, out[-5000:]
    assert state(lab)[0] != before[0]
