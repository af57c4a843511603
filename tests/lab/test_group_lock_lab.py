"""A trainer group locked for its whole run, on lab containers 500, 501 and 502 (each running examples/trainer,
no rendezvous: each member proves on its own steps and GPUs).

One member is made slow on purpose, never by timing: its simulated GPUs keep a stopped trainer's memory held
(fakegpu's release delay), so that member's restart job waits in its drain for as long as the test holds it -
here longer than three lock leases after the other members' jobs proved them. Meanwhile:

- every member's deploy lock is sampled on the target: from the group's first read to the slow member's let-go,
  it is always there, always the first deploy's (its token) and its lease never over;
- a deploy with the default trainer_lock_wait_s 0 is refused and takes no member's lock;
- a deploy queued behind it (trainer_lock_wait_s) changes nothing until the first ends - which ends proved on
  its own release - then reads afresh and deploys its own release to every member, proved;
- a controller killed during that wait strands no lock: the fast members' leases lapse (nothing renews them once
  nobody reads the play's output), the slow member's job ends on its own, and the next run converges."""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from labkit import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTS = ("500", "501", "502")
GROUP = "tg500"
STATE = "/var/lib/dflash-trainer/restart.json"
LOCK_RECORD = "/run/dflash-trainer.deploy.lock/owner.json"
LEASE_S = 15  # trainer_lock_lease_s's default
FAST = {"trainer_ready_hold_s": 3, "trainer_ready_stall_s": 3, "trainer_ready_timeout_s": 60,
        "trainer_restart_sec": 1, "trainer_drain_timeout_s": 900}


def env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


def argv(inv_path, src, extra=None):
    return ["ansible-playbook", "-i", inv_path, "deploy.yml", "-e",
            json.dumps(dict(FAST, trainer_src=src, **(extra or {})))]


def play(inv_path, src, extra=None):
    res = subprocess.run(argv(inv_path, src, extra), cwd=ROOT, env=env(), capture_output=True, text=True,
                         timeout=1800, check=False)
    res.out = res.stdout + res.stderr
    return res


def tree(base, name):
    dst = base / name
    if not dst.exists():
        shutil.copytree(os.path.join(ROOT, "examples", "trainer"), dst)
        (dst / "VERSION").write_text(name + "\n")
    return str(dst)


def inventory(lab, path):
    hosts = {"g%d" % rank: dict(lab.conn_vars(), proxmox_vmid=int(ct), trainer_env={"FAKE_TRAINER_STARTUP_S": "0.3"})
             for rank, ct in enumerate(CTS)}
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
    return tmp_path_factory.mktemp("grouplock")


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


def running_version(lab, ct):
    """(the release current points at, last good, the VERSION file current holds)."""
    current = os.path.basename(lab.ct(ct, "readlink", "/opt/dflash-trainer/current").stdout.strip())
    last_good = lab.ct(ct, "cat", "/opt/dflash-trainer/last_good").stdout.strip()
    version = lab.ct(ct, "cat", "/opt/dflash-trainer/current/VERSION").stdout.strip()
    return current, last_good, version


def job(lab, ct):
    res = lab.ct(ct, "cat", STATE)
    try:
        return json.loads(res.stdout) if res.returncode == 0 else {}
    except ValueError:
        return {}


def lock_record(lab, ct):
    """The member's deploy lock record, or None when there is no lock."""
    res = lab.ct(ct, "cat", LOCK_RECORD)
    if res.returncode != 0:
        return None
    try:
        return json.loads(res.stdout)
    except ValueError:
        return {"unreadable": res.stdout}


def hold_gpu(lab, ct):
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


def output(out_path):
    with open(out_path) as fh:
        return fh.read()


def running(proc, out_path):
    if proc.poll() is not None:
        pytest.fail("the deploy ended early: %s" % output(out_path)[-4000:])
    return True


class Sampler(threading.Thread):
    """Reads every member's lock record, one member after the other, until stopped: (ct, time before the
    read, record)."""

    def __init__(self, lab):
        super().__init__(daemon=True)
        self.lab, self.samples, self.stop = lab, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            for ct in CTS:
                at = time.time()
                self.samples.append((ct, at, lock_record(self.lab, ct)))


def lapses(samples, tokens, until):
    """The samples up to ``until`` in which a member's lock is not the deploy's (``tokens``: each member's) with a
    live lease."""
    bad = []
    for ct, at, rec in samples:
        if at > until:
            continue
        if not rec or rec.get("token") != tokens[ct] or not isinstance(rec.get("expires"), (int, float)) \
                or rec["expires"] < at:
            bad.append((ct, round(at, 1), rec and {k: rec.get(k) for k in ("token", "owner", "expires")}))
    return bad


def test_a_group_waiting_for_its_slowest_member_holds_every_lock_and_a_queued_deploy_waits(lab, proved, inv, base):
    before = {ct: job(lab, ct).get("job_id") for ct in CTS}
    hold_gpu(lab, CTS[2])  # g2's job waits in its drain until let go
    log1, log2 = str(base / "first.out"), str(base / "queued.out")
    first = started(inv, tree(base, "r2"), log1)
    second = None
    sampler = Sampler(lab)
    try:
        def every_job_recorded():  # past the group's first read: every member's lock is the first deploy's
            running(first, log1)
            return all(job(lab, ct).get("job_id") not in (None, before[ct]) for ct in CTS)

        assert wait_for(every_job_recorded, timeout=900, interval=0.2), "the first deploy's jobs never started"
        # each member's lock token (the play's on that member) while its restart job runs
        tokens = {ct: (lock_record(lab, ct) or {}).get("token") for ct in CTS}
        assert all(tokens.values()), tokens
        sampler.start()

        def fast_members_proved():
            running(first, log1)
            return all(job(lab, ct).get("done") and (job(lab, ct).get("result") or {}).get("ok") for ct in CTS[:2])

        assert wait_for(fast_members_proved, timeout=900, interval=0.2), "g0 and g1 never proved"
        fast_done = time.time()
        assert job(lab, CTS[2]).get("phase") == "draining"  # g2 is still held

        # a deploy with the default trainer_lock_wait_s 0 is refused, taking no member's lock
        refused = play(inv, tree(base, "r3"))
        assert refused.returncode != 0, refused.out[-3000:]
        assert "another deploy holds" in refused.out, refused.out[-3000:]

        second = started(inv, tree(base, "r3"), log2, extra={"trainer_lock_wait_s": 3000})

        def three_leases_past():  # the wait the group must survive: longer than three leases
            running(first, log1)
            running(second, log2)
            return time.time() > fast_done + 3 * LEASE_S + 5

        assert wait_for(three_leases_past, timeout=600, interval=0.5)
        held_until = time.time()
        assert job(lab, CTS[2]).get("phase") == "draining"
        let_go(lab, CTS[2])
        first.wait(timeout=1800)
        out1 = output(log1)
        sampler.stop.set()
        sampler.join(timeout=120)
        assert len([s for s in sampler.samples if s[1] <= held_until]) >= 3 * len(CTS)
        assert lapses(sampler.samples, tokens, held_until) == [], "a member's lock was not the first deploy's"
        assert first.returncode == 0, out1[-5000:]
        assert "every member (g0, g1, g2) proved" in out1, out1[-5000:]
        second.wait(timeout=1800)
        out2 = output(log2)
    finally:
        sampler.stop.set()
        let_go(lab, CTS[2])
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    # the queued deploy read afresh once the first had ended and deployed its own release to every member
    assert second.returncode == 0, out2[-5000:]
    assert "every member (g0, g1, g2) proved" in out2, out2[-5000:]
    seen = [running_version(lab, ct) for ct in CTS]
    assert all(current == last_good and version == "r3" for current, last_good, version in seen), seen
    assert len({s[0] for s in seen}) == 1, seen
    for ct in CTS:
        assert unit(lab, ct)["ActiveState"] == "active"
        ledger = lab.ct(ct, "cat", "/opt/dflash-trainer/ledger.json").stdout
        proved_entries = [e for e in json.loads(ledger)["entries"] if e.get("verdict") == "proved"]
        assert proved_entries[-1]["release"] == seen[0][0], ledger[-2000:]
        # r1, r2, r3, each started and proved once on every member: the slow member's wait restarted no other
        assert len(proved_entries) == 3 and len({e["release"] for e in proved_entries}) == 3, ledger[-3000:]


def lapsed(lab, ct):
    """The member's deploy lock is free or its lease over (a next run may take it)."""
    rec = lock_record(lab, ct)
    return rec is None or (isinstance(rec.get("expires"), (int, float)) and rec["expires"] < time.time())


def test_a_controller_killed_while_the_group_waits_strands_no_lock_and_the_next_run_converges(lab, proved, inv, base):
    """The fast members' locks are renewed by the play's modules while the group waits (group_hold); a killed
    controller reads their output no more, so they stop renewing and each lease lapses - nothing is stranded. The
    slow member's job goes on to its end on its own; the next run (trainer_lock_wait_s) takes every lock and ends
    with every member on one release, proved."""
    before = {ct: job(lab, ct).get("job_id") for ct in CTS}
    hold_gpu(lab, CTS[2])  # g2's job waits in its drain until let go
    log = str(base / "killed.out")
    proc = started(inv, tree(base, "r6"), log)
    try:
        def fast_members_proved():
            running(proc, log)
            return all(job(lab, ct).get("job_id") not in (None, before[ct]) and job(lab, ct).get("done")
                       and (job(lab, ct).get("result") or {}).get("ok") for ct in CTS[:2])

        assert wait_for(fast_members_proved, timeout=900, interval=0.2), "g0 and g1 never proved"
        assert job(lab, CTS[2]).get("phase") == "draining"
        held = {ct: lock_record(lab, ct) for ct in CTS[:2]}
        assert all(rec and not lapsed(lab, ct) for ct, rec in held.items()), held  # held while the group waits
        os.killpg(proc.pid, 9)
        proc.wait(timeout=60)
        assert wait_for(lambda: all(lapsed(lab, ct) for ct in CTS[:2]), timeout=4 * LEASE_S, interval=0.5), \
            {ct: lock_record(lab, ct) for ct in CTS[:2]}
        assert job(lab, CTS[2]).get("phase") == "draining"  # the slow member's job goes on without the controller
    finally:
        let_go(lab, CTS[2])
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    res = play(inv, tree(base, "r6"), extra={"trainer_lock_wait_s": 600})
    assert res.returncode == 0, res.out[-5000:]
    # proved as one now (or found proved so, when the members' own proofs made r6 the last good everywhere)
    assert "every member (g0, g1, g2) proved" in res.out or "left running: release" in res.out, res.out[-5000:]
    seen = [running_version(lab, ct) for ct in CTS]
    assert len({s[0] for s in seen}) == 1 and all(s[2] == "r6" for s in seen), seen
    assert all(unit(lab, ct)["ActiveState"] == "active" for ct in CTS)
