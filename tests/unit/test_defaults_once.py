"""Every default is written once: where a role default (roles/trainer/defaults/main.yml) reaches code
that has its own default for it, the two are equal; the code's fixed sets of accepted values are the
argument spec's ``choices:``.

Nothing here is a hand list of pairs. The pairs are found by scanning:

- the role's task files (every ``roles/trainer/tasks/*.yml``, blocks opened): a task calling module
  ``dflash.trainer.<m>`` with ``<option>: "{{ trainer_x }}"`` pairs ``trainer_x`` with the option's
  ``default=`` in ``<m>``'s argument spec (read from the module itself: its ``AnsibleModule`` is
  replaced by one that records the spec). Values that are internal variables of ``vars/main.yml``
  (``"{{ __trainer_install_args }}"``), their attributes (``__trainer_install_args.unit``) and
  Jinja dict literals (``{'stale_s': trainer_lock_stale_s, ...}``) are followed into suboptions;
- the code's own declarations: a module_utils ``VARIABLES`` dict (option -> role variable, e.g.
  ``proof.readiness.VARIABLES``) pairs that role variable with the defaults of the dataclass fields of
  that name in the same file, and with the option of that name in every module that takes all of
  the dict's options (``trainer_restart``);
- every ``DEFAULT_<NAME>`` constant of ``plugins/module_utils`` is paired with the one role
  variable whose name ends in ``_<name>`` (or with its file's ``VARIABLES`` entry); a constant
  that names no role default must be listed, with why, in ``NOT_ROLE_DEFAULTS``.

A difference found is a test failure unless it is listed in ``KNOWN_DIFFERENT`` (each with why it
is not fixed here); a listed difference that is gone fails too, so the list only ever shrinks.
``defaults/main.yml`` against ``meta/argument_specs.yml``'s ``default:`` is
tests/unit/test_argument_specs.py's (test_every_stated_default_is_the_roles_default).
"""
import ast
import copy
import dataclasses
import glob
import importlib
import os
import re

import pytest
import yaml
from role_tasks import tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(ROOT, "roles", "trainer")
PKG = "ansible_collections.dflash.trainer.plugins"

# DEFAULT_* constants of module_utils that are no role variable's default (why).
NOT_ROLE_DEFAULTS = {
    "proof.log_tail.DEFAULT_MAX_BYTES": "how much of a log one tail read takes; no role variable",
    "plan.decide.DEFAULT_JOB_WAIT_S": "how long a standalone trainer_plan (no settings) waits for a running job; the "
                                      "role's is the job's budget from its settings",
    "proof.preflight.DEFAULT_PROPERTIES": "systemd's own defaults of unit properties",
    "release.archive.DEFAULT_COMPRESSLEVEL": "gzip level of the release archive; no role variable",
    "target.command.DEFAULT_TIMEOUT_S": "the bound of one command a module runs (nvidia-smi, systemctl); no role variable",
    "proof.trainer_log.DEFAULT_KEEP_LINES": "lines of a start's log kept in memory; no role variable",
}

# Differences that are deliberate semantics of the code's default (why each): the test fails when one is
# gone - delete its line then. Every other code default of a role variable is the role's.
KNOWN_DIFFERENT = {
    "trainer_restart.lock_path": "module default '' means no lock at all (a standalone job); the role always "
                                 "passes trainer_lock_path",
    "trainer_restart.preflight.gpus": "suboption default [] means no GPU to check (a pre-flight of a CPU-only "
                                      "command); the role passes trainer_gpus",
    "trainer_status.history": "module default 0 means no history read (status, logs); history.yml passes "
                              "trainer_history_count",
}

_TYPES = {"int": int, "float": float, "str": str, "path": str, "bool": bool, "list": list, "dict": dict}
_CAST = re.compile(r"\s*\|\s*(?:int|float|bool|string)\s*")


def load(*parts):
    with open(os.path.join(ROLE, *parts), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def role_defaults():
    return load("defaults", "main.yml")


def module_names():
    return sorted(os.path.splitext(os.path.basename(p))[0]
                  for p in glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py"))
                  if not os.path.basename(p).startswith("_"))


class _Recorded(Exception):
    pass


_SPECS = {}


def argument_spec(module):
    """The argument spec module ``module``'s main() builds (its AnsibleModule replaced by a recorder)."""
    if module not in _SPECS:
        mod = importlib.import_module("%s.modules.%s" % (PKG, module))
        if not hasattr(mod, "main"):  # an action's documentation alone (it runs on the controller): its options
            _SPECS[module] = yaml.safe_load(mod.DOCUMENTATION)["options"]
            return _SPECS[module]
        seen = {}

        def record(*args, **kwargs):
            seen.update(copy.deepcopy(kwargs.get("argument_spec") or args[0]))
            raise _Recorded()

        saved = mod.AnsibleModule
        mod.AnsibleModule = record
        try:
            mod.main()
        except _Recorded:
            pass
        finally:
            mod.AnsibleModule = saved
        assert seen, "%s's main() built no AnsibleModule" % module
        _SPECS[module] = seen
    return _SPECS[module]


def option(spec, path):
    """The option at ``path`` (option, suboption, ...) of an argument spec; None when there is none."""
    node = {"options": spec}
    for name in path:
        node = (node.get("options") or {}).get(name)
        if node is None:
            return None
    return node


def task_files():
    return sorted(glob.glob(os.path.join(ROLE, "tasks", "*.yml")))


def module_calls(paths=None):
    """(file, module, args) of every task calling a module of the collection."""
    names = set(module_names())
    out = []
    for path in paths or task_files():
        with open(path, encoding="utf-8") as fh:
            for task in tasks(yaml.safe_load(fh)):
                for key, args in task.items():
                    m = re.fullmatch(r"dflash\.trainer\.(\w+)", str(key))
                    if m and m.group(1) in names:
                        out.append((os.path.relpath(path, ROOT), m.group(1), args if isinstance(args, dict) else {}))
    return out


def resolve(value, internal, depth=0):
    """What a task argument passes: a role variable's name, a dict of resolved values, or None.

    ``"{{ trainer_x }}"`` (``| int`` etc. allowed, ``... if C else omit`` too), ``"{{ __trainer_y }}"``
    and ``"{{ __trainer_y.key }}"`` (followed through vars/main.yml), a dict, or a Jinja dict literal
    ``{'key': trainer_x, ...}``."""
    if depth > 8:
        return None
    if isinstance(value, dict):
        out = {k: resolve(v, internal, depth + 1) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None} or None
    if not isinstance(value, str):
        return None
    m = re.fullmatch(r"\s*\{\{(.*)\}\}\s*", value, re.S)
    if not m:
        return None
    expr = _CAST.sub(" ", m.group(1)).strip()
    expr = re.sub(r"^(.*?)\s+if\s+.*\s+else\s+omit$", r"\1", expr, flags=re.S)
    expr = re.sub(r"^omit\s+if\s+.*?\s+else\s+(.*)$", r"\1", expr, flags=re.S).strip()
    if re.fullmatch(r"vars\s*\|\s*dflash\.trainer\.proof_options(?:\(.*\))?", expr, re.S):
        return proof_variables()
    m = re.fullmatch(r"(_{0,2}trainer_\w+)((?:\.\w+)*)", expr)
    if m:
        name, attrs = m.group(1), [a for a in m.group(2).split(".") if a]
        if not name.startswith("_"):
            return name if not attrs else None
        if name not in internal:
            return None
        got = resolve(internal[name], internal, depth + 1)
        for attr in attrs:
            got = got.get(attr) if isinstance(got, dict) else None
        return got
    pairs = re.findall(r"'(\w+)'\s*:\s*(_{0,2}trainer_\w+)\s*(?=[,}])", expr)
    if pairs and expr.startswith("{"):
        out = {k: resolve("{{ %s }}" % v, internal, depth + 1) for k, v in pairs}
        return {k: v for k, v in out.items() if v is not None} or None
    return None


def proof_variables():
    """{setting: role variable} the proof_options filter reads (the judge's table)."""
    from ansible_collections.dflash.trainer.plugins.module_utils.proof.readiness import PROOF_SETTINGS
    return dict((name, var) for name, (var, _kind, _default) in PROOF_SETTINGS.items())


def _flatten(resolved, path):
    if isinstance(resolved, str):
        yield resolved, path
    elif isinstance(resolved, dict):
        for k, v in resolved.items():
            yield from _flatten(v, path + (k,))


def task_pairs(calls=None):
    """{(role variable, module, option path)} the role's tasks pass."""
    internal = load("vars", "main.yml")
    out = set()
    for _path, module, args in (module_calls() if calls is None else calls):
        # trainer_restart's job: the role's job settings, spread under the task's own options
        job = resolve(args.get("job"), internal) if module == "trainer_restart" else None
        spread = dict(job or {}, **{k: v for k, v in args.items() if k != "job"})
        for opt, value in spread.items():
            # trainer_restart's proof: its settings go over the top-level options of the same names
            resolved = value if opt in (job or {}) and opt not in args else resolve(value, internal)
            for var, path in _flatten(resolved, () if opt == "proof" else (opt,)):
                out.add((var, module, path))
    return out


def utils_modules():
    out = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "plugins", "module_utils", "*", "*.py"))):
        name = os.path.splitext(os.path.relpath(path, os.path.join(ROOT, "plugins", "module_utils")))[0].replace("/", ".")
        if not name.endswith("__init__"):
            out[name] = importlib.import_module("%s.module_utils.%s" % (PKG, name))
    return out


def declared_variables():
    """{module_utils name: its VARIABLES dict} where that dict maps names to role variables."""
    out = {}
    for name, mod in utils_modules().items():
        v = getattr(mod, "VARIABLES", None)
        if isinstance(v, dict) and v and all(isinstance(x, str) and x.startswith("trainer_") for x in v.values()):
            out[name] = v
    return out


def coerce(kind, value):
    cast = _TYPES.get(kind)
    if value is None or cast is None:
        return value
    if cast in (int, float) and isinstance(value, bool):
        return value
    try:
        return cast(value)
    except (TypeError, ValueError):
        return value


def same(a, b):
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return list(a) == list(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def comparisons(defaults=None):
    """[(where, role variable, code default, role default)] for every pair found (code default None:
    the code has none, nothing to compare)."""
    defaults = role_defaults() if defaults is None else defaults
    out = {}
    for var, module, path in sorted(task_pairs()):
        spec = option(argument_spec(module), path)
        if var in defaults and spec is not None and spec.get("default") is not None:
            out["%s.%s" % (module, ".".join(path))] = (var, spec["default"], coerce(spec.get("type"), defaults[var]))
    utils = utils_modules()
    for uname, variables in declared_variables().items():
        mod = utils[uname]
        for cls in vars(mod).values():
            if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == mod.__name__:
                for f in dataclasses.fields(cls):
                    if f.name in variables and f.default is not dataclasses.MISSING and f.default is not None:
                        var = variables[f.name]
                        role = coerce(type(f.default).__name__, defaults[var])
                        out["%s.%s.%s" % (uname, cls.__name__, f.name)] = (var, f.default, role)
        for module in module_names():
            spec = argument_spec(module)
            if set(variables) <= set(spec):
                for opt, var in variables.items():
                    if spec[opt].get("default") is not None:
                        out.setdefault("%s.%s" % (module, opt), (var, spec[opt]["default"],
                                                                 coerce(spec[opt].get("type"), defaults[var])))
    for key, (var, value) in default_constants(defaults)[0].items():
        out[key] = (var, value, coerce(type(value).__name__, defaults[var]) if not isinstance(value, tuple)
                    else defaults[var])
    return out


def default_constants(defaults=None):
    """({"_file.DEFAULT_X": (role variable, value)}, [unpaired "_file.DEFAULT_X"])."""
    defaults = role_defaults() if defaults is None else defaults
    declared = declared_variables()
    paired, unpaired = {}, []
    for uname, mod in utils_modules().items():
        with open(mod.__file__, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        names = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                 if isinstance(t, ast.Name) and t.id.startswith("DEFAULT_")]
        for const in names:
            stem = const[len("DEFAULT_"):].lower()
            if stem in declared.get(uname, {}):
                candidates = [declared[uname][stem]]
            else:
                candidates = [v for v in defaults if v == "trainer_" + stem or v.endswith("_" + stem)]
            key = "%s.%s" % (uname, const)
            if len(candidates) == 1 and candidates[0] in defaults:
                paired[key] = (candidates[0], getattr(mod, const))
            else:
                unpaired.append(key)
    return paired, sorted(unpaired)


def differences(found):
    return sorted(k for k, (_var, code, role) in found.items() if not same(code, role))


@pytest.fixture(scope="module")
def found():
    return comparisons()


def test_the_scan_finds_the_pairs_it_must(found):
    """The scanner is not vacuous: the proof's, the release's and the lock's options are paired."""
    for key, var in (("trainer_restart.ready_regex", "trainer_ready_regex"),
                     ("trainer_restart.step_regex", "trainer_step_regex"),
                     ("trainer_restart.hold_s", "trainer_ready_hold_s"),
                     ("trainer_restart.tail_lines", "trainer_log_tail_lines"),
                     ("trainer_restart.preflight.timeout_s", "trainer_preflight_timeout_s"),
                     ("trainer_release.keep", "trainer_release_keep"),
                     ("trainer_release.excludes", "trainer_release_excludes"),
                     ("proof.readiness.Expectations.hold_s", "trainer_ready_hold_s"),
                     ("proof.trainer_log.DEFAULT_STEP_REGEX", "trainer_step_regex"),
                     ("proof.trainer_log.DEFAULT_ERROR_REGEXES", "trainer_error_regexes"),
                     ("proof.readiness.DEFAULT_STALL_S", "trainer_ready_stall_s"),
                     ("release.scan.DEFAULT_EXCLUDES", "trainer_release_excludes")):
        assert key in found and found[key][0] == var, (key, found.get(key))
    # the first read's lock (a Jinja dict literal; whichever module takes it)
    assert any(k.endswith(".lock.stale_s") and v[0] == "trainer_lock_stale_s" for k, v in found.items())
    assert len(found) >= 40, len(found)


def test_every_code_default_of_a_role_variable_is_the_roles_default(found):
    wrong = {k: "%s: code %r, role %r" % found[k] for k in differences(found)}
    unexpected = {k: v for k, v in wrong.items() if k not in KNOWN_DIFFERENT}
    assert unexpected == {}, unexpected
    assert sorted(set(KNOWN_DIFFERENT) - set(wrong)) == [], "fixed: delete these from KNOWN_DIFFERENT"


def test_the_progress_formats_are_written_once(found):
    """The regexes the proof reads the log with (proof.trainer_log's constants) are the role's defaults,
    character for character (YAML folds the role's copy)."""
    from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl
    d = role_defaults()
    assert (tl.DEFAULT_READY_REGEX, tl.DEFAULT_STEP_REGEX, tl.DEFAULT_TOKPS_REGEX, list(tl.DEFAULT_ERROR_REGEXES)) == (
        d["trainer_ready_regex"], d["trainer_step_regex"], d["trainer_tokps_regex"], d["trainer_error_regexes"])


def test_every_default_constant_is_paired_or_said_not_to_be_a_role_default():
    paired, unpaired = default_constants()
    assert unpaired == sorted(NOT_ROLE_DEFAULTS), "pair these with a role variable or say why not: %s" % (
        sorted(set(unpaired) ^ set(NOT_ROLE_DEFAULTS)))
    assert not set(paired) & set(NOT_ROLE_DEFAULTS)


def test_the_checks_can_fail(found):
    """A changed role default (a float, a regex, a list, a suboption's) is a difference; a new
    DEFAULT_ constant without a role variable is unpaired; a task passing a variable is followed
    through internal variables, attributes and Jinja dict literals."""
    d = copy.deepcopy(role_defaults())
    d["trainer_ready_hold_s"] = 11
    d["trainer_step_regex"] = r"step (\d+)"
    d["trainer_release_excludes"] = [".git"]
    d["trainer_preflight_timeout_s"] = 61
    d["trainer_lock_stale_s"] = 7200
    wrong = set(differences(comparisons(d))) - set(KNOWN_DIFFERENT)
    assert {"trainer_restart.hold_s", "proof.readiness.Expectations.hold_s",
            "proof.readiness.DEFAULT_HOLD_S", "trainer_restart.step_regex", "proof.trainer_log.DEFAULT_STEP_REGEX",
            "trainer_release.excludes", "release.scan.DEFAULT_EXCLUDES", "trainer_restart.preflight.timeout_s",
            } <= wrong, wrong
    assert any(k.endswith(".lock.stale_s") for k in wrong), wrong
    assert not same(1, True) and same((1, 2), [1, 2]) and same(900.0, 900)
    d["trainer_xyz_foo"] = 1
    d["trainer_abc_foo"] = 2
    internal = {"__trainer_a": {"x": "{{ trainer_p }}", "y": "{{ __trainer_b.z }}"},
                "__trainer_b": {"z": "{{ trainer_q }}"},
                "__trainer_c": "{{ {'lease_s': trainer_r | int, 'token': __trainer_t} if c else none }}"}
    assert resolve("{{ __trainer_a if v | bool else omit }}", internal) == {"x": "trainer_p", "y": "trainer_q"}
    assert resolve("{{ __trainer_a.y }}", internal) == "trainer_q"
    assert resolve("{{ omit if m else {'path': trainer_s, 'n': __trainer_j | int} }}", internal) == {
        "path": "trainer_s"}
    assert resolve("{{ trainer_x | int }}", internal) == "trainer_x"
    assert resolve("{{ 0 if trainer_f | bool else trainer_x }}", internal) is None   # a decision, not a pass-through
    assert task_pairs([("t.yml", "trainer_ready", {"hold_s": "{{ trainer_ready_hold_s }}",
                                                   "lock": "{{ __trainer_play_lock }}"})]) >= {
        ("trainer_ready_hold_s", "trainer_ready", ("hold_s",)),
        ("trainer_lock_lease_s", "trainer_ready", ("lock", "lease_s"))}


# -- choices -------------------------------------------------------------------------------------

def validator_choices():
    """{role variable: values} the validator accepts from a fixed set: in plugins/plugin_utils/_validate.py,
    a function naming one role variable (``name = "trainer_x"``) that refuses ``value not in CONST``,
    CONST a module-level tuple/list/frozenset of strings (``key in RESERVED`` refuses a set: no choices)."""
    from ansible_collections.dflash.trainer.plugins.plugin_utils import _validate
    with open(_validate.__file__, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    consts = {n: getattr(_validate, n) for n in dir(_validate)
              if isinstance(getattr(_validate, n), (tuple, list, frozenset)) and getattr(_validate, n)
              and all(isinstance(x, str) for x in getattr(_validate, n))}
    out = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        named = {node.value.value for node in ast.walk(fn) if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 and re.fullmatch(r"trainer_\w+", node.value.value)}
        used = {c.id for node in ast.walk(fn) if isinstance(node, ast.Compare)
                for op, c in zip(node.ops, node.comparators)
                if isinstance(op, ast.NotIn) and isinstance(c, ast.Name) and c.id in consts}
        if len(named) == 1 and len(used) == 1:
            out[named.pop()] = list(consts[used.pop()])
    return out


def code_choices():
    """{role variable: sorted choices} from the validator and from every module option with
    ``choices=`` the role's tasks pass a role variable to."""
    out = {k: sorted(v) for k, v in validator_choices().items()}
    for var, module, path in task_pairs():
        spec = option(argument_spec(module), path)
        if spec and spec.get("choices"):
            out[var] = sorted(set(out.get(var, [])) | set(spec["choices"]))
    return out


def spec_choices(specs):
    out = {}
    for entry, spec in specs.items():
        for name, opt in (spec.get("options") or {}).items():
            if "choices" in opt:
                out.setdefault(name, {})[entry] = sorted(opt["choices"], key=str)
    return out


def choice_problems(code, specs):
    out = []
    stated = spec_choices(specs)
    for var, values in sorted(code.items()):
        for entry, spec in sorted(specs.items()):
            opt = (spec.get("options") or {}).get(var)
            if opt is not None and sorted(opt.get("choices") or [], key=str) != values:
                out.append("%s: %s states choices %s; the code accepts %s" % (entry, var, opt.get("choices"), values))
    for var in sorted(set(stated) - set(code)):
        out.append("%s states choices the code does not enforce" % var)
    return out


@pytest.fixture(scope="module")
def specs():
    return load("meta", "argument_specs.yml")["argument_specs"]


def test_the_specs_choices_are_the_codes(specs):
    code = code_choices()
    assert "trainer_restart_policy" in code          # the scan finds the validator's fixed set
    assert choice_problems(code, specs) == []
    for var, values in code.items():                  # YAML's `no` is a string here, not false
        assert all(isinstance(v, str) for v in values), (var, values)
        default = role_defaults().get(var)
        assert default is None or default in values, (var, default)


def test_the_choice_check_can_fail(specs):
    wrong = copy.deepcopy(specs)
    wrong["main"]["options"]["trainer_restart_policy"] = dict(wrong["main"]["options"]["trainer_restart_policy"],
                                                              choices=["no", "always"])
    wrong["status"]["options"]["trainer_root"] = dict(wrong["status"]["options"]["trainer_root"], choices=["/opt/x"])
    problems = choice_problems(code_choices(), wrong)
    assert any(p.startswith("main: trainer_restart_policy states choices ['no', 'always']") for p in problems), problems
    assert "trainer_root states choices the code does not enforce" in problems
    assert any(p.startswith("main: trainer_restart_policy") for p in
               choice_problems(dict(code_choices(), trainer_restart_policy=["no"]), specs))
