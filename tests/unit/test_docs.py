"""The docs describe the code that is there (issue 14 item 4): README.md and docs/ name no module,
plugin, playbook, role variable or file of the collection that does not exist, and describe no
mechanism the code no longer uses (the restart under Ansible `async`)."""
import ast
import glob
import os
import re

import pytest
import yaml
from role_tasks import tasks as _walk

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
# rendered from the role's argument spec, whose defaults test_argument_specs.py holds to defaults/main.yml and
# test_variables_doc.py holds the page to: its default column is no claim written by hand
RENDERED = {os.path.join(ROOT, "docs", "variables.md")}
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
    for kind in ("modules", "action", "callback", "connection", "filter", "lookup"):
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


def test_every_playbook_imports_the_target_guard_first():
    """target_guard.yml and _preload.py say every playbook imports the guard first: each of playbooks/."""
    books = sorted(set(glob.glob(os.path.join(ROOT, "playbooks", "*.yml"))) - {
        os.path.join(ROOT, "playbooks", "target_guard.yml")})
    assert books
    for path in books:
        with open(path, encoding="utf-8") as fh:
            first = yaml.safe_load(fh)[0]
        assert first.get("ansible.builtin.import_playbook") == "target_guard.yml", path


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


# -- the numbers and claims the docs state (issue: test_docs checks every default, number of calls
# and "the role calls ..." claim against the code) ---------------------------------------------

NUMBER = r"-?\d+(?:\.\d+)?"
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
# the stated default of these is a description of the forms they read, not lines to match
DESCRIBED = {"trainer_step_regex": "names the forms (`step`, `[N/M]`, tqdm's `N/M [`), not whole lines"}


def flat(doc_text):
    """The text with line breaks inside a paragraph joined (claims wrap over lines)."""
    return re.sub(r"[ \t]*\n[ \t]*(?=\S)(?![|#`\-*]|\d+\.)", " ", doc_text)


def role_defaults():
    with open(os.path.join(ROOT, "roles", "trainer", "defaults", "main.yml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def stated_defaults(doc_text):
    """[(variable, stated text)]: a table's Default column, "`trainer_x` (900 s)", "`trainer_x` (0 by
    default", "`trainer_x` 256,", "(`trainer_x`, 15 s)". A range ("(0.05 … 3600 s)") is no default."""
    out = []
    lines = doc_text.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        if cells and any(c.lower() == "default" for c in cells) and i + 1 < len(lines) and \
                re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1]):
            col = [c.lower() for c in cells].index("default")
            for row in lines[i + 2:]:
                if not row.lstrip().startswith("|"):
                    break
                rc = [c.strip() for c in row.strip().strip("|").split("|")]
                m = re.fullmatch(r"`(trainer_[a-z0-9_]+)`", rc[0]) if rc else None
                if m and col < len(rc):
                    out.append((m.group(1), rc[col]))
    text = flat(doc_text)
    unit = r"(?:\s?(?:s|MiB|seconds))?"
    not_range = r"(?!\s*(?:…|\.\.|-\s*\d|–))"
    inline = r"`(trainer_[a-z0-9_]+)` \((%s)%s%s(?=\)| by default|[,;:])" % (NUMBER, unit, not_range)
    for m in re.finditer(inline, text):
        out.append((m.group(1), m.group(2)))
    for m in re.finditer(r"`(trainer_[a-z0-9_]+)` (%s)%s(?=[,;)])" % (NUMBER, not_range), text):
        out.append((m.group(1), m.group(2)))
    for m in re.finditer(r"\(`(trainer_[a-z0-9_]+)`, (%s)%s\)" % (NUMBER, unit), text):
        out.append((m.group(1), m.group(2)))
    return out


def _literal(stated):
    """The value a stated default writes, or NotImplemented when it describes it in words."""
    s = stated.strip()
    if re.fullmatch(r"`[^`]*`", s):
        s = s[1:-1]
    m = re.fullmatch(r"\[(-?\d+), …, (-?\d+)\]", s)
    if m:
        return list(range(int(m.group(1)), int(m.group(2)) + 1))
    m = re.fullmatch(r"(%s)(?:\s?(?:s|MiB|seconds))?" % NUMBER, s)
    if m:
        return float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    if re.fullmatch(r"true|false|null|\"\"|''|\[[^`]*\]|\{[^`]*\}", s):
        return yaml.safe_load(s)
    return NotImplemented


def default_claim_problems(claims, defaults):
    out = []
    for var, stated in claims:
        if var not in defaults:
            out.append("%s: states a default for %s, which defaults/main.yml lacks" % (stated, var))
            continue
        value, truth = _literal(stated), defaults[var]
        if value is not NotImplemented:
            if value != truth or isinstance(value, bool) != isinstance(truth, bool):
                out.append("%s: stated default %r, defaults/main.yml has %r" % (var, stated, truth))
        elif var.endswith(("_regex", "_regexes")) and var not in DESCRIBED:
            patterns = truth if isinstance(truth, list) else [truth]
            examples = re.findall(r"`([^`]+)`", stated)
            if not examples:
                out.append("%s: stated default %r names nothing to check" % (var, stated))
            for ex in examples:
                if not any(re.search(p, ex) for p in patterns):
                    out.append("%s: stated default reads %r, which its default does not match" % (var, ex))
            if isinstance(truth, list) and len(examples) != len(truth):
                out.append("%s: states %d patterns, defaults/main.yml has %d" % (var, len(examples), len(truth)))
    return out


def formula_problems(doc_text, defaults):
    """"`a × (b + c)`: with the defaults 3 × (5 + 900) = 2715 s": the numbers are the defaults' and the product."""
    out = []
    for m in re.finditer(r"`(trainer_\w+) × \((trainer_\w+) \+ (trainer_\w+)\)`: with the defaults "
                         r"(\d+) × \((\d+) \+ (\d+)\) = (\d+)", flat(doc_text)):
        names, nums = m.groups()[:3], [int(x) for x in m.groups()[3:]]
        truth = [defaults[n] for n in names]
        if nums[:3] != truth or nums[3] != truth[0] * (truth[1] + truth[2]):
            out.append("%r: the defaults give %s × (%s + %s) = %s" % (
                m.group(0), truth[0], truth[1], truth[2], truth[0] * (truth[1] + truth[2])))
    return out


@pytest.mark.parametrize("doc", [d for d in DOCS if d not in RENDERED],
                         ids=[os.path.relpath(d, ROOT) for d in DOCS if d not in RENDERED])
def test_every_default_the_docs_state_is_the_roles(doc):
    d = role_defaults()
    assert default_claim_problems(stated_defaults(text(doc)), d) + formula_problems(text(doc), d) == []


def test_the_docs_state_defaults_the_test_reads():
    claims = [c for doc in DOCS for c in stated_defaults(text(doc))]
    names = {v for v, _value in claims}
    assert {"trainer_ready_timeout_s", "trainer_stop_disable", "trainer_gpus", "trainer_lock_lease_s",
            "trainer_log_max_mib", "trainer_lock_wait_s", "trainer_error_regexes"} <= names, sorted(names)
    assert not any(v == "trainer_ready_interval_s" and s.startswith("0.05") for v, s in claims)  # a range


@pytest.mark.parametrize("doc_text, problem", [
    ("loads in silence, bounded by `trainer_ready_timeout_s` (300 s). The",
     "trainer_ready_timeout_s: stated default '300'"),
    ("| Variable | Default | Meaning |\n|---|---|---|\n| `trainer_stop_disable` | `true` | x |\n",
     "trainer_stop_disable: stated default '`true`'"),
    ("| Variable | Default |\n|---|---|\n| `trainer_gpus` | `[0, …, 3]` |\n", "trainer_gpus: stated default"),
    ("its lease (`trainer_lock_lease_s`, 30 s).", "trainer_lock_lease_s: stated default '30'"),
    ("`trainer_log_max_mib` 128, `trainer_log_keep` 3):", "trainer_log_max_mib: stated default '128'"),
    ("for up to `trainer_lock_wait_s` (5 by default: refused", "trainer_lock_wait_s: stated default '5'"),
    ("| Variable | Default |\n|---|---|\n| `trainer_error_regexes` | `Traceback`, `Segfault` |\n",
     "trainer_error_regexes: stated default reads 'Segfault'"),
    ("| Variable | Default |\n|---|---|\n| `trainer_tokps_regex` | `tok/s=12.4K`, `throughput 5` |\n",
     "trainer_tokps_regex: stated default reads 'throughput 5'"),
    ("`trainer_nope_s` (7)", "states a default for trainer_nope_s"),
    ("`trainer_start_limit_burst × (trainer_restart_sec + trainer_ready_timeout_s)`: with the defaults "
     "3 × (5 + 300) = 915 s", "the defaults give 3 × (5 + 900) = 2715"),
])
def test_a_wrong_stated_default_fails(doc_text, problem):
    d = role_defaults()
    found = default_claim_problems(stated_defaults(doc_text), d) + formula_problems(doc_text, d)
    assert any(problem in p for p in found), found
    assert default_claim_problems(stated_defaults("`trainer_ready_timeout_s` (900 s) and (0.05 … 3600 s)"), d) == []


# -- what the role calls ---------------------------------------------------------------------------


def filter_names():
    import importlib
    names = set()
    for path in glob.glob(os.path.join(ROOT, "plugins", "filter", "*.py")):
        mod = importlib.import_module("ansible_collections.dflash.trainer.plugins.filter." +
                                      os.path.splitext(os.path.basename(path))[0])
        names.update(mod.FilterModule().filters())
    return names


def role_calls():
    """{"modules": {module: [args of each task]}, "plugins": filters and lookups the role's Jinja names}:
    every roles/trainer/tasks/*.yml (and vars/, templates/)."""
    modules = _modules()
    calls, jinja = {}, []
    for path in sorted(glob.glob(os.path.join(ROOT, "roles", "trainer", "tasks", "*.yml"))):
        with open(path, encoding="utf-8") as fh:
            for task in _walk(yaml.safe_load(fh)):
                for key, args in task.items():
                    m = re.fullmatch(r"dflash\.trainer\.(\w+)", str(key))
                    if m and m.group(1) in modules:
                        calls.setdefault(m.group(1), []).append(args if isinstance(args, dict) else {})
        jinja.append(text(path))
    for path in glob.glob(os.path.join(ROOT, "roles", "trainer", "vars", "*.yml")) + \
            glob.glob(os.path.join(ROOT, "roles", "trainer", "templates", "*")):
        jinja.append(text(path))
    used = set(re.findall(r"dflash\.trainer\.(\w+)", "\n".join(jinja))) - modules
    return {"modules": calls, "plugins": used}


def call_claim_problems(doc_text, calls, modules):
    """"X, Y and Z are standalone ... (the role calls none of them", "`A` (standalone, for playbooks
    outside the role)", "it calls `M`", "the role calls through the `F` filter", "`M state=S`"."""
    out = []
    body = flat(doc_text)
    called = set(calls["modules"])
    for sentence in re.split(r"(?<=[.|])\s+|\n", body):
        if re.search(r"calls none of them|standalone modules? for playbooks outside the role", sentence):
            head = re.split(r"calls none of them|are standalone", sentence)[0]
            for name in re.findall(r"`(\w+)`", head):
                if name in modules and name in called:
                    out.append("says the role calls none of %s, but it calls it" % name)
        for m in re.finditer(r"((?:`\w+`,?\s*(?:and\s+)?)+)\(standalone, for playbooks outside the role\)", sentence):
            for name in re.findall(r"`(\w+)`", m.group(1)):
                if name in modules and name in called:
                    out.append("says %s is standalone, for playbooks outside the role, but the role calls it" % name)
        for m in re.finditer(r"\b(?:it|the role) calls `(\w+)`", sentence):
            if m.group(1) in modules and m.group(1) not in called:
                out.append("says the role calls %s, which no task of it calls" % m.group(1))
        for m in re.finditer(r"the role calls through the `(\w+)` filter", sentence):
            if m.group(1) not in calls["plugins"]:
                out.append("says the role calls the %s filter, which it does not use" % m.group(1))
    for m in re.finditer(r"`(\w+) (\w+)=([\w-]+)`", body):
        module, arg, value = m.groups()
        if module in modules and module in called | {"trainer_restart", "trainer_validate"} and \
                not any(str(a.get(arg)) == value for a in calls["modules"].get(module, [])):
            out.append("says %s runs with %s=%s, which no task of the role passes" % (module, arg, value))
    return out


# Claims found false (the docs are the lead's to fix): delete the line once the doc says the truth.
KNOWN_FALSE_CALL_CLAIMS = set()


def _modules():
    return {os.path.splitext(os.path.basename(p))[0]
            for p in glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py"))}


def test_every_claim_of_what_the_role_calls_is_true():
    calls = role_calls()
    assert {"trainer_restart", "trainer_validate", "trainer_release"} <= set(calls["modules"])
    assert "start_limit_interval" in calls["plugins"] and "start_limit_interval" in filter_names()
    found = {(os.path.relpath(d, ROOT), p) for d in DOCS for p in call_claim_problems(text(d), calls, _modules())}
    assert found - KNOWN_FALSE_CALL_CLAIMS == set()
    assert KNOWN_FALSE_CALL_CLAIMS - found == set(), "the doc was fixed: delete it from KNOWN_FALSE_CALL_CLAIMS"


# a module the role does not call (the collection ships none today: every module is the role's)
UNCALLED = "trainer_extra"


@pytest.mark.parametrize("doc_text, problem", [
    ("`trainer_extra` and `trainer_restart` are standalone modules for playbooks outside the role (the role calls "
     "none of them).", "calls none of trainer_restart"),
    ("| modules: `trainer_extra`, `trainer_release` (standalone, for playbooks outside the role) |",
     "trainer_release is standalone"),
    ("The role is thin; it calls `trainer_extra` before the stop.", "the role calls trainer_extra"),
    ("decided in one function, which the role calls through the `restart_nope` filter.", "restart_nope filter"),
    ("The `stop` entry point runs `trainer_restart state=halt`.", "trainer_restart runs with state=halt"),
])
def test_a_false_call_claim_fails(doc_text, problem):
    modules = _modules() | {UNCALLED}
    assert UNCALLED not in role_calls()["modules"]
    found = call_claim_problems(doc_text, role_calls(), modules)
    assert any(problem in p for p in found), found
    assert call_claim_problems("`trainer_extra` is a standalone module for playbooks outside the role "
                               "(the role calls none of them; it calls `trainer_install` once). It runs "
                               "`trainer_restart operation=stop`.", role_calls(), modules) == []


# -- the number of remote calls (the lab counts them: tests/lab/test_round_trips.py) -----------------

ROUND_TRIPS = os.path.join(ROOT, "tests", "lab", "test_round_trips.py")
# which lab test counts which case, by its name; what the docs say of that case
CASES = {
    "no_op": (r"no_op", r"(?:changes nothing|no-op)\b[^.;]*?\b(\w+) remote calls?\b"),
    "forced_restart": (r"forced_restart", r"forced restart of the current release (?:is )?(\w+)\b"),
    "status": (r"status", r"\bstatus (?:is |makes )?(?:at most )?(\w+) remote calls?\b"),
}


def lab_counts(source=None):
    """{case: (op, n)}: what each round-trip test of the lab asserts of ``calls(...)`` - a literal or a
    module-level constant of that file."""
    tree = ast.parse(text(ROUND_TRIPS) if source is None else source)
    consts = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)}
    out = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
        case = next((c for c, (name_re, _why) in CASES.items() if re.search(name_re, fn.name)), None)
        for node in ast.walk(fn):
            if not isinstance(node, ast.Compare):
                continue
            terms = [node.left] + node.comparators
            if not any(isinstance(t, ast.Call) and getattr(t.func, "id", None) == "calls" for t in terms):
                continue
            for op, (a, b) in zip(node.ops, zip(terms, terms[1:])):
                other = b if isinstance(a, ast.Call) else a
                n = other.value if isinstance(other, ast.Constant) else consts.get(getattr(other, "id", None))
                if case and isinstance(n, int):
                    kind = {ast.Eq: "==", ast.LtE: "<=", ast.GtE: ">="}.get(type(op))
                    if kind and not (kind == ">=" and isinstance(a, ast.Constant)):
                        out.setdefault(case, []).append((kind if isinstance(a, ast.Call) else
                                                         {"<=": ">=", ">=": "<="}.get(kind, kind), n))
    return {c: dict(v) for c, v in out.items()}


def round_trip_problems(doc_text, counts):
    out = []
    body = flat(doc_text)
    for case, (_name_re, said_re) in CASES.items():
        for m in re.finditer(said_re, body):
            word = m.group(1).lower()
            n = WORDS.get(word, int(word) if word.isdigit() else None)
            if n is None:
                continue
            lab = counts.get(case)
            if lab is None:
                out.append("%r: no lab test counts this case" % m.group(0))
            elif "==" in lab and n != lab["=="] or "<=" in lab and "==" not in lab and n != lab["<="]:
                out.append("%r: the lab counts %s" % (m.group(0), lab))
    return out


def test_the_round_trip_counts_are_the_labs():
    counts = lab_counts()
    assert counts.get("no_op", {}).get("==") is not None and counts.get("forced_restart", {}).get("==") is not None
    said = [m for d in DOCS for c in ("no_op", "forced_restart") for m in re.finditer(CASES[c][1], flat(text(d)))]
    assert len(said) >= 3, said                # README, operating.md and design.md say the no-op's count
    assert [p for d in DOCS for p in round_trip_problems(text(d), counts)] == []


@pytest.mark.parametrize("doc_text, problem", [
    ("Deploying the same code again changes nothing and costs two remote calls.", "changes nothing"),
    ("Deploying it again is a no-op (3 remote calls) and adds no entry.", "no-op"),
    ("a forced restart of the current release 3 (status, the start call)", "forced restart of the current release 3"),
])
def test_a_wrong_round_trip_count_fails(doc_text, problem):
    found = round_trip_problems(doc_text, lab_counts())
    assert any(problem in p for p in found), found


def test_the_lab_counts_are_read_from_the_lab_test():
    src = "N = 4\ndef test_no_op_x():\n    assert calls(o) == N\ndef test_status_y():\n    assert 1 <= calls(o) <= 2\n"
    assert lab_counts(src) == {"no_op": {"==": 4}, "status": {">=": 1, "<=": 2}}
    assert round_trip_problems("changes nothing and costs one remote call", lab_counts(src)) != []
    assert round_trip_problems("changes nothing and costs four remote calls", lab_counts(src)) == []


# -- module defaults the docs state ("`trainer_restart`: `hold_s` 10, `stall_s` 5"; "`trainer_restart`'s
# `drain_max_mib` and `drain_timeout_s` are `trainer_drain_max_mib` and `trainer_drain_timeout_s`") ---------

def module_default_problems(doc_text, spec_of, defaults):
    out = []
    body = flat(doc_text)
    for m in re.finditer(r"`(\w+)`: ((?:`\w+` %s(?:, |;|\)|$))+)" % NUMBER, body):
        spec = spec_of(m.group(1))
        for opt, value in re.findall(r"`(\w+)` (%s)" % NUMBER, m.group(2)):
            if spec is not None and opt in spec and float(spec[opt].get("default") or 0) != float(value):
                out.append("%s's %s: stated default %s, the module has %r" % (
                    m.group(1), opt, value, spec[opt].get("default")))
    for m in re.finditer(r"`(\w+)`'s `(\w+)` and `(\w+)` are `(trainer_\w+)` and `(trainer_\w+)`", body):
        spec = spec_of(m.group(1))
        for opt, var in ((m.group(2), m.group(4)), (m.group(3), m.group(5))):
            if spec is not None and (opt not in spec or var not in defaults or
                                     spec[opt].get("default") != defaults[var]):
                out.append("%s's %s is said to be %s (%r); the module has %r" % (
                    m.group(1), opt, var, defaults.get(var), (spec.get(opt) or {}).get("default")))
    return out


def _spec_of(name):
    from test_defaults_once import argument_spec
    return argument_spec(name) if name in _modules() else None


def test_every_module_default_the_docs_state_is_the_modules():
    d = role_defaults()
    # (the docs may state none: the standalone modules whose role defaults they gave are gone)
    assert module_default_problems("`trainer_restart`'s `drain_max_mib` and `drain_timeout_s` are "
                                   "`trainer_drain_max_mib` and `trainer_drain_timeout_s`; `trainer_restart`: "
                                   "`hold_s` 10, `stall_s` 5;", _spec_of, d) == []
    assert [p for doc in DOCS for p in module_default_problems(text(doc), _spec_of, d)] == []
    assert any(formula_problems(t.replace("= 2715", "= 2716"), d) for t in (text(doc) for doc in DOCS)), \
        "the start limit's worked example is no longer found"


@pytest.mark.parametrize("doc_text, problem", [
    ("with the role's defaults (`trainer_restart`: `timeout_s` 300, `interval_s` 0.5;", "trainer_restart's timeout_s"),
    ("`trainer_restart`'s `drain_max_mib` and `drain_timeout_s` are `trainer_drain_max_mib` and "
     "`trainer_stop_timeout_s`", "trainer_restart's drain_timeout_s is said to be trainer_stop_timeout_s"),
])
def test_a_wrong_module_default_fails(doc_text, problem):
    found = module_default_problems(doc_text, _spec_of, role_defaults())
    assert any(problem in p for p in found), found


def test_the_readme_stays_the_users_and_short():
    """The README is for users of the collection: at most 250 lines (the lab, development and figures live in docs/)."""
    with open(os.path.join(ROOT, "README.md")) as fh:
        lines = fh.read().splitlines()
    assert len(lines) <= 250, len(lines)
