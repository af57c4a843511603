"""plugins/modules/trainer_release.py: run(params, check_mode) against a tmp root, no Ansible."""
from __future__ import annotations

import json
import base64
import os
import stat
import subprocess
import sys

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.release.archive import build_archive, manifest_items
from ansible_collections.dflash.trainer.plugins.module_utils.release.root import switch_current
from ansible_collections.dflash.trainer.plugins.module_utils.target.marks import MARKER_NAME
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import scan_tree
from ansible_collections.dflash.trainer.plugins.modules import trainer_release as mod

MODULE_FILE = mod.__file__


def make_src(path, version):
    os.makedirs(os.path.join(path, "pkg"), exist_ok=True)
    with open(os.path.join(path, "run.sh"), "w") as f:
        f.write("#!/bin/sh\nexec python3 trainer.py\n")
    os.chmod(os.path.join(path, "run.sh"), 0o755)
    with open(os.path.join(path, "trainer.py"), "w") as f:
        f.write("VERSION = %r\n" % version)
    with open(os.path.join(path, "pkg", "__init__.py"), "w") as f:
        f.write("")
    return path


class Lab(object):
    """A tmp root plus a factory of (release id, archive) pairs."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.root = str(tmp_path / "opt" / "dflash-trainer")

    def build(self, version):
        src = make_src(str(self.tmp / ("src-%s" % version)), version)
        scan = scan_tree(src)
        archive = str(self.tmp / ("%s.tar.gz" % version))
        build_archive(scan, archive)
        return scan.release_id, archive

    def build_delta(self, version, have, change=None):
        """(release id, delta archive) of version against a base holding the sha256s in have."""
        src = make_src(str(self.tmp / ("src-%s" % version)), version)
        if change:
            change(src)
        scan = scan_tree(src)
        archive = str(self.tmp / ("%s-delta.tar.gz" % version))
        build_archive(scan, archive, have=have)
        return scan.release_id, archive

    def run(self, check_mode=False, **params):
        full = dict(root=self.root, state="present", release=None, archive=None, keep=5,
                    src=None, excludes=None, base=None)
        full.update(params)
        return mod.run(full, check_mode)

    def deploy(self, version, mtime=None, **params):
        rid, archive = self.build(version)
        result = self.run(release=rid, archive=archive, **params)
        if mtime is not None:  # age the release deterministically for prune tests
            marker = os.path.join(self.root, "releases", rid, MARKER_NAME)
            os.utime(marker, (mtime, mtime))
        return rid, result

    def current(self):
        """Where <root>/current points (None without one)."""
        link = os.path.join(self.root, "current")
        return os.readlink(link) if os.path.lexists(link) else None

    def switch(self, rid):
        """Point current at rid the way the restart job does (trainer_release never moves it)."""
        switch_current(self.root, rid)

    def complete(self, rid):
        return os.path.isfile(os.path.join(self.root, "releases", rid, MARKER_NAME))

    def snapshot(self):
        out = {}
        if not os.path.exists(self.root):
            return out
        for dirpath, dirnames, filenames in os.walk(self.root):
            for n in sorted(dirnames + filenames):
                p = os.path.join(dirpath, n)
                st = os.lstat(p)
                out[os.path.relpath(p, self.root)] = (
                    st.st_mode, st.st_mtime_ns, os.readlink(p) if os.path.islink(p) else None)
        return out


@pytest.fixture
def lab(tmp_path):
    return Lab(tmp_path)


def test_present_without_archive_asks_for_it_and_touches_nothing(lab):
    rid, _ignored = lab.build("v1")
    result = lab.run(release=rid)
    assert result["needs_archive"] is True and result["changed"] is False
    assert result["previous"] is None and result["releases"] == []
    assert result["base"] is None and result["have"] == []  # nothing to build a delta on
    assert not os.path.exists(lab.root)


def test_present_with_archive_creates_the_release_and_leaves_current_alone(lab):
    rid, result = lab.deploy("v1")
    assert result["changed"] and result["transferred"] and "switched" not in result
    assert result["release"] == rid and result["previous"] is None
    assert result["releases"] == [rid] and result["current"] is None
    assert lab.current() is None  # the restart job switches current, not trainer_release
    release = os.path.join(lab.root, "releases", rid)
    assert os.access(os.path.join(release, "run.sh"), os.X_OK)
    lab.switch(rid)
    assert os.access(os.path.join(lab.root, "current", "run.sh"), os.X_OK)
    marker = json.load(open(os.path.join(release, MARKER_NAME)))
    assert marker["id"] == rid and marker["digest"].startswith(rid)
    assert not [n for n in os.listdir(os.path.join(lab.root, "releases")) if n.startswith(".tmp-")]


def test_same_release_again_is_a_no_op(lab):
    rid, _ignored = lab.deploy("v1")
    # installed but not current: still a no-op, and current stays absent
    result = lab.run(release=rid)
    assert result["changed"] is False and result["transferred"] is False and result["needs_archive"] is False
    assert result["current"] is None and lab.current() is None
    lab.switch(rid)
    before = lab.snapshot()
    result = lab.run(release=rid)  # no archive needed
    assert result["changed"] is False and result["needs_archive"] is False
    assert result["transferred"] is False and "switched" not in result
    assert result["previous"] == rid and result["current"] == rid
    # an archive given anyway is not extracted
    _ignored, archive = lab.build("v1")
    assert lab.run(release=rid, archive=archive)["transferred"] is False
    assert {k: v for k, v in lab.snapshot().items() if k != ".lock"} == \
        {k: v for k, v in before.items() if k != ".lock"}


def test_second_release_installs_beside_the_current_one(lab):
    r1, _ignored = lab.deploy("v1")
    lab.switch(r1)
    r2, result = lab.deploy("v2")
    assert r1 != r2
    assert result["previous"] == r1 and result["release"] == r2 and "switched" not in result
    assert result["changed"] and result["transferred"] and lab.complete(r2)
    assert set(result["releases"]) == {r1, r2} and result["releases"][0] == r2
    assert result["current"] == r1 and lab.current() == "releases/" + r1  # not moved


def test_interrupted_extraction_never_becomes_current_and_is_cleaned(lab):
    r1, _ignored = lab.deploy("v1")
    lab.switch(r1)
    r2, archive2 = lab.build("v2")
    # an interrupted run: a half-extracted tmp dir and a temporary link never renamed
    stale = os.path.join(lab.root, "releases", ".tmp-%s-dead" % r2)
    os.makedirs(os.path.join(stale, "pkg"))
    open(os.path.join(stale, "trainer.py"), "w").close()
    os.symlink("releases/" + r2, os.path.join(lab.root, "current.tmp-dead"))
    assert lab.run(state="query")["releases"] == [r1]
    with pytest.raises(mod.ReleaseModuleError, match="not a complete release"):
        lab.run(state="mark_good", release=r2)
    with pytest.raises(mod.ReleaseModuleError, match="invalid release id"):
        lab.run(state="mark_good", release=".tmp-%s-dead" % r2)
    assert not os.path.exists(os.path.join(lab.root, "last_good"))
    # a no-op deploy of r1 cleans the leftovers
    result = lab.run(release=r1)
    assert sorted(result["cleaned"]) == sorted(["releases/.tmp-%s-dead" % r2, "current.tmp-dead"])
    assert result["changed"] is True and result["transferred"] is False and "switched" not in result
    assert result["current"] == r1 and lab.current() == "releases/" + r1
    assert not os.path.exists(stale)
    assert not os.path.lexists(os.path.join(lab.root, "current.tmp-dead"))
    # and the real r2 still installs
    assert lab.run(release=r2, archive=archive2)["transferred"] is True


def test_incomplete_dir_with_the_release_name_is_replaced(lab):
    rid, archive = lab.build("v1")
    os.makedirs(os.path.join(lab.root, "releases", rid))  # renamed but no marker: not a release
    assert lab.run(release=rid)["needs_archive"] is True
    result = lab.run(release=rid, archive=archive)
    assert result["transferred"] and lab.complete(rid) and lab.current() is None
    assert os.path.isfile(os.path.join(lab.root, "releases", rid, "run.sh"))


def test_archive_of_other_content_is_refused(lab):
    r1, _ignored = lab.build("v1")
    _ignored, archive2 = lab.build("v2")
    with pytest.raises(mod.ReleaseModuleError, match="holds release"):
        lab.run(release=r1, archive=archive2)
    assert lab.run(state="query")["releases"] == []
    assert not [n for n in os.listdir(os.path.join(lab.root, "releases")) if n.startswith(".tmp-")]


def test_missing_archive_file(lab):
    rid, _ignored = lab.build("v1")
    with pytest.raises(mod.ReleaseModuleError, match="does not exist on the target"):
        lab.run(release=rid, archive=str(lab.tmp / "nope.tar.gz"))


def test_keep_prunes_oldest_but_not_last_good(lab):
    r1, _ignored = lab.deploy("v1", mtime=1000)
    lab.switch(r1)
    lab.run(state="mark_good")
    r2, _ignored = lab.deploy("v2", mtime=2000)
    lab.switch(r2)
    r3, _ignored = lab.deploy("v3", mtime=3000)
    lab.switch(r3)
    r4, result = lab.deploy("v4", keep=2)
    # r3: what current points at (the running trainer's release), r1: last good - both kept
    assert result["pruned"] == [r2]
    assert result["current"] == r3 and lab.current() == "releases/" + r3
    assert result["releases"] == [r4, r3, r1]
    assert result["last_good"] == r1
    assert not os.path.exists(os.path.join(lab.root, "releases", r2))
    assert not [n for n in os.listdir(os.path.join(lab.root, "releases")) if n.startswith(".tmp-")]


def test_mark_good(lab):
    r1, _ignored = lab.deploy("v1")
    lab.switch(r1)
    result = lab.run(state="mark_good")
    assert result == dict(result, changed=True, release=r1, previous=None, last_good=r1, current=r1)
    assert open(os.path.join(lab.root, "last_good")).read() == r1 + "\n"
    assert lab.run(state="mark_good")["changed"] is False
    r2, _ignored = lab.deploy("v2")
    # explicit release: recorded as last good, current stays where it is
    result = lab.run(state="mark_good", release=r2)
    assert result["changed"] is True and result["previous"] == r1 and result["last_good"] == r2
    assert result["current"] == r1 and lab.current() == "releases/" + r1
    assert open(os.path.join(lab.root, "last_good")).read() == r2 + "\n"


def test_mark_good_without_current(lab):
    with pytest.raises(mod.ReleaseModuleError, match="no current release"):
        lab.run(state="mark_good")


def test_query(lab):
    assert lab.run(state="query") == dict(changed=False, release=None, current=None, last_good=None,
                                          releases=[])
    r1, _ignored = lab.deploy("v1")
    assert lab.run(state="query") == dict(changed=False, release=None, current=None, last_good=None,
                                          releases=[r1])
    lab.switch(r1)
    lab.run(state="mark_good")
    assert lab.run(state="query") == dict(changed=False, release=r1, current=r1, last_good=r1,
                                          releases=[r1])


def test_current_that_is_not_a_symlink_is_refused(lab):
    os.makedirs(os.path.join(lab.root, "current"))
    rid, archive = lab.build("v1")
    with pytest.raises(mod.ReleaseModuleError, match="not a symlink"):
        lab.run(release=rid, archive=archive)


def test_check_mode_changes_nothing(lab):
    r1, _ignored = lab.deploy("v1", mtime=1000)
    lab.switch(r1)
    r2, archive2 = lab.build("v2")
    stale = os.path.join(lab.root, "releases", ".tmp-x-dead")
    os.makedirs(stale)
    before = lab.snapshot()
    result = lab.run(check_mode=True, release=r2, archive=archive2, keep=0)
    assert result["changed"] and result["transferred"] and "switched" not in result
    assert result["current"] == r1 and result["previous"] == r1  # check mode reports no switch either
    # r1 is what current points at (the running trainer's release): never pruned
    assert result["pruned"] == [] and result["cleaned"] == ["releases/.tmp-x-dead"]
    assert result["releases"] == [r2, r1]
    assert lab.run(check_mode=True, state="mark_good", release=r1)["changed"] is True
    assert lab.run(check_mode=True, state="mark_good")["changed"] is True
    assert lab.snapshot() == before
    # a fresh root in check mode stays absent
    other = Lab(lab.tmp / "fresh")
    rid, archive = other.build("v1")
    assert other.run(check_mode=True, release=rid, archive=archive)["changed"] is True
    assert not os.path.exists(other.root)


def test_src_is_refused_by_the_module(lab):
    with pytest.raises(mod.ReleaseModuleError, match="action plugin"):
        lab.run(src="/tmp")


def test_invalid_release_id(lab):
    with pytest.raises(mod.ReleaseModuleError, match="invalid release id"):
        lab.run(release="../etc")


def test_module_runs_as_a_program(lab, tmp_path):
    """The real AnsibleModule entry point: argument spec, exit_json, fail_json."""
    rid, archive = lab.build("v1")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))

    def call(args):
        path = tmp_path / "args.json"
        path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
        proc = subprocess.run([sys.executable, MODULE_FILE, str(path)], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        return json.loads(proc.stdout)

    out = call({"root": lab.root, "release": rid, "archive": archive})
    assert out["changed"] is True and out["release"] == rid and out["current"] is None
    assert "switched" not in out and lab.complete(rid)
    # state=rollback is gone (the restart job switches current): the argument spec refuses it
    out = call({"root": lab.root, "state": "rollback"})
    assert out["failed"] is True and "rollback" in out["msg"]
    assert "mark_good, present, query" in out["msg"], out["msg"]
    out = call({"root": lab.root})
    assert out["failed"] is True and "release" in out["msg"]
    assert not os.path.lexists(os.path.join(lab.root, "current"))
    lab.switch(rid)
    out = call({"root": lab.root, "state": "query"})
    assert out["current"] == rid and out["releases"] == [rid]
    assert stat.S_ISLNK(os.lstat(os.path.join(lab.root, "current")).st_mode)


# --- delta releases ---------------------------------------------------------------------------

def _chmod_init(src):
    os.chmod(os.path.join(src, "pkg", "__init__.py"), 0o600)  # same content, other mode


def test_release_records_its_manifest_and_offers_itself_as_base(lab):
    r1, _ignored = lab.deploy("v1")
    marker = json.load(open(os.path.join(lab.root, "releases", r1, MARKER_NAME)))
    scan = scan_tree(str(lab.tmp / "src-v1"))
    assert marker["manifest"] == manifest_items(scan.entries)
    r2, _ignored = lab.build("v2")
    # the base of a delta is the release current points at: none yet
    answer = lab.run(release=r2)
    assert answer["needs_archive"] is True and answer["base"] is None and answer["have"] == []
    lab.switch(r1)
    answer = lab.run(release=r2)
    assert answer["needs_archive"] is True and answer["base"] == r1 and answer["changed"] is False
    assert answer["have"] == sorted(set(e.payload for e in scan.entries if e.kind == "f"))


def test_delta_install_reuses_base_files_byte_and_mode_exact(lab):
    r1, _ignored = lab.deploy("v1")
    lab.switch(r1)
    r2, _ignored = lab.build("v2")
    answer = lab.run(release=r2)
    rid, delta = lab.build_delta("v2", answer["have"], change=_chmod_init)
    before = lab.snapshot()
    result = lab.run(release=rid, archive=delta, base=answer["base"])
    assert result["changed"] and result["transferred"] and "switched" not in result
    assert result["current"] == r1 and lab.current() == "releases/" + r1
    assert result["delta"] is True and result["base"] == r1
    assert result["sent_files"] == 1 and result["reused_files"] == 2  # trainer.py sent
    # run.sh (same mode) linked to the base's inode, pkg/__init__.py (other mode) copied
    assert result["linked_files"] == 1 and result["copied_files"] == 1
    new = os.path.join(lab.root, "releases", rid)
    assert scan_tree(new, [MARKER_NAME]).release_id == rid == scan_tree(str(lab.tmp / "src-v2")).release_id
    assert os.access(os.path.join(new, "run.sh"), os.X_OK)
    assert stat.S_IMODE(os.stat(os.path.join(new, "pkg", "__init__.py")).st_mode) == 0o600
    old = os.path.join(lab.root, "releases", r1)
    assert stat.S_IMODE(os.stat(os.path.join(old, "pkg", "__init__.py")).st_mode) == 0o644
    assert os.stat(os.path.join(new, "run.sh")).st_ino == os.stat(os.path.join(old, "run.sh")).st_ino
    assert os.stat(os.path.join(new, "pkg", "__init__.py")).st_ino != \
        os.stat(os.path.join(old, "pkg", "__init__.py")).st_ino
    # the base is untouched and the new release records its own manifest (a base for the next)
    assert {k: v for k, v in lab.snapshot().items() if k.startswith("releases/" + r1)} == \
        {k: v for k, v in before.items() if k.startswith("releases/" + r1)}
    lab.switch(rid)
    assert lab.run(release=lab.build("v3")[0])["base"] == rid


def test_delta_with_a_tampered_base_file_is_refused(lab):
    r1, _ignored = lab.deploy("v1")
    lab.switch(r1)
    path = os.path.join(lab.root, "releases", r1, "run.sh")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data.replace(b"python3", b"pythonX"))
    answer = lab.run(release=lab.build("v2")[0])
    rid, delta = lab.build_delta("v2", answer["have"])
    with pytest.raises(mod.ReleaseModuleError, match="does not match its recorded sha256") as info:
        lab.run(release=rid, archive=delta, base=r1)
    assert info.value.result["base_unusable"] is True
    assert lab.run(state="query")["releases"] == [r1] and lab.current() == "releases/" + r1
    assert not [n for n in os.listdir(os.path.join(lab.root, "releases")) if n.startswith(".tmp-")]
    # the full archive still installs (the action's fallback)
    assert lab.run(release=rid, archive=lab.build("v2")[1])["delta"] is False


def test_delta_on_a_vanished_or_manifestless_base_asks_for_the_full_archive(lab):
    r1, _ignored = lab.deploy("v1")
    lab.switch(r1)
    answer = lab.run(release=lab.build("v2")[0])
    assert answer["base"] == r1 and answer["have"]
    rid, delta = lab.build_delta("v2", answer["have"])
    os.rename(os.path.join(lab.root, "releases", r1), os.path.join(lab.root, "gone"))
    with pytest.raises(mod.ReleaseModuleError, match="not a complete release") as info:
        lab.run(release=rid, archive=delta, base=r1)
    assert info.value.result["base_unusable"] is True
    os.rename(os.path.join(lab.root, "gone"), os.path.join(lab.root, "releases", r1))
    # a release from before manifests (marker without one) is no base
    marker_path = os.path.join(lab.root, "releases", r1, MARKER_NAME)
    marker = json.load(open(marker_path))
    del marker["manifest"]
    with open(marker_path, "w") as f:
        json.dump(marker, f)
    answer = lab.run(release=rid)
    assert answer["needs_archive"] is True and answer["base"] is None and answer["have"] == []
    with pytest.raises(mod.ReleaseModuleError, match="no readable manifest") as info:
        lab.run(release=rid, archive=delta, base=r1)
    assert info.value.result["base_unusable"] is True
    result = lab.run(release=rid, archive=lab.build("v2")[1])
    assert result["delta"] is False and result["sent_files"] == 3 and result["reused_files"] == 0
    assert result["linked_files"] == 0 and result["copied_files"] == 0


def test_delta_archive_for_other_content_is_refused(lab):
    r1, _ignored = lab.deploy("v1")
    lab.switch(r1)
    answer = lab.run(release=lab.build("v2")[0])
    _ignored, delta3 = lab.build_delta("v3", answer["have"])
    r2, _ignored = lab.build("v2")
    with pytest.raises(mod.ReleaseModuleError, match="holds release"):
        lab.run(release=r2, archive=delta3, base=r1)
    assert lab.current() == "releases/" + r1


def test_base_needs_an_archive_and_a_valid_id(lab):
    r1, _ignored = lab.deploy("v1")
    with pytest.raises(mod.ReleaseModuleError, match="only valid together with archive"):
        lab.run(release=lab.build("v2")[0], base=r1)
    with pytest.raises(mod.ReleaseModuleError, match="invalid base release id"):
        lab.run(release=lab.build("v2")[0], archive=lab.build("v2")[1], base="../x")


def test_pruning_the_base_leaves_a_linked_release_complete_and_verified(lab):
    r1, _ignored = lab.deploy("v1")
    lab.switch(r1)
    answer = lab.run(release=lab.build("v2")[0])
    rid, delta = lab.build_delta("v2", answer["have"])
    result = lab.run(release=rid, archive=delta, base=r1, keep=1)
    # r1 is what current points at: kept although keep=1
    assert result["linked_files"] == 2 and result["copied_files"] == 0 and result["pruned"] == []
    lab.switch(rid)
    result = lab.run(release=rid, keep=1)  # the next deploy: r1 is no longer what current points at
    assert result["pruned"] == [r1]
    new = os.path.join(lab.root, "releases", rid)
    assert not os.path.exists(os.path.join(lab.root, "releases", r1))
    assert os.stat(os.path.join(new, "run.sh")).st_nlink == 1 and os.access(os.path.join(new, "run.sh"), os.X_OK)
    assert scan_tree(new, [MARKER_NAME]).release_id == rid
    q = lab.run(state="query", verify=True)
    assert q["verified"] is True and q["mismatches"] == [] and q["current"] == rid


def test_query_verify_finds_an_in_place_edit_shared_by_linked_releases(lab):
    assert lab.run(state="query", verify=True)["verified"] is None  # nothing deployed yet
    r1, _ignored = lab.deploy("v1")
    lab.switch(r1)
    q = lab.run(state="query")
    assert "verified" not in q and "mismatches" not in q  # plain query reads no file
    answer = lab.run(release=lab.build("v2")[0])
    rid, delta = lab.build_delta("v2", answer["have"])
    assert lab.run(release=rid, archive=delta, base=r1)["linked_files"] == 2
    lab.switch(rid)  # query verifies the release current points at
    assert lab.run(state="query", verify=True)["verified"] is True
    # the limit of hard links: editing a file of one release in place edits the other too
    with open(os.path.join(lab.root, "releases", r1, "run.sh"), "a") as f:
        f.write("# edited\n")
    os.chmod(os.path.join(lab.root, "releases", rid, "pkg", "__init__.py"), 0o600)
    with open(os.path.join(lab.root, "releases", rid, "extra.txt"), "w") as f:
        f.write("x")
    q = lab.run(state="query", verify=True)
    assert q["verified"] is False and q["changed"] is False
    assert q["mismatches"] == ["pkg/__init__.py: mode 0600, expected 0644",
                               "run.sh: content differs from its recorded sha256",
                               "extra.txt: not in the manifest"]
    os.unlink(os.path.join(lab.root, "releases", rid, "trainer.py"))
    assert "trainer.py: missing" in lab.run(state="query", verify=True)["mismatches"]
    with pytest.raises(mod.ReleaseModuleError, match="only valid with state=query"):
        lab.run(release=rid, verify=True)


def test_inline_archive_installs_and_leaves_no_upload_behind(lab):
    rid, archive = lab.build("v1")
    with open(archive, "rb") as fh:
        inline = base64.b64encode(fh.read()).decode("ascii")
    result = lab.run(release=rid, archive_b64=inline)
    assert result["transferred"] is True and lab.complete(rid)
    assert result["current"] is None and lab.current() is None
    assert not [n for n in os.listdir(lab.root) if n.startswith(".upload-")]


@pytest.mark.parametrize("extra,message", [
    ({"archive_b64": "not base64!"}, "archive_b64 is not valid base64"),
    ({"archive_b64": "AAAA", "archive": "/x.tar.gz"}, "mutually exclusive"),
])
def test_inline_archive_refusals(lab, extra, message):
    rid, _archive = lab.build("v1")
    with pytest.raises(mod.ReleaseModuleError) as err:
        lab.run(release=rid, **extra)
    assert message in err.value.msg
    assert not os.path.exists(os.path.join(lab.root, "current"))
