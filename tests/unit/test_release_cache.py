"""The controller's hash cache (_release_cache): a file is read again whenever its size, mtime,
ctime, inode or device differ from when it was hashed, never cached while racily young, and the
cache file is per tree, atomic and optional. A fake clock stands in for time."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import file_sha256, scan_tree
from ansible_collections.dflash.trainer.plugins.plugin_utils import _release_cache as rc

LATER = 3600 * 10 ** 9  # the fake clock reads one hour after every file's ctime: nothing is racy


class Counting(object):
    """file_sha256 that counts the files it reads."""

    def __init__(self):
        self.paths = []

    def __call__(self, path):
        self.paths.append(os.path.relpath(path))
        return file_sha256(path)


def tree(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "trainer.py").write_text("print('step=1')\n")
    (src / "pkg" / "model.py").write_text("W = 1\n")
    (src / "weights.bin").write_bytes(os.urandom(100000))
    return src


def scan(src, cache_dir, now_ns=None, racy_ns=rc.RACY_NS):
    """One deploy's scan: load, scan with the cache's hasher, save. -> (TreeScan, cache, hasher)."""
    counting = Counting()
    clock = now_ns or (lambda: max(os.lstat(os.path.join(d, f)).st_ctime_ns
                                   for d, _ds, fs in os.walk(str(src)) for f in fs) + LATER)
    cache = rc.HashCache.for_tree(str(src), str(cache_dir), now_ns=clock, racy_ns=racy_ns, hash_file=counting)
    result = scan_tree(str(src), (), hasher=cache.hasher)
    cache.save()
    return result, cache, counting


def test_unchanged_files_are_not_read_again_and_the_id_is_the_same(tmp_path):
    src, cdir = tree(tmp_path), tmp_path / "cache"
    first, c1, h1 = scan(src, cdir)
    assert c1.hashed == 3 and c1.hits == 0 and len(h1.paths) == 3
    second, c2, h2 = scan(src, cdir)
    assert c2.hashed == 0 and c2.hits == 3 and h2.paths == []
    assert second.digest == first.digest == scan_tree(str(src), ()).digest


def change_in_place_same_size_same_mtime(path):
    st = os.stat(path)
    data = bytearray(open(path, "rb").read())
    data[0] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back: only ctime tells


def replace_by_rename_same_size(path):
    st = os.stat(path)
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(bytes(data))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(tmp, path)  # another inode


@pytest.mark.parametrize("change", [change_in_place_same_size_same_mtime, replace_by_rename_same_size,
                                    lambda p: open(p, "ab").write(b"more")])
def test_a_changed_file_is_hashed_again(tmp_path, change):
    src, cdir = tree(tmp_path), tmp_path / "cache"
    first = scan(src, cdir)[0]
    change(str(src / "weights.bin"))
    second, cache, counting = scan(src, cdir)
    assert counting.paths == [os.path.relpath(str(src / "weights.bin"))]
    assert second.digest != first.digest
    assert second.digest == scan_tree(str(src), ()).digest


def test_racily_young_files_are_hashed_but_not_cached(tmp_path):
    src, cdir = tree(tmp_path), tmp_path / "cache"

    def young():
        return os.lstat(str(src / "weights.bin")).st_ctime_ns + rc.RACY_NS // 2
    _scan, cache, _h = scan(src, cdir, now_ns=young)
    assert cache.hashed == 3
    _scan, cache, counting = scan(src, cdir)  # the files' age now allows caching them
    assert cache.hashed == 3 and len(counting.paths) == 3
    _scan, cache, counting = scan(src, cdir)
    assert cache.hashed == 0 and counting.paths == []


def test_cache_is_keyed_by_absolute_path_one_file_per_tree(tmp_path):
    src, cdir = tree(tmp_path), tmp_path / "cache"
    scan(src, cdir)
    path = rc.cache_path(str(src), str(cdir))
    doc = json.loads(open(path).read())
    assert doc["version"] == rc.CACHE_VERSION
    assert sorted(doc["files"]) == sorted(str(src / p) for p in ("trainer.py", "pkg/model.py", "weights.bin"))
    other = tmp_path / "other"
    other.mkdir()
    assert rc.cache_path(str(other), str(cdir)) != path
    (src / "trainer.py").unlink()  # a file gone from the tree leaves the cache with the next scan
    scan(src, cdir)
    assert str(src / "trainer.py") not in json.loads(open(path).read())["files"]


def test_a_no_op_scan_does_not_rewrite_the_cache(tmp_path):
    src, cdir = tree(tmp_path), tmp_path / "cache"
    _s, c1, _h = scan(src, cdir)
    path = rc.cache_path(str(src), str(cdir))
    inode = os.stat(path).st_ino
    _s, c2, _h = scan(src, cdir)
    assert c2.hits == 3 and os.stat(path).st_ino == inode  # not replaced


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 99, "files": {}}', b"[]",
                                     b'{"version": 1, "files": {"/x": [1, 2, 3, 4, 5, "nothex"]}}'])
def test_a_broken_cache_file_is_ignored(tmp_path, content):
    src, cdir = tree(tmp_path), tmp_path / "cache"
    path = rc.cache_path(str(src), str(cdir))
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(content)
    result, cache, _h = scan(src, cdir)
    assert cache.hashed == 3 and result.digest == scan_tree(str(src), ()).digest
    assert json.loads(open(path).read())["version"] == rc.CACHE_VERSION  # rewritten whole


def test_a_forged_entry_for_another_stat_is_not_believed(tmp_path):
    src, cdir = tree(tmp_path), tmp_path / "cache"
    scan(src, cdir)
    path = rc.cache_path(str(src), str(cdir))
    doc = json.loads(open(path).read())
    rec = doc["files"][str(src / "weights.bin")]
    rec[1] += 1  # another mtime: the cached hash is for another file
    rec[5] = "0" * 64
    with open(path, "w") as f:
        json.dump(doc, f)
    result, cache, counting = scan(src, cdir)
    assert counting.paths == [os.path.relpath(str(src / "weights.bin"))]
    assert result.digest == scan_tree(str(src), ()).digest


def test_an_unwritable_cache_directory_is_only_a_note(tmp_path):
    src = tree(tmp_path)
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    result, cache, _h = scan(src, blocker / "cache")
    assert result.digest == scan_tree(str(src), ()).digest
    assert cache.error and "cannot write" in cache.error


def test_default_cache_dir_follows_xdg():
    assert rc.default_cache_dir({"XDG_CACHE_HOME": "/c"}) == "/c/dflash-trainer/release-hashes"
    assert rc.default_cache_dir({}) == os.path.join(os.path.expanduser("~"), ".cache", "dflash-trainer",
                                                    "release-hashes")


def test_unused_cache_files_of_other_trees_are_pruned_by_a_save(tmp_path):
    src, cdir = tree(tmp_path), tmp_path / "cache"
    scan(src, cdir)
    old, recent = cdir / "release-hashes-old.json", cdir / "recent.json"
    path = rc.cache_path(str(src), str(cdir))
    for other in (old, recent):
        other.write_text("{}")
    now = os.stat(path).st_mtime
    os.utime(old, (now - rc.PRUNE_AFTER_S - 60,) * 2)
    os.utime(recent, (now - rc.PRUNE_AFTER_S + 3600,) * 2)
    (src / "trainer.py").write_text("print('step=2')\n")  # a change: the save writes, then prunes
    _s, cache, _h = scan(src, cdir, now_ns=lambda: int(now * 1e9) + rc.RACY_NS * 10)
    assert cache.hashed == 1
    assert not old.exists() and recent.exists() and os.path.exists(path)


def test_a_cache_only_read_is_kept_fresh(tmp_path):
    src, cdir = tree(tmp_path), tmp_path / "cache"
    scan(src, cdir)
    path = rc.cache_path(str(src), str(cdir))
    week_ago = os.stat(path).st_mtime - 7 * 86400
    os.utime(path, (week_ago, week_ago))
    _s, cache, _h = scan(src, cdir)
    assert cache.hits == 3 and os.stat(path).st_mtime > week_ago + 86400
