"""The launcher writes only what it owns (roles/trainer/files/dflash-trainer-launch): the log is
created 0640 and never opened through a symlink, a hard link or as another user's file; the start
record's temporary file is created O_EXCL|O_NOFOLLOW (a link planted at its name is never written
through); rotation moves and replaces only its own rotations within keep and never touches a
file beyond keep. Run here as root with files chowned to uid 1000 (the lab does it with a real user)."""
import importlib.machinery
import importlib.util
import io
import json
import os
import stat
import subprocess
import sys

import pytest

LAUNCHER = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "trainer", "files", "dflash-trainer-launch")
VICTIM = "root's file: must not change\n"


def load():
    loader = importlib.machinery.SourceFileLoader("dflash_launch_safety", LAUNCHER)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


L = load()


@pytest.fixture
def root(tmp_path):
    rel = tmp_path / "releases" / "abc123"
    rel.mkdir(parents=True)
    (rel / "run.sh").write_text("#!/bin/sh\necho hello\n")
    (rel / "run.sh").chmod(0o755)
    (rel / "many.sh").write_text('#!/bin/sh\ni=0\nwhile [ $i -lt 2000 ]; do echo "step=$i pad pad pad"; i=$((i+1)); done\n')
    (rel / "many.sh").chmod(0o755)
    (tmp_path / "current").symlink_to("releases/abc123")
    (tmp_path / "logs").mkdir()
    return tmp_path


def launch(root, cmd="./run.sh", flags=()):
    argv = [sys.executable, LAUNCHER, "--root", str(root), "--log", str(root / "logs" / "t.log"), *flags, "--", cmd]
    return subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, INVOCATION_ID="inv1"),
                          timeout=60, check=False)


def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_text(VICTIM)
    return path


def test_a_new_log_is_0640(root):
    assert launch(root).returncode == 0
    assert stat.S_IMODE((root / "logs" / "t.log").stat().st_mode) == 0o640
    assert stat.S_IMODE((root / "logs" / "t.log.start").stat().st_mode) == 0o640


@pytest.mark.parametrize("before, after", [(0o644, 0o640), (0o666, 0o640), (0o600, 0o600), (0o640, 0o640)])
def test_an_adopted_log_gets_no_more_than_the_logs_mode(root, before, after):
    log = root / "logs" / "t.log"
    log.write_text("an earlier start's lines\n")
    log.chmod(before)
    assert launch(root).returncode == 0
    assert stat.S_IMODE(log.stat().st_mode) == after
    assert log.read_text().startswith("an earlier start's lines\n")  # adopted, appended to


def test_a_log_that_is_a_symlink_is_not_written_through(root, tmp_path):
    target = victim(tmp_path)
    (root / "logs" / "t.log").symlink_to(target)
    res = launch(root)
    assert res.returncode == 0 and "hello" in res.stdout  # the trainer ran; its output went to the journal
    assert "cannot write the log" in res.stdout
    assert target.read_text() == VICTIM


def test_a_hard_link_to_roots_file_is_not_adopted(root, tmp_path):
    target = victim(tmp_path)
    os.link(target, root / "logs" / "t.log")
    res = launch(root)
    assert res.returncode == 0 and "not a plain file with one link" in res.stdout
    assert target.read_text() == VICTIM


def test_an_empty_log_of_another_user_is_not_adopted(root):
    log = root / "logs" / "t.log"
    log.write_text("")
    os.chown(log, 1000, 1000)
    res = launch(root)
    assert res.returncode == 0 and "owned by uid 1000" in res.stdout
    assert log.read_text() == "" and log.stat().st_uid == 1000


def test_a_link_planted_at_the_start_records_temporary_name_is_not_written_through(root, tmp_path):
    target = victim(tmp_path)
    log_path = str(root / "logs" / "t.log")
    tmp = "%s.start.%d.tmp" % (log_path, 4242)
    os.symlink(str(target), tmp)
    out = io.BytesIO()
    log = L.Log(log_path, "inv1", "abc123", 4242, 0, 3, L.Journal(out))
    log.start()
    log.close()
    assert target.read_text() == VICTIM
    record = json.loads((root / "logs" / "t.log.start").read_text())
    assert record["invocation"] == "inv1" and record["offset"] == 0
    assert not os.path.lexists(tmp)


def test_a_start_record_that_is_not_ours_is_left_alone(root):
    side = root / "logs" / "t.log.start"
    side.write_text("a user's file\n")
    os.chown(side, 1000, 1000)
    res = launch(root)
    assert res.returncode == 0 and "the start record is not written" in res.stdout
    assert side.read_text() == "a user's file\n"


def test_keep_0_never_unlinks_a_persons_file_at_a_rotation_name(root):
    person = root / "logs" / "t.log.1"
    person.write_text("a person's notes\n")
    assert launch(root, "./many.sh", ["--log-max-mib", "0.01", "--log-keep", "0"]).returncode == 0
    assert person.read_text() == "a person's notes\n"


def test_a_file_beyond_keep_is_never_touched(root):
    env_like = root / "logs" / "t.log.4"
    env_like.write_text('# dflash.trainer: the environment\nHF_TOKEN="x"\n')
    assert launch(root, "./many.sh", ["--log-max-mib", "0.01", "--log-keep", "3"]).returncode == 0
    assert env_like.read_text() == '# dflash.trainer: the environment\nHF_TOKEN="x"\n'
    assert (root / "logs" / "t.log.3").exists()  # rotation ran up to keep


@pytest.mark.parametrize("index", [1, 2, 3])
def test_a_foreign_file_at_any_rotation_index_stops_rotation_and_is_kept(root, index):
    foreign = root / "logs" / ("t.log.%d" % index)
    foreign.write_text("not a rotation\n")
    res = launch(root, "./many.sh", ["--log-max-mib", "0.01", "--log-keep", "3"])
    assert res.returncode == 0
    assert foreign.read_text() == "not a rotation\n"
    assert "is not a rotation this launcher wrote" in res.stdout
    # nothing was moved: the log kept every line (it grew past its limit instead)
    lines = (root / "logs" / "t.log").read_text().splitlines()
    assert "step=0 pad pad pad" in lines and "step=1999 pad pad pad" in lines


def test_a_rotation_of_another_user_is_not_ours(root):
    rot = root / "logs" / "t.log.1"
    rot.write_text(L.Log(str(root / "logs" / "t.log"), "i", "r", 1, 0, 1, L.Journal(io.BytesIO())).marker(
        "rotated").decode())
    assert L.is_rotation(str(rot))
    os.chown(rot, 1000, 1000)
    assert not L.is_rotation(str(rot))
    assert L.is_rotation(str(root / "logs" / "absent"))
    os.symlink(str(rot), str(root / "logs" / "link"))
    assert not L.is_rotation(str(root / "logs" / "link"))


def test_metrics_match_only_the_first_match_chars_of_a_line():
    m = L.Metrics.__new__(L.Metrics)
    m.tokps_regex, m.step_regex, m.samples, m.step, m.clock = None, L.re.compile(r"step=(\d+)"), [], None, lambda: 0
    m.line("x" * L.MATCH_CHARS + " step=5")
    assert m.step is None
    m.line("step=7 " + "x" * 100000)
    assert m.step == 7
