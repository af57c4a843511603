"""After the proof, in lab container 290 (issue 15 item 3, issue 16 item 3): a trainer that dies
~15 s after its proof is recorded in the ledger ("proved, then died") and reported by status with
exit != 0; trainer_watch_s fails a deploy whose trainer dies in the window; the metrics file parses
as Prometheus reads it and follows the trainer (step, tok/s) without a deploy."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "290"
PROM_DIR = "/var/lib/node_exporter/textfile_collector"
PROM = PROM_DIR + "/dflash_trainer.prom"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 60,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}, "trainer_target_hosts": "all",
        "trainer_metrics_path": PROM, "trainer_metrics_interval_s": 1}
CRASH_STEPS = 20  # one progress line a second: dies ~15 s after a proof of ~4 s


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    lab.ct(CT, "systemctl", "stop", "dflash-trainer")
    lab.ct(CT, "rm", "-rf", "/opt/dflash-trainer", PROM_DIR)
    lab.ct(CT, "mkdir", "-p", PROM_DIR)
    base = tmp_path_factory.mktemp("after")
    path = base / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"ap": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    return str(path), base


def tree(base, name, fault_env):
    dst = base / name
    if not dst.exists():
        shutil.copytree(os.path.join(ROOT, "examples", "trainer"), dst)
        (dst / "fault.env").write_text(fault_env)
    return str(dst)


def play(inv_path, playbook, **extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run(["ansible-playbook", "-i", inv_path, playbook, "-l", "ap", "-e", json.dumps(dict(FAST, **extra))],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    res.out = " ".join((res.stdout + res.stderr).split())
    return res


def poll(what, fn, timeout=60.0, every=0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, "%s not seen within %s s" % (what, timeout)
        time.sleep(every)


def ledger(lab):
    res = lab.ct(CT, "cat", "/opt/dflash-trainer/ledger.json")
    return json.loads(res.stdout)["entries"] if res.returncode == 0 else []


def metrics(lab):
    """{name: (value, labels)} of the metrics file, parsed as Prometheus parses it; {} when absent."""
    res = lab.ct(CT, "cat", PROM)
    if res.returncode != 0:
        return {}
    assert res.stdout.startswith("# dflash.trainer metrics"), res.stdout[:200]
    return {f.name: (f.samples[0].value, f.samples[0].labels) for f in text_string_to_metric_families(res.stdout)}


def metrics_if(lab, predicate):
    m = metrics(lab)
    return m if predicate(m) else None


def test_a_death_after_the_proof_is_recorded_reported_and_seen_in_the_metrics(lab, inv):
    inv_path, base = inv
    # the metrics follow a trainer that stays up (the crashing one may be gone before a slow deploy even returns)
    res = play(inv_path, "deploy.yml", trainer_src=tree(base, "good", "# no fault\n"))
    assert res.returncode == 0 and "ready: release" in res.out, res.out[-3000:]
    release = ledger(lab)[-1]["release"]
    assert ledger(lab)[-1]["verdict"] == "proved" and "died" not in ledger(lab)[-1]

    # the metrics follow the trainer without a deploy: the step and the file change, tok/s is read
    first = poll("the metrics file", lambda: metrics(lab).get("dflash_trainer_step") and metrics(lab))
    later = poll("a later step in the metrics", lambda: metrics_if(
        lab, lambda m: m.get("dflash_trainer_step", (0,))[0] > first["dflash_trainer_step"][0] + 1), timeout=20)
    assert later["dflash_trainer_metrics_updated_timestamp_seconds"][0] > \
        first["dflash_trainer_metrics_updated_timestamp_seconds"][0]
    assert later["dflash_trainer_up"] == (1.0, {"release": release, "source": "content %s" % release})
    assert 41250 * 0.97 <= later["dflash_trainer_tokens_per_second"][0] <= 41250 * 1.03
    assert later["dflash_trainer_proved"][0] == 1 and later["dflash_trainer_died_after_proof"][0] == 0
    assert later["dflash_trainer_unit_restarts"][0] == 0 and later["dflash_trainer_seconds_since_proof"][0] >= 0
    assert later["dflash_trainer_last_verdict"][1]["verdict"] == "proved"

    # the death: in the ledger, in the metrics, and status fails naming it
    src = tree(base, "crash", "FAULT=crash_after\nCRASH_AFTER_STEPS=%d\n" % CRASH_STEPS)
    res = play(inv_path, "deploy.yml", trainer_src=src)
    assert res.returncode == 0 and "ready: release" in res.out, res.out[-3000:]
    assert ledger(lab)[-1]["verdict"] == "proved" and ledger(lab)[-1]["release"] != release
    died = poll("the death in the ledger", lambda: ledger(lab)[-1].get("died"), timeout=60)
    proof = ledger(lab)[-1]
    assert died["reason"] == "RuntimeError: CUDA error: an illegal memory access was encountered", died
    # after_s is counted from the proof (the ledger's own two times), whatever a loaded machine made of ~15 s
    assert died["exit"] == "exit status 1" and 0 < died["after_s"], died
    assert abs(died["after_s"] - (died["time"] - proof["time"])) <= 0.15, (died, proof["time"])
    m = poll("the death in the metrics", lambda: metrics_if(
        lab, lambda m: m.get("dflash_trainer_died_after_proof", (0,))[0] == 1), timeout=20)
    assert m["dflash_trainer_died_after_proof_seconds"][1]["reason"] == died["reason"]

    res = play(inv_path, "playbooks/status.yml")
    assert res.returncode != 0, res.out[-3000:]
    assert "died %.0f s after its proof: RuntimeError: CUDA error: an illegal memory access was encountered" % \
        died["after_s"] in res.out, res.out[-3000:]
    assert "unit restarts:" in res.out and "is not running its proved release healthily" in res.out
    res = play(inv_path, "playbooks/history.yml")
    assert "proved, then died after %.0f s: RuntimeError: CUDA error" % died["after_s"] in res.out, res.out[-3000:]


def test_the_collections_own_restart_is_not_a_death_and_status_passes(lab, inv):
    inv_path, base = inv
    good = tree(base, "good", "# no fault\n")
    res = play(inv_path, "deploy.yml", trainer_src=good)
    assert res.returncode == 0, res.out[-3000:]
    res = play(inv_path, "playbooks/restart.yml", trainer_src=good)  # stops the proved trainer on purpose
    assert res.returncode == 0, res.out[-3000:]
    entries = [e for e in ledger(lab) if e["release"] == ledger(lab)[-1]["release"]]
    assert len(entries) >= 2 and not any("died" in e for e in entries), entries
    res = play(inv_path, "playbooks/status.yml")
    assert res.returncode == 0 and "health: running release" in res.out, res.out[-3000:]


def test_trainer_watch_s_fails_a_deploy_whose_trainer_dies_in_the_window(lab, inv):
    inv_path, base = inv
    src = tree(base, "crash", "FAULT=crash_after\nCRASH_AFTER_STEPS=%d\n" % CRASH_STEPS)
    res = play(inv_path, "deploy.yml", trainer_src=src, trainer_watch_s=60)
    ended = time.time()
    assert res.returncode != 0, res.out[-3000:]
    assert "did not stay up for trainer_watch_s=60 s after its proof: died" in res.out, res.out[-3000:]
    assert "RuntimeError: CUDA error" in res.out
    # it failed when the trainer died, before the window's end: timed from the proof the ledger recorded (the same
    # clock: the container shares the host's), not from the deploy's start, which a loaded machine stretches
    proof = ledger(lab)[-1]
    assert proof["verdict"] == "proved" and "died" in proof, proof
    assert ended < proof["time"] + 60, (ended, proof)


def test_a_metrics_file_not_written_by_the_collection_is_refused(lab, inv):
    inv_path, base = inv
    other = PROM_DIR + "/node.prom"
    lab.ct(CT, "sh", "-c", "echo 'node_foo 1' > %s" % other)
    res = play(inv_path, "deploy.yml", trainer_src=tree(base, "good", ""), trainer_metrics_path=other)
    assert res.returncode != 0 and "trainer_metrics_path: %s exists and was not written by dflash.trainer" % other \
        in res.out, res.out[-3000:]
    assert lab.ct(CT, "cat", other).stdout == "node_foo 1\n"
