"""The launcher under real systemd (KillMode=control-group) in lab container 217: a full disk
(a 1 MiB tmpfs mounted in the container) and a removed log never take the trainer down, the
journal says so once, the log resumes with a continuation marker, rotation keeps K files."""
import json
import re
import os
import subprocess
import sys

import pytest

from labkit import wait_for

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "roles", "trainer", "files", "dflash-trainer-launch")
CT = "217"
UNIT = "dflash-launch-lab"
BASE = "/opt/dflash-launch-lab"
MNT = "/mnt/dflash-launch-lab"
LOG = MNT + "/t.log"
TRAINER = '#!/bin/sh\ni=0\nwhile :; do echo "step=$i tok/s=1.0 $PAD"; i=$((i+1)); sleep 0.01; done\n'


def ct(*cmd, check=True, **kw):
    res = subprocess.run(["pct", "exec", CT, "--", *cmd], capture_output=True, text=True, timeout=60,
                         check=False, **kw)
    if check and res.returncode != 0:
        raise AssertionError("%s: exit %d: %s" % (cmd, res.returncode, res.stderr or res.stdout))
    return res


def sh(script, check=True):
    return ct("sh", "-c", script, check=check)


def journal():
    """This activation's journal only (a rerun in the same container has older ones)."""
    inv = sh("systemctl show -p InvocationID --value %s.service" % UNIT).stdout.strip()
    return sh("journalctl -u %s.service _SYSTEMD_INVOCATION_ID=%s -o cat --no-pager" % (UNIT, inv)).stdout


def props():
    out = sh("systemctl show -p ActiveState,MainPID %s.service" % UNIT).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def cleanup():
    sh("systemctl stop %s.service; systemctl reset-failed %s.service; umount %s; rm -rf %s %s"
       % (UNIT, UNIT, MNT, BASE, MNT), check=False)


@pytest.fixture
def launched():
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    cleanup()
    with open(LAUNCHER) as f:
        ct("sh", "-c", "mkdir -p %s && cat > %s/launch" % (BASE, BASE), input=f.read())
    sh("mkdir -p %s/releases/r1 %s && ln -s releases/r1 %s/current && mount -t tmpfs -o size=1m tmpfs %s"
       % (BASE, MNT, BASE, MNT))
    ct("sh", "-c", "cat > %s/releases/r1/trainer.sh && chmod +x %s/releases/r1/trainer.sh" % (BASE, BASE),
       input=TRAINER)
    pad = "x" * 200
    sh("systemd-run --unit=%s --property=Type=exec --property=KillMode=control-group --setenv=PAD=%s "
       "/usr/bin/python3 %s/launch --root %s --log %s --log-max-mib 0.25 --log-keep 1 -- ./trainer.sh"
       % (UNIT, pad, BASE, BASE, LOG))
    assert wait_for(lambda: "step=20 " in sh("cat %s" % LOG, check=False).stdout, timeout=20)
    yield
    cleanup()


def test_full_disk_and_removed_log_do_not_stop_the_trainer(launched):
    before = props()
    assert before["ActiveState"] == "active"
    assert wait_for(lambda: sh("test -e %s.1" % LOG, check=False).returncode == 0, timeout=30), "no rotation"
    sh("dd if=/dev/zero of=%s/filler bs=4k 2>/dev/null; true" % MNT)
    assert wait_for(lambda: "cannot write the log %s (No space left on device)" % LOG in journal(), timeout=10)
    steps = journal().count("step=")
    assert wait_for(lambda: journal().count("step=") > steps + 100, timeout=20)  # the journal gets every line
    assert props() == before                   # same process, still active: the trainer was not touched
    # said once per outage: a rotation may free space for a moment (then "written again"), but
    # never twice in a row for the same outage
    said = re.findall(r"cannot write the log|is written again \(", journal())
    assert said and said[-1] == "cannot write the log"
    assert all(a != b for a, b in zip(said, said[1:])), said
    sh("rm %s/filler" % MNT)
    assert wait_for(lambda: "is written again (" in journal(), timeout=10)
    assert "continued=resumed unlogged_lines=" in sh("cat %s" % LOG).stdout
    sh("rm %s" % LOG)                         # removed under the launcher's feet
    assert wait_for(lambda: "continued=" in sh("head -1 %s" % LOG, check=False).stdout, timeout=10)
    record = json.loads(sh("cat %s.start" % LOG).stdout)
    first = sh("head -1 %s" % LOG).stdout
    assert record["offset"] == 0 and record["inode"] == int(sh("stat -c %%i %s" % LOG).stdout)
    assert first.startswith("==> dflash.trainer start invocation=%s " % record["invocation"])
    assert props() == before
    assert sorted(sh("ls %s" % MNT).stdout.split()) == ["t.log", "t.log.1", "t.log.start"]
