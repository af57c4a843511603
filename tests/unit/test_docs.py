"""The docs describe the code that is there (issue 14 item 4): README.md and docs/ name no module,
plugin, playbook, role variable or file of the collection that does not exist, and describe no
mechanism the code no longer uses (the restart under Ansible `async`)."""
import glob
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
# variables the role reads that are not defaults (the user sets them) or that name inventory/CLI inputs
USER_VARS = {"trainer_src", "trainer_rollback_release", "trainer_target_hosts", "trainer_serial", "trainer_hosts"}


def text(path):
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def role_variables():
    with open(os.path.join(ROOT, "roles", "trainer", "defaults", "main.yml")) as fh:
        names = set(yaml.safe_load(fh))
    with open(os.path.join(ROOT, "roles", "trainer", "meta", "argument_specs.yml")) as fh:
        for spec in yaml.safe_load(fh)["argument_specs"].values():
            names.update(spec.get("options", {}))
    return names


def plugin_names():
    names = set()
    for kind in ("modules", "action", "connection", "filter", "lookup"):
        for path in glob.glob(os.path.join(ROOT, "plugins", kind, "*.py")) + \
                glob.glob(os.path.join(ROOT, "plugins", kind, "*.yml")):
            names.add(os.path.splitext(os.path.basename(path))[0])
    names.update(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, "playbooks", "*.yml")))
    names.add("trainer")  # the role
    return names


@pytest.mark.parametrize("doc", DOCS, ids=[os.path.relpath(d, ROOT) for d in DOCS])
def test_every_fqcn_in_the_docs_exists(doc):
    missing = sorted(set(re.findall(r"\bdflash\.trainer\.([a-z_][a-z0-9_]*)", text(doc))) - plugin_names())
    assert missing == [], "%s names dflash.trainer.%s, which the collection does not have" % (doc, missing)


@pytest.mark.parametrize("doc", DOCS, ids=[os.path.relpath(d, ROOT) for d in DOCS])
def test_every_role_variable_in_the_docs_exists(doc):
    found = {v for v in re.findall(r"`(trainer_[a-z0-9_]+)", text(doc)) if not v.endswith("_")}  # `trainer_log_*`
    missing = sorted(found - role_variables() - USER_VARS - plugin_names())
    assert missing == [], "%s names %s, which the role does not have" % (os.path.relpath(doc, ROOT), missing)


@pytest.mark.parametrize("doc", DOCS, ids=[os.path.relpath(d, ROOT) for d in DOCS])
def test_every_repository_path_in_the_docs_exists(doc):
    paths = set(re.findall(r"`((?:plugins|roles|lab|tests|bench|extras|playbooks|docs|examples|molecule)/[\w./-]+)`",
                           text(doc)))
    generated = ("bench/results/",)  # written by the benchmarks
    missing = sorted(p for p in paths if not glob.glob(os.path.join(ROOT, p.rstrip("/"))) and not p.startswith(generated))
    assert missing == [], "%s names %s, which the repository does not have" % (os.path.relpath(doc, ROOT), missing)


def test_no_doc_says_the_restart_runs_under_ansible_async():
    sources = DOCS + glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py")) + \
        glob.glob(os.path.join(ROOT, "plugins", "module_utils", "*.py")) + \
        glob.glob(os.path.join(ROOT, "roles", "trainer", "*", "*.yml"))
    said = []
    for path in sources:
        for n, line in enumerate(text(path).splitlines(), 1):
            if re.search(r"under (Ansible'?s? )?`{0,2}C?\(?async|^\s*async: \d+|async_wrapper daemonises|async limit", line):
                said.append("%s:%d: %s" % (os.path.relpath(path, ROOT), n, line.strip()))
    assert said == []


def test_the_docs_test_can_fail(tmp_path):
    """The checks above are not vacuous: each finds what it looks for in a doc that has it."""
    assert re.findall(r"\bdflash\.trainer\.([a-z_][a-z0-9_]*)", "use dflash.trainer.trainer_nope") == ["trainer_nope"]
    assert "trainer_nope" not in plugin_names() and "trainer_status" in plugin_names()
    assert "trainer_lock_lease_s" in role_variables() and "trainer_nope_s" not in role_variables()


def test_install_files_fragment_copies_agree():
    """The install_files doc fragment's two literal copies of the file options - O(install)'s
    suboptions and trainer_install's top-level options - say the same."""
    from ansible_collections.dflash.trainer.plugins.doc_fragments.install_files import ModuleDocFragment as f

    nested = yaml.safe_load(f.DOCUMENTATION)["options"]["install"]["suboptions"]
    top = yaml.safe_load(f.FILES)["options"]
    assert nested == top
    assert sorted(top) == ["enabled", "env_path", "launcher_content", "launcher_path", "unit", "unit_content",
                           "unit_path"]
