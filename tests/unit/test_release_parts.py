"""The release code's parts (plugins/module_utils/release/{scan,archive,extract,prune,diff}.py):
how they import each other, and the helpers no other test calls directly (check_relpath, the
manifest round trip, order_newest_first)."""
from __future__ import annotations

import ast
import json
import os

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.release.archive import (
    MANIFEST_VERSION,
    manifest_bytes,
    manifest_items,
    parse_manifest,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.prune import order_newest_first
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import (
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
# release/scan.py stands alone (bench/soak.py imports it with plugins/module_utils/release on sys.path)
LAYERS = {
    "release.scan": set(),
    "release.archive": {"release.scan"},
    "release.extract": {"release.scan", "release.archive", "target.private_file"},  # fsync_dir
    "release.prune": set(),
    "release.diff": {"release.scan"},
}


def collection_imports(name):
    """The module_utils files (``package.file``) that the module_utils file ``name`` imports."""
    with open(os.path.join(MODULE_UTILS, *name.split(".")) + ".py", encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            module = node.module[len(PREFIX):]
            if os.path.isdir(os.path.join(MODULE_UTILS, module)):  # from ...module_utils.release import scan
                found.update("%s.%s" % (module, a.name) for a in node.names)
            else:
                found.add(module)
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
