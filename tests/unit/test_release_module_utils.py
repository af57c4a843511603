"""module_utils/release/install.py and release/states.py: what trainer_release does on the target,
called directly against a tmp root (no Ansible, no module)."""
from __future__ import annotations

import base64
import json
import os

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.release.archive import build_archive, manifest_items
from ansible_collections.dflash.trainer.plugins.module_utils.target.marks import MARKER_NAME
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import (
    KIND_FILE,
    RELEASE_ID_LEN,
    scan_tree,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release import install as inst
from ansible_collections.dflash.trainer.plugins.module_utils.release import states
from ansible_collections.dflash.trainer.plugins.module_utils.release.root import (
    ReleaseModuleError,
    is_complete,
    read_current,
    read_last_good,
    release_path,
    releases_dir,
    switch_current,
)
from ansible_collections.dflash.trainer.plugins.modules import trainer_release as module


def make_src(path, version, link=False):
    os.makedirs(os.path.join(path, "pkg"), exist_ok=True)
    with open(os.path.join(path, "run.sh"), "w") as f:
        f.write("#!/bin/sh\nexec python3 trainer.py\n")
    os.chmod(os.path.join(path, "run.sh"), 0o755)
    with open(os.path.join(path, "trainer.py"), "w") as f:
        f.write("VERSION = %r\n" % version)
    with open(os.path.join(path, "pkg", "__init__.py"), "w") as f:
        f.write("")
    if link:
        os.symlink("../trainer.py", os.path.join(path, "pkg", "entry.py"))
    return path


@pytest.fixture
def root(tmp_path):
    path = str(tmp_path / "opt" / "dflash-trainer")
    os.makedirs(os.path.join(path, "releases"))
    return path


def build(tmp_path, version, have=None, link=False):
    """(release id, archive path, scan) of a source tree for version (a delta with have)."""
    src = make_src(str(tmp_path / ("src-%s" % version)), version, link=link)
    scan = scan_tree(src)
    archive = str(tmp_path / ("%s%s.tar.gz" % (version, "-delta" if have is not None else "")))
    build_archive(scan, archive, have=have)
    return scan.release_id, archive, scan


def params(root, **kw):
    out = dict(root=root, state="present", release=None, archive=None, archive_b64=None, base=None,
               keep=5, src=None, excludes=None, verify=False)
    out.update(kw)
    return out


# --- install_release --------------------------------------------------------------------------

def test_install_release_unpacks_checks_and_writes_the_marker(tmp_path, root):
    rid, archive, scan = build(tmp_path, "v1")
    stats = inst.install_release(root, rid, archive)
    assert stats == dict(delta=False, sent_files=3, reused_files=0, linked_files=0, copied_files=0)
    assert is_complete(root, rid)
    assert sorted(os.listdir(releases_dir(root))) == [rid]  # no .tmp-* left behind
    with open(os.path.join(release_path(root, rid), MARKER_NAME)) as f:
        marker = json.load(f)
    assert marker["id"] == rid and marker["digest"][:RELEASE_ID_LEN] == rid
    assert marker["manifest"] == manifest_items(scan.entries)
    assert scan_tree(release_path(root, rid), [MARKER_NAME]).release_id == rid


def test_install_release_refuses_an_archive_of_another_release(tmp_path, root):
    got, archive, _scan = build(tmp_path, "v1")
    wanted = "0123456789abcdef"
    with pytest.raises(ReleaseModuleError) as e:
        inst.install_release(root, wanted, archive)
    assert e.value.msg == ("Unable to install release %s: the archive %s holds release %s "
                           "(content changed or wrong archive)" % (wanted, archive, got))
    assert os.listdir(releases_dir(root)) == []  # the tmp dir is gone


def test_install_release_names_a_broken_archive(tmp_path, root):
    broken = tmp_path / "broken.tar"
    broken.write_bytes(b"not a tar at all" * 64)
    with pytest.raises(ReleaseModuleError, match=r"^Unable to unpack release 0123456789abcdef from %s: "
                       % str(broken)):
        inst.install_release(root, "0123456789abcdef", str(broken))
    assert os.listdir(releases_dir(root)) == []


def test_install_release_on_a_missing_base_asks_for_the_full_archive(tmp_path, root):
    rid, archive, _scan = build(tmp_path, "v1")
    with pytest.raises(ReleaseModuleError) as e:
        inst.install_release(root, rid, archive, base="feedfacefeedface")
    assert e.value.msg.startswith("Unable to install release %s as a delta on base release feedfacefeedface: "
                                  "it is not a complete release under " % rid)
    assert e.value.msg.endswith("; send the full archive")
    assert e.value.result == dict(base_unusable=True, base="feedfacefeedface")


def test_install_release_replaces_an_incomplete_leftover_with_its_id(tmp_path, root):
    rid, archive, _scan = build(tmp_path, "v1")
    leftover = release_path(root, rid)
    os.makedirs(leftover)
    with open(os.path.join(leftover, "junk"), "w") as f:
        f.write("half")
    inst.install_release(root, rid, archive)
    assert not os.path.exists(os.path.join(leftover, "junk"))
    assert is_complete(root, rid) and sorted(os.listdir(releases_dir(root))) == [rid]


def test_install_release_from_a_delta_reuses_the_base_files(tmp_path, root):
    r1, archive1, scan1 = build(tmp_path, "v1")
    inst.install_release(root, r1, archive1)
    have = sorted(set(e.payload for e in scan1.entries if e.kind == KIND_FILE))
    r2, delta, _scan = build(tmp_path, "v2", have=have)
    stats = inst.install_release(root, r2, delta, base=r1)
    assert stats["delta"] is True and stats["sent_files"] == 1 and stats["reused_files"] == 2
    assert stats["linked_files"] + stats["copied_files"] == 2
    assert scan_tree(release_path(root, r2), [MARKER_NAME]).release_id == r2


def test_is_fifo(tmp_path):
    fifo, plain = str(tmp_path / "fifo"), str(tmp_path / "plain")
    os.mkfifo(fifo)
    open(plain, "w").close()
    assert inst._is_fifo(fifo) is True
    assert inst._is_fifo(plain) is False
    assert inst._is_fifo(str(tmp_path / "missing")) is False


# --- verify_release ---------------------------------------------------------------------------

@pytest.fixture
def installed(tmp_path, root):
    rid, archive, _scan = build(tmp_path, "v1", link=True)
    inst.install_release(root, rid, archive)
    return rid, release_path(root, rid)


def test_verify_release_of_an_untouched_release(root, installed):
    rid, _path = installed
    assert inst.verify_release(root, rid) == (True, [])


def test_verify_release_names_every_kind_of_change(root, installed):
    rid, path = installed
    os.chmod(os.path.join(path, "trainer.py"), 0o600)  # read-only releases are not enforced
    with open(os.path.join(path, "trainer.py"), "a") as f:
        f.write("# edited in place\n")
    os.chmod(os.path.join(path, "run.sh"), 0o700)
    os.unlink(os.path.join(path, "pkg", "__init__.py"))
    os.unlink(os.path.join(path, "pkg", "entry.py"))
    os.symlink("../run.sh", os.path.join(path, "pkg", "entry.py"))
    with open(os.path.join(path, "extra.txt"), "w") as f:
        f.write("x")
    ok, mismatches = inst.verify_release(root, rid)
    assert ok is False
    assert sorted(mismatches) == sorted([
        "pkg/__init__.py: missing",
        "pkg/entry.py: points at ../run.sh, recorded ../trainer.py",
        "run.sh: mode 0700, expected 0755",
        "trainer.py: content differs from its recorded sha256",
        "extra.txt: not in the manifest",
    ])


def test_verify_release_without_a_manifest(root, installed):
    rid, path = installed
    marker = os.path.join(path, MARKER_NAME)
    with open(marker) as f:
        data = json.load(f)
    del data["manifest"]
    with open(marker, "w") as f:
        json.dump(data, f)
    assert inst.verify_release(root, rid) == (False, ["%s: the marker records no readable manifest" % MARKER_NAME])


def test_verify_release_of_a_manifest_that_is_not_the_release(root, installed):
    rid, path = installed
    marker = os.path.join(path, MARKER_NAME)
    with open(marker) as f:
        data = json.load(f)
    data["manifest"] = [m for m in data["manifest"] if m[0] != "run.sh"]
    with open(marker, "w") as f:
        json.dump(data, f)
    ok, mismatches = inst.verify_release(root, rid)
    assert ok is False
    assert mismatches == ["%s: the recorded manifest is not that of release %s" % (MARKER_NAME, rid),
                          "run.sh: not in the manifest"]


# --- the states -------------------------------------------------------------------------------

def test_the_module_offers_the_states_and_re_exports_run():
    assert sorted(states.STATES) == ["mark_good", "present", "query"]  # current is the restart job's
    assert module.run is states.run and module.STATES is states.STATES
    assert module.ReleaseModuleError is ReleaseModuleError


@pytest.mark.parametrize("kw, message", [
    (dict(src="/somewhere"), "src is read on the controller by the dflash.trainer.trainer_release action plugin; "
                             "the module on the target takes release= (and archive=)"),
    (dict(state="mark_good", verify=True), "verify is only valid with state=query"),
    (dict(release="0123456789abcdef", archive="/a.tar", archive_b64="AAAA"),
     "archive and archive_b64 are mutually exclusive"),
    (dict(release="0123456789abcdef", base="fedcba9876543210"),
     "base is only valid together with archive (a delta archive)"),
    (dict(release="0123456789abcdef", keep=-1), "keep must be 0 or more, got -1"),
    (dict(state="mark_good"), "no current release under {root}; nothing to mark good"),
])
def test_run_refuses_with_the_exact_message(root, kw, message):
    before = sorted(os.listdir(root))
    with pytest.raises(ReleaseModuleError) as e:
        states.run(params(root, **kw))
    assert e.value.msg == message.format(root=root)
    assert sorted(os.listdir(root)) == before  # nothing written


def test_run_names_invalid_inline_base64(root):
    with pytest.raises(ReleaseModuleError, match="^archive_b64 is not valid base64: "):
        states.run(params(root, release="0123456789abcdef", archive_b64="not base64!"))


def test_present_without_the_release_asks_for_an_archive_and_touches_nothing(tmp_path, root):
    rid, _archive, _scan = build(tmp_path, "v1")
    result = states.run(params(root, release=rid), diff=True)
    assert result == dict(changed=False, release=rid, previous=None, transferred=False,
                          needs_archive=True, pruned=[], cleaned=[], last_good=None, current=None,
                          base=None, have=[], releases=[], base_manifest=None)
    assert os.listdir(releases_dir(root)) == []


def test_present_in_check_mode_plans_without_writing(tmp_path, root):
    rid, archive, _scan = build(tmp_path, "v1")
    stale = os.path.join(releases_dir(root), ".tmp-%s-abc" % rid)
    os.makedirs(stale)
    result = states.run(params(root, release=rid, archive=archive), check_mode=True)
    assert result["changed"] is True and result["transferred"] is True and "switched" not in result
    assert result["current"] is None and result["releases"] == [rid] and result["pruned"] == []
    assert result["cleaned"] == ["releases/.tmp-%s-abc" % rid]
    assert os.path.isdir(stale) and read_current(root) is None and not is_complete(root, rid)


def test_present_then_mark_good_then_present_then_query(tmp_path, root):
    r1, a1, _scan = build(tmp_path, "v1")
    r2, a2, _scan = build(tmp_path, "v2")
    first = states.run(params(root, release=r1, archive=a1))
    assert first["changed"] and first["transferred"] and first["previous"] is None
    assert first["current"] is None and read_current(root) is None and "switched" not in first
    switch_current(root, r1)  # what the restart job does
    good = states.run(params(root, state="mark_good"))
    assert good == dict(changed=True, release=r1, previous=None, last_good=r1, current=r1, releases=[r1])
    assert read_last_good(root) == r1
    second = states.run(params(root, release=r2, archive=a2), diff=True)
    assert second["transferred"] and second["current"] == r1 and second["previous"] == r1
    assert read_current(root) == r1 and "switched" not in second
    assert "diff" not in second  # the action plugin diffs a release it uploads
    # r2 is installed now: present shows what switching current to it would change, moving nothing
    again = states.run(params(root, release=r2), diff=True)
    assert again["changed"] is False and again["current"] == r1 and read_current(root) == r1
    assert again["diff"]["prepared"].splitlines() == [
        "release %s → %s: 0 added, 0 removed, 1 modified" % (r1, r2), "M trainer.py (15 B → 15 B)"]
    query = states.run(params(root, state="query", verify=True))
    assert query["release"] == query["current"] == r1 and query["last_good"] == r1
    assert sorted(query["releases"]) == sorted([r1, r2])
    assert query["verified"] is True and query["mismatches"] == [] and query["changed"] is False


def test_query_verify_without_a_current_release(root):
    result = states.run(params(root, state="query", verify=True))
    assert result == dict(changed=False, release=None, current=None, last_good=None, releases=[],
                          verified=None, mismatches=[])


def test_inline_archive_installs_and_leaves_no_upload(tmp_path, root):
    rid, archive, _scan = build(tmp_path, "v1")
    with open(archive, "rb") as f:
        data = base64.b64encode(f.read()).decode()
    result = states.run(params(root, release=rid, archive_b64=data))
    assert result["transferred"] is True and is_complete(root, rid)
    assert result["current"] is None and read_current(root) is None
    assert not [n for n in os.listdir(root) if n.startswith(".upload-")]


def test_switch_diff_from_no_release(tmp_path, root):
    rid, archive, _scan = build(tmp_path, "v1")
    inst.install_release(root, rid, archive)
    assert states.switch_diff(root, None, rid)["prepared"].splitlines() == [
        "release (none) → %s: 3 added, 0 removed, 0 modified" % rid,
        "+ pkg/__init__.py (0 B)", "+ run.sh (34 B)", "+ trainer.py (15 B)"]
