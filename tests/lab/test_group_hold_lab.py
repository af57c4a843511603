"""A trainer group that holds as one, on lab containers 400 and 401 (each running examples/trainer, no
rendezvous: each member proves on its own steps and GPUs).

A member is made slow on purpose, never by timing: its simulated GPUs keep a stopped trainer's memory held
(fakegpu's release delay), so that member's restart job waits in its drain for as long as the test holds it;
letting go lets it go on.

- a member whose trainer dies (systemd restarts it) after its own proof, while another member still waits
  in its drain: the group fails naming it, and every member runs the previous release again (current and
  last good), active;
- a failed configuration change of the group (trainer_env, same code): every member is back on the last good
  release and the configuration proved with it (its environment file, the trainer's environment), active;
- a host of the group's inventory group whose own trainer_group is empty is refused before any change;
- a member that dies within trainer_watch_s after the group's proof fails every member, named;
- status says whether the group runs as one proved job (every member read), and names the member that does not."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from labkit import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTS = ("400", "401")
GROUP = "tg400"
STATE = "/var/lib/dflash-trainer/restart.json"
ENV_FILE = "/etc/dflash-trainer/trainer.env"
FAST = {"trainer_ready_hold_s": 3, "trainer_ready_stall_s": 3, "trainer_ready_timeout_s": 60,
        "trainer_restart_sec": 1, "trainer_drain_timeout_s": 600}


def env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


def argv(inv_path, src, extra=None):
    return ["ansible-playbook", "-i", inv_path, "deploy.yml", "-e",
            json.dumps(dict(FAST, trainer_src=src, **(extra or {})))]


def play(inv_path, src, extra=None):
    res = subprocess.run(argv(inv_path, src, extra), cwd=ROOT, env=env(), capture_output=True, text=True,
                         timeout=900, check=False)
    res.out = res.stdout + res.stderr
    return res


def tree(base, name):
    dst = base / name
    if not dst.exists():
        shutil.copytree(os.path.join(ROOT, "examples", "trainer"), dst)
        (dst / "VERSION").write_text(name + "\n")
    return str(dst)


def inventory(lab, path, member_env=None, stray=None):
    """The group's inventory: g0 on 400, g1 on 401; ``member_env``: trainer_env of a member (by name);
    ``stray``: a member whose own trainer_group is empty."""
    hosts = {}
    for rank, ct in enumerate(CTS):
        name = "g%d" % rank
        host = dict(lab.conn_vars(), proxmox_vmid=int(ct),
                    trainer_env=dict({"FAKE_TRAINER_STARTUP_S": "0.3"}, **(member_env or {}).get(name, {})))
        if stray == name:
            host["trainer_group"] = ""
        hosts[name] = host
    path.write_text(json.dumps({"all": {"children": {
        "trainer_hosts": {"hosts": {h: {} for h in hosts}},
        GROUP: {"hosts": hosts, "vars": {"trainer_group": GROUP}}}}}))
    return str(path)


@pytest.fixture(scope="module")
def base(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", *CTS],
                   check=True, stdout=subprocess.DEVNULL)
    for ct in CTS:
        lab.ct(ct, "systemctl", "stop", "dflash-trainer")
        lab.ct(ct, "rm", "-rf", "/opt/dflash-trainer")
    return tmp_path_factory.mktemp("grouphold")


@pytest.fixture(scope="module")
def inv(lab, base):
    return inventory(lab, base / "hosts.json")


@pytest.fixture(scope="module")
def proved(lab, base, inv):
    res = play(inv, tree(base, "r1"))
    assert res.returncode == 0, res.out[-4000:]
    return res


def unit(lab, ct):
    out = lab.ct(ct, "systemctl", "show", "dflash-trainer", "-p", "ActiveState", "-p", "MainPID").stdout
    return dict(line.split("=", 1) for line in out.split())


def pointers(lab, ct):
    current = os.path.basename(lab.ct(ct, "readlink", "/opt/dflash-trainer/current").stdout.strip())
    last_good = lab.ct(ct, "cat", "/opt/dflash-trainer/last_good").stdout.strip()
    return current, last_good


def job(lab, ct):
    res = lab.ct(ct, "cat", STATE)
    try:
        return json.loads(res.stdout) if res.returncode == 0 else {}
    except ValueError:
        return {}


def hold_gpu(lab, ct):
    """Keep the memory of the container's trainer held once it is stopped (fakegpu: a dead holder's memory is
    never released), so that the member's restart job waits in its drain until ``let_go``."""
    res = lab.ct(ct, "python3", "-m", "fakegpu", "config", "--release-delay", "never")
    assert res.returncode == 0, res.stdout + res.stderr


def let_go(lab, ct):
    res = lab.ct(ct, "python3", "-m", "fakegpu", "config", "--release-delay", "0")
    assert res.returncode == 0, res.stdout + res.stderr


def started(inv_path, src, out_path, extra=None):
    """A deploy in the background, its output in ``out_path`` (a file: a pipe nobody reads would block it)."""
    with open(out_path, "w") as out:
        return subprocess.Popen(argv(inv_path, src, extra), cwd=ROOT, env=env(), stdout=out, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)


def ended(proc, out_path):
    """Wait for the background deploy -> its output."""
    proc.wait(timeout=900)
    with open(out_path) as fh:
        return fh.read()


def running(proc, out_path):
    """A condition's guard: the background deploy still runs (else fail with its output)."""
    if proc.poll() is not None:
        with open(out_path) as fh:
            pytest.fail("the deploy ended early: %s" % fh.read()[-4000:])


def test_a_member_that_dies_after_its_own_proof_fails_the_group(lab, proved, inv, base):
    good = pointers(lab, CTS[0])[1]
    before = job(lab, CTS[0]).get("job_id")
    hold_gpu(lab, CTS[1])  # g1 waits in its drain until the holder is let go
    log = str(base / "dies.out")
    proc = started(inv, tree(base, "r2"), log)
    try:
        def g0_proved_alone():
            running(proc, log)
            state = job(lab, CTS[0])
            return state.get("job_id") != before and state.get("done") and (state.get("result") or {}).get("ok")

        assert wait_for(g0_proved_alone, timeout=600, interval=0.2), "g0's job never proved it"
        assert job(lab, CTS[1]).get("phase") == "draining"  # g1 is still held
        pid = unit(lab, CTS[0])["MainPID"]
        assert lab.ct(CTS[0], "kill", "-9", pid).returncode == 0  # g0's trainer dies; systemd starts it again
        assert wait_for(lambda: unit(lab, CTS[0])["MainPID"] not in ("0", pid), timeout=120, interval=0.2)
        let_go(lab, CTS[1])
        out = ended(proc, log)
    finally:
        let_go(lab, CTS[1])
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode != 0, out[-4000:]
    assert "every member (g0, g1) proved: release" not in out, out[-4000:]  # never reported proved (the rollback is)
    assert "g0:" in out and "main pid" in out.lower(), out[-4000:]
    assert "Every member was put back on release %s" % good in out, out[-4000:]
    assert [pointers(lab, ct) for ct in CTS] == [(good, good)] * 2
    assert all(unit(lab, ct)["ActiveState"] == "active" for ct in CTS)


def test_a_member_that_dies_within_trainer_watch_s_after_the_groups_proof_fails_every_member(lab, proved, inv, base):
    """trainer_watch_s for a group: once every member's last good release is the new one (the group's proof), g1's
    trainer is killed (systemd starts it again); every member fails, naming g1 and what its watch saw. The proved
    release stays, as for one host."""
    before = [pointers(lab, ct)[1] for ct in CTS]
    log = str(base / "watch.out")
    proc = started(inv, tree(base, "r3"), log, extra={"trainer_watch_s": 60})
    try:
        def group_proved():
            running(proc, log)
            now = [pointers(lab, ct) for ct in CTS]
            return all(cur == good and good != old for (cur, good), old in zip(now, before)) and now

        now = wait_for(group_proved, timeout=600, interval=0.2)
        assert now, "the group was never proved on the new release"
        pid = unit(lab, CTS[1])["MainPID"]
        assert lab.ct(CTS[1], "kill", "-9", pid).returncode == 0  # g1's trainer dies; systemd starts it again
        out = ended(proc, log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    flat = " ".join(out.split())
    assert proc.returncode != 0, out[-4000:]
    assert "the watch (trainer_watch_s=60) failed on 1 of 2 members - g1: did not stay up for" in flat, out[-4000:]
    assert [pointers(lab, ct) for ct in CTS] == now  # the proved release stays
    assert all(unit(lab, ct)["ActiveState"] == "active" for ct in CTS)


def test_a_member_whose_own_trainer_group_is_empty_is_refused_before_any_change(lab, proved, base):
    inv_stray = inventory(lab, base / "stray.json", stray="g1")
    before = [unit(lab, ct)["MainPID"] for ct in CTS]
    res = play(inv_stray, tree(base, "r3"), extra={"trainer_force_restart": True})
    assert res.returncode != 0, res.out[-3000:]
    assert "g1" in res.out and "trainer_group is empty" in res.out, res.out[-3000:]
    assert [unit(lab, ct)["MainPID"] for ct in CTS] == before
    assert all(pointers(lab, ct)[0] == pointers(lab, ct)[1] for ct in CTS)


def test_a_failed_configuration_change_puts_every_member_back_on_the_proved_configuration(lab, proved, base):
    good = pointers(lab, CTS[0])[1]
    inv_bad = inventory(lab, base / "badenv.json", member_env={"g1": {"FAKE_TRAINER_FAULT": "import_error"}})
    res = play(inv_bad, tree(base, "r1"))  # the same code: only g1's environment changes
    assert res.returncode != 0 and "g1:" in res.out, res.out[-4000:]
    assert "Every member was put back on release %s" % good in res.out, res.out[-4000:]
    assert [pointers(lab, ct) for ct in CTS] == [(good, good)] * 2
    for ct in CTS:
        assert unit(lab, ct)["ActiveState"] == "active"
        assert "FAKE_TRAINER_FAULT" not in lab.ct(ct, "cat", ENV_FILE).stdout
        pid = unit(lab, ct)["MainPID"]
        assert "FAKE_TRAINER_FAULT" not in lab.ct(ct, "cat", "/proc/%s/environ" % pid).stdout


def status(inv_path, *extra):
    res = subprocess.run(["ansible-playbook", "-i", inv_path, "playbooks/status.yml", *extra], cwd=ROOT, env=env(),
                         capture_output=True, text=True, timeout=300, check=False)
    res.out = " ".join((res.stdout + res.stderr).split())
    return res


def test_status_says_whether_the_group_runs_as_one_proved_job(lab, proved, inv, base):
    res = play(inv, tree(base, "r1"), extra={"trainer_force_restart": True})  # the group proved, whatever ran before
    assert res.returncode == 0, res.out[-4000:]
    good = pointers(lab, CTS[0])[1]
    assert [pointers(lab, ct) for ct in CTS] == [(good, good)] * 2
    res = status(inv)
    assert res.returncode == 0, res.out[-3000:]
    assert "trainer group %s: proved as one - release %s on every member (g0, g1)" % (GROUP, good) in res.out, \
        res.out[-3000:]
    res = status(inv, "-l", "g0")
    assert res.returncode == 0 and "not judged as one - g1 not read in this run (read every member: -l %s)" % GROUP \
        in res.out, res.out[-3000:]
    pid = unit(lab, CTS[1])["MainPID"]
    assert lab.ct(CTS[1], "kill", "-9", pid).returncode == 0  # g1's trainer dies; systemd starts it again
    assert wait_for(lambda: unit(lab, CTS[1])["MainPID"] not in ("0", pid), timeout=120, interval=0.2)
    res = status(inv)
    assert res.returncode != 0, res.out[-3000:]
    assert "trainer group %s: not proved as one - g1: " % GROUP in res.out, res.out[-3000:]
