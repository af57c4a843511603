"""Progress the trainer writes elsewhere, with the role's defaults (lab container 585): a trainer that prints
one line and logs its progress to a text file of its own gets its verdict within 120 s of its start - not at
trainer_ready_timeout_s (900 s) - naming the file and the setting that reads it, and is proved with that
setting; a trainer that loads for 40 s printing nothing, writing no file, is still proved with the defaults
(nothing is found elsewhere, so its full ready timeout stands)."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from labkit import own_log_trainer

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "585"
OWN_DIR = "/workspace/own"
OWN_LOG = OWN_DIR + "/train.log"
VERDICT_WITHIN_S = 120
# only what is not this test's: the target pattern, and the purge (tests/lab/test_purge_lab.py)
BASE = {"trainer_target_hosts": "all", "trainer_purge_inductor_cache": False}


@pytest.fixture(scope="module", name="inv")
def fixture_inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    assert lab.ct(CT, "install", "-d", "-m", "0755", OWN_DIR).returncode == 0
    base = tmp_path_factory.mktemp("elsewhere")
    path = base / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"pe": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    plain = base / "trainer"
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), str(plain))
    own = base / "trainer-own-log"
    shutil.copytree(str(plain), str(own))
    own_log_trainer(str(own), OWN_LOG)
    return str(path), str(plain), str(own)


def deploy(inv_path, **extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(["ansible-playbook", "-i", inv_path, "deploy.yml", "-l", "pe", "-e",
                           json.dumps(dict(BASE, **extra))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def ledger(lab):
    res = lab.ct(CT, "cat", "/opt/dflash-trainer/ledger.json")
    return json.loads(res.stdout)["entries"] if res.returncode == 0 else []


def test_progress_in_a_file_of_its_own_is_named_within_120_s_with_the_defaults(lab, inv):
    inv_path, plain, own = inv
    res = deploy(inv_path, trainer_src=plain)  # a good release to roll back to
    assert res.returncode == 0, res.stdout[-4000:]

    started = time.monotonic()
    res = deploy(inv_path, trainer_src=own)
    took = time.monotonic() - started
    out = " ".join(res.stdout.split())
    assert res.returncode != 0, out[-4000:]
    assert "not ready after 900 s" not in out, out[-4000:]
    assert "the trainer writes its progress to %s, not to this start's log" % OWN_LOG in out, out[-4000:]
    # the fix: a line of its own, pasted as is
    assert "prove from it with:" in out and "-e trainer_progress_path=%s" % OWN_LOG in [
        line.strip() for line in res.stdout.splitlines()], res.stdout[-4000:]
    failed = [e for e in ledger(lab) if e.get("verdict") not in ("proved", None)]
    assert failed, ledger(lab)
    # the verdict came within 120 s of the start: the whole run (upload, pre-flight, the proof, the
    # rollback and its proof) took less than the default deadline by far
    assert took < 900 / 2, took
    seconds = re.search(r"no progress in this start's log after ([\d.]+) s: the trainer writes its progress to", out)
    assert seconds and float(seconds.group(1)) <= VERDICT_WITHIN_S, out[-4000:]
    assert lab.ct(CT, "systemctl", "is-active", "dflash-trainer").stdout.strip() == "active"  # rolled back

    # the setting it named proves it
    res = deploy(inv_path, trainer_src=own, trainer_progress_path=OWN_LOG)
    assert res.returncode == 0, res.stdout[-4000:]
    assert ledger(lab)[-1]["verdict"] == "proved"


def test_a_silent_40_s_load_is_still_proved_with_the_defaults(lab, inv):
    inv_path, plain, _own = inv
    res = deploy(inv_path, trainer_src=plain, trainer_env={"FAKE_TRAINER_STARTUP_S": "40"})
    assert res.returncode == 0, res.stdout[-4000:]
    last = ledger(lab)[-1]
    assert last["verdict"] == "proved", last
    out = " ".join(res.stdout.split())
    ready = re.search(r"([\d.]+) s to ready", out)
    assert ready and float(ready.group(1)) >= 40, out[-4000:]
