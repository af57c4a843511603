"""A trainer group on lab containers 340 and 341: one distributed job (examples/dist_trainer, whose ranks
rendezvous through a directory `lab.py group` bind-mounts into both and hang when a peer is missing, as
NCCL does) deployed, restarted, proved and rolled back as one:

- a group deploy is proved on every member: the same release current and last good on both, node 0's
  steps read, node 1 proved by its GPUs; a second deploy changes nothing;
- a deploy limited to one member, and a restart of one member, are refused before any change;
- a release whose node 1 fails to start puts every member back on the last good release, restarted
  and proved together (node 0's own proof alone never decides);
- a member unreachable at the first read: refused before any stop, every lock released;
- a controller killed while the members' jobs run: the next deploy converges the group on one release;
- a second deploy of the group while one runs is refused (or waits and finds it proved), and the first
  ends proved."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from labkit import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTS = ("340", "341")
GROUP = "tg340"
LOCK = "/run/dflash-trainer.deploy.lock"
STATE = "/var/lib/dflash-trainer/restart.json"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 40,
        "trainer_restart_sec": 2, "trainer_drain_timeout_s": 20}


def env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


def argv(inv_path, src, playbook="deploy.yml", limit=None, extra=None):
    cmd = ["ansible-playbook", "-i", inv_path, playbook, "-e", json.dumps(dict(FAST, trainer_src=src, **(extra or {})))]
    return cmd + (["-l", limit] if limit else [])


def play(inv_path, src, **kw):
    res = subprocess.run(argv(inv_path, src, **kw), cwd=ROOT, env=env(), capture_output=True, text=True, timeout=400,
                         check=False)
    res.out = res.stdout + res.stderr
    return res


def tree(base, name, fault=None):
    dst = base / name
    if not dst.exists():
        shutil.copytree(os.path.join(ROOT, "examples", "dist_trainer"), dst)
        (dst / "VERSION").write_text(name + "\n")
        if fault:
            (dst / "fault.env").write_text(fault)
    return str(dst)


def inventory(lab, path, unreachable=None):
    hosts = {}
    for rank, ct in enumerate(CTS):
        host = dict(lab.conn_vars(), proxmox_vmid=int(ct), trainer_group_progress=rank == 0,
                    trainer_env={"DIST_TRAINER_NODE_RANK": str(rank), "DIST_TRAINER_NNODES": str(len(CTS))})
        if unreachable == ct:
            host["ansible_port"] = 1  # nothing listens there
        hosts["g%d" % rank] = host
    path.write_text(json.dumps({"all": {"children": {
        "trainer_hosts": {"hosts": {h: {} for h in hosts}},
        GROUP: {"hosts": hosts, "vars": {"trainer_group": GROUP}}}}}))
    return str(path)


@pytest.fixture(scope="module")
def base(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "group", "--name", GROUP, "--ids", *CTS,
                    "--fresh"], check=True, stdout=subprocess.DEVNULL)
    return tmp_path_factory.mktemp("group")


@pytest.fixture(scope="module")
def inv(lab, base):
    return inventory(lab, base / "hosts.json")


def unit(lab, ct):
    out = lab.ct(ct, "systemctl", "show", "dflash-trainer", "-p", "ActiveState", "-p", "MainPID",
                 "-p", "InvocationID").stdout
    return dict(line.split("=", 1) for line in out.split())


def pointers(lab, ct):
    current = os.path.basename(lab.ct(ct, "readlink", "/opt/dflash-trainer/current").stdout.strip())
    last_good = lab.ct(ct, "cat", "/opt/dflash-trainer/last_good").stdout.strip()
    return current, last_good


def lock_free(lab, ct):
    return lab.ct(ct, "test", "-e", LOCK).returncode != 0


def job_phase(lab, ct):
    res = lab.ct(ct, "cat", STATE)
    try:
        state = json.loads(res.stdout) if res.returncode == 0 else {}
    except ValueError:
        state = {}
    return state.get("job_id"), state.get("phase")


@pytest.fixture(scope="module")
def proved(lab, base, inv):
    res = play(inv, tree(base, "r1"))
    assert res.returncode == 0, res.out[-4000:]
    return res


def test_a_group_deploy_is_proved_on_every_member(lab, proved, inv, base):
    assert "every member (g0, g1) proved" in proved.out, proved.out[-3000:]
    (c0, g0), (c1, g1) = pointers(lab, CTS[0]), pointers(lab, CTS[1])
    assert c0 == c1 == g0 == g1 and len(c0) == 16
    assert all(unit(lab, ct)["ActiveState"] == "active" for ct in CTS)
    log0 = lab.ct(CTS[0], "cat", "/workspace/trainer.log").stdout
    assert "rendezvous complete: world of 2 nodes" in log0 and "step=" in log0
    before = [unit(lab, ct)["InvocationID"] for ct in CTS]
    again = play(inv, tree(base, "r1"))
    assert again.returncode == 0 and "left running" in again.out, again.out[-3000:]
    assert [unit(lab, ct)["InvocationID"] for ct in CTS] == before
    assert all(lock_free(lab, ct) for ct in CTS)


def test_one_member_alone_is_refused_before_any_change(lab, proved, inv, base):
    before = [unit(lab, ct)["InvocationID"] for ct in CTS]
    res = play(inv, tree(base, "r2"), limit="g0")
    assert res.returncode != 0 and "is deployed as one" in res.out and "g1 is not in this run" in res.out, res.out[-3000:]
    res = play(inv, tree(base, "r1"), playbook="playbooks/restart.yml", limit="g1")
    assert res.returncode != 0 and "trainer group %s" % GROUP in res.out, res.out[-3000:]
    assert [unit(lab, ct)["InvocationID"] for ct in CTS] == before
    assert all(pointers(lab, ct)[0] == pointers(lab, ct)[1] for ct in CTS)
    assert all(lock_free(lab, ct) for ct in CTS)


def test_a_release_failing_on_one_member_puts_every_member_back(lab, proved, inv, base):
    good = pointers(lab, CTS[0])[1]
    before = [unit(lab, ct)["InvocationID"] for ct in CTS]
    bad = tree(base, "r-bad", fault="FAULT=crash_before_rdzv\nFAULT_NODE=1\n")
    res = play(inv, bad)
    assert res.returncode != 0, res.out[-3000:]
    assert "g1:" in res.out and "Every member was put back on release %s" % good in res.out, res.out[-4000:]
    assert [pointers(lab, ct) for ct in CTS] == [(good, good)] * 2
    after = [unit(lab, ct) for ct in CTS]
    assert all(u["ActiveState"] == "active" for u in after)
    assert [u["InvocationID"] for u in after] != before  # restarted together on the good release
    assert all(lock_free(lab, ct) for ct in CTS)


def test_an_unreachable_member_is_refused_before_any_stop(lab, proved, base):
    inv_bad = inventory(lab, base / "unreachable.json", unreachable=CTS[1])
    before = unit(lab, CTS[0])["InvocationID"]
    res = play(inv_bad, tree(base, "r3"), extra={"trainer_force_restart": True})
    # the group takes every member's lock before it reads any: an unreachable member refuses it there
    assert res.returncode != 0 and "nothing was read or changed on any member" in res.out, res.out[-3000:]
    assert unit(lab, CTS[0])["InvocationID"] == before
    assert lock_free(lab, CTS[0])


def test_a_killed_controller_mid_restart_converges_on_the_next_run(lab, proved, inv, base):
    src = tree(base, "r4")
    before = job_phase(lab, CTS[1])[0]
    proc = subprocess.Popen(argv(inv, src), cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        def in_start_or_proof():
            job, phase = job_phase(lab, CTS[1])  # one read: id and phase of one state (two reads halved the poll rate)
            return job != before and phase in ("starting", "proving")

        hit = wait_for(in_start_or_proof, timeout=120, interval=0.05)
        assert hit, "the members' jobs never started"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # the members' jobs end on their own; their locks stay the killed play's for the rest of its lease, which
    # the next run waits out (trainer_lock_wait_s)
    assert wait_for(lambda: all(job_phase(lab, ct)[1] == "done" for ct in CTS), timeout=120)
    res = play(inv, src, extra={"trainer_lock_wait_s": 40})
    assert res.returncode == 0, res.out[-4000:]
    (c0, g0), (c1, g1) = pointers(lab, CTS[0]), pointers(lab, CTS[1])
    assert c0 == c1 == g0 == g1
    assert all(unit(lab, ct)["ActiveState"] == "active" for ct in CTS)


def test_a_second_deploy_of_the_group_while_one_runs_is_refused_or_waits(lab, proved, inv, base):
    src = tree(base, "r5")
    before = job_phase(lab, CTS[0])[0]
    proc = subprocess.Popen(argv(inv, src), cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        assert wait_for(lambda: job_phase(lab, CTS[0])[0] != before, timeout=120, interval=0.05)
        second = play(inv, src)
        # refused (the lock held), or - when the first ended within the few seconds a run waits for a lock
        # whose restart job it saw end - it waited and found the group proved on that release: never both at once
        refused = second.returncode != 0 and "lock" in second.out
        waited = second.returncode == 0 and "left running: release" in second.out
        assert refused or waited, second.out[-3000:]
        out, _err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    (c0, g0), (c1, g1) = pointers(lab, CTS[0]), pointers(lab, CTS[1])
    assert c0 == c1 == g0 == g1 and all(lock_free(lab, ct) for ct in CTS)
