"""The optimization loop (issue 9 items 1-3) on lab container 222: two releases of the stand-in with
different throughput (its TOKPS knob) are measured, compared in the deploy's last lines, kept in the
release ledger; with trainer_min_tokps_ratio the slower one is rolled back."""
import json
import re
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "222"
FAST = {"trainer_ready_hold_s": 4, "trainer_ready_stall_s": 3, "trainer_ready_timeout_s": 40,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3", "FAKE_TRAINER_STEP_INTERVAL_S": "0.25"},
        "trainer_target_hosts": "all", "trainer_measure_regexes": {"q_target": r"queue_target=(\d+)"}}


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    lab.ct(CT, "rm", "-rf", "/opt/dflash-trainer")
    base = tmp_path_factory.mktemp("tput")
    path = base / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"tp": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    return str(path), base


def tree(base, name, tokps):
    dst = base / name
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), dst)
    (dst / "fault.env").write_text("TOKPS=%s\n" % tokps)
    return str(dst)


def deploy(inv_path, src, **extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(["ansible-playbook", "-i", inv_path, "deploy.yml", "-l", "tp", "-e",
                           json.dumps(dict(FAST, trainer_src=src, **extra))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def ledger(lab):
    res = lab.ct(CT, "cat", "/opt/dflash-trainer/ledger.json")
    return json.loads(res.stdout)["entries"] if res.returncode == 0 else []


def test_two_releases_are_measured_compared_and_gated(lab, inv):
    inv_path, base = inv
    res = deploy(inv_path, tree(base, "fast", 21500))
    assert res.returncode == 0, res.stdout[-3000:]
    assert "no previous good release measured" in res.stdout
    fast = ledger(lab)[-1]
    assert fast["verdict"] == "proved" and fast["source"].startswith("content ")
    med = fast["figures"]["tok_s"]["median"]
    assert 21500 * 0.97 <= med <= 21500 * 1.03 and fast["figures"]["tok_s"]["n"] >= 8
    assert 6 <= fast["figures"]["q_target"]["median"] <= 10

    res = deploy(inv_path, tree(base, "slow", 12400))
    assert res.returncode == 0, res.stdout[-3000:]
    slow = ledger(lab)[-1]
    assert slow["verdict"] == "proved" and slow["release"] != fast["release"]
    line = "release %s (content %s): " % (slow["release"], slow["release"])
    assert line in res.stdout and "previous %s: 21." % fast["release"] in res.stdout, res.stdout[-2000:]
    assert re.search(r"previous \w+: 2\d\.\dK \(-(3[7-9]|4[0-7])%\)", res.stdout), res.stdout[-2000:]

    # back to fast, then the slow one again with the gate: refused and rolled back
    res = deploy(inv_path, tree(base, "fast2", 21500))
    assert res.returncode == 0, res.stdout[-3000:]
    good = ledger(lab)[-1]["release"]
    res = deploy(inv_path, tree(base, "slow2", 12400), trainer_min_tokps_ratio=0.9)
    out = res.stdout
    assert res.returncode != 0
    assert "throughput gate: 12." in out and "of the previous good release %s" % good in out, out[-3000:]
    assert "Rolled back: the last good release %s runs again" % good in out
    entries = ledger(lab)
    assert [e["verdict"] for e in entries[-2:]] == ["rolled back", "proved"]
    assert entries[-1]["release"] == good
    current = os.path.basename(lab.ct(CT, "readlink", "/opt/dflash-trainer/current").stdout.strip())
    assert current == good

    # a forced deploy accepts the slower release
    res = deploy(inv_path, tree(base, "slow3", 12400), trainer_min_tokps_ratio=0.9, trainer_force_restart=True)
    assert res.returncode == 0, res.stdout[-3000:]
    assert ledger(lab)[-1]["verdict"] == "proved"


def test_cli_history_shows_the_ledger(lab, inv):
    inv_path, base = inv
    while len(ledger(lab)) < 3:  # run alone: measure a few releases first
        assert deploy(inv_path, tree(base, "h%d" % len(ledger(lab)), 20000 + len(ledger(lab)))).returncode == 0
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    res = subprocess.run([sys.executable, "-m", "dflash_trainer", "history", "-i", inv_path, "-l", "tp",
                          "-e", "trainer_target_hosts=all", "-n", "3", "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.lstrip().startswith("{"), res.stdout[-2000:] + res.stderr[-2000:]
    host = json.loads(res.stdout)["hosts"]["tp"]
    rows = host["status"]["history"]
    entries = ledger(lab)
    assert [r["release"] for r in rows] == [e["release"] for e in reversed(entries[-3:])]
    assert rows[0]["verdict"] == "proved" and "running" in rows[0]["marks"]
    assert rows[0]["median"] == entries[-1]["figures"]["tok_s"]["median"]
    text = subprocess.run([sys.executable, "-m", "dflash_trainer", "history", "-i", inv_path, "-l", "tp",
                           "-e", "trainer_target_hosts=all", "-n", "3"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False).stdout
    assert "RELEASE" in text and rows[0]["line"] in text
