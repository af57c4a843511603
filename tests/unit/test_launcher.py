"""The unit's launcher: pins the release, marks this start in the log, copies output, keeps the
command's exit status and forwards SIGTERM. Run here as a plain process (no systemd needed)."""
import errno
import json
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


def launch(root, *cmd, env=None, flags=(), **kw):
    argv = [sys.executable, LAUNCHER, "--root", str(root), "--log", str(root / "logs" / "t.log"), *flags, "--", *cmd]
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


# --- the log never takes the trainer down; rotation; the sidecar (issue 7 item 6) -------------

from ansible_collections.dflash.trainer.plugins.module_utils.proof import log_file as lf  # noqa: E402
from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl  # noqa: E402

from waiting import poll  # noqa: E402

TRAINER = """#!%s
import os, sys, time
ctl = os.environ["CTL"]
pad = "x" * int(os.environ.get("PAD", "0"))
i = 0
while not os.path.exists(os.path.join(ctl, "stop")):
    print("step=%%d tok/s=1.0 %%s" %% (i, pad), flush=True)
    i += 1
    time.sleep(float(os.environ.get("EVERY", "0.01")))
print("done", flush=True)
""" % sys.executable


class Running(object):
    """The launcher running the fake trainer (step=N lines until CTL/stop exists)."""

    def __init__(self, root, log, *flags, **env):
        rel = root / "releases" / "abc123"
        (rel / "trainer.py").write_text(TRAINER)
        (rel / "trainer.py").chmod(0o755)
        self.ctl = root / "ctl"
        self.ctl.mkdir(exist_ok=True)
        self.log = log
        argv = [sys.executable, LAUNCHER, "--root", str(root), "--log", str(log), *flags, "--", "./trainer.py"]
        self.out = open(str(root / "journal"), "wb")
        self.journal_path = root / "journal"
        self.proc = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, INVOCATION_ID="inv1", CTL=str(self.ctl),
                                              **{k: str(v) for k, v in env.items()}))

    def journal(self):
        return self.journal_path.read_text(errors="replace")

    def steps_in_journal(self):
        return [line for line in self.journal().splitlines() if line.startswith("step=")]

    def wait_steps(self, n, timeout=20):
        poll(lambda: len(self.steps_in_journal()) >= n, timeout=timeout, what="%d steps in the journal" % n)

    def stop(self):
        (self.ctl / "stop").write_text("")
        rc = self.proc.wait(timeout=30)
        self.out.close()
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


@pytest.fixture
def running(root):
    started = []

    def start(log, *flags, **env):
        r = Running(root, log, *flags, **env)
        started.append(r)
        return r
    yield start
    for r in started:
        (r.ctl / "stop").write_text("")
        try:
            r.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        r.kill()


def markers(path):
    return [tl.parse_marker(line) for line in path.read_text(errors="replace").splitlines()
            if tl.parse_marker(line)]


def read_this_start(path):
    follower, where = lf.read_start(str(path), "inv1", lambda: tl.StartLog("inv1"))
    return follower, where


def test_sidecar_records_the_start_marker_offset(root):
    log = root / "logs" / "t.log"
    log.parent.mkdir()
    log.write_text("old run\n" * 1000)
    launch(root, "./run.sh")
    record = json.loads((root / "logs" / "t.log.start").read_text())
    assert record["invocation"] == "inv1" and record["offset"] == 8000
    assert record["inode"] == os.stat(str(log)).st_ino
    with open(str(log), "rb") as f:
        f.seek(8000)
        assert f.readline().startswith(b"==> dflash.trainer start invocation=inv1 release=abc123")
    follower, where = read_this_start(log)
    assert where.source == "sidecar" and where.offset == 8000
    cwd = os.path.realpath(root / "releases" / "abc123")
    assert list(follower.analysis.lines)[:1] == ["release=abc123 cwd=%s" % cwd]


def test_rotation_keeps_k_files_each_starting_with_a_marker(root):
    log = root / "logs" / "t.log"
    log.parent.mkdir()
    # beyond keep (keep lowered, or a person's file): never touched
    (root / "logs" / "t.log.3").write_text("from when keep was 3\n")
    rel = root / "releases" / "abc123"
    (rel / "many.sh").write_text('#!/bin/sh\ni=0\n'
                                 'while [ $i -lt 3000 ]; do echo "step=$i tok/s=1.0 pad"; i=$((i+1)); done\n')
    (rel / "many.sh").chmod(0o755)
    max_bytes = int(0.01 * 1024 * 1024)
    res = launch(root, "./many.sh", flags=["--log-max-mib", "0.01", "--log-keep", "2"])
    assert res.returncode == 0
    files = sorted(p.name for p in log.parent.iterdir())
    assert files == ["t.log", "t.log.1", "t.log.2", "t.log.3", "t.log.start"]
    assert (root / "logs" / "t.log.3").read_text() == "from when keep was 3\n"
    for name in ("t.log", "t.log.1", "t.log.2"):
        path = log.parent / name
        assert path.stat().st_size <= max_bytes, name
        first = tl.parse_marker(path.read_text().splitlines()[0])
        assert first["invocation"] == "inv1" and first["release"] == "abc123", name
        assert first["continued"] == "rotated", name   # 3000 lines: the start marker rotated away
    # no line lost or reordered: the files hold the journal's last lines, in order
    kept = [line for name in ("t.log.2", "t.log.1", "t.log")
            for line in (log.parent / name).read_text().splitlines() if not line.startswith("==> ")]
    journal = [line for line in res.stdout.splitlines() if not line.startswith("==> ")]
    assert journal == ["step=%d tok/s=1.0 pad" % i for i in range(3000)]
    assert kept == journal[-len(kept):]
    # this start's log is found in the rotated file: its continuation marker begins it
    follower, where = read_this_start(log)
    assert where.source == "sidecar" and where.offset == 0
    assert follower.marker["continued"] == "rotated" and follower.analysis.last_step == 2999


def test_a_log_over_the_limit_at_start_is_rotated_before_the_start_marker(root):
    log = root / "logs" / "t.log"
    log.parent.mkdir()
    log.write_text("x" * 20000 + "\n")
    assert launch(root, "./run.sh", flags=["--log-max-mib", "0.01", "--log-keep", "0"]).returncode == 0
    assert not (root / "logs" / "t.log.1").exists()  # keep 0: nothing kept
    first = tl.parse_marker(log.read_text().splitlines()[0])
    assert first["invocation"] == "inv1" and "continued" not in first


def test_rotation_off_with_max_0(root):
    log = root / "logs" / "t.log"
    log.parent.mkdir()
    log.write_text("x" * 20000 + "\n")
    assert launch(root, "./run.sh", flags=["--log-max-mib", "0"]).returncode == 0
    assert sorted(p.name for p in log.parent.iterdir()) == ["t.log", "t.log.start"]


def test_bad_flags_are_refused(root):
    res = launch(root, "./run.sh", flags=["--log-keep", "-1"])
    assert res.returncode == 2 and "must not be negative" in res.stderr


@pytest.mark.parametrize("how", ["removed", "renamed"])
def test_log_removed_or_moved_away_is_reopened_with_a_continuation_marker(root, running, how):
    log = root / "logs" / "t.log"
    r = running(log)
    r.wait_steps(5)
    if how == "removed":
        log.unlink()
    else:
        log.rename(str(log) + ".old")
    poll(lambda: log.exists() and len(log.read_text().splitlines()) >= 3, what="log reopened")
    first = tl.parse_marker(log.read_text().splitlines()[0])
    assert first["invocation"] == "inv1" and first["continued"] == "reopened"
    assert r.proc.poll() is None   # the trainer runs on
    follower, where = read_this_start(log)
    assert where.source == "sidecar" and where.offset == 0 and follower.analysis.n_steps >= 2
    assert r.stop() == 0


def test_log_truncated_in_place_gets_a_continuation_marker(root, running):
    log = root / "logs" / "t.log"
    r = running(log)
    r.wait_steps(5)
    os.truncate(str(log), 0)
    poll(lambda: lf.read_start(str(log), "inv1", lambda: tl.StartLog("inv1"))[0].marker,
         what="a marker of inv1 again")
    follower, _where = read_this_start(log)
    assert follower.marker["continued"] == "truncated"
    assert r.proc.poll() is None
    assert r.stop() == 0


def test_log_that_cannot_be_opened_at_start_does_not_stop_the_trainer(root):
    (root / "logs" / "t.log").mkdir(parents=True)   # the log path is a directory: open fails
    res = launch(root, "./run.sh", "3")
    assert res.returncode == 3
    lines = res.stdout.splitlines()
    assert lines[0].startswith("dflash-trainer-launch: cannot write the log %s" % (root / "logs" / "t.log"))
    assert "the trainer keeps running" in lines[0]
    assert lines[1].startswith("==> dflash.trainer start invocation=inv1")
    assert lines[2:] == ["release=abc123 cwd=%s" % os.path.realpath(root / "releases" / "abc123"), "oops"]


def test_a_closed_journal_does_not_stop_the_trainer(root):
    rel = root / "releases" / "abc123"
    (rel / "talk.sh").write_text('#!/bin/sh\ni=0\nwhile [ $i -lt 200 ]; do echo "line $i"; i=$((i+1)); done\nexit 4\n')
    (rel / "talk.sh").chmod(0o755)
    argv = [sys.executable, LAUNCHER, "--root", str(root), "--log", str(root / "t.log"), "--", "./talk.sh"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=dict(os.environ, INVOCATION_ID="inv1"))
    proc.stdout.close()        # journald gone: every write to stdout fails (EPIPE)
    assert proc.wait(timeout=30) == 4
    assert (root / "t.log").read_text().splitlines()[-1] == "line 199"


def test_a_line_without_end_is_cut_so_memory_stays_bounded(root):
    rel = root / "releases" / "abc123"
    (rel / "bar.py").write_text("#!%s\nimport sys\nsys.stdout.write('\\r' * 200000)\nsys.stdout.flush()\n"
                                % sys.executable)
    (rel / "bar.py").chmod(0o755)
    assert launch(root, "./bar.py").returncode == 0
    lines = (root / "logs" / "t.log").read_text().split("\n")
    assert max(len(line) for line in lines) <= 200000 // 2


@pytest.fixture
def tiny_fs(tmp_path):
    """A 1 MiB tmpfs (needs root): a disk that fills up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, check=False)
    if res.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: %s" % res.stderr.decode(errors="replace").strip())
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(directory):
    """Write a file until the file system is full; answer its path."""
    path = directory / "filler"
    with open(str(path), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return path


def test_disk_full_keeps_the_trainer_running_and_the_log_resumes(root, running, tiny_fs):
    log = tiny_fs / "t.log"
    r = running(log, PAD=200)
    r.wait_steps(5)
    filler = fill(tiny_fs)
    poll(lambda: "cannot write the log" in r.journal(), what="the launcher saying the log is not written")
    seen = len(r.steps_in_journal())
    r.wait_steps(seen + 50)            # the journal still gets every line
    assert r.proc.poll() is None       # and the trainer runs
    assert r.journal().count("cannot write the log") == 1
    assert "(No space left on device)" in r.journal()
    filler.unlink()
    poll(lambda: "is written again (" in r.journal(), what="the log resumed")
    resumed = [m for m in markers(log) if m.get("continued") == "resumed"]
    assert len(resumed) == 1 and int(resumed[0]["unlogged_lines"]) >= 50
    r.wait_steps(len(r.steps_in_journal()) + 10)
    assert r.stop() == 0
    journal = r.steps_in_journal()
    assert journal == ["step=%d tok/s=1.0 %s" % (i, "x" * 200) for i in range(len(journal))]  # none lost
    text = log.read_text(errors="replace")
    assert text.rstrip("\n").splitlines()[-1] == "done"
    # this start's log is still this start's: the original marker is there, found by the sidecar
    follower, where = read_this_start(log)
    assert where.source == "sidecar" and where.offset == 0 and "continued" not in follower.marker
    assert follower.analysis.last_step == len(journal) - 1


def test_disk_full_at_start_then_freed(root, running, tiny_fs):
    filler = fill(tiny_fs)
    log = tiny_fs / "t.log"
    r = running(log)
    r.wait_steps(5)
    assert r.journal().startswith("dflash-trainer-launch: cannot write the log")
    filler.unlink()
    poll(lambda: "is written again (" in r.journal(), what="the log resumed")
    follower, where = read_this_start(log)
    assert follower.marker["continued"] == "resumed" and where.source == "sidecar"
    assert r.stop() == 0


def test_rotation_on_a_full_disk_and_a_user_freeing_space_by_truncating(root, running, tiny_fs):
    log = tiny_fs / "t.log"
    r = running(log, "--log-max-mib", "0.25", "--log-keep", "1", PAD=500, EVERY=0.002)
    poll((tiny_fs / "t.log.1").exists, what="a first rotation")
    filler = fill(tiny_fs)
    poll(lambda: "cannot write the log" in r.journal(), what="the launcher saying the log is not written")
    os.truncate(str(log), 0)           # what people do on a full disk
    filler.unlink()
    poll(lambda: "is written again (" in r.journal(), what="the log resumed")
    follower, _where = read_this_start(log)
    assert follower.marker is not None and follower.marker["invocation"] == "inv1"
    assert r.proc.poll() is None
    assert r.stop() == 0
    assert log.stat().st_size <= 0.25 * 1024 * 1024


def test_progress_bar_redraws_reach_the_log_as_they_come(root):
    """tqdm redraws its bar with \\r and no newline: each update is in the log while the command
    still runs (the proof reads progress from it), not when the bar's line ends."""
    rel = root / "releases" / "abc123"
    (rel / "bar.py").write_text(
        "import sys, time\n"
        "for i in range(1, 4):\n"
        "    sys.stdout.write('\\r%d/100 [00:0%d<00:10, 9.5it/s]' % (i, i))\n"
        "    sys.stdout.flush()\n"
        "    time.sleep(0.05)\n"
        "time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, LAUNCHER, "--root", str(root), "--log", str(root / "logs" / "t.log"), "--",
                             sys.executable, "bar.py"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, INVOCATION_ID="inv1"))
    try:
        deadline = time.monotonic() + 10
        text = ""
        while "3/100 [" not in text and time.monotonic() < deadline:
            time.sleep(0.05)
            text = (root / "logs" / "t.log").read_text() if (root / "logs" / "t.log").exists() else ""
        assert proc.poll() is None  # still running: the bar's line has not ended
        updates = [part for line in text.split("\n") for part in line.split("\r") if part]
        assert updates[1:] == ["1/100 [00:01<00:10, 9.5it/s]", "2/100 [00:02<00:10, 9.5it/s]",
                               "3/100 [00:03<00:10, 9.5it/s]"], text
    finally:
        proc.kill()
        proc.wait()
