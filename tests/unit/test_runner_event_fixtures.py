"""The runner-event fixtures (fixtures/runner_events): trimmed as their recorder trims, and each
said in the README to be recorded from the lab (by record.py, which writes it) or hand-written."""
import glob
import importlib.util
import json
import os
import re

import pytest

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "runner_events")


def recorder():
    spec = importlib.util.spec_from_file_location("record_runner_events", os.path.join(FIXTURES, "record.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


record = recorder()

PROPS = dict({"Prop%d" % i: str(i) for i in range(200)}, ActiveState="active", SubState="running")


def test_trim_keeps_result_and_stats_events_and_only_their_named_keys():
    raw = [
        {"event": "playbook_on_start", "counter": 1, "event_data": {"playbook": "deploy.yml"}},
        {"event": "runner_on_start", "counter": 2, "event_data": {"host": "h", "task": "t"}},
        {"event": "runner_on_ok", "counter": 3, "created": "2026-12-02T03:00:00.000001", "uuid": "u",
         "stdout": "ok: [h]", "event_data": {
             "host": "h", "task": "t", "task_action": "dflash.trainer.trainer_status",
             "resolved_action": "dflash.trainer.trainer_status", "ignore_errors": None, "play": "p",
             "task_args": "", "remote_addr": "127.0.0.1", "uuid": "x",
             "res": {"changed": False, "status": PROPS, "nested": [{"props": dict(PROPS)}],
                     "small": {"ActiveState": "active", "Id": "x"},
                     "invocation": {"module_args": {"state": "present", "src": "/x", "env_content": "A=1"}}}}},
        {"event": "verbose", "counter": 4, "stdout": "noise"},
        {"event": "runner_item_on_failed", "counter": 5,
         "event_data": {"host": "h", "task": "loop", "res": {"msg": "item broke"}}},
        {"event": "playbook_on_stats", "counter": 6, "uuid": "s", "event_data": {
            "ok": {"h": 3}, "failures": {}, "dark": {}, "changed": {}, "skipped": {}, "rescued": {},
            "ignored": {}, "processed": {"h": 1}, "playbook": "deploy.yml", "artifact_data": {}}},
        "junk", None,
    ]
    got = record.trim(raw)
    assert [e["event"] for e in got] == ["runner_on_ok", "runner_item_on_failed", "playbook_on_stats"]
    ok = got[0]
    assert set(ok) == {"event", "counter", "created", "event_data"}
    assert set(ok["event_data"]) == {"host", "task", "task_action", "resolved_action", "ignore_errors", "res"}
    res = ok["event_data"]["res"]
    assert res["status"] == {"ActiveState": "active", "SubState": "running"}  # systemd's properties cut to two
    assert res["nested"] == [{"props": {"ActiveState": "active", "SubState": "running"}}]
    assert res["small"] == {"ActiveState": "active", "Id": "x"}  # not a systemctl show: kept
    assert res["invocation"] == {"module_args": {"state": "present"}}  # results.py reads only the state
    assert got[1]["event_data"] == {"host": "h", "task": "loop", "res": {"msg": "item broke"}}
    assert set(got[2]["event_data"]) == set(record.STATS_KEYS)
    assert raw[2]["event_data"]["res"]["status"] is PROPS and len(PROPS) == 202  # the input is left alone


def fixture_names():
    return sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(FIXTURES, "*.json")))


@pytest.mark.parametrize("name", fixture_names())
def test_every_fixture_is_trimmed(name):
    with open(os.path.join(FIXTURES, name + ".json")) as fh:
        events = json.load(fh)
    assert events and record.trim(events) == events, "%s: run it through record.trim" % name
    assert events[-1]["event"] == "playbook_on_stats" or "no_recap" in name


def readme_lists():
    """(recorded, hand-written): the fixture names each paragraph of the README names."""
    with open(os.path.join(FIXTURES, "README.md")) as fh:
        text = fh.read()
    recorded_part, _sep, hand_part = text.partition("\n## Hand-written")
    return (set(re.findall(r"`(\w+)\.json`", recorded_part)), set(re.findall(r"`(\w+)\.json`", hand_part)))


def test_the_readme_says_which_fixtures_are_recorded_and_which_hand_written():
    recorded, hand = readme_lists()
    with open(os.path.join(FIXTURES, "record.py")) as fh:
        written = set(re.findall(r'rec\.run\("(\w+)"', fh.read()))
    assert written and recorded == written, (sorted(recorded ^ written))
    assert not recorded & hand
    assert recorded | hand == set(fixture_names()), sorted((recorded | hand) ^ set(fixture_names()))
