"""Deploy lock decisions (pure) and the module against a tmp directory."""
import json

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils._lock import (
    KEEP, REFUSE, STALE, decide, owner_record, parse_record, refusal_message)

NOW = 1_000_000.0


@pytest.mark.parametrize("record,token,expected", [
    ({"token": "t1", "owner": "a", "since": NOW - 10}, "t1", KEEP),
    ({"token": "t1", "owner": "a", "since": NOW - 10}, "t2", REFUSE),
    ({"token": "t1", "owner": "a", "since": NOW - 7200}, "t2", STALE),
    (None, "t2", STALE),
])
def test_decide(record, token, expected):
    assert decide(record, token, NOW, 3600) == expected


@pytest.mark.parametrize("text", ["", "{", "[]", '{"token": "x"}', '{"since": "yesterday"}'])
def test_unreadable_records(text):
    assert parse_record(text) is None


def test_record_round_trip_and_message():
    rec = parse_record(owner_record("t", "alice on laptop", NOW - 42))
    assert rec == {"token": "t", "owner": "alice on laptop", "since": NOW - 42}
    msg = refusal_message("/run/x.lock", rec, NOW)
    assert "alice on laptop since 42 s ago" in msg and "/run/x.lock" in msg
    assert json.loads(owner_record("t", "o", 1.0))["token"] == "t"
