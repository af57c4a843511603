"""What a module ships to the target: Ansible packs a module with every module_utils file it imports,
directly or through another (the AnsiballZ payload, built for each remote call). The status read
(trainer_status) is the one call of a deploy that changes nothing, so its payload is kept to what it
uses: the restart job's state file is read through _job_state, never through the restart job's
machinery (_restart_job -> _cycle -> _readiness, _progress_file, ...)."""
import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UTILS = os.path.join(ROOT, "plugins", "module_utils")
PREFIX = "ansible_collections.dflash.trainer.plugins.module_utils"

# trainer_status: 24 module_utils files (7827 lines) when it read the job's state through
# _restart_job; 20 (about 5600 lines) since _job_state owns that file
STATUS_MAX_FILES = 20
STATUS_MAX_LINES = 6500
# the restart's machinery: the status read never needs it
NOT_IN_STATUS = {"_cycle", "_readiness", "_restart_job", "_restart_steps", "_progress_file", "_job_result",
                 "_preflight_run", "_release_root"}


def package_of(path):
    """The package a file of this collection is in (``ansible_collections.dflash.trainer.plugins.modules``)."""
    rel = os.path.relpath(os.path.dirname(os.path.abspath(path)), ROOT)
    return ".".join(["ansible_collections", "dflash", "trainer"] + (rel.split(os.sep) if rel != "." else []))


def imported_utils(path, package=None):
    """The collection's module_utils a Python file imports (every form Ansible follows)."""
    package = package or package_of(path)
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from ..module_utils._x import y, from ._x import y
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                module = "%s.%s" % (base, module) if module else base
            names = [module] + ["%s.%s" % (module, a.name) for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith(PREFIX + "."):
                first = name[len(PREFIX) + 1:].split(".")[0]
                if os.path.exists(os.path.join(UTILS, first + ".py")):
                    found.add(first)
    return found


def closure_of(path):
    """Every module_utils file (its name) that a payload built from ``path`` holds."""
    seen, todo = set(), list(imported_utils(path))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imported_utils(os.path.join(UTILS, name + ".py")))
    return seen


def closure(module):
    return closure_of(os.path.join(ROOT, "plugins", "modules", module + ".py"))


def lines(names):
    return sum(len(open(os.path.join(UTILS, n + ".py")).readlines()) for n in names)


def test_the_status_read_ships_no_restart_machinery():
    shipped = closure("trainer_status")
    assert "_job_state" in shipped and "_status" in shipped
    assert not shipped & NOT_IN_STATUS, "trainer_status ships %s" % sorted(shipped & NOT_IN_STATUS)


def test_the_status_read_stays_small():
    shipped = closure("trainer_status")
    assert len(shipped) <= STATUS_MAX_FILES, sorted(shipped)
    assert lines(shipped) <= STATUS_MAX_LINES, "%d lines in %s" % (lines(shipped), sorted(shipped))


def test_the_job_state_file_has_one_owner():
    """Readers and the writer of restart.json meet in _job_state, which needs nothing of the cycle."""
    assert closure_of(os.path.join(UTILS, "_job_state.py")) <= {"_private_file"}
    for module in ("trainer_begin", "trainer_restart"):
        assert "_job_state" in imported_utils(os.path.join(ROOT, "plugins", "modules", module + ".py"))
    assert "_job_state" in imported_utils(os.path.join(UTILS, "_status_read.py"))  # trainer_status's read
    assert "_job_state" in imported_utils(os.path.join(UTILS, "_status.py"))
    assert "_restart_job" not in imported_utils(os.path.join(UTILS, "_status.py"))


def test_the_parser_follows_each_import_form(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(textwrap.dedent("""
        from ansible_collections.dflash.trainer.plugins.module_utils._wait import poll_until
        from ansible_collections.dflash.trainer.plugins.module_utils import _lock
        import ansible_collections.dflash.trainer.plugins.module_utils._run
        from ..module_utils._secrets import mask
        from ..module_utils import _systemd
        from ansible.module_utils.basic import AnsibleModule
        import os
    """))
    assert imported_utils(str(src), package="ansible_collections.dflash.trainer.plugins.modules") == {"_wait", "_lock", "_run", "_secrets", "_systemd"}


BUILD = r"""
import base64, io, json, os, re, sys, zipfile
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=[os.path.join(sys.argv[1], "collections")])._install()
from ansible.executor import module_common
from ansible.template import Templar
out = {}
for name in sys.argv[2:]:
    built = module_common.modify_module(
        module_name="dflash.trainer." + name, module_path=os.path.join(sys.argv[1], "plugins", "modules", name + ".py"),
        module_args={}, templar=Templar(loader=None), task_vars={"ansible_python_interpreter": "/usr/bin/python3"})
    data = built.b_module_data
    z = zipfile.ZipFile(io.BytesIO(base64.b64decode(re.search(rb"zip_data='([A-Za-z0-9+/=]+)'", data).group(1))))
    out[name] = sorted(n.rsplit("/", 1)[1][:-3] for n in z.namelist()
                       if "/dflash/trainer/plugins/module_utils/_" in n and not n.endswith("/__init__.py"))
print(json.dumps(out))
"""


def test_ansible_ships_what_the_parser_finds():
    """Cross-check with Ansible's own payload builder (ansible-core's module_common), in a process of
    its own (its collection loader replaces the import machinery)."""
    pytest.importorskip("ansible.executor.module_common")
    modules = ("trainer_status", "trainer_restart", "trainer_lock")
    run = subprocess.run([sys.executable, "-c", BUILD, ROOT] + list(modules), capture_output=True, text=True,
                         timeout=120, check=False)
    if run.returncode != 0 and ("TypeError" in run.stderr or "AttributeError" in run.stderr):
        pytest.skip("this ansible-core builds payloads differently: %s" % run.stderr.strip().splitlines()[-1])
    assert run.returncode == 0, run.stderr
    shipped = json.loads(run.stdout)
    for module in modules:
        assert set(shipped[module]) == closure(module), module
