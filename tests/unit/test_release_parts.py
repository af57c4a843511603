"""The release code's parts (plugins/module_utils/_release_{scan,archive,extract,prune,diff}.py):
how they import each other, and the helpers no other test calls directly (check_relpath, the
manifest round trip, order_newest_first)."""
from __future__ import annotations

import ast
import json
import os

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils._release_archive import (
    MANIFEST_VERSION,
    manifest_bytes,
    manifest_items,
    parse_manifest,
)
from ansible_collections.dflash.trainer.plugins.module_utils._release_prune import order_newest_first
from ansible_collections.dflash.trainer.plugins.module_utils._release_scan import (
    KIND_DIR,
    KIND_FILE,
    KIND_SYMLINK,
    Entry,
    UnsafeArchiveError,
    check_relpath,
)

MODULE_UTILS = os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "module_utils")
PREFIX = "ansible_collections.dflash.trainer.plugins.module_utils."
# what each part may import from the collection: only downwards, so there is no cycle, and
# _release_scan stands alone (bench/soak.py imports it with plugins/module_utils on sys.path)
LAYERS = {
    "_release_scan": set(),
    "_release_archive": {"_release_scan"},
    "_release_extract": {"_release_scan", "_release_archive", "_private_file"},  # fsync_dir
    "_release_prune": set(),
    "_release_diff": {"_release_scan"},
}


def collection_imports(name):
    with open(os.path.join(MODULE_UTILS, name + ".py"), encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            found.add(node.module[len(PREFIX):])
        elif isinstance(node, ast.ImportFrom) and node.module == PREFIX.rstrip("."):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name[len(PREFIX):] for a in node.names if a.name.startswith(PREFIX))
    return found


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_release_parts_import_only_downwards(name):
    assert collection_imports(name) == LAYERS[name]


@pytest.mark.parametrize("name, expected", [
    ("a", "a"), ("a//./b", "a/b"), ("./a/", "a"), ("a/b.c/d", "a/b.c/d"),
])
def test_check_relpath_normalises(name, expected):
    assert check_relpath(name) == expected


@pytest.mark.parametrize("name, needle", [
    ("", "empty or invalid name"), ("a\0b", "empty or invalid name"), ("/etc/passwd", "absolute path"),
    (".", "names the destination itself"), ("./", "names the destination itself"),
    ("a/../b", "contains '..'"), ("..", "contains '..'"),
])
def test_check_relpath_refuses(name, needle):
    with pytest.raises(UnsafeArchiveError, match=needle):
        check_relpath(name, "manifest entry")


def test_manifest_round_trip():
    entries = [Entry("pkg/m.py", KIND_FILE, 0o644, 3, "a" * 64), Entry("pkg", KIND_DIR, 0o755),
               Entry("link", KIND_SYMLINK, 0, 0, "pkg/m.py"), Entry("run.sh", KIND_FILE, 0o755, 9, "b" * 64)]
    doc = json.loads(manifest_bytes(entries).decode("ascii"))
    assert doc["version"] == MANIFEST_VERSION and doc["entries"] == manifest_items(entries)
    assert manifest_bytes(list(reversed(entries))) == manifest_bytes(entries)
    assert parse_manifest(doc["entries"]) == sorted(entries, key=lambda e: e.relpath)


def test_order_newest_first():
    assert order_newest_first({"a": 1, "b": 3, "c": 2}) == ["b", "c", "a"]
    assert order_newest_first([("a", 5), ("c", 5), ("b", 1)]) == ["c", "a", "b"]  # ties: id, descending
    assert order_newest_first({}) == []
