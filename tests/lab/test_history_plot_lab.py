"""The optimization loop as a chart, from a real ledger (issue 16 items 1 and 2), on lab container
280: `.venv/bin/dflash-trainer`, run with a PATH that lacks the venv, deploys a fast release, then a
slow one that the throughput gate rolls back; `history --plot` draws them (SVG read back: a point
and a label per ledger entry, the threshold, the running release ringed) and prints the sparkline."""
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "280"
HOST = "loop"
CLI = os.path.join(os.path.dirname(sys.executable), "dflash-trainer")
FAST = {"trainer_target_hosts": "all", "trainer_ready_hold_s": 4, "trainer_ready_stall_s": 3,
        "trainer_ready_timeout_s": 40,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3", "FAKE_TRAINER_STEP_INTERVAL_S": "0.25"}}
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    lab.ct(CT, "rm", "-rf", "/opt/dflash-trainer")  # a ledger of this test's releases only
    base = tmp_path_factory.mktemp("loop")
    path = base / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {HOST: {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    return str(path), base


def cli(inv_path, *args, extra=None, timeout=300):
    """The Quick start's .venv/bin/dflash-trainer with a PATH that lacks the venv."""
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
           "ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg")}
    return subprocess.run([CLI, *args, "-i", inv_path, "-l", HOST, "-q", "-e", json.dumps(dict(FAST, **(extra or {})))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def tree(base, name, tokps):
    dst = base / name
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), dst)
    (dst / "fault.env").write_text("TOKPS=%s\n" % tokps)
    return str(dst)


@pytest.fixture(scope="module")
def loop(inv):
    inv_path, base = inv
    res = cli(inv_path, "deploy", "--json", extra={"trainer_src": tree(base, "fast", 21500)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    fast = json.loads(res.stdout)["hosts"][HOST]["release"]
    res = cli(inv_path, "deploy", "--json", extra={"trainer_src": tree(base, "slow", 12400),
                                                   "trainer_min_tokps_ratio": 0.9})
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    slow = json.loads(res.stdout)["hosts"][HOST]["previous_release"]
    assert slow and slow != fast
    return fast, slow


def test_the_chart_draws_every_release_of_the_lab_ledger(inv, loop, tmp_path):
    inv_path = inv[0]
    fast, slow = loop
    chart = tmp_path / "history.svg"
    res = cli(inv_path, "history", "--plot", str(chart), "--min-tokps-ratio", "0.9")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "chart: %s (%s: 3 releases)" % (chart, HOST) in res.stderr, res.stderr
    root = ET.parse(str(chart)).getroot()
    ids = {e.get("id"): e for e in root.iter() if e.get("id")}
    # fast proved, slow rolled back by the gate, fast re-proved and running
    assert sorted(i for i in ids if i.startswith("point-")) == ["point-0", "point-1", "point-2"]
    labels = [[t.text for t in ids["label-%d" % i].iter(SVG + "text")] for i in range(3)]
    assert [lab[0] for lab in labels] == [fast[:8], slow[:8], fast[:8]]
    assert all(lab[1].startswith(("content ", "git ")) for lab in labels), labels
    assert [i for i in ids if i.startswith("running-")] == ["running-2"]
    # only the slow release had a previous good one of another release (the re-proof's other release never proved)
    assert len(list(ids["gate-threshold"].iter(SVG + "path"))) == 1
    # the table with its sparkline: fast high, slow low, fast high
    spark = [line for line in res.stdout.splitlines() if "tok/s per release" in line]
    assert spark and spark[0].split(": ", 1)[1].startswith("█▁█"), res.stdout


def test_png_and_html_from_the_lab(inv, loop, tmp_path):
    inv_path = inv[0]
    for name in ("history.png", "history.html"):
        res = cli(inv_path, "history", "--plot", str(tmp_path / name))
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (tmp_path / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "history.html").read_text(encoding="utf-8")
    assert page.count("<td>%s</td>" % loop[0]) == 2 and page.count("<td>%s</td>" % loop[1]) == 1
    assert "throughput gate: 12." in page
