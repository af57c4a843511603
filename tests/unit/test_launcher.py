"""The unit's launcher: pins the release, marks this start in the log, copies output, keeps the
command's exit status and forwards SIGTERM. Run here as a plain process (no systemd needed)."""
import os
import signal
import subprocess
import sys
import time

import pytest

LAUNCHER = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "trainer", "files", "dflash-trainer-launch")


@pytest.fixture
def root(tmp_path):
    rel = tmp_path / "releases" / "abc123"
    rel.mkdir(parents=True)
    (rel / "run.sh").write_text('#!/bin/sh\necho "release=$DFLASH_RELEASE cwd=$(pwd)"\necho oops >&2\nexit "${1:-0}"\n')
    (rel / "run.sh").chmod(0o755)
    (tmp_path / "current").symlink_to("releases/abc123")
    return tmp_path


def launch(root, *cmd, env=None, **kw):
    argv = [sys.executable, LAUNCHER, "--root", str(root), "--log", str(root / "logs" / "t.log"), "--", *cmd]
    return subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, INVOCATION_ID="inv1", **(env or {})),
                          timeout=30, check=False, **kw)


def test_marks_the_start_pins_the_release_and_copies_output(root):
    res = launch(root, "./run.sh", "3")
    assert res.returncode == 3  # the command's own status
    log = (root / "logs" / "t.log").read_text().splitlines()
    assert log[0].startswith("==> dflash.trainer start invocation=inv1 release=abc123 pid=")
    assert log[0].endswith(" <==")
    assert log[1:] == ["release=abc123 cwd=%s" % os.path.realpath(root / "releases" / "abc123"), "oops"]
    assert res.stdout.splitlines() == log  # the same lines go to the journal (stdout)


def test_appends_never_truncates(root):
    launch(root, "./run.sh")
    launch(root, "./run.sh")
    markers = [line for line in (root / "logs" / "t.log").read_text().splitlines() if line.startswith("==> ")]
    assert len(markers) == 2


def test_missing_command_and_missing_release(root):
    assert launch(root, "./nope").returncode == 127
    assert "launch failed: ./nope" in (root / "logs" / "t.log").read_text()
    (root / "current").unlink()
    assert launch(root, "./run.sh").returncode == 1
    assert "does not point to a release directory" in (root / "logs" / "t.log").read_text()


def test_forwards_sigterm_and_dies_of_the_same_signal(root):
    rel = root / "releases" / "abc123"
    (rel / "sleeper.sh").write_text("#!/bin/sh\necho started\nexec sleep 60\n")
    (rel / "sleeper.sh").chmod(0o755)
    argv = [sys.executable, LAUNCHER, "--root", str(root), "--log", str(root / "t.log"), "--", "./sleeper.sh"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("==> dflash.trainer start")
    assert proc.stdout.readline() == "started\n"
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.returncode == -signal.SIGTERM
