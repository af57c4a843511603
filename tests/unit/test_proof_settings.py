"""The proof's settings are one table: the fields of proof.readiness.Expectations that name a role variable
(PROOF_SETTINGS). A setting is added there - a field, its role default, its argument spec entry and its use
in the judge - and reaches the role (the proof_options filter), trainer_restart (its ``proof`` option),
the job's Expectations and the CLI's check-log with no other edit. These tests hold the table to the
role's defaults and specs, hold the role to passing all of it in one dict, and add a fake setting to the
table to show that it flows through."""
import dataclasses
import glob
import importlib
import json
import os

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args

from ansible_collections.dflash.trainer.plugins.filter import trainer_run
from ansible_collections.dflash.trainer.plugins.module_utils.proof import readiness as rd
from ansible_collections.dflash.trainer.plugins.module_utils.job import options as ro
from ansible_collections.dflash.trainer.plugins.modules import trainer_restart
from role_tasks import tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(ROOT, "roles", "trainer")
SPEC_TYPES = {"int": "int", "float": "float", "str": "str", "tuple": "list"}
# entry points that restart (and so prove) the trainer
PROVING = ("main", "restart", "rollback", "start")


def load(*parts):
    with open(os.path.join(ROLE, *parts), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def restart_calls():
    out = []
    for path in sorted(glob.glob(os.path.join(ROLE, "tasks", "*.yml"))):
        for task in tasks(load("tasks", os.path.basename(path))):
            args = task.get("dflash.trainer.trainer_restart")
            if isinstance(args, dict):
                out.append((os.path.basename(path), args))
    return out


def test_the_table_is_the_judges_fields():
    names = list(rd.PROOF_SETTINGS)
    assert names[:7] == ["min_mib", "min_steps", "hold_s", "stall_s", "timeout_s", "tail_lines", "ready_regex"]
    assert {"step_regex", "tokps_regex", "error_regexes", "interval_s"} <= set(names)
    assert "invocation_id" not in names and "gpus" not in names      # what one start is, not a setting
    assert rd.VARIABLES == dict((n, v) for n, (v, _k, _d) in rd.PROOF_SETTINGS.items())


def test_every_setting_has_a_role_default_equal_to_the_judges_and_a_typed_spec_entry():
    defaults = load("defaults", "main.yml")
    specs = load("meta", "argument_specs.yml")["argument_specs"]
    for name, (var, kind, default) in rd.PROOF_SETTINGS.items():
        assert var in defaults, var
        role = defaults[var]
        assert (list(role) == list(default)) if kind == "tuple" else (role == default), (var, role, default)
        for entry in PROVING:
            opt = specs[entry]["options"].get(var)
            assert opt is not None, "%s: %s has no argument spec entry" % (entry, var)
            assert opt["type"] == SPEC_TYPES[kind], (entry, var, opt["type"], kind)


def test_the_role_passes_every_setting_in_one_dict_and_none_on_its_own():
    calls = restart_calls()
    proving = [(f, a) for f, a in calls if a.get("operation", "start") == "start"]
    assert {f for f, _a in proving} == {"run.yml", "group.yml"}, calls
    job = load("vars", "main.yml")["__trainer_job_args"]
    for f, args in proving:  # the job's settings carry the proof's, or the call names its own
        proof = args.get("proof") or (job["proof"] if args.get("job") == "{{ __trainer_job_args }}" else "")
        assert proof.replace(" ", "").startswith("{{vars|dflash.trainer.proof_options"), (f, proof)
    for f, args in calls:  # a setting passed beside the dict would be a second place to add it
        assert not set(args) & set(rd.PROOF_SETTINGS), (f, sorted(set(args) & set(rd.PROOF_SETTINGS)))


def test_the_filter_reads_each_setting_by_its_role_variable():
    variables = dict((var, "v-" + name) for name, (var, _k, _d) in rd.PROOF_SETTINGS.items())
    variables["trainer_unrelated"] = 1
    got = trainer_run.proof_options(variables)
    assert got == dict((name, "v-" + name) for name in rd.PROOF_SETTINGS)
    member = trainer_run.proof_options(variables, False)
    assert (member["ready_regex"], member["min_steps"]) == (".", 0) and member["hold_s"] == "v-hold_s"
    with pytest.raises(Exception, match="trainer_ready_hold_s is not defined"):
        trainer_run.proof_options({k: v for k, v in variables.items() if k != "trainer_ready_hold_s"})


@pytest.mark.parametrize("given,want", [
    ({"hold_s": "12", "min_steps": "3", "ready_regex": "ok", "error_regexes": ["E"]},
     {"hold_s": 12.0, "min_steps": 3, "ready_regex": "ok", "error_regexes": ["E"]}),
    ({}, {}),
])
def test_proof_options_are_typed(given, want):
    got = rd.proof_options(given)
    assert got == want and all(type(got[k]) is type(want[k]) for k in want)


@pytest.mark.parametrize("given,words", [
    ({"hold": 10}, "proof: unknown setting 'hold'"),
    ({"hold_s": "ten"}, "proof: hold_s (trainer_ready_hold_s) must be a float"),
    ({"min_steps": True}, "proof: min_steps (trainer_ready_min_steps) must be a int"),
    ({"error_regexes": "Traceback"}, "proof: error_regexes (trainer_error_regexes) must be a list"),
])
def test_a_bad_proof_setting_is_refused_by_name(given, words):
    with pytest.raises(ValueError) as exc:
        rd.proof_options(given)
    assert str(exc.value).startswith(words)


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            trainer_restart.main()
    return json.loads(capsys.readouterr().out)


def test_trainer_restart_refuses_an_unknown_proof_setting_before_anything(capsys, tmp_path):
    out = run_module({"operation": "start", "job_id": "j", "state_path": str(tmp_path / "s.json"),
                      "proof": {"hold_s": 10, "hold": 3}}, capsys)
    assert out["failed"] and out["msg"].startswith("proof: unknown setting 'hold'") and out["not_started"]
    assert not (tmp_path / "s.json").exists()


def test_the_proof_goes_over_the_top_level_options():
    params = dict((name, ro.RESTART_OPTIONS[name]["default"]) for name in rd.PROOF_SETTINGS)
    params["proof"] = {"timeout_s": "60", "min_mib": 10}
    ro.with_proof(params)
    assert (params["timeout_s"], params["min_mib"], params["hold_s"]) == (60.0, 10, 10.0)
    expect = rd.expectations("inv", 0, params, gpus=[0])
    assert (expect.timeout_s, expect.min_mib, expect.gpus, expect.tail_lines) == (60.0, 10, [0], 20)


# -- a setting added to the table flows through ---------------------------------------------------

@pytest.fixture()
def fake_setting(monkeypatch):
    """Expectations with one more proof setting (trainer_ready_fake_s), patched in where the table lives."""
    fake = dataclasses.make_dataclass(
        "Expectations", [("fake_s", float, rd._proof_setting(1.5, "trainer_ready_fake_s"))], bases=(rd.Expectations,))
    table = rd.proof_settings(fake)
    monkeypatch.setattr(rd, "Expectations", fake)
    monkeypatch.setattr(rd, "PROOF_SETTINGS", table)
    return fake


def test_a_new_setting_reaches_the_role_the_module_the_judge_and_check_log(fake_setting, monkeypatch):
    assert rd.PROOF_SETTINGS["fake_s"] == ("trainer_ready_fake_s", "float", 1.5)
    # the role: the filter reads it from the play's vars
    variables = dict((var, default) for _n, (var, _k, default) in rd.PROOF_SETTINGS.items())
    variables["trainer_ready_fake_s"] = "2.5"
    proof = trainer_run.proof_options(variables)
    assert proof["fake_s"] == "2.5"
    # the module: its proof option takes it, typed
    params = ro.with_proof({"proof": proof})
    assert params["fake_s"] == 2.5
    # the judge: the job's Expectations carry it
    assert rd.expectations("inv", 0, params).fake_s == 2.5
    # check-log: its table is the collection's
    check_log = importlib.import_module("dflash_trainer.check_log")
    coll = check_log.Collection(ROOT, None, rd, None, None, None, None)
    assert ("fake_s", "trainer_ready_fake_s") in check_log.proof_variables(coll)


def test_without_the_role_variable_a_new_setting_fails_the_task_by_name(fake_setting):
    variables = dict((var, default) for name, (var, _k, default) in rd.PROOF_SETTINGS.items() if name != "fake_s")
    with pytest.raises(Exception, match="trainer_ready_fake_s is not defined"):
        trainer_run.proof_options(variables)
