"""plugins/module_utils/release/scan.py, release/archive.py, release/extract.py, release/prune.py:
content hash, excludes, archive, safe extraction, prune plan."""
from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tarfile

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.release import extract as _release_extract
from ansible_collections.dflash.trainer.plugins.module_utils.release.archive import (
    ARCHIVE_MTIME,
    MANIFEST_MEMBER,
    MANIFEST_VERSION,
    build_archive,
    delta_counts,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.extract import (
    extract_archive_entries,
    extract_delta,
    extraction_owner,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.prune import plan_prune
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import (
    DEFAULT_EXCLUDES,
    KIND_FILE,
    BaseReleaseError,
    Entry,
    ReleaseError,
    UnsafeArchiveError,
    hash_entries,
    is_excluded,
    scan_tree,
)

# A tree is data: relpath -> spec. bytes = file (mode 0644), (bytes, mode) = file with mode,
# "DIR" / ("DIR", mode) = directory, ("LINK", target) = symlink.
BASE_TREE = {
    "run.sh": (b"#!/bin/sh\nexec python3 trainer.py\n", 0o755),
    "trainer.py": b"print('step=1')\n",
    "pkg/__init__.py": b"",
    "pkg/model.py": b"W = 1\n",
    "conf/fault.env": b"FAKE_TRAINER_MODE=ok\n",
    "latest.py": ("LINK", "trainer.py"),
}


def extract_archive(archive_path, dest):
    """The digest of an archive extracted into ``dest`` (what the install compares with the release id)."""
    return extract_archive_entries(archive_path, dest)[0]


def make_tree(root, spec):
    os.makedirs(root, exist_ok=True)
    for relpath, item in sorted(spec.items()):
        path = os.path.join(root, relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if item == "DIR" or (isinstance(item, tuple) and item[0] == "DIR"):
            os.makedirs(path, exist_ok=True)
            if isinstance(item, tuple):
                os.chmod(path, item[1])
        elif isinstance(item, tuple) and item[0] == "LINK":
            os.symlink(item[1], path)
        else:
            data, mode = item if isinstance(item, tuple) else (item, 0o644)
            with open(path, "wb") as f:
                f.write(data)
            os.chmod(path, mode)
    return root


def tree_id(tmp_path, spec, name="src", excludes=DEFAULT_EXCLUDES):
    return scan_tree(make_tree(str(tmp_path / name), spec), excludes).release_id


# --- hash: stable and order/mtime independent -------------------------------------------------

def test_hash_stable_across_runs_and_copies(tmp_path):
    a = tree_id(tmp_path, BASE_TREE, "a")
    b = tree_id(tmp_path, dict(reversed(list(BASE_TREE.items()))), "b")  # other creation order
    assert a == b == scan_tree(str(tmp_path / "a")).release_id
    assert len(a) == 16 and int(a, 16) >= 0


def test_hash_ignores_mtime(tmp_path):
    root = make_tree(str(tmp_path / "src"), BASE_TREE)
    before = scan_tree(root).release_id
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            os.utime(os.path.join(dirpath, n), (1, 1), follow_symlinks=False)
    assert scan_tree(root).release_id == before


def test_hash_entries_independent_of_order():
    entries = [Entry("b", "f", 0o644, 1, "x"), Entry("a", "d", 0o755)]
    assert hash_entries(entries) == hash_entries(list(reversed(entries)))


CHANGES = [
    ("file content", {"trainer.py": b"print('step=2')\n"}),
    ("file mode", {"trainer.py": (b"print('step=1')\n", 0o755)}),
    ("new empty dir", {"empty": "DIR"}),
    ("dir mode", {"pkg": ("DIR", 0o700)}),
    ("symlink target", {"latest.py": ("LINK", "pkg/model.py")}),
    ("new file", {"pkg/extra.py": b""}),
    ("file becomes symlink", {"conf/fault.env": ("LINK", "../trainer.py")}),
]


@pytest.mark.parametrize("what,change", CHANGES, ids=[c[0] for c in CHANGES])
def test_hash_changes_with(tmp_path, what, change):
    spec = dict(BASE_TREE)
    spec.update(change)
    assert tree_id(tmp_path, BASE_TREE, "a") != tree_id(tmp_path, spec, "b")


def test_renamed_file_changes_hash(tmp_path):
    spec = dict(BASE_TREE)
    spec["trainer2.py"] = spec.pop("trainer.py")
    spec["latest.py"] = ("LINK", "trainer2.py")
    assert tree_id(tmp_path, BASE_TREE, "a") != tree_id(tmp_path, spec, "b")


def test_scan_counts(tmp_path):
    scan = scan_tree(make_tree(str(tmp_path / "src"), BASE_TREE))
    assert scan.file_count == 5
    assert scan.bytes == sum(len(v[0] if isinstance(v, tuple) else v)
                             for v in BASE_TREE.values() if not (isinstance(v, tuple) and v[0] == "LINK"))
    assert [e.relpath for e in scan.entries] == sorted(e.relpath for e in scan.entries)


# --- excludes ---------------------------------------------------------------------------------

EXCLUDE_CASES = [
    # (extra tree entries, excludes, relpaths expected absent, expected same id as BASE_TREE)
    ({".git/HEAD": b"ref", ".git/objects/ab": b"x"}, DEFAULT_EXCLUDES, [".git", ".git/HEAD"], True),
    ({"pkg/__pycache__/model.cpython-311.pyc": b"\0"}, DEFAULT_EXCLUDES,
     ["pkg/__pycache__"], True),
    ({"pkg/stale.pyc": b"\0", "top.pyc": b"\0"}, DEFAULT_EXCLUDES, ["pkg/stale.pyc", "top.pyc"], True),
    ({"checkpoints/step-100.pt": b"w" * 100}, DEFAULT_EXCLUDES, ["checkpoints"], True),
    ({"logs/a.log": b"x", "logs/b.log": b"y"}, list(DEFAULT_EXCLUDES) + ["*.log"],
     ["logs/a.log", "logs/b.log"], False),  # logs/ dir itself stays
    ({"data/big.bin": b"x"}, ["data/big.bin"], ["data/big.bin"], False),  # whole relative path
    ({".git/HEAD": b"ref"}, [], [], False),  # excludes off: .git counts
]


@pytest.mark.parametrize("extra,excludes,absent,same", EXCLUDE_CASES)
def test_excludes(tmp_path, extra, excludes, absent, same):
    spec = dict(BASE_TREE)
    spec.update(extra)
    scan = scan_tree(make_tree(str(tmp_path / "src"), spec), excludes)
    paths = {e.relpath for e in scan.entries}
    for p in absent:
        assert p not in paths
    assert (scan.release_id == tree_id(tmp_path, BASE_TREE, "base")) is same


@pytest.mark.parametrize("relpath,patterns,expected", [
    ("a/b/__pycache__/x.pyc", ["__pycache__"], True),
    ("a/b/c.pyc", ["*.pyc"], True),
    ("a/.gitignore", [".git"], False),
    ("a/b", ["a/b"], True),
    ("a/b", ["a/*"], True),
    ("a/b", [], False),
])
def test_is_excluded_table(relpath, patterns, expected):
    assert is_excluded(relpath, patterns) is expected


@pytest.mark.parametrize("spec,needle", [
    ({"abs": ("LINK", "/etc/passwd")}, "points outside"),
    ({"sub/up": ("LINK", "../../x")}, "points outside"),
])
def test_scan_refuses_escaping_symlinks(tmp_path, spec, needle):
    with pytest.raises(ReleaseError, match=needle):
        scan_tree(make_tree(str(tmp_path / "src"), spec))


def test_scan_refuses_fifo(tmp_path):
    root = make_tree(str(tmp_path / "src"), BASE_TREE)
    os.mkfifo(os.path.join(root, "pipe"))
    with pytest.raises(ReleaseError, match="pipe is not a regular file"):
        scan_tree(root)


def test_scan_missing_src(tmp_path):
    with pytest.raises(ReleaseError, match="not a directory"):
        scan_tree(str(tmp_path / "nope"))


# --- archive round trip -----------------------------------------------------------------------

def test_archive_deterministic_and_round_trip(tmp_path):
    spec = dict(BASE_TREE, **{"empty": "DIR", "private": ("DIR", 0o700), "private/f": b"r"})
    scan = scan_tree(make_tree(str(tmp_path / "src"), spec))
    a1, a2 = str(tmp_path / "a1.tar.gz"), str(tmp_path / "a2.tar.gz")
    assert build_archive(scan, a1) == scan.digest
    os.utime(os.path.join(scan.root, "trainer.py"), (5, 5))
    assert build_archive(scan_tree(scan.root), a2) == scan.digest
    assert open(a1, "rb").read() == open(a2, "rb").read()

    with tarfile.open(a1) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [e.relpath for e in scan.entries]
    assert all(m.uid == 0 and m.gid == 0 and m.mtime == ARCHIVE_MTIME for m in members)

    dest = tmp_path / "dest"
    dest.mkdir()
    assert extract_archive(a1, str(dest)) == scan.digest
    assert scan_tree(str(dest), []).digest == scan.digest
    assert os.access(dest / "run.sh", os.X_OK)
    assert stat.S_IMODE(os.stat(dest / "run.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(dest / "trainer.py").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(dest / "private").st_mode) == 0o700
    assert (dest / "pkg" / "model.py").read_bytes() == b"W = 1\n"
    assert os.readlink(dest / "latest.py") == "trainer.py"
    assert (dest / "empty").is_dir()


def test_build_archive_detects_change_during_build(tmp_path):
    scan = scan_tree(make_tree(str(tmp_path / "src"), BASE_TREE))
    with open(os.path.join(scan.root, "pkg/model.py"), "wb") as f:
        f.write(b"W = 2\n")  # same size, new content
    assert build_archive(scan, str(tmp_path / "a.tar.gz")) != scan.digest


# --- unsafe archives --------------------------------------------------------------------------

def _tar(path, members):
    """members: (name, kind, extra) with kind in file/dir/sym/lnk/chr/fifo."""
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, extra in members:
            ti = tarfile.TarInfo(name)
            ti.mode = 0o644
            data = None
            if kind == "file":
                data = extra or b"x"
                ti.size = len(data)
            elif kind == "dir":
                ti.type = tarfile.DIRTYPE
                ti.mode = 0o755
            elif kind == "sym":
                ti.type, ti.linkname = tarfile.SYMTYPE, extra
            elif kind == "lnk":
                ti.type, ti.linkname = tarfile.LNKTYPE, extra
            elif kind == "chr":
                ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 1, 3
            elif kind == "fifo":
                ti.type = tarfile.FIFOTYPE
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    return path


UNSAFE = [
    ("absolute path", [("/etc/evil", "file", None)], "absolute"),
    ("dotdot", [("../x", "file", None)], r"'\.\.'"),
    ("nested dotdot", [("a/../../x", "file", None)], r"'\.\.'"),
    ("symlink absolute", [("l", "sym", "/etc")], "outside"),
    ("symlink escaping", [("a/l", "sym", "../../etc")], "outside"),
    ("write through symlink", [("l", "sym", "."), ("l/x", "file", None)], "not a directory"),
    ("late escape via dir link", [("l1", "sym", "d/../x"), ("d", "sym", "."), ], "outside"),
    ("device node", [("null", "chr", None)], "device"),
    ("fifo", [("p", "fifo", None)], "fifo"),
    ("hard link", [("a", "file", None), ("b", "lnk", "a")], "hard link"),
    ("duplicate", [("a", "file", None), ("a", "file", None)], "twice"),
]


@pytest.mark.parametrize("what,members,needle", UNSAFE, ids=[u[0] for u in UNSAFE])
def test_unsafe_archives_rejected(tmp_path, what, members, needle):
    archive = _tar(str(tmp_path / "bad.tar.gz"), members)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(UnsafeArchiveError, match=needle):
        extract_archive(archive, str(dest))
    assert not (tmp_path / "evil").exists() and not (tmp_path / "x").exists()


def test_read_only_dir_extracts_and_stays_manageable(tmp_path):
    spec = {"ro": ("DIR", 0o555), "ro/f": b"r"}
    scan = scan_tree(make_tree(str(tmp_path / "src"), spec))
    archive = str(tmp_path / "a.tar.gz")
    build_archive(scan, archive)
    dest = tmp_path / "dest"
    dest.mkdir()
    assert extract_archive(archive, str(dest)) == scan.digest  # verified as archived
    assert (dest / "ro" / "f").read_bytes() == b"r"
    assert stat.S_IMODE(os.stat(dest / "ro").st_mode) == 0o755  # owner keeps rwx
    os.chmod(str(tmp_path / "src" / "ro"), 0o755)


def test_extraction_drops_setuid_and_group_write(tmp_path):
    archive = str(tmp_path / "a.tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        ti = tarfile.TarInfo("suid")
        ti.mode, ti.size = 0o4777, 1
        tar.addfile(ti, io.BytesIO(b"x"))
    dest = tmp_path / "dest"
    dest.mkdir()
    extract_archive(archive, str(dest))
    assert stat.S_IMODE(os.stat(dest / "suid").st_mode) == 0o755


# --- prune plan -------------------------------------------------------------------------------

PRUNE_CASES = [
    # releases {id: mtime}, current, last_good, keep, expected deletions (oldest first)
    ({"a": 1, "b": 2, "c": 3, "d": 4}, "d", None, 2, ["a", "b"]),
    ({"a": 1, "b": 2, "c": 3, "d": 4}, "d", "a", 2, ["b", "c"]),  # keep counts current and last good
    ({"a": 1, "b": 2, "c": 3, "d": 4}, "b", "a", 1, ["c", "d"]),  # rolled back: both protected, no room
    ({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}, "a", "a", 3, ["b", "c", "d"]),  # failed in a row
    ({"a": 1, "b": 2}, "b", "a", 0, []),
    ({"a": 1, "b": 2, "c": 3}, "c", None, 0, ["a", "b"]),
    ({"a": 1, "b": 2, "c": 3}, "c", "b", 5, []),
    ({}, None, None, 5, []),
    ({"x": 1, "y": 1, "z": 1}, "z", None, 1, ["x", "y"]),  # equal mtimes: id breaks the tie
]


@pytest.mark.parametrize("releases,current,last_good,keep,expected", PRUNE_CASES)
def test_plan_prune(releases, current, last_good, keep, expected):
    doomed = plan_prune(releases, current, last_good, keep)
    assert doomed == expected
    assert current not in doomed and last_good not in doomed
    assert plan_prune(list(releases.items()), current, last_good, keep) == expected


def test_plan_prune_rejects_negative_keep():
    with pytest.raises(ValueError):
        plan_prune({"a": 1}, "a", None, -1)


# --- delta archives ---------------------------------------------------------------------------

def _install_full(tmp_path, spec, name):
    """A base release: spec extracted from a full archive into tmp_path/name; (dir, entries)."""
    scan = scan_tree(make_tree(str(tmp_path / ("src-" + name)), spec))
    archive = str(tmp_path / (name + ".tar.gz"))
    build_archive(scan, archive)
    dest = tmp_path / name
    dest.mkdir()
    digest, entries = extract_archive_entries(archive, str(dest))
    assert digest == scan.digest
    return str(dest), entries


def _have(entries):
    return sorted(set(e.payload for e in entries if e.kind == KIND_FILE))


def test_delta_round_trip_reuses_base_files_byte_and_mode_exact(tmp_path):
    base_dir, base_entries = _install_full(tmp_path, BASE_TREE, "base")
    spec = dict(BASE_TREE)
    spec["trainer.py"] = b"print('step=2')\n"  # changed: sent
    spec["pkg/model.py"] = (b"W = 1\n", 0o600)  # same content, other mode: reused, mode from manifest
    spec["pkg/copy.py"] = b"W = 1\n"  # same content at a new path: reused
    scan = scan_tree(make_tree(str(tmp_path / "src-new"), spec))
    archive = str(tmp_path / "delta.tar.gz")
    assert build_archive(scan, archive, have=_have(base_entries)) == scan.digest
    assert delta_counts(scan, _have(base_entries)) == (1, 5)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names[0] == MANIFEST_MEMBER
    assert "trainer.py" in names and "pkg/model.py" not in names and "run.sh" not in names
    assert "pkg" in names and "latest.py" in names  # directories and symlinks always go

    dest = tmp_path / "new"
    dest.mkdir()
    result = extract_delta(archive, str(dest), base_dir, base_entries)
    digest, entries, sent, reused = result
    assert digest == scan.digest and (sent, reused) == (1, 5)
    # pkg/model.py changed mode: copied; every other reused file is hard-linked
    assert (result.linked, result.copied) == (4, 1)
    assert scan_tree(str(dest), []).digest == scan.digest
    assert sorted(entries, key=lambda e: e.relpath) == sorted(scan.entries, key=lambda e: e.relpath)
    assert (dest / "run.sh").read_bytes() == BASE_TREE["run.sh"][0] and os.access(dest / "run.sh", os.X_OK)
    assert stat.S_IMODE(os.stat(dest / "pkg" / "model.py").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.join(base_dir, "pkg", "model.py")).st_mode) == 0o644

    def ino(path):
        return os.stat(str(path)).st_ino

    # equal mode: the same inode as the base file (pkg/copy.py shares pkg/model.py's, mode 0644)
    for relpath, base_rel in (("run.sh", "run.sh"), ("pkg/__init__.py", "pkg/__init__.py"),
                              ("conf/fault.env", "conf/fault.env"), ("pkg/copy.py", "pkg/model.py")):
        assert ino(dest / relpath) == ino(os.path.join(base_dir, base_rel)), relpath
    # other mode: a copy of its own, with the manifest's mode
    assert ino(dest / "pkg" / "model.py") != ino(os.path.join(base_dir, "pkg", "model.py"))
    assert os.stat(dest / "pkg" / "model.py").st_nlink == 1
    assert ino(dest / "trainer.py") != ino(os.path.join(base_dir, "trainer.py"))  # sent


def test_delta_links_survive_pruning_the_base(tmp_path):
    base_dir, base_entries = _install_full(tmp_path, BASE_TREE, "base")
    spec = dict(BASE_TREE, **{"trainer.py": b"print('step=2')\n"})
    scan = scan_tree(make_tree(str(tmp_path / "src-new"), spec))
    archive = str(tmp_path / "delta.tar.gz")
    build_archive(scan, archive, have=_have(base_entries))
    dest = tmp_path / "new"
    dest.mkdir()
    result = extract_delta(archive, str(dest), base_dir, base_entries)
    assert result.linked == 4 and result.copied == 0 and result.sent == 1
    assert os.stat(dest / "run.sh").st_nlink == 2
    shutil.rmtree(base_dir)  # prune the base release
    assert os.stat(dest / "run.sh").st_nlink == 1
    assert scan_tree(str(dest), []).digest == scan.digest
    assert os.access(dest / "run.sh", os.X_OK) and (dest / "pkg" / "model.py").read_bytes() == b"W = 1\n"


def test_delta_link_false_or_other_owner_copies(tmp_path, monkeypatch):
    base_dir, base_entries = _install_full(tmp_path, BASE_TREE, "base")
    scan = scan_tree(make_tree(str(tmp_path / "src-new"), dict(BASE_TREE, **{"trainer.py": b"2\n"})))
    archive = str(tmp_path / "delta.tar.gz")
    build_archive(scan, archive, have=_have(base_entries))
    (tmp_path / "a").mkdir()
    result = extract_delta(archive, str(tmp_path / "a"), base_dir, base_entries, link=False)
    assert (result.linked, result.copied) == (0, 4) and result.digest == scan.digest
    assert os.stat(tmp_path / "a" / "run.sh").st_ino != os.stat(os.path.join(base_dir, "run.sh")).st_ino
    # a base whose files a fresh extraction would give another owner: copies
    monkeypatch.setattr(_release_extract, "extraction_owner", lambda dest: (os.geteuid() + 1, os.getegid()))
    (tmp_path / "b").mkdir()
    result = extract_delta(archive, str(tmp_path / "b"), base_dir, base_entries)
    assert (result.linked, result.copied) == (0, 4) and result.digest == scan.digest


def test_delta_falls_back_to_a_copy_when_link_fails(tmp_path, monkeypatch):
    base_dir, base_entries = _install_full(tmp_path, BASE_TREE, "base")
    scan = scan_tree(make_tree(str(tmp_path / "src-new"), dict(BASE_TREE, **{"trainer.py": b"2\n"})))
    archive = str(tmp_path / "delta.tar.gz")
    build_archive(scan, archive, have=_have(base_entries))

    def no_link(src, dst, **kw):
        raise OSError(18, "Invalid cross-device link")  # EXDEV: another filesystem
    monkeypatch.setattr(os, "link", no_link)
    dest = tmp_path / "new"
    dest.mkdir()
    result = extract_delta(archive, str(dest), base_dir, base_entries)
    assert (result.linked, result.copied) == (0, 4) and result.digest == scan.digest
    assert scan_tree(str(dest), []).digest == scan.digest
    assert os.stat(dest / "run.sh").st_nlink == 1 and os.access(dest / "run.sh", os.X_OK)


def test_extraction_owner_is_what_extraction_gives(tmp_path):
    (tmp_path / "d").mkdir()
    archive = _tar(str(tmp_path / "a.tar.gz"), [("x", "file", b"x")])
    extract_archive(archive, str(tmp_path / "d"))
    st = os.stat(tmp_path / "d" / "x")
    assert extraction_owner(str(tmp_path / "d")) == (st.st_uid, st.st_gid)


def test_delta_detects_a_tampered_base_file(tmp_path):
    base_dir, base_entries = _install_full(tmp_path, BASE_TREE, "base")
    with open(os.path.join(base_dir, "pkg", "model.py"), "wb") as f:
        f.write(b"W = 9\n")  # same size, other bytes: the manifest still says W = 1
    spec = dict(BASE_TREE, **{"trainer.py": b"print('step=2')\n"})
    scan = scan_tree(make_tree(str(tmp_path / "src-new"), spec))
    archive = str(tmp_path / "delta.tar.gz")
    build_archive(scan, archive, have=_have(base_entries))
    dest = tmp_path / "new"
    dest.mkdir()
    with pytest.raises(BaseReleaseError, match="does not match its recorded sha256"):
        extract_delta(archive, str(dest), base_dir, base_entries)
    # checked before linking: the tampered file (mode and owner fit for a link) is not in dest,
    # and nothing in dest shares its inode
    assert not (dest / "pkg" / "model.py").exists()
    tampered = os.stat(os.path.join(base_dir, "pkg", "model.py"))
    assert tampered.st_nlink == 1
    assert extraction_owner(str(dest)) == (tampered.st_uid, tampered.st_gid)


def test_delta_base_lacking_a_file_is_a_base_error(tmp_path):
    base_dir, base_entries = _install_full(tmp_path, BASE_TREE, "base")
    scan = scan_tree(make_tree(str(tmp_path / "src-new"), dict(BASE_TREE, **{"x.py": b"new\n"})))
    archive = str(tmp_path / "delta.tar.gz")
    build_archive(scan, archive, have=_have(base_entries) + ["0" * 64])
    os.unlink(os.path.join(base_dir, "trainer.py"))
    dest = tmp_path / "new"
    dest.mkdir()
    with pytest.raises(BaseReleaseError, match="trainer.py"):
        extract_delta(archive, str(dest), base_dir, base_entries)
    # a sha the base manifest does not know at all
    dest2 = tmp_path / "new2"
    dest2.mkdir()
    with pytest.raises(BaseReleaseError, match="neither in the archive nor in the base"):
        extract_delta(archive, str(dest2), base_dir, [e for e in base_entries if e.relpath != "run.sh"])


def _delta_tar(path, manifest_entries, members=(), raw_manifest=None):
    """A delta archive by hand: manifest member first (items as given), then members (_tar kinds)."""
    data = raw_manifest if raw_manifest is not None else json.dumps(
        {"version": MANIFEST_VERSION, "entries": manifest_entries}).encode()
    with tarfile.open(path, "w:gz") as tar:
        ti = tarfile.TarInfo(MANIFEST_MEMBER)
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
        for name, kind, extra in members:
            ti = tarfile.TarInfo(name)
            if kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(ti)
            else:
                ti.mode, ti.size = 0o644, len(extra)
                tar.addfile(ti, io.BytesIO(extra))
    return path


SHA_X = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"  # sha256(b"x")

UNSAFE_MANIFESTS = [
    ("dotdot", [["../evil", "f", 420, 1, SHA_X]], r"'\.\.'"),
    ("nested dotdot", [["pkg", "d", 493, 0, ""], ["pkg/../../evil", "f", 420, 1, SHA_X]], r"'\.\.'"),
    ("absolute", [["/etc/evil", "f", 420, 1, SHA_X]], "absolute"),
    ("not canonical", [["./pkg//m.py", "f", 420, 1, SHA_X]], "canonical"),
    ("parent not a dir", [["trainer.py/x", "f", 420, 1, SHA_X]], "not a directory"),
    ("symlink outside", [["l", "l", 0, 0, "../../etc"]], "outside"),
    ("bad sha", [["a", "f", 420, 1, "nothex"]], "not a sha256"),
    ("bad kind", [["a", "c", 420, 0, ""]], "unknown kind"),
    ("duplicate", [["a", "f", 420, 1, SHA_X], ["a", "f", 420, 1, SHA_X]], "twice"),
    ("not a list", {"a": 1}, "not a list"),
]


@pytest.mark.parametrize("what,items,needle", UNSAFE_MANIFESTS, ids=[u[0] for u in UNSAFE_MANIFESTS])
def test_delta_manifest_paths_are_checked(tmp_path, what, items, needle):
    base_dir, base_entries = _install_full(tmp_path, BASE_TREE, "base")
    archive = _delta_tar(str(tmp_path / "bad.tar.gz"), items)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(UnsafeArchiveError, match=needle):
        extract_delta(archive, str(dest), base_dir, base_entries)
    assert not (tmp_path / "evil").exists() and os.listdir(str(dest)) == []


def test_delta_archive_must_match_its_manifest(tmp_path):
    base_dir, base_entries = _install_full(tmp_path, BASE_TREE, "base")
    cases = [
        # a member the manifest does not list
        ([["a", "f", 420, 1, SHA_X]], [("a", "file", b"x"), ("b", "file", b"x")], "does not match"),
        # a member whose content differs from the manifest's sha256
        ([["a", "f", 420, 1, SHA_X]], [("a", "file", b"y")], "does not match"),
        # a directory of the manifest missing from the archive
        ([["d", "d", 493, 0, ""]], [], "missing from the delta archive"),
        # no manifest member first
        (None, [], "must start with its manifest"),
    ]
    for i, (items, members, needle) in enumerate(cases):
        path = str(tmp_path / ("c%d.tar.gz" % i))
        if items is None:
            _tar(path, [("a", "file", b"x")])
        else:
            _delta_tar(path, items, members)
        dest = tmp_path / ("dest%d" % i)
        dest.mkdir()
        with pytest.raises(UnsafeArchiveError, match=needle):
            extract_delta(path, str(dest), base_dir, base_entries)
    with pytest.raises(UnsafeArchiveError, match="unreadable manifest"):
        (tmp_path / "destx").mkdir()
        extract_delta(_delta_tar(str(tmp_path / "x.tar.gz"), None, raw_manifest=b"{nope"),
                      str(tmp_path / "destx"), base_dir, base_entries)


def test_delta_member_named_like_the_manifest_is_a_plain_file(tmp_path):
    spec = dict(BASE_TREE, **{MANIFEST_MEMBER: b"a file of the tree\n"})
    base_dir, base_entries = _install_full(tmp_path, spec, "base")
    assert (tmp_path / "base" / MANIFEST_MEMBER).read_bytes() == b"a file of the tree\n"
    spec[MANIFEST_MEMBER] = b"changed\n"
    scan = scan_tree(make_tree(str(tmp_path / "src-new"), spec))
    archive = str(tmp_path / "delta.tar.gz")
    build_archive(scan, archive, have=_have(base_entries))
    dest = tmp_path / "new"
    dest.mkdir()
    assert extract_delta(archive, str(dest), base_dir, base_entries)[0] == scan.digest
    assert (dest / MANIFEST_MEMBER).read_bytes() == b"changed\n"


def test_plan_prune_never_deletes_the_release_current_pointed_at_before():
    # switching current from c (the running trainer's) to d, last good a, keep 2
    assert plan_prune({"a": 1, "b": 2, "c": 3, "d": 4}, "d", "a", 2, also=("c",)) == ["b"]
    # a run of failed releases: last good a runs, f is new; keep 3 -> a, f and the newest other
    assert plan_prune({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}, "f", "a", 3, also=("a",)) == \
        ["b", "c", "d"]
