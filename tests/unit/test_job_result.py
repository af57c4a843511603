"""The restart job's result is declared once (module_utils/job/result.py, issue 14 item 4): the
job builds it through that declaration (an undeclared key cannot appear), trainer_restart's
RETURN documents exactly the declared keys, and the API reads only declared keys, each as its
declared type."""
import dataclasses
import json
import os
import re
import typing

import pytest
import yaml

from ansible_collections.dflash.trainer.plugins.module_utils.job import steps as rs
from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed
from ansible_collections.dflash.trainer.plugins.module_utils.job.result import (
    BY_NAME,
    FIELDS,
    KEYS,
    KINDS,
    JobResult,
    JobResultError,
    check,
    problems,
)
from ansible_collections.dflash.trainer.plugins.module_utils.job.restart import RestartJob
from ansible_collections.dflash.trainer.plugins.module_utils.job.stop import StopJob
from ansible_collections.dflash.trainer.plugins.modules import trainer_restart
from dflash_trainer.results import Proof, RestartJobResult, build_host_results
from test_restart_job import FakeLayout, FakeSteps, Lease  # pylint: disable=wrong-import-order
from test_restart_steps import params, release_root  # pylint: disable=wrong-import-order

ANSIBLE_TYPES = ("bool", "complex", "dict", "float", "int", "list", "raw", "str")


# --- the declaration ----------------------------------------------------------------------------

def test_each_key_is_declared_once_with_an_ansible_type_words_and_when_it_is_returned():
    assert len(KEYS) == len(set(KEYS)) == len(FIELDS) and set(BY_NAME) == set(KEYS)
    for f in FIELDS:
        assert f.type in ANSIBLE_TYPES and f.type in KINDS, f
        assert f.description.strip() and f.returned.strip(), f
        assert (f.elements is not None) == (f.type == "list"), f
        assert f.elements is None or f.elements in KINDS, f


def test_an_undeclared_key_raises_however_it_is_set():
    with pytest.raises(JobResultError, match="'rollback_reason' is not a key"):
        JobResult(ok=False, rollback_reason="x")
    result = JobResult(ok=True)
    with pytest.raises(JobResultError, match="'oK' is not a key"):
        result["oK"] = True
    with pytest.raises(JobResultError):
        result.update(outcome="fine", extra=1)
    assert result.to_dict() == {"ok": True}  # a refused update sets nothing
    with pytest.raises(JobResultError):
        JobResult.from_dict({"ok": True, "surprise": 1})
    with pytest.raises(JobResultError):
        check({"ok": True, "surprise": 1})


@pytest.mark.parametrize("key,value", [
    ("ok", "yes"), ("ok", 1), ("msg", ["a"]), ("proof", [1]), ("log_tail", "a line"), ("log_tail", ["a", 2]),
    ("warnings", {"a": 1}), ("failure_details", "x"), ("restarted", "false"),
])
def test_a_value_of_the_wrong_kind_raises(key, value):
    with pytest.raises(JobResultError, match=key):
        JobResult(**{key: value})
    assert problems({key: value})


def test_none_stands_for_what_the_job_has_not_got_and_values_of_the_declared_kinds_pass():
    data = {"ok": False, "proof": None, "failed_phase": None, "release": None, "log_tail": ("a", "b"),
            "restarted": False, "figures": {}, "warnings": []}
    assert check(data) is data and problems(data) == []
    assert problems(["not", "a", "dict"]) == ["the restart job's result is a list, not a dict"]


def test_to_dict_and_from_dict_give_the_result_back_json_included():
    result = JobResult(release="r2", restarted=False, rolled_back=False, proof=None)
    result.update(ok=True, proof={"main_pid": 7}, outcome="ready")
    result["warnings"] = ["w"]
    data = result.to_dict()
    assert data.__class__ is dict
    assert list(data) == ["release", "restarted", "rolled_back", "proof", "ok", "outcome", "warnings"]
    assert data is not result.to_dict()  # a copy
    assert JobResult.from_dict(data) == result == JobResult.from_dict(json.loads(json.dumps(data)))
    assert result["proof"] == {"main_pid": 7} and "ok" in result and result.get("failure") is None
    with pytest.raises(KeyError):
        result["failure"]  # pylint: disable=pointless-statement


# --- the job builds its result through it -------------------------------------------------------

class StopFails(FakeSteps):
    def stop(self):
        if self.n.get("stop"):
            self.calls.append("stop")
            raise StepFailed("Unable to stop unit dflash-trainer: busy")
        return super(StopFails, self).stop()


class LedgerFails(FakeLayout):
    def record(self, entries):
        raise OSError(28, "No space left on device")


class MarkGoodFails(FakeLayout):
    def mark_good(self, rid):
        raise OSError(30, "Read-only file system")


class MeasuredSteps(FakeSteps):
    def prove(self, invocation_id, n_restarts, reproof=False):
        proof = super(MeasuredSteps, self).prove(invocation_id, n_restarts)
        proof["figures"] = {"tok_s": {"median": 1000.0, "p10": 900.0, "p90": 1100.0, "n": 9, "window_s": 10.0}}
        return proof


def scenarios():
    """(name, result) of every way the job ends, each producing its own keys."""
    yield "proved", RestartJob(MeasuredSteps(), FakeLayout()).run()
    yield "rolled back", RestartJob(FakeSteps(fail=[("prove", 1, "no progress")]), FakeLayout()).run()
    yield "rollback failed", RestartJob(FakeSteps(fail=[("prove", 1, "a"), ("prove", 2, "b")]), FakeLayout()).run()
    yield "restored", RestartJob(FakeSteps(fail=[("drain", 1, "held"), ("drain", 2, "held")]),
                                 FakeLayout(current="cur", last_good="cur")).run()
    yield "restore failed", RestartJob(FakeSteps(fail=[("start", 1, "a"), ("start", 2, "b")]),
                                       FakeLayout(current="cur", last_good=None)).run()
    yield "stop of the failed trainer failed", RestartJob(StopFails(fail=[("prove", 1, "no progress")]),
                                                          FakeLayout(last_good=None)).run()
    yield "no rollback", RestartJob(FakeSteps(fail=[("prove", 1, "x")]), FakeLayout(), rollback=False).run()
    yield "ledger unwritable", RestartJob(FakeSteps(), LedgerFails()).run()
    yield "last good unwritable", RestartJob(FakeSteps(), MarkGoodFails()).run()
    yield "lease lost", RestartJob(FakeSteps(), FakeLayout(), lease=Lease(1)).run()
    yield "stopped on purpose", StopJob(FakeSteps(), lambda: {"running": True, "release": "r", "main_pid": 7},
                                        "dflash-trainer").run()


def test_every_way_the_job_ends_is_a_declared_result_and_every_declared_key_is_produced():
    seen = set()
    for name, result in scenarios():
        assert result.__class__ is dict, name
        assert problems(result) == [], name
        assert problems(json.loads(json.dumps(result))) == [], name
        seen.update(result)
    assert seen == set(KEYS)  # no declared key that the job never produces


@pytest.mark.parametrize("fail", [[], [("prove", 1, "no progress")]])
def test_an_undeclared_key_in_the_job_raises(fail):
    class Typo(RestartJob):
        def _record(self, result, records):
            result["ledger_eror"] = "typo"

    with pytest.raises(JobResultError, match="'ledger_eror' is not a key"):
        Typo(FakeSteps(fail=fail), FakeLayout()).run()


def test_run_restart_results_before_and_around_the_cycle_are_declared(tmp_path):
    p = params(tmp_path, root=str(release_root(tmp_path)), tokps_regex="(")
    assert problems(rs.run_restart(p, "systemctl", "smi", pid=os.getpid(), release_lock=lambda *a: None)) == []

    def broken(*_args):
        raise RuntimeError("no steps")

    other = tmp_path / "other"
    p = params(other, root=str(release_root(other)))
    assert problems(rs.run_restart(p, "systemctl", "smi", pid=os.getpid(), make_steps=broken)) == []


# --- the docs: trainer_restart's RETURN ---------------------------------------------------------

def test_trainer_restart_documents_exactly_the_declared_keys():
    documented = yaml.safe_load(trainer_restart.RETURN)["result"]
    assert documented["type"] == "dict"
    contains = documented["contains"]
    assert list(contains) == list(KEYS)
    for f in FIELDS:
        doc = contains[f.name]
        assert (doc["type"], doc.get("elements")) == (f.type, f.elements), f.name
        assert " ".join(doc["description"].split()) == " ".join(f.description.split()), f.name
        assert " ".join(doc["returned"].split()) == " ".join(f.returned.split()), f.name


# --- the role (and the controller's outcome for it) reads only declared keys ----------------------------------------------------------

def test_the_role_reads_only_declared_keys():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    read = set()
    for base in ("roles", "playbooks"):
        for where, _dirs, files in os.walk(os.path.join(root, base)):
            for name in files:
                if name.endswith((".yml", ".yaml")):
                    text = open(os.path.join(where, name)).read()
                    read.update(re.findall(r"__trainer_job\w*\.result\.(\w+)", text))
    # what the role shows of a job's end is read by the controller's outcome (plugin_utils/_watch.py)
    with open(os.path.join(root, "plugins", "plugin_utils", "_watch.py")) as fh:
        source = fh.read()
    body = source[source.index("\ndef outcome("):]
    body = body[:body.index("\ndef ", 1)]
    read.update(re.findall(r"\bresult(?:\.get\(|\[)\"(\w+)\"", body))
    assert read and read <= set(KEYS), sorted(read - set(KEYS))


# --- the API reads only declared keys, each as its declared type ---------------------------------

def _declared_type(hint):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    cls = args[0] if args else hint
    cls = typing.get_origin(cls) or cls
    return {bool: "bool", str: "str", int: "int", float: "float", dict: "dict", list: "list", Proof: "dict"}[cls]


def test_the_api_reads_declared_keys_as_their_declared_types():
    hints = typing.get_type_hints(RestartJobResult)
    for f in dataclasses.fields(RestartJobResult):
        assert f.name in BY_NAME, "the API reads %r, which the job's result does not declare" % f.name
        assert _declared_type(hints[f.name]) == BY_NAME[f.name].type, f.name


def _restart_event(result):
    return {"event": "runner_on_ok", "event_data": {
        "host": "gpu-host", "task": "Watch the restart job", "resolved_action": "dflash.trainer.trainer_restart",
        "res": {"changed": True, "finished": True, "phase": "done", "result": result}}}


def test_the_api_reads_what_the_job_returns():
    steps = MeasuredSteps(fail=[("prove", 1, "no progress")])
    result = RestartJob(steps, FakeLayout(current="new", last_good="old")).run()
    h = build_host_results([_restart_event(json.loads(json.dumps(result)))])[0]["gpu-host"]
    assert h.rolled_back and h.release == "old" and h.previous_release == "new" and h.restarted
    assert h.proof.main_pid == 42 and h.log_tail == ["boom"]
    job = RestartJobResult.from_result(result)
    assert job.rollback_proof.invocation_id == "inv2" and job.proof is None and job.figures is None

    h = build_host_results([_restart_event(RestartJob(MeasuredSteps(), FakeLayout()).run())])[0]["gpu-host"]
    assert h.restarted and not h.rolled_back and h.proof.tok_s == 1000.0 and h.figures["tok_s"]["n"] == 9
    assert h.comparison["words"].startswith("release new")
    assert RestartJobResult.from_result(None) == RestartJobResult()
