"""--diff of a release: the pure helper (manifest_changes, release_diff), the module's diff of a
release already on the target against current, and the action plugin's diff of a src tree against
the target's current release. trainer_release never moves current (the restart job does): the tests
switch it with switch_current where a diff needs a current release."""
from __future__ import annotations

import os

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.release.archive import build_archive
from ansible_collections.dflash.trainer.plugins.module_utils.release.root import switch_current
from ansible_collections.dflash.trainer.plugins.module_utils.release.diff import (
    human_size,
    manifest_changes,
    release_diff,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import Entry, scan_tree

SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64


def tree(*entries):
    return [Entry(*e) for e in entries]


BEFORE = tree(("pkg", "d", 0o755), ("pkg/model.py", "f", 0o644, 1200, SHA_A), ("run.sh", "f", 0o755, 40, SHA_B),
              ("old.txt", "f", 0o644, 3, SHA_C), ("latest", "l", 0, 0, "pkg/model.py"))
AFTER = tree(("pkg", "d", 0o755), ("pkg/model.py", "f", 0o644, 1300, SHA_C), ("run.sh", "f", 0o700, 40, SHA_B),
             ("data", "d", 0o755), ("data/new.bin", "f", 0o644, 3 * 1024 * 1024, SHA_A),
             ("latest", "l", 0, 0, "run.sh"))


@pytest.mark.parametrize("n, words", [(0, "0 B"), (512, "512 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
                                      (3 * 1024 * 1024, "3.0 MiB"), (5 * 1024 ** 4, "5120.0 GiB")])
def test_human_size(n, words):
    assert human_size(n) == words


def test_changes_list_added_removed_modified_sorted():
    assert manifest_changes(BEFORE, AFTER) == [
        ("+", "data/new.bin", "(3.0 MiB)"),
        ("M", "latest", "(-> run.sh, was -> pkg/model.py)"),
        ("-", "old.txt", ""),
        ("M", "pkg/model.py", "(1.2 KiB → 1.3 KiB)"),
        ("M", "run.sh", "(mode 0755 → 0700)"),
    ]


def test_same_tree_no_change_and_directories_alone_are_not_listed():
    assert manifest_changes(BEFORE, BEFORE) == []
    assert manifest_changes(tree(("a", "d", 0o755)), tree(("b", "d", 0o755))) == []
    # a file that became a directory is
    assert manifest_changes(tree(("x", "f", 0o644, 5, SHA_A)), tree(("x", "d", 0o755))) == [
        ("M", "x", "(directory, was 5 B)")]


def test_content_and_mode_change_together():
    a = tree(("t.py", "f", 0o644, 10, SHA_A))
    b = tree(("t.py", "f", 0o755, 10, SHA_B))
    assert manifest_changes(a, b) == [("M", "t.py", "(10 B → 10 B) mode 0644 → 0755")]


def test_release_diff_is_a_prepared_ansible_diff():
    d = release_diff(BEFORE, AFTER, "1111111111111111", "2222222222222222")
    assert list(d) == ["prepared"]
    lines = d["prepared"].splitlines()
    assert lines[0] == "release 1111111111111111 → 2222222222222222: 1 added, 1 removed, 3 modified"
    assert lines[1:] == ["+ data/new.bin (3.0 MiB)", "M latest (-> run.sh, was -> pkg/model.py)", "- old.txt",
                         "M pkg/model.py (1.2 KiB → 1.3 KiB)", "M run.sh (mode 0755 → 0700)"]


def test_first_release_lists_every_file_added():
    d = release_diff(None, AFTER, None, "2222222222222222")["prepared"].splitlines()
    assert d[0] == "release (none) → 2222222222222222: 4 added, 0 removed, 0 modified"
    assert "+ pkg/model.py (1.3 KiB)" in d and "+ latest (-> run.sh)" in d
    # a current release without a manifest says so
    d = release_diff(None, AFTER, "1111111111111111", "2222222222222222")["prepared"]
    assert "records no manifest" in d


# ---- the module: a release already on the target, diffed against current ----------------------
def make_tree(path, files):
    for name, content in files.items():
        full = os.path.join(str(path), name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(content)


def install(root, src):
    from ansible_collections.dflash.trainer.plugins.modules import trainer_release as mod
    scan = scan_tree(str(src))
    archive = str(src) + ".tar.gz"
    build_archive(scan, archive)
    mod.run(dict(root=str(root), state="present", release=scan.release_id, archive=archive, keep=5))
    return scan.release_id


def test_module_diff_of_a_release_on_the_target_against_current(tmp_path):
    from ansible_collections.dflash.trainer.plugins.modules import trainer_release as mod
    root = tmp_path / "root"
    make_tree(tmp_path / "one", {"run.sh": "#!/bin/sh\n", "pkg/a.py": "A = 1\n"})
    make_tree(tmp_path / "two", {"run.sh": "#!/bin/sh\n", "pkg/a.py": "A = 22\n", "pkg/b.py": "B\n"})
    one = install(root, tmp_path / "one")
    switch_current(str(root), one)  # as the restart job does
    mod.run(dict(root=str(root), state="mark_good", keep=5))
    two = install(root, tmp_path / "two")
    switch_current(str(root), two)
    # one (complete on the target, not current): the module diffs the two manifests itself, in check
    # mode too, and leaves current where it is
    for check in (True, False):
        r = mod.run(dict(root=str(root), state="present", release=one, keep=5), check_mode=check, diff=True)
        assert r["diff"]["prepared"].splitlines() == [
            "release %s → %s: 0 added, 1 removed, 1 modified" % (two, one), "M pkg/a.py (7 B → 6 B)",
            "- pkg/b.py"], r
        assert r["changed"] is False and r["current"] == two
        assert os.readlink(str(root / "current")) == "releases/" + two
    switch_current(str(root), one)
    r = mod.run(dict(root=str(root), state="present", release=one, keep=5), diff=True)
    assert "diff" not in r and r["changed"] is False  # one is current: nothing to show
    r = mod.run(dict(root=str(root), state="present", release=two, keep=5), check_mode=True, diff=True)
    assert r["diff"]["prepared"].splitlines() == [
        "release %s → %s: 1 added, 0 removed, 1 modified" % (one, two), "M pkg/a.py (6 B → 7 B)",
        "+ pkg/b.py (2 B)"], r
    switch_current(str(root), two)
    # without diff mode: no diff, and the needs_archive answer carries no manifest
    make_tree(tmp_path / "three", {"run.sh": "#!/bin/sh\n"})
    scan = scan_tree(str(tmp_path / "three"))
    r = mod.run(dict(root=str(root), state="present", release=scan.release_id, keep=5))
    assert r["needs_archive"] and "base_manifest" not in r and "diff" not in r
    r = mod.run(dict(root=str(root), state="present", release=scan.release_id, keep=5), diff=True)
    assert [item[0] for item in r["base_manifest"]] == ["pkg", "pkg/a.py", "pkg/b.py", "run.sh"]


# ---- the action plugin, end to end over the local connection (ansible-playbook --diff) ---------
def test_action_diff_against_the_current_release(tmp_path, monkeypatch):
    from test_release_action_local import make_src, play  # noqa: E402  (same directory)
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs /usr/bin/python3")
    src, root = tmp_path / "src", tmp_path / "opt" / "dflash-trainer"
    make_src(str(src))
    monkeypatch.setenv("ANSIBLE_DIFF_ALWAYS", "1")
    proc, r = play(tmp_path, src, root, check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r["diff"]["prepared"].startswith("release (none) → %s: 22 added" % r["release"]), r
    assert "base_manifest" not in r
    proc, r1 = play(tmp_path, src, root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not os.path.lexists(str(root / "current"))  # trainer_release never switches it
    switch_current(str(root), r1["release"])  # as the restart job does
    (src / "trainer.py").write_text("print('step=22')\n")
    os.unlink(str(src / "pkg" / "m03.py"))
    (src / "pkg" / "new.py").write_text("N = 1\n")
    for check in (True, False):
        proc, r = play(tmp_path, src, root, check=check)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = r["diff"]["prepared"].splitlines()
        assert lines == ["release %s → %s: 1 added, 1 removed, 1 modified" % (r1["release"], r["release"]),
                         "- pkg/m03.py", "+ pkg/new.py (6 B)", "M trainer.py (16 B → 17 B)"], r["diff"]
        assert "base_manifest" not in r and "have" not in r
        # the default callback prints it
        assert "+ pkg/new.py (6 B)" in proc.stdout
        assert r["current"] == r1["release"]
        assert os.readlink(str(root / "current")) == "releases/" + r1["release"]
    # installed but not current: nothing changes, the diff still shows what switching would change
    proc, r = play(tmp_path, src, root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r["changed"] is False and r["diff"]["prepared"].startswith(
        "release %s → %s: 1 added, 1 removed, 1 modified" % (r1["release"], r["release"])), r
    switch_current(str(root), r["release"])
    proc, r = play(tmp_path, src, root)  # deployed and current: nothing changes, no diff
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r["changed"] is False and "diff" not in r
