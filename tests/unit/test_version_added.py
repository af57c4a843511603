"""Every plugin's documentation says which version added it, and that version is one the collection
ships: galaxy.yml's `version`, or a release of changelogs/changelog.yaml - never a version after it."""
import ast
import glob
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_yaml(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def shipped():
    """(galaxy.yml's version, every version the collection has shipped or ships now)."""
    version = str(load_yaml("galaxy.yml")["version"])
    released = {str(v) for v in (load_yaml("changelogs", "changelog.yaml").get("releases") or {})}
    return version, released | {version}


def _py_documentation(path):
    """The DOCUMENTATION string of a plugin's .py file, read without importing it."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DOCUMENTATION" for t in node.targets):
            return yaml.safe_load(node.value.value)
    return None


def documented_plugins():
    """{relative path: its documentation (a dict, None when it has none)} for every module, connection,
    lookup, and filter documentation file; action plugins share their module's documentation."""
    out = {}
    for kind in ("modules", "connection", "lookup"):
        for path in sorted(glob.glob(os.path.join(ROOT, "plugins", kind, "*.py"))):
            if not os.path.basename(path).startswith("_"):
                out[os.path.relpath(path, ROOT)] = _py_documentation(path)
    for path in sorted(glob.glob(os.path.join(ROOT, "plugins", "filter", "*.yml"))):
        out[os.path.relpath(path, ROOT)] = (load_yaml(os.path.relpath(path, ROOT)) or {}).get("DOCUMENTATION")
    return out


def _key(version):
    return tuple(int(x) for x in version.split("."))


def version_problems(docs, version, versions):
    """What is wrong with each plugin's version_added: missing, not X.Y.Z, after galaxy.yml's
    version, or a version the collection never shipped."""
    out = []
    for path, doc in sorted(docs.items()):
        said = (doc or {}).get("version_added")
        if said is None:
            out.append("%s: no version_added" % path)
            continue
        said = str(said)
        if not re.match(r"^\d+\.\d+\.\d+$", said):
            out.append("%s: version_added %r is not a version (X.Y.Z)" % (path, said))
        elif _key(said) > _key(version):
            out.append("%s: version_added %s is after galaxy.yml's version %s" % (path, said, version))
        elif said not in versions:
            out.append("%s: version_added %s was never shipped (galaxy.yml: %s, released: %s)" % (
                path, said, version, ", ".join(sorted(versions, key=_key))))
    return out


def test_every_plugin_names_a_version_the_collection_ships():
    docs = documented_plugins()
    assert sum(p.startswith("plugins/modules/") for p in docs) >= 8 and any("connection" in p for p in docs)
    version, versions = shipped()
    assert version_problems(docs, version, versions) == []


@pytest.mark.parametrize("doc, problem", [
    ({"version_added": "0.2.0"}, "is after galaxy.yml's version 0.1.0"),
    ({"version_added": "0.0.9"}, "was never shipped"),
    ({"version_added": "1.0"}, "is not a version"),
    ({"short_description": "x"}, "no version_added"),
    (None, "no version_added"),
])
def test_a_wrong_version_added_is_found(doc, problem):
    found = version_problems({"plugins/modules/x.py": doc}, "0.1.0", {"0.1.0"})
    assert len(found) == 1 and problem in found[0], found
    assert version_problems({"plugins/modules/x.py": {"version_added": "0.1.0"}}, "0.1.0", {"0.1.0"}) == []
