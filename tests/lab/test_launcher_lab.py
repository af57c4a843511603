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


def start_pair(run, unit, log):
    """The log's start record and the log itself (inode, first line), read in one command while the
    launcher is stopped (SIGSTOP to the unit's main process, SIGCONT after): a rotation or reopen
    can never come between the two reads. Between a new log's marker and its record the launcher
    may be stopped too: callers poll until the record names the log (``consistent``)."""
    script = ("pid=$(systemctl show -p MainPID --value {u}.service); kill -STOP \"$pid\" || exit 1; "
              "cat {l}.start; stat -c %i {l}; head -1 {l}; ls {d}; kill -CONT \"$pid\"")
    res = run(script.format(u=unit, l=log, d=os.path.dirname(log)), check=False)
    lines = res.stdout.splitlines()
    try:
        record, inode, first, listing = json.loads(lines[0]), int(lines[1]), lines[2], lines[3:]
    except (IndexError, ValueError):
        return None
    return {"record": record, "inode": inode, "first": first, "ls": sorted(listing),
            "consistent": record.get("inode") == inode}


def consistent_start(run, unit, log):
    """start_pair, polled until the record names the log it sits beside (the launcher rewrites the
    record right after a new log's marker); fails naming the last reading."""
    last = []

    def read():
        last[:] = [start_pair(run, unit, log)]
        return last[0] and last[0]["consistent"]
    assert wait_for(read, timeout=10), "the start record never named the log: %r" % last
    return last[0]


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
    # the record, the log's inode and first line, and the directory as one reading (start_pair)
    pair = consistent_start(sh, UNIT, LOG)
    assert pair["record"]["offset"] == 0
    assert pair["first"].startswith("==> dflash.trainer start invocation=%s " % pair["record"]["invocation"])
    # (a record's temporary file may be there for the moment the launcher was stopped in its write)
    assert [n for n in pair["ls"] if not n.endswith(".tmp")] == ["t.log", "t.log.1", "t.log.start"]
    assert props() == before


# --- a container user's links and files (lab container 244, a real uid-1000 user) ------------------
CT_USER = "244"
U_UNIT = "dflash-launch-user-lab"
U_BASE = "/opt/dflash-launch-user-lab"
U_DIR = "/srv/dflash-u1000"  # the log's directory, owned by uid 1000
U_LOG = U_DIR + "/t.log"
VICTIM_PATH = "/root/dflash-victim"
VICTIM_TEXT = "root's own file: never written by the launcher\n"
PERSON = "a person's notes at a rotation name\n"
SNAP = "stat -c '%n %u %a %s %Y' {v} {d}/t.log.1; sha256sum {v} {d}/t.log.1".format(v=VICTIM_PATH, d=U_DIR)


def cu(*cmd, check=True, **kw):
    res = subprocess.run(["pct", "exec", CT_USER, "--", *cmd], capture_output=True, text=True, timeout=60,
                         check=False, **kw)
    if check and res.returncode != 0:
        raise AssertionError("%s: exit %d: %s" % (cmd, res.returncode, res.stderr or res.stdout))
    return res


def csh(script, check=True):
    return cu("sh", "-c", script, check=check)


def as_user(script, **kw):
    return cu("runuser", "-u", "dfuser", "--", "sh", "-c", script, **kw)


def test_a_container_users_links_and_files_are_never_written_or_removed():
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT_USER],
                   check=True, stdout=subprocess.DEVNULL)
    csh("id dfuser >/dev/null 2>&1 || useradd -u 1000 -M -s /bin/sh dfuser")
    with open(LAUNCHER) as f:
        cu("sh", "-c", "mkdir -p %s && cat > %s/launch" % (U_BASE, U_BASE), input=f.read())
    csh("mkdir -p %s/releases/r1 && ln -sfn releases/r1 %s/current && mkdir -p %s && chown 1000:1000 %s && "
        "chmod 0755 %s" % (U_BASE, U_BASE, U_DIR, U_DIR, U_DIR))
    cu("sh", "-c", "cat > %s && chmod 0644 %s" % (VICTIM_PATH, VICTIM_PATH), input=VICTIM_TEXT)
    cu("sh", "-c", "cat > %s/releases/r1/trainer.sh && chmod +x %s/releases/r1/trainer.sh" % (U_BASE, U_BASE),
       input=TRAINER)
    # the user's own file at the first rotation name (trainer_log_keep 0 must not unlink it)
    as_user("cat > %s/t.log.1" % U_DIR, input=PERSON)
    before = csh(SNAP).stdout
    # the launcher's pid is known before it runs (exec keeps it): the user plants a link at the start
    # record's temporary name, pointing at root's file
    csh("rm -f /run/dfl-go /run/dfl-pid")
    csh("systemd-run --unit=%s --property=Type=exec --property=KillMode=control-group --setenv=PAD=%s "
        "/bin/sh -c 'echo $$$$ > /run/dfl-pid; while [ ! -e /run/dfl-go ]; do sleep 0.05; done; exec /usr/bin/python3 "
        "%s/launch --root %s --log %s --log-max-mib 0.01 --log-keep 0 -- ./trainer.sh'"
        % (U_UNIT, "x" * 200, U_BASE, U_BASE, U_LOG))
    try:
        assert wait_for(lambda: csh("test -s /run/dfl-pid", check=False).returncode == 0, timeout=20)
        pid = csh("cat /run/dfl-pid").stdout.strip()
        as_user("ln -s %s %s.start.%s.tmp" % (VICTIM_PATH, U_LOG, pid))
        csh("touch /run/dfl-go")
        # it runs, writes its own log (0640, root's) and start record, and rotates (keep 0) past the person's file
        assert wait_for(lambda: "step=300 " in csh("cat %s" % U_LOG, check=False).stdout, timeout=30)
        assert csh("stat -c '%%u %%a' %s %s.start" % (U_LOG, U_LOG)).stdout.split() == ["0", "640", "0", "640"]
        # the record and the log's inode as one reading: the launcher rotates (keep 0) about twice a
        # second, and a rotation between two separate reads made them disagree on a loaded machine
        pair = consistent_start(csh, U_UNIT, U_LOG)
        assert pair["record"]["pid"] == int(pid)
        # the user swaps the log for a link to root's file (one rename: the launcher, rotating, may make a
        # new log at any moment): the launcher refuses to reopen it
        as_user("ln -s %s %s.lnk && mv -T %s.lnk %s" % (VICTIM_PATH, U_LOG, U_LOG, U_LOG))
        inv = csh("systemctl show -p InvocationID --value %s.service" % U_UNIT).stdout.strip()
        assert wait_for(lambda: "cannot write the log %s" % U_LOG in csh(
            "journalctl -u %s.service _SYSTEMD_INVOCATION_ID=%s -o cat --no-pager" % (U_UNIT, inv)).stdout,
            timeout=15)
        assert csh("systemctl is-active %s.service" % U_UNIT, check=False).stdout.strip() == "active"
        # root's file and the person's file: byte for byte, owner, mode and mtime as before
        assert csh(SNAP).stdout == before
    finally:
        csh("systemctl stop %s.service; systemctl reset-failed %s.service; rm -rf %s %s %s /run/dfl-go /run/dfl-pid"
            % (U_UNIT, U_UNIT, U_BASE, U_DIR, VICTIM_PATH), check=False)
