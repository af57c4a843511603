"""The playbooks from the repository root, end to end on lab containers 213 and 214:
restart, status, on-demand rollback, and a two-host deploy that stops at the first failure;
and a run whose host pattern matches no host fails, saying so, without touching a container."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTS = ("213", "214")
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30, "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}}


@pytest.fixture(scope="module")
def hosts(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", *CTS],
                   check=True, stdout=subprocess.DEVNULL)
    inv = tmp_path_factory.mktemp("inv") / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"pb-%s" % ct: {"proxmox_vmid": int(ct)} for ct in CTS}, "vars": {
        "ansible_connection": "dflash.trainer.pct", "ansible_host": lab.host, "ansible_port": lab.port,
        "ansible_user": lab.user, "ansible_ssh_private_key_file": lab.key,
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_pct_known_hosts_file": lab.facts["known_hosts"]}}}))
    return str(inv)


def playbook(inv, path, limit, **extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    extra = dict(FAST, trainer_target_hosts="all", **extra)
    return subprocess.run(["ansible-playbook", "-i", inv, path, "-l", limit, "-e", json.dumps(extra)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def tree(tmp_path, name, fault=None):
    dst = tmp_path / name
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), dst)
    (dst / "VERSION").write_text(name + "\n")
    if fault:
        (dst / "fault.env").write_text("FAULT=%s\n" % fault)
    return str(dst)


def show(lab, ct, prop):
    return lab.ct(ct, "systemctl", "show", "dflash-trainer", "-p", prop, "--value").stdout.strip()


def current(lab, ct):
    return os.path.basename(lab.ct(ct, "readlink", "/opt/dflash-trainer/current").stdout.strip())


def test_restart_status_and_rollback(lab, hosts, tmp_path):
    ct = CTS[0]
    res = playbook(hosts, "deploy.yml", "pb-" + ct, trainer_src=tree(tmp_path, "v1"))
    assert res.returncode == 0, res.stdout[-3000:]
    v1 = current(lab, ct)
    res = playbook(hosts, "deploy.yml", "pb-" + ct, trainer_src=tree(tmp_path, "v2"))
    assert res.returncode == 0, res.stdout[-3000:]
    v2 = current(lab, ct)
    assert v2 != v1

    # restart: a new activation on the same release, proved
    before = show(lab, ct, "InvocationID")
    res = playbook(hosts, "playbooks/restart.yml", "pb-" + ct)
    assert res.returncode == 0, res.stdout[-3000:]
    assert show(lab, ct, "InvocationID") != before and current(lab, ct) == v2
    assert "ready: release %s" % v2 in res.stdout.replace("\n", " ").replace("  ", " ")

    # status: read-only, names running/current/last good and progress
    res = playbook(hosts, "playbooks/status.yml", "pb-" + ct)
    assert res.returncode == 0 and "changed=0" in res.stdout
    assert "release running %s, current %s, last good %s" % (v2, v2, v2) in res.stdout
    assert "tok/s" in res.stdout

    # on-demand rollback: current is the last good one, so a release must be named
    res = playbook(hosts, "playbooks/rollback.yml", "pb-" + ct)
    assert res.returncode != 0 and "nothing to roll back to" in res.stdout
    res = playbook(hosts, "playbooks/rollback.yml", "pb-" + ct, trainer_rollback_release=v1)
    assert res.returncode == 0, res.stdout[-3000:]
    assert current(lab, ct) == v1
    assert lab.ct(ct, "cat", "/opt/dflash-trainer/last_good").stdout.strip() == v1
    pid = show(lab, ct, "MainPID")
    child = lab.ct(ct, "pgrep", "-P", pid).stdout.split()[0]
    assert ("DFLASH_RELEASE=" + v1) in lab.ct(ct, "cat", "/proc/%s/environ" % child).stdout.split("\0")


def test_fleet_deploy_is_serial_and_stops_at_the_first_failure(lab, hosts, tmp_path):
    good_src = tree(tmp_path, "good")
    for ct in CTS:  # both start from a known good release
        res = playbook(hosts, "deploy.yml", "pb-" + ct, trainer_src=good_src)
        assert res.returncode == 0, res.stdout[-3000:]
    good = {ct: current(lab, ct) for ct in CTS}
    untouched = lab.ct(CTS[1], "ls", "/opt/dflash-trainer/releases").stdout.split()
    res = playbook(hosts, "deploy.yml", "all", trainer_src=tree(tmp_path, "broken", fault="import_error"))
    assert res.returncode != 0
    assert "ModuleNotFoundError: No module named 'flash_attn'" in res.stdout
    # serial: 1 — the first host failed (and rolled back); the second was never touched
    assert current(lab, CTS[0]) == good[CTS[0]]
    assert current(lab, CTS[1]) == good[CTS[1]]
    # (the trainer-group play before it skips every host that is in no group)
    assert "pb-%s" % CTS[1] not in res.stdout.split("PLAY [Deploy and prove the DFlash trainer]")[1].split("PLAY RECAP")[0]
    releases = lab.ct(CTS[1], "ls", "/opt/dflash-trainer/releases").stdout.split()
    assert releases == untouched and good[CTS[1]] in releases
    # the failed deploy released its lock (the role's `always`)
    assert lab.ct(CTS[0], "test", "-d", "/run/dflash-trainer.deploy.lock").returncode == 1


def test_a_second_deploy_is_refused_while_one_runs(lab, hosts, tmp_path):
    """Two deploys to one container would interleave stop/start/proof: the lock refuses the second."""
    from labkit import wait_for
    ct = CTS[0]
    src = tree(tmp_path, "locked")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    # the first deploy's pre-flight (under its lock) lasts until the test opens a gate: never sized to this machine
    gate = "/run/dflash-test-second-deploy-gate"
    lab.ct(ct, "rm", "-f", gate)
    extra = json.dumps(dict(FAST, trainer_target_hosts="all", trainer_src=src, trainer_force_restart=True,
                            trainer_preflight_command=["sh", "-c", "until [ -e %s ]; do sleep 0.1; done" % gate]))
    first = subprocess.Popen(["ansible-playbook", "-i", hosts, "deploy.yml", "-l", "pb-" + ct, "-e", extra],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: lab.ct(ct, "pgrep", "-f", "until \\[ -e %s" % gate).returncode == 0,
                        timeout=60), "the first deploy never reached its pre-flight"
        assert lab.ct(ct, "test", "-d", "/run/dflash-trainer.deploy.lock").returncode == 0, "the first holds no lock"
        second = playbook(hosts, "deploy.yml", "pb-" + ct, trainer_src=src)
        assert second.returncode != 0
        assert "another deploy holds /run/dflash-trainer.deploy.lock" in second.stdout
        # the refused play never touches the lock it did not take (its `always` skips the release): the first,
        # still at its gate, holds it
        assert lab.ct(ct, "test", "-d", "/run/dflash-trainer.deploy.lock").returncode == 0
        lab.ct(ct, "touch", gate)
        out, _err = first.communicate(timeout=600)
        assert first.returncode == 0, out[-3000:]
    finally:
        lab.ct(ct, "touch", gate)
        if first.poll() is None:
            first.kill()
    # released at the end: the next deploy goes through
    assert lab.ct(ct, "test", "-d", "/run/dflash-trainer.deploy.lock").returncode == 1
    assert playbook(hosts, "deploy.yml", "pb-" + ct, trainer_src=src).returncode == 0


# ---- the host pattern: the documented real-host command lists its host; no match fails -------
PLAYBOOKS = ["deploy.yml", "playbooks/deploy.yml", "playbooks/restart.yml", "playbooks/rollback.yml",
             "playbooks/status.yml"]


def run(*argv, inventory=None):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    inv = ["-i", inventory] if inventory else []
    return subprocess.run(["ansible-playbook", *inv, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_example_inventory_lists_its_host():
    """README/docs: ansible-playbook -i inventory/example-proxmox.yml deploy.yml targets the example host."""
    res = run("deploy.yml", "--list-hosts", inventory="inventory/example-proxmox.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    deploy_play = res.stdout.split("Deploy and prove the DFlash trainer")[1]
    assert "hosts (1):" in deploy_play and "gpu-node1-trainer" in deploy_play, res.stdout


def test_limit_matching_no_inventory_host_fails():
    """ansible-playbook itself refuses a --limit that matches no host of the inventory."""
    res = run("deploy.yml", "-l", "no-such-host")
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "no-such-host" in out and "no hosts to target" in out, out


@pytest.mark.parametrize("path", PLAYBOOKS)
def test_limit_outside_the_group_fails_with_the_pattern(path):
    """lab-201 is in the lab inventory but not in trainer_hosts: the play would match nothing."""
    res = run(path, "-l", "lab-201")
    assert res.returncode != 0, res.stdout
    assert "no host matched the pattern 'trainer_hosts' within --limit 'lab-201'" in res.stdout, res.stdout
    assert "PLAY RECAP" in res.stdout and "changed=1" not in res.stdout
    assert "Check that the run targets at least one host" in res.stdout
    assert len(res.stdout.split("PLAY [")) == 2  # only the check ran; no other play started


def test_inventory_without_the_group_fails(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("proxmox_trainers:\n  hosts:\n    ct1:\n      proxmox_vmid: 201\n")
    for path in ("deploy.yml", "playbooks/status.yml"):
        res = run(path, inventory=str(inv))
        assert res.returncode != 0, res.stdout
        assert "no host matched the pattern 'trainer_hosts' in the inventory %s" % inv in \
            res.stdout.replace("\n        ", " "), res.stdout


@pytest.mark.parametrize("path", PLAYBOOKS)
def test_target_pattern_set_in_the_inventory_is_refused_naming_it(path, tmp_path):
    """A play's hosts: reads only extra vars: trainer_target_hosts set as an inventory variable
    would make every play match nothing and exit 0 having done nothing. Refused, naming it."""
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  vars:\n    trainer_target_hosts: all\n  hosts:\n    ct1:\n      proxmox_vmid: 201\n")
    res = run(path, inventory=str(inv))
    out = res.stdout.replace("\n        ", " ").replace("\n          ", " ")
    assert res.returncode != 0, res.stdout
    assert "trainer_target_hosts is 'all' in the inventory" in out and "-e trainer_target_hosts=all" in out, res.stdout
    assert len(res.stdout.split("PLAY [")) == 2  # only the check ran


def test_target_pattern_typo_fails():
    res = run("playbooks/restart.yml", "-e", "trainer_target_hosts=trainer_hostz")
    assert res.returncode != 0
    assert "no host matched the pattern 'trainer_hostz'" in res.stdout, res.stdout


def test_matching_run_passes_the_check(hosts):
    """A pattern that matches (here through --limit) passes the check, which connects nowhere."""
    res = run("playbooks/status.yml", "-l", "pb-%s" % CTS[0], "-e", "trainer_target_hosts=all",
              "--list-tasks", inventory=hosts)
    assert res.returncode == 0, res.stdout + res.stderr
    res = run("playbooks/status.yml", "-l", "pb-%s" % CTS[0], "-e", "trainer_target_hosts=all",
              "--tags", "never-a-tag", "-vv", inventory=hosts)
    assert res.returncode == 0, res.stdout + res.stderr
    # judged by ansible-playbook itself (a meta task's condition): the check play ends there, no task forked
    check = res.stdout.split("PLAY [Check that the run targets at least one host")[1].split("PLAY [")[0]
    assert "META: ending play" in check and "-> localhost" not in check and "fatal" not in check, res.stdout
