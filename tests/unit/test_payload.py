"""What a module ships to the target: Ansible packs a module with every module_utils file it imports,
directly or through another (the AnsiballZ payload, built for each remote call). The status read
(trainer_status) is the one call of a deploy that changes nothing, so its payload is kept to what it
uses: the restart job's state file is read through job.state, never through the restart job's
machinery (job.restart -> job.cycle -> proof.readiness, proof.progress_file, ...), the release pointers through
release.root (which needs nothing of the release's archive or scan), the ledger through release.ledger, and
what only trainer_plan decides (the lock, what the run may write) is plan.first_read's. Each file of state has
one owner: the ledger (release.ledger), the job's state (job.state), current and last_good (release.root).
bench/payload.py measures each module's payload with Ansible's own builder."""
import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UTILS = os.path.join(ROOT, "plugins", "module_utils")
MODULES = os.path.join(ROOT, "plugins", "modules")
PREFIX = "ansible_collections.dflash.trainer.plugins.module_utils"

# trainer_status: 24 module_utils files (7827 lines) when it read the job's state through
# job.restart; 19 (5374 lines) with the lock and ownership helpers in plan.status and release.scan /
# proof.preflight shipped for two constants; 17 (about 3500 lines) since plan.first_read, release.ledger, target.marks and a
# release.root of its own; about 3800 with what the read itself must judge: the time bound on the user's
# regexes over this start's log (proof.trainer_log), nvidia-smi's exit codes by name and the device nodes CUDA
# opens (target.nvidia_smi) - the status read is also the deploy's first read, before anything is stopped; about
# 4050 with the JSONL records it reads in this start's log (proof.trainer_log.ProgressAnalysis: the one parser of
# the log and the progress file)
STATUS_MAX_FILES = 17
STATUS_MAX_LINES = 4100
# the restart's machinery, the lock, the ownership judges, the release's archive: the status read
# never needs them
NOT_IN_STATUS = {"job.cycle", "proof.readiness", "job.restart", "job.steps", "proof.progress_file", "job.result",
                 "proof.preflight", "plan.first_read", "job.lock", "target.ownership", "target.inductor_cache", "release.scan",
                 "release.archive", "release.extract", "release.install", "release.states"}


def modules():
    return sorted(n[:-3] for n in os.listdir(MODULES) if n.endswith(".py") and not n.startswith("_"))


def utils():
    """Every module_utils file by its dotted name under module_utils (``job.state``)."""
    return sorted("%s.%s" % (pkg, n[:-3]) for pkg in os.listdir(UTILS) if os.path.isdir(os.path.join(UTILS, pkg))
                  for n in os.listdir(os.path.join(UTILS, pkg)) if n.endswith(".py") and n != "__init__.py")


def util_path(name):
    """The file of the module_utils ``name`` (``job.state`` -> .../module_utils/job/state.py)."""
    return os.path.join(UTILS, *name.split(".")) + ".py"


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
                first = ".".join(name[len(PREFIX) + 1:].split(".")[:2])  # package.file
                if os.path.exists(util_path(first)):
                    found.add(first)
    return found


def closure_of(path):
    """Every module_utils file (its name) that a payload built from ``path`` holds."""
    seen, todo = set(), list(imported_utils(path))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imported_utils(util_path(name)))
    return seen


def closure(module):
    return closure_of(os.path.join(MODULES, module + ".py"))


def lines(names):
    return sum(len(open(util_path(n)).readlines()) for n in names)


def test_the_status_read_ships_no_restart_machinery():
    shipped = closure("trainer_status")
    assert "job.state" in shipped and "plan.status" in shipped
    assert not shipped & NOT_IN_STATUS, "trainer_status ships %s" % sorted(shipped & NOT_IN_STATUS)


def test_the_status_read_stays_small():
    shipped = closure("trainer_status")
    assert len(shipped) <= STATUS_MAX_FILES, sorted(shipped)
    assert lines(shipped) <= STATUS_MAX_LINES, "%d lines in %s" % (lines(shipped), sorted(shipped))


def test_the_status_read_returns_no_lock():
    """trainer_status takes no lock: neither its payload nor its result carries the lock's internals."""
    with open(os.path.join(MODULES, "trainer_status.py")) as fh:
        tree = ast.parse(fh.read())
    doc = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
               and any(getattr(t, "id", None) == "RETURN" for t in node.targets))
    assert not [key for key in yaml.safe_load(doc) if "lock" in key]
    assert "job.lock" not in closure("trainer_status") and "job.lock" in closure("trainer_plan")


def test_the_job_state_file_has_one_owner():
    """Readers and the writer of restart.json meet in job.state, which needs nothing of the cycle,
    and every judge of whether a job ended asks its job_end."""
    assert closure_of(os.path.join(UTILS, "job/state.py")) <= {"target.private_file"}
    assert "job.state" in imported_utils(os.path.join(UTILS, "plan/first_read.py"))  # trainer_plan waits for a job
    assert "job.state" in imported_utils(os.path.join(UTILS, "job/start.py"))  # trainer_restart's and begin's start
    assert "job.state" in imported_utils(os.path.join(UTILS, "plan/status_read.py"))  # trainer_status's read
    assert "job.state" in imported_utils(os.path.join(UTILS, "plan/status.py"))
    for name in ("plan.first_read", "job.steps", "plan.status"):  # job_over, job_ended, stopped_on_purpose
        assert "job_end" in names_from(util_path(name), "job.state"), name
    for path in python_files():  # nobody imports the job state's names from elsewhere (no re-export)
        for util in ("job.restart", "plan.status", "job.cycle", "job.steps", "job.start"):
            assert not names_from(path, util) & {"read_state", "write_state", "job_alive", "observe_job", "pid_start",
                                                 "outcome_words", "job_end"}, (path, util)


def python_files():
    """The collection's plugins and the unit tests."""
    out = [util_path(n) for n in utils()] + [os.path.join(MODULES, n + ".py") for n in modules()]
    unit = os.path.dirname(os.path.abspath(__file__))
    return out + sorted(os.path.join(unit, n) for n in os.listdir(unit) if n.endswith(".py"))


def names_from(path, util):
    """The names ``path`` imports from the module_utils file ``util`` (``from ..._x import a, b``)."""
    with open(path) as fh:
        tree = ast.parse(fh.read(), path)
    return {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.module or "").endswith("module_utils." + util) for a in node.names}


def joined_names(path):
    """The constant names ``path`` joins to a path (``os.path.join(root, "ledger.json")``)."""
    with open(path) as fh:
        tree = ast.parse(fh.read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
            out.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return out


@pytest.mark.parametrize("name, owner", [("ledger.json", "release.ledger"), ("current", "release.root"),
                                         ("last_good", "release.root")])
def test_each_file_of_state_has_one_owner(name, owner):
    """Only its owner makes the path of the ledger, of ``current`` or of ``last_good`` (and the
    ownership check, which looks at what a root holds before anything is written: the ledger's first
    bytes tell whether it is ours)."""
    makers = [n for n in utils() if name in joined_names(util_path(n))]
    makers += [n for n in modules() if name in joined_names(os.path.join(MODULES, n + ".py"))]
    assert set(makers) <= {owner, "target.ownership"}, makers


def test_small_owners_stay_small():
    """The constants and owners many payloads share import nothing heavy."""
    assert closure_of(os.path.join(UTILS, "target/marks.py")) == set()
    assert closure_of(os.path.join(UTILS, "release/ledger.py")) <= {"target.private_file"}
    assert closure_of(os.path.join(UTILS, "release/root.py")) <= {"target.marks", "target.private_file"}
    assert "proof.preflight" not in closure_of(os.path.join(UTILS, "target/ownership.py"))
    assert "release.scan" not in closure_of(os.path.join(UTILS, "target/ownership.py"))
    # the purge and its judge: stdlib only (the lab runs the file's source alone in a container)
    assert closure_of(os.path.join(UTILS, "target/inductor_cache.py")) == set()
    # the checks on the target's first read: stdlib only (a module on the target ships them, not _validate)
    assert closure_of(os.path.join(UTILS, "plan/target_checks.py")) == set()


def used_names(tree):
    """Every name a file reads (``x`` and the ``x`` of ``x.y``), its imports left out."""
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


@pytest.mark.parametrize("path", [os.path.join(MODULES, n + ".py") for n in modules()] +
                         [util_path(n) for n in utils()], ids=lambda p: os.path.relpath(p, os.path.dirname(UTILS)))
def test_no_import_of_a_module_util_is_dead(path):
    """A file imports from the collection's module_utils only names it uses: a payload carries no
    file that nothing in it needs (an unused import would still ship that file and all it imports)."""
    with open(path) as fh:
        tree = ast.parse(fh.read(), path)
    used = used_names(tree)
    dead = [a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith(PREFIX) for a in node.names if (a.asname or a.name) not in used]
    assert not dead, dead


def test_the_parser_follows_each_import_form(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(textwrap.dedent("""
        from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import poll_until
        from ansible_collections.dflash.trainer.plugins.module_utils.job import lock as _lock
        import ansible_collections.dflash.trainer.plugins.module_utils.target.command
        from ..module_utils.target.secrets import mask
        from ..module_utils.target import systemd as _systemd
        from ansible.module_utils.basic import AnsibleModule
        import os
    """))
    assert imported_utils(str(src), package="ansible_collections.dflash.trainer.plugins.modules") == {
        "job.wait", "job.lock", "target.command", "target.secrets", "target.systemd"}


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
    utils = "/dflash/trainer/plugins/module_utils/"
    out[name] = sorted(n.split(utils, 1)[1][:-3].replace("/", ".") for n in z.namelist()
                       if utils in n and not n.endswith("/__init__.py"))
print(json.dumps(out))
"""


def test_ansible_ships_what_the_parser_finds():
    """Cross-check with Ansible's own payload builder (ansible-core's module_common), in a process of
    its own (its collection loader replaces the import machinery), for every module."""
    pytest.importorskip("ansible.executor.module_common")
    # each module's payload holds what it imports and nothing more (a module that is documentation alone -
    # its action runs on the controller - has no payload)
    every = [m for m in modules() if "def main(" in open(os.path.join(MODULES, m + ".py")).read()]
    run = subprocess.run([sys.executable, "-c", BUILD, ROOT] + every, capture_output=True, text=True,
                         timeout=180, check=False)
    if run.returncode != 0 and ("TypeError" in run.stderr or "AttributeError" in run.stderr):
        pytest.skip("this ansible-core builds payloads differently: %s" % run.stderr.strip().splitlines()[-1])
    assert run.returncode == 0, run.stderr
    shipped = json.loads(run.stdout)
    for module in every:
        assert set(shipped[module]) == closure(module), module
