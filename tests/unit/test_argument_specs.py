"""The role's argument specs agree with its defaults and with what each entry point reads (issue 14 item 4).

``roles/trainer/meta/argument_specs.yml`` writes the options the entry points share once (YAML
anchors, merged with ``<<:``). These tests hold it to two facts:

- every default an entry point's spec states is the value of ``defaults/main.yml`` (an option that
  is not a default - ``trainer_src`` - states none);
- every variable of ``defaults/main.yml`` that an entry point reads - in its task files (followed
  through ``include_tasks``, a file chosen by a variable included too), in ``vars/main.yml``'s
  internal variables they use, in the unit template - is in that entry point's spec, so role
  argument validation types it and ``ansible-doc -t role`` lists it; and the spec of a read-only
  entry point (status, history, logs: ``trainer_status check=status``, which checks only what a
  read uses) lists no variable it never reads. (deploy, restart and rollback validate every
  ``trainer_*`` variable of the play, so their specs may type more than their task files read.)

The checks are functions of (specs, defaults, uses), run on the repository's files and, to prove
they can fail, on copies with a wrong default, a missing option and an option not read.
"""
import copy
import os
import re

import pytest
import yaml
from role_tasks import tasks as _tasks

from ansible_collections.dflash.trainer.plugins.plugin_utils._validate import RUN_VARIABLES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(ROOT, "roles", "trainer")
VAR_RE = re.compile(r"\b(_{0,2}trainer_[a-z0-9_]+)\b")
NO_DEFAULT = object()


def load(*parts):
    with open(os.path.join(ROLE, *parts), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def read(*parts):
    with open(os.path.join(ROLE, *parts), encoding="utf-8") as fh:
        return fh.read()


def _included(task, chosen):
    """(file, vars) an include_tasks/import_tasks task runs; a file named by a variable is looked up
    in ``chosen`` (the vars the includes on the way passed)."""
    for key in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks", "import_tasks"):
        if key in task:
            name = task[key]
            if isinstance(name, dict):
                name = name.get("file")
            m = re.fullmatch(r"\{\{\s*(\w+)\s*\}\}", name)
            if m:
                name = chosen[m.group(1)]
            assert "{{" not in name, "cannot follow the include of %r" % name
            return name, task.get("vars") or {}
    return None


def uses(entry):
    """Names ``_*trainer_*`` that entry point ``entry`` (tasks/<entry>.yml) reads, through its includes,
    vars/main.yml's internal variables and the unit template it renders."""
    internal = load("vars", "main.yml")
    text, seen, todo = [], set(), [(entry + ".yml", {})]
    while todo:
        name, chosen = todo.pop()
        if (name, tuple(sorted(chosen.items()))) in seen:
            continue
        seen.add((name, tuple(sorted(chosen.items()))))
        text.append(read("tasks", name))
        for task in _tasks(load("tasks", name)):
            run = (task.get("dflash.trainer.trainer_validate") or {}).get("run")
            if run:  # a run's input check reads its entry point's variables in Python (main.yml's: its importer's)
                run = chosen.get("__trainer_run", "main") if "{{" in run else run
                text.append(" ".join(RUN_VARIABLES[run]))
            inc = _included(task, chosen)
            if inc:
                todo.append((inc[0], dict(chosen, **{k: v for k, v in inc[1].items() if isinstance(v, str)})))
    text = "\n".join(text)

    def closure(found, names):
        todo = set(found)
        while todo:                       # __trainer_x from vars/main.yml reads what its value names
            name = todo.pop()
            if name in names:
                continue
            names.add(name)
            if name in internal:
                todo.update(VAR_RE.findall(str(internal[name])))
        return names

    found = VAR_RE.findall(text)
    if "dflash.trainer.proof_options" in text:  # the filter reads every proof setting's role variable
        from ansible_collections.dflash.trainer.plugins.module_utils.proof.readiness import PROOF_SETTINGS
        found += [var for var, _kind, _default in PROOF_SETTINGS.values()]
    names = closure(found, set())
    # the templates it renders: named in its task files or in the internal variables it reads
    text += "\n".join(str(internal[n]) for n in sorted(names) if n in internal)
    for template in set(re.findall(r"template'?,\s*'([\w.]+\.j2)'|src:\s*([\w.]+\.j2)", text)):
        closure(VAR_RE.findall(read("templates", [t for t in template if t][0])), names)
    return names


def entry_points():
    """tasks_from names the playbooks use, and main."""
    found = {"main"}
    for base, _dirs, files in os.walk(os.path.join(ROOT, "playbooks")):
        for f in files:
            if f.endswith(".yml"):
                with open(os.path.join(base, f), encoding="utf-8") as fh:
                    found.update(re.findall(r"tasks_from:\s*(\w+)", fh.read()))
    return sorted(found)


def default_problems(specs, defaults):
    """Options whose stated default is not defaults/main.yml's value (or that state one defaults/main.yml lacks)."""
    out = []
    for entry, spec in specs.items():
        for name, option in (spec.get("options") or {}).items():
            stated = option.get("default", NO_DEFAULT)
            if name not in defaults:
                if stated is not NO_DEFAULT:
                    out.append("%s: %s states default %r; defaults/main.yml has none" % (entry, name, stated))
            elif stated is NO_DEFAULT and defaults[name] is not None:
                out.append("%s: %s states no default; defaults/main.yml has %r" % (entry, name, defaults[name]))
            elif stated is not NO_DEFAULT and (stated != defaults[name] or type(stated) is not type(defaults[name])):
                out.append("%s: %s states default %r; defaults/main.yml has %r" % (entry, name, stated, defaults[name]))
    return out


def read_only(entry):
    """Whether the entry point's input check is the read-only one (its read's own: ``trainer_status check=status``)."""
    reads = [t for t in _tasks(load("tasks", entry + ".yml")) if "dflash.trainer.trainer_status" in t]
    return any(t["dflash.trainer.trainer_status"].get("check") == "status" for t in reads)


def coverage_problems(specs, defaults, used, strict=None):
    """Defaults an entry point reads that its spec lacks, options the spec of a read-only entry point
    (``strict``) lists that it never reads, and entry points without a spec."""
    strict = {e for e in used if read_only(e)} if strict is None else strict
    out = []
    for entry, names in used.items():
        if entry not in specs:
            out.append("entry point %s has no argument spec" % entry)
            continue
        options = set(specs[entry].get("options") or {})
        for name in sorted((names & set(defaults)) - options):
            out.append("%s reads %s, which its argument spec lacks" % (entry, name))
        for name in sorted(options - names if entry in strict else ()):
            out.append("%s's argument spec lists %s, which it never reads" % (entry, name))
    return out


@pytest.fixture(scope="module")
def specs():
    return load("meta", "argument_specs.yml")["argument_specs"]


@pytest.fixture(scope="module")
def defaults():
    return load("defaults", "main.yml")


@pytest.fixture(scope="module")
def used():
    return {entry: uses(entry) for entry in entry_points()}


def test_every_stated_default_is_the_roles_default(specs, defaults):
    assert default_problems(specs, defaults) == []


def test_every_default_an_entry_point_reads_is_in_its_spec(specs, defaults, used):
    assert coverage_problems(specs, defaults, used) == []


def test_every_default_is_read_by_some_entry_point(defaults, used):
    assert sorted(set(defaults) - set().union(*used.values())) == []


def test_the_entry_points_are_the_playbooks_and_main(specs):
    assert set(entry_points()) >= {"main", "restart", "rollback", "status"}
    assert sorted(specs) == entry_points()
    assert sorted(e for e in entry_points() if read_only(e)) == ["history", "logs", "status"]


def test_shared_options_are_written_once():
    """An option is spelled out (its type, default, description) once in the file; the entry points
    that share it merge (<<:) or alias (*name) it."""
    text = read("meta", "argument_specs.yml")
    described = re.findall(r"^\s+(trainer_[a-z0-9_]+):(?: &\w+)?\n\s+type:", text, re.M)
    assert len(described) == len(set(described)), sorted(n for n in set(described) if described.count(n) > 1)
    entry_points_ = load("meta", "argument_specs.yml")["argument_specs"].values()
    assert len(described) == len(set().union(*(s.get("options", {}) for s in entry_points_)))
    assert "<<: *" in text


def test_the_checks_can_fail(specs, defaults, used):
    wrong = copy.deepcopy(specs)
    wrong["restart"]["options"]["trainer_release_keep"] = {"type": "int", "default": 6}
    wrong["restart"]["options"]["trainer_src"] = {"type": "str"}
    # (the groups are shared: replace an entry point's option, not the group's)
    wrong["status"]["options"]["trainer_root"] = dict(wrong["status"]["options"]["trainer_root"], default="/opt/other")
    wrong["main"]["options"]["trainer_ready_hold_s"] = dict(wrong["main"]["options"]["trainer_ready_hold_s"],
                                                            default="10")     # a string, not the number 10
    del wrong["rollback"]["options"]["trainer_gpus"]
    wrong["history"]["options"]["trainer_nope_s"] = {"type": "int"}
    assert sorted(default_problems(wrong, defaults)) == sorted([
        "main: trainer_ready_hold_s states default '10'; defaults/main.yml has 10",
        "restart: trainer_release_keep states default 6; defaults/main.yml has 5",
        "status: trainer_root states default '/opt/other'; defaults/main.yml has '/opt/dflash-trainer'",
    ])
    problems = coverage_problems(wrong, defaults, used)
    assert "rollback reads trainer_gpus, which its argument spec lacks" in problems
    assert "history's argument spec lists trainer_nope_s, which it never reads" in problems
    assert not any(p.startswith("restart's") for p in problems)        # restart validates every variable
    assert "restart's argument spec lists trainer_src, which it never reads" in \
        coverage_problems(wrong, defaults, used, strict={"restart"})
    del wrong["logs"]
    assert "entry point logs has no argument spec" in coverage_problems(wrong, defaults, used)
    # one written option, one object for every entry point that merges its group
    assert specs["main"]["options"]["trainer_root"] is specs["status"]["options"]["trainer_root"]
    assert specs["main"]["options"]["trainer_gpus"] is specs["rollback"]["options"]["trainer_gpus"]


def test_the_proofs_log_pattern_fragment_has_the_roles_defaults(defaults):
    """plugins/doc_fragments/log_patterns.py documents the modules' pattern defaults: the role's."""
    from ansible_collections.dflash.trainer.plugins.doc_fragments.log_patterns import ModuleDocFragment
    options = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
    assert {k: v["default"] for k, v in options.items()} == {
        k: defaults["trainer_" + k] for k in ("ready_regex", "step_regex", "tokps_regex")}


def test_what_a_run_learns_is_emptied_at_its_end_as_it_starts():
    """vars/main.yml's empty starting values of what a run learns and the reset at the end of a run (main.yml's
    `always:`, and the group's) are one list: a fact
    added to one and not the other would start undefined, or outlive its run into the next run of the play."""
    empty = {name: value for name, value in load("vars", "main.yml").items() if value in ({}, "")}
    for name in ("main.yml", "group.yml"):
        resets = [t["ansible.builtin.set_fact"] for t in _tasks(load("tasks", name)) if "ansible.builtin.set_fact" in t]
        assert len(resets) == 1 and resets[0] and resets[0] == empty, (name, resets, empty)
