"""A trainer that logs its progress through logging.FileHandler to a file of its own, on lab
container 275: with one line on stdout it cannot be proved from the launcher's log (refused at the
deadline, "no line matching"); with trainer_progress_path naming its file it is proved and measured
from that file's lines of this start only (the previous run's lines there never count), and the
collection never changes the file: what it held before the start is still its prefix afterwards,
its inode is the same, every byte added is a line the trainer wrote, and a status run and a
check-mode deploy with the trainer stopped leave its sha256 and mtime as they were."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from labkit import own_log_trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "275"
OWN_DIR = "/workspace/own"
OWN_LOG = OWN_DIR + "/train.log"
UNIT = "dflash-trainer"
FAST = {"trainer_ready_hold_s": 4, "trainer_ready_stall_s": 3, "trainer_ready_timeout_s": 20,
        "trainer_target_hosts": "all", "trainer_purge_inductor_cache": False}  # the purge is not this test's
# the trainer's own lines, as its FileHandler formats them
OWN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO train: ")

# what a previous run left in the file: progress lines the proof must never read
STALE = "".join("2026-11-30 09:00:%02d,000 INFO train: step=%d loss=9.9 tok/s=99999.0\n" % (i % 60, 900 + i)
                for i in range(40))


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    lab.ct(CT, "rm", "-rf", "/opt/dflash-trainer", OWN_DIR)
    assert lab.ct(CT, "install", "-d", "-m", "0755", OWN_DIR).returncode == 0
    res = lab.ct(CT, "sh", "-c", "cat > %s" % OWN_LOG, input=STALE)
    assert res.returncode == 0, res.stderr
    base = tmp_path_factory.mktemp("progress_file")
    path = base / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"pf": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    src = base / "trainer"
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), str(src))
    own_log_trainer(str(src), OWN_LOG)
    (src / "fault.env").write_text("STARTUP_S=0.3\nSTEP_INTERVAL_S=0.25\n")  # the stand-in's knobs
    return str(path), str(src)


def play(inv_path, playbook, *args, **extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(["ansible-playbook", "-i", inv_path, playbook, "-l", "pf", *args, "-e",
                           json.dumps(dict(FAST, **extra))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def own_file(lab):
    """(bytes, sha256, mtime_ns, inode) of the trainer's own log, read inside the container."""
    res = lab.ct(CT, "cat", OWN_LOG, text=False)
    assert res.returncode == 0, res.stderr
    st = lab.ct(CT, "stat", "-c", "%i", OWN_LOG)
    mtime_s = lab.ct(CT, "python3", "-c", "import os; print(os.stat(%r).st_mtime_ns)" % OWN_LOG).stdout.strip()
    return res.stdout, hashlib.sha256(res.stdout).hexdigest(), int(mtime_s), int(st.stdout)


def ledger(lab):
    res = lab.ct(CT, "cat", "/opt/dflash-trainer/ledger.json")
    return json.loads(res.stdout)["entries"] if res.returncode == 0 else []


def test_a_trainer_logging_to_its_own_file_is_proved_through_trainer_progress_path(lab, inv):
    inv_path, src = inv
    before, _sha, _mtime, inode = own_file(lab)
    assert before == STALE.encode()

    # the finding: one line on stdout, progress in its own file -> no proof from the launcher's log
    res = play(inv_path, "deploy.yml", trainer_src=src)
    assert res.returncode != 0
    assert "not ready after 20 s" in res.stdout and "no line matching" in res.stdout, res.stdout[-3000:]
    assert "training; progress is logged to %s" % OWN_LOG in res.stdout  # the launcher's tail

    # the same trainer, its own file named: proved from this start's lines of it
    res = play(inv_path, "deploy.yml", trainer_src=src, trainer_progress_path=OWN_LOG, trainer_force_restart=True)
    assert res.returncode == 0, res.stdout[-4000:]
    last = ledger(lab)[-1]
    assert last["verdict"] == "proved", last
    tok = last["figures"]["tok_s"]
    assert 41250 * 0.9 <= tok["median"] <= 41250 * 1.1 and tok["n"] >= 8, tok  # never the stale 99999
    assert "99999" not in json.dumps(last["figures"])
    assert lab.ct(CT, "systemctl", "is-active", UNIT).stdout.strip() == "active"

    # the collection only read it: the same file, what it held before is its prefix, and every
    # byte added since is a line the trainer wrote (two starts: the failed one and the proved one)
    after, _sha, _mtime, inode_after = own_file(lab)
    assert inode_after == inode
    assert after.startswith(before) and len(after) > len(before)
    added = after[len(before):].decode().splitlines()
    assert added and all(OWN_LINE.match(line) for line in added), [l for l in added if not OWN_LINE.match(l)][:5]
    assert sum(1 for line in added if "tok/s=" in line) >= 8

    # with the trainer stopped, status and a check-mode deploy leave it byte for byte as it was
    assert lab.ct(CT, "systemctl", "stop", UNIT).returncode == 0
    stopped = own_file(lab)
    res = play(inv_path, "playbooks/status.yml", trainer_progress_path=OWN_LOG)
    # status read everything and says the trainer is stopped (its exit status is for cron and alerts)
    assert "is not running its proved release healthily: not running" in res.stdout, res.stdout[-3000:]
    res = play(inv_path, "deploy.yml", "--check", trainer_src=src, trainer_progress_path=OWN_LOG)
    assert res.returncode == 0, res.stdout[-3000:]
    assert own_file(lab) == stopped


def test_a_progress_path_the_collection_writes_is_refused_before_any_change(lab, inv):
    inv_path, src = inv
    unit_before = lab.ct(CT, "systemctl", "show", "-p", "InvocationID,ActiveState", UNIT).stdout
    res = play(inv_path, "deploy.yml", trainer_src=src, trainer_progress_path="/workspace/trainer.log")
    assert res.returncode != 0
    assert "trainer_progress_path: is the same file as trainer_log_path" in res.stdout, res.stdout[-3000:]
    assert "refused before any change" in res.stdout
    assert lab.ct(CT, "systemctl", "show", "-p", "InvocationID,ActiveState", UNIT).stdout == unit_before


# A trainer that prints one line and writes its progress as JSONL records to a file of its own
JSONL = OWN_DIR + "/metrics.jsonl"
JSONL_PY = '''import json, os, re, subprocess, sys
os.makedirs("%(dir)s", exist_ok=True)
print("training; metrics go to %(path)s", flush=True)
here = os.path.dirname(os.path.abspath(__file__))
child = subprocess.Popen([sys.executable, os.path.join(here, "trainer.py")], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
with open("%(path)s", "a") as out:
    for line in child.stdout:
        m = re.search(r"step=(\\d+) .*tok/s=([\\d.]+)", line)
        if m:
            out.write(json.dumps({"step": int(m.group(1)), "tok_s": float(m.group(2))}) + "\\n")
            out.flush()
sys.exit(child.wait())
''' % {"dir": OWN_DIR, "path": JSONL}


def test_progress_written_elsewhere_is_named_with_its_setting_long_before_the_deadline(lab, inv):
    """With the default ready timeout (900 s), a trainer whose progress goes only to its own JSONL file
    gets its verdict within FAIL_AFTER_S (90 s) of the start, naming the file and the setting - not at
    the deadline; with that setting it is proved."""
    inv_path, src = inv
    jsonl_src = os.path.join(os.path.dirname(src), "trainer-jsonl")
    shutil.copytree(src, jsonl_src)
    with open(os.path.join(jsonl_src, "jsonl.py"), "w") as fh:
        fh.write(JSONL_PY)
    with open(os.path.join(jsonl_src, "run.sh"), "w") as fh:
        fh.write('#!/bin/bash\nexec python3 "$(dirname "$(readlink -f "$0")")/jsonl.py" "$@"\n')
    res = play(inv_path, "deploy.yml", trainer_src=jsonl_src, trainer_ready_timeout_s=900, trainer_force_restart=True)
    out = " ".join(res.stdout.split())
    assert res.returncode != 0, out[-4000:]
    assert "not ready after 900 s" not in out, out[-4000:]
    assert "the trainer writes its progress to %s, not to this start's log" % JSONL in out, out[-4000:]
    # the fix: a line of its own, pasted as is
    assert "prove from it with:" in out and "-e trainer_progress_path=%s" % JSONL in [
        line.strip() for line in res.stdout.splitlines()], res.stdout[-4000:]
    # the setting it named proves it
    res = play(inv_path, "deploy.yml", trainer_src=jsonl_src, trainer_progress_path=JSONL, trainer_force_restart=True)
    assert res.returncode == 0, res.stdout[-4000:]
    assert ledger(lab)[-1]["verdict"] == "proved"
