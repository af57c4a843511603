"""Big releases at disk speed (issue 15, item 5): the plain tar, streaming through a fifo into the
module, the sender's stat check, and the action plugin's stream protocol with each side failing
first - run with real fifos, the real module code and the pct connection in local mode against a
fake pct (no lab)."""
from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading

import pytest

from ansible_collections.dflash.trainer.plugins.action import trainer_release as act
from ansible_collections.dflash.trainer.plugins.module_utils.release.archive import archive_estimate, write_archive
from ansible_collections.dflash.trainer.plugins.module_utils.release.extract import (
    GZIP_MAGIC,
    _ForwardReader,
    extract_archive_entries,
    extract_delta,
)
from ansible_collections.dflash.trainer.plugins.module_utils.target.marks import MARKER_NAME
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import (
    KIND_FILE,
    ReleaseError,
    scan_tree,
)
from ansible_collections.dflash.trainer.plugins.modules import trainer_release as mod

from test_pct_connection import FAKE_PCT, make_conn  # pylint: disable=wrong-import-order

GUARD_S = 120  # a hung protocol fails the test instead of hanging it; no test waits on it otherwise


def make_tree(root, big=3 * 1024 * 1024):
    os.makedirs(os.path.join(root, "pkg", "deep"))
    with open(os.path.join(root, "run.sh"), "w") as f:
        f.write("#!/bin/sh\nexec python3 trainer.py\n")
    os.chmod(os.path.join(root, "run.sh"), 0o755)
    for i in range(30):
        with open(os.path.join(root, "pkg", "m%02d.py" % i), "w") as f:
            f.write("X = %d\n" % i * (i + 1))
    with open(os.path.join(root, "pkg", "deep", "n" * 120 + ".py"), "w") as f:  # a pax header
        f.write("long = True\n")
    os.symlink("run.sh", os.path.join(root, "start"))
    with open(os.path.join(root, "weights.bin"), "wb") as f:
        f.write(os.urandom(big))
    return root


def sha_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def written_to_fifo(fifo, data_or_writer):
    """A thread writing into fifo (bytes, or a function of the open file); box['error'] after."""
    box = {}

    def run():
        try:
            with open(fifo, "wb") as out:
                if callable(data_or_writer):
                    data_or_writer(out)
                else:
                    out.write(data_or_writer)
        except BaseException as e:  # pylint: disable=broad-except
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


# --- the archive --------------------------------------------------------------------------------

@pytest.mark.parametrize("level", [None, 1])
def test_plain_and_gzip_archives_carry_the_same_release(tmp_path, level):
    scan = scan_tree(make_tree(str(tmp_path / "src"), big=200000))
    buf = io.BytesIO()
    digest, size = write_archive(scan, buf, compresslevel=level)
    data = buf.getvalue()
    assert digest == scan.digest and size == len(data)
    assert data[:2] == GZIP_MAGIC if level else data[:2] != GZIP_MAGIC
    again = io.BytesIO()
    write_archive(scan_tree(scan.root), again, compresslevel=level)
    assert again.getvalue() == data  # deterministic
    path = tmp_path / "a.tar"
    path.write_bytes(data)
    dest = tmp_path / "dest"
    dest.mkdir()
    assert extract_archive_entries(str(path), str(dest))[0] == scan.digest
    assert sha_of(dest / "weights.bin") == sha_of(os.path.join(scan.root, "weights.bin"))


def test_estimate_bounds_the_plain_tar(tmp_path):
    scan = scan_tree(make_tree(str(tmp_path / "src"), big=123457))
    size = write_archive(scan, io.BytesIO())[1]
    assert size <= archive_estimate(scan) < size + 64 * 1024
    have = [e.payload for e in scan.entries if e.relpath == "weights.bin"]
    delta = write_archive(scan, io.BytesIO(), have=have)[1]
    assert delta <= archive_estimate(scan, have) < archive_estimate(scan) - 100000


def test_stat_check_names_a_file_changed_after_the_scan(tmp_path):
    scan = scan_tree(make_tree(str(tmp_path / "src"), big=4096))
    assert write_archive(scan, io.BytesIO(), check="stat")[0] == scan.digest
    path = os.path.join(scan.root, "pkg", "m03.py")
    st = os.stat(path)
    with open(path, "r+b") as f:  # same size, other content, mtime put back: ctime still moves
        f.write(b"Y")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert write_archive(scan, io.BytesIO(), check="stat")[0] != scan.digest
    assert write_archive(scan, io.BytesIO(), check="hash")[0] != scan.digest


def test_stat_check_refuses_a_file_that_shrank(tmp_path):
    scan = scan_tree(make_tree(str(tmp_path / "src"), big=300000))
    with open(os.path.join(scan.root, "weights.bin"), "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ReleaseError, match="weights.bin shrank from 300000 bytes"):
        write_archive(scan, io.BytesIO(), check="stat")


@pytest.mark.parametrize("level", [None, 1])
def test_full_and_delta_archives_extract_from_a_fifo(tmp_path, level):
    scan = scan_tree(make_tree(str(tmp_path / "src"), big=2 * 1024 * 1024))
    fifo = str(tmp_path / "archive.fifo")
    os.mkfifo(fifo)
    thread, box = written_to_fifo(fifo, lambda out: write_archive(scan, out, compresslevel=level))
    dest = tmp_path / "full"
    dest.mkdir()
    digest, entries = extract_archive_entries(fifo, str(dest))
    thread.join(GUARD_S)
    assert not thread.is_alive() and "error" not in box  # read to the end: the writer was not cut off
    assert digest == scan.digest and len(entries) == len(scan.entries)

    with open(os.path.join(scan.root, "pkg", "m01.py"), "a") as f:
        f.write("# changed\n")
    new = scan_tree(scan.root)
    have = [e.payload for e in entries if e.kind == KIND_FILE]
    os.unlink(fifo)
    os.mkfifo(fifo)
    thread, box = written_to_fifo(fifo, lambda out: write_archive(new, out, have=have, compresslevel=level))
    dest2 = tmp_path / "delta"
    dest2.mkdir()
    done = extract_delta(fifo, str(dest2), str(dest), entries)
    thread.join(GUARD_S)
    assert not thread.is_alive() and "error" not in box
    assert done.digest == new.digest and done.sent == 1 and done.reused == new.file_count - 1


def test_a_cut_stream_is_refused(tmp_path):
    scan = scan_tree(make_tree(str(tmp_path / "src"), big=500000))
    buf = io.BytesIO()
    write_archive(scan, buf)
    fifo = str(tmp_path / "archive.fifo")
    os.mkfifo(fifo)
    thread, _box = written_to_fifo(fifo, buf.getvalue()[:300000])
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises((tarfile.TarError, OSError, ReleaseError)):
        extract_archive_entries(fifo, str(dest))
    thread.join(GUARD_S)


# --- the action's stream protocol ---------------------------------------------------------------

class Target(object):
    """An action plugin wired to the pct connection in local mode (fake pct: commands run here) and
    to the module's run() in-process, each side able to fail first."""

    def __init__(self, tmp_path, execute=None, put_stream=None):
        fake = tmp_path / "pct"
        fake.write_text(FAKE_PCT)
        fake.chmod(0o755)
        self.conn = make_conn(pct_local=True, pct_path=str(fake))
        self.conn._connect()
        self.remote_tmp = tmp_path / "remote-tmp"
        self.remote_tmp.mkdir()
        self.conn._shell.tmpdir = str(self.remote_tmp)
        if put_stream is not None:
            self.conn.put_stream = put_stream
        self.root = tmp_path / "root"
        self.action = object.__new__(act.ActionModule)
        self.action._connection = self.conn
        self.action._fixup_perms2 = lambda paths: None
        self.action._low_level_execute_command = self._low_level
        self.action._execute_module = execute or self._module
        self.module_args = []

    def _low_level(self, cmd, sudoable=True):
        rc, out, err = self.conn.exec_command(cmd, sudoable=sudoable)
        return dict(rc=rc, stdout=out.decode(), stderr=err.decode())

    def _module(self, module_name=None, module_args=None, task_vars=None):
        self.module_args.append(module_args)
        try:
            return mod.run(dict(dict(state="present", keep=5), **module_args))
        except mod.ReleaseModuleError as e:
            return dict(e.result, failed=True, msg=e.msg)

    def send(self, scan, produce=None):
        """_stream_into_module in a thread, so that a hung protocol fails the test."""
        if produce is None:
            def produce(out):
                return write_archive(scan, out, check="stat")
        result, tree, box = {}, {}, {}

        def run():
            box["answer"] = self.action._stream_into_module(
                produce, "release-%s.tar" % scan.release_id, dict(root=str(self.root), release=scan.release_id),
                {}, scan, scan.root, tree, result, "test")
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(GUARD_S)
        assert not thread.is_alive(), "the stream protocol hung"
        return box.get("answer"), result, tree


def no_release(target):
    """Nothing installed (not even a partial release) under the target's releases/."""
    releases = target.root / "releases"
    return not releases.exists() or not list(releases.iterdir())


def test_stream_into_module_installs_the_release_without_a_copy(tmp_path):
    scan = scan_tree(make_tree(str(tmp_path / "src")))
    target = Target(tmp_path)
    answer, result, tree = target.send(scan)
    assert not result.get("failed"), result
    assert answer["transferred"] is True and "switched" not in answer
    # trainer_release never moves current (the restart job does)
    assert answer["current"] is None and not (target.root / "current").exists()
    assert tree["archive_bytes"] >= scan.bytes
    assert target.module_args[0]["archive"].endswith(".fifo")
    release = target.root / "releases" / scan.release_id
    assert sha_of(release / "weights.bin") == sha_of(os.path.join(scan.root, "weights.bin"))
    assert scan_tree(str(release), [MARKER_NAME]).digest == scan.digest
    # nothing but the fifo went to the remote tmp dir: no archive file on the target
    assert [p.name for p in target.remote_tmp.iterdir()] == ["release-%s.tar.fifo" % scan.release_id]


def test_module_failing_before_it_opens_the_fifo_releases_the_sender(tmp_path):
    scan = scan_tree(make_tree(str(tmp_path / "src")))
    target = Target(tmp_path, execute=lambda **kw: dict(failed=True, msg="Unable to take the lock"))
    answer, result, _tree = target.send(scan)
    assert answer is None or answer.get("failed")
    assert result.get("failed") or answer.get("failed")
    assert "Unable to take the lock" in (result.get("msg") or answer.get("msg"))
    assert not (target.root / "current").exists() and no_release(target)


def test_sender_failing_midway_fails_the_install_and_says_why(tmp_path):
    scan = scan_tree(make_tree(str(tmp_path / "src")))

    def produce(out):
        buf = io.BytesIO()
        write_archive(scan, buf)
        out.write(buf.getvalue()[:1024 * 1024])
        raise ReleaseError("weights.bin: Input/output error")

    target = Target(tmp_path)
    answer, result, _tree = target.send(scan, produce=produce)
    assert answer is None and result["failed"]
    assert "Input/output error" in result["msg"] and "(the target: " in result["msg"]
    assert not (target.root / "current").exists()
    assert not list((target.root / "releases").iterdir())  # the partial release is gone


def test_transfer_failing_before_it_opens_the_fifo_releases_the_module(tmp_path):
    scan = scan_tree(make_tree(str(tmp_path / "src")))

    def broken_put(src, out_path):
        raise act.AnsibleError("host pve1 is unreachable (ssh): Connection refused")

    target = Target(tmp_path, put_stream=broken_put)
    answer, result, _tree = target.send(scan)
    assert answer is None and result["failed"]
    assert "Connection refused" in result["msg"] and "(the target: " in result["msg"]
    assert not (target.root / "current").exists() and no_release(target)


def test_a_file_rewritten_after_the_scan_is_refused_and_named(tmp_path):
    scan = scan_tree(make_tree(str(tmp_path / "src")))
    with open(os.path.join(scan.root, "pkg", "m02.py"), "r+b") as f:
        f.write(b"Z")  # same size, other content
    target = Target(tmp_path)
    answer, result, _tree = target.send(scan)
    assert answer is None and result["failed"]
    assert "changed while the release archive was built" in result["msg"]
    assert "(the target: Unable to install release %s" % scan.release_id in result["msg"]
    assert not (target.root / "current").exists() and no_release(target)  # the target refused the content


def test_a_file_grown_after_the_scan_installs_what_the_id_names(tmp_path):
    """The tar carries the scanned size: the target gets the scanned bytes, checks them against
    the id and installs a release that is exactly the one the id names (a warning says so)."""
    scan = scan_tree(make_tree(str(tmp_path / "src")))
    path = os.path.join(scan.root, "pkg", "m02.py")
    before = open(path, "rb").read()
    with open(path, "a") as f:
        f.write("# appended during the deploy\n")
    target = Target(tmp_path)
    answer, result, _tree = target.send(scan)
    assert not result.get("failed") and answer["transferred"] is True and answer["release"] == scan.release_id
    release = target.root / "releases" / scan.release_id
    assert scan_tree(str(release), [MARKER_NAME]).release_id == scan.release_id
    assert (release / "pkg" / "m02.py").read_bytes() == before


def test_stream_checks_every_byte_arrived():
    def short_put(src):
        src.read()
        return 10

    with pytest.raises(act.AnsibleError, match="received 10 of the 20 bytes"):
        act._stream(lambda out: (out.write(b"x" * 20), ("d", 20))[1], short_put)


def test_put_stream_over_the_pct_connection(tmp_path):
    fake = tmp_path / "pct"
    fake.write_text(FAKE_PCT)
    fake.chmod(0o755)
    conn = make_conn(pct_local=True, pct_path=str(fake))
    conn._connect()
    data = os.urandom(3 * 1024 * 1024 + 7)
    rfd, wfd = os.pipe()
    thread, _box = None, None

    def feed():
        with os.fdopen(wfd, "wb") as out:
            out.write(data)
    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    with os.fdopen(rfd, "rb") as src:
        got = conn.put_stream(src, str(tmp_path / "it's a file"))
    thread.join(GUARD_S)
    assert got == len(data) and (tmp_path / "it's a file").read_bytes() == data
    fifo = str(tmp_path / "f.fifo")
    os.mkfifo(fifo)
    reader_box = {}

    def read_fifo():
        with open(fifo, "rb") as f:
            reader_box["data"] = f.read()
    reader = threading.Thread(target=read_fifo, daemon=True)
    reader.start()
    assert conn.put_stream(io.BytesIO(b"abc"), fifo) is None  # a fifo's reader checks what it got
    reader.join(GUARD_S)
    assert reader_box["data"] == b"abc"


def test_forward_reader_serves_the_peeked_magic_and_never_seeks_back():
    reader = _ForwardReader(io.BytesIO(b"abcdefghij"))
    assert not reader.gzipped
    assert reader.read(1) == b"a" and reader.read(3) == b"bcd" and reader.tell() == 4
    assert reader.seek(6) == 6 and reader.read(2) == b"gh"
    assert reader.seek(1, 1) == 9 and reader.read() == b"j"
    with pytest.raises(io.UnsupportedOperation, match="cannot seek back"):
        reader.seek(2)
    assert _ForwardReader(io.BytesIO(GZIP_MAGIC + b"x")).gzipped
