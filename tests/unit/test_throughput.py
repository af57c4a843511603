"""Measured throughput, the ledger, the comparison and the gate (module_utils/proof/throughput.py)."""
import json

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.release import ledger as ld
from ansible_collections.dflash.trainer.plugins.module_utils.proof import throughput as t


def test_percentiles_match_numpy_linear():
    xs = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert t.percentile(xs, 0.5) == 30.0 and t.percentile(xs, 0.1) == 14.0 and t.percentile(xs, 0.9) == 46.0
    assert t.percentile([], 0.5) is None and t.percentile([7.0], 0.9) == 7.0


def test_summarize_drops_non_numbers():
    got = t.summarize([1.0, float("nan"), float("inf"), 3.0, "x", None], window_s=10)
    assert got == {"n": 2, "window_s": 10, "median": 2.0, "p10": 1.2, "p90": 2.8, "unreadable": 1}
    assert t.summarize([])["median"] is None


def led(*medians):
    return [t.entry("r%d" % i, "proved", {"tok_s": {"median": m, "n": 5}}, now=i) for i, m in enumerate(medians)]


def test_compare_with_previous_good_and_best():
    ledger = led(21900.0, 21500.0) + [t.entry("bad", "failed", {}, reason="x", now=9)]
    c = t.compare({"tok_s": {"median": 12400.0, "n": 58, "window_s": 60.0}}, ledger, "3e0a823", "git 4f1c2d9")
    assert c["words"] == ("release 3e0a823 (git 4f1c2d9): 12.4K tok/s (median of 58 samples over 60 s) — "
                          "previous r1: 21.5K (-42%), best 21.9K")
    assert c["previous_release"] == "r1" and c["change_pct"] == -42.3 and c["best_median"] == 21900.0


def test_compare_takes_the_entry_before_that_was_proved_whichever_release_and_says_when_nothing_to_compare():
    # a restart of r0 is compared with r0's own proof: the entry before it in time that was proved
    c = t.compare({"tok_s": {"median": 100.0, "n": 3, "window_s": 10.0}}, led(200.0), "r0")
    assert c["previous_release"] == "r0" and c["change_pct"] == -50.0
    c = t.compare({"tok_s": {"median": 100.0, "n": 3, "window_s": 10.0}}, [t.entry("x", "failed", {}, now=1)], "r0")
    assert c["previous_release"] is None and "no previous good release measured" in c["words"]


@pytest.mark.parametrize("ratio,median,refused", [(0.9, 12400.0, True), (0.9, 19400.0, False), (0, 1.0, False),
                                                  (0.9, None, False)])
def test_gate(ratio, median, refused):
    c = t.compare({"tok_s": {"median": median, "n": 3, "window_s": 10.0}}, led(21500.0), "new")
    got = t.gate(c, ratio)
    assert bool(got) == refused
    if refused:
        assert got == ("throughput gate: 12.4K tok/s is 58% of the previous good release r0 (21.5K tok/s); "
                       "trainer_min_tokps_ratio asks for at least 90%")


def test_ledger_is_atomic_bounded_and_survives_garbage(tmp_path):
    path = str(tmp_path / "ledger.json")
    assert ld.read_ledger(path) == []
    for i in range(60):
        ld.append_ledger(path, [t.entry("r%d" % i, "proved", {}, now=i)], keep=50)
    entries = ld.read_ledger(path)
    assert len(entries) == 50 and entries[0]["release"] == "r10" and entries[-1]["release"] == "r59"
    assert json.load(open(path))["version"] == 1
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    with open(path, "w") as fh:
        fh.write("{not json")
    assert ld.read_ledger(path) == []


def test_history_rows_newest_first_with_marks():
    ledger = led(100.0, 200.0)
    rows = t.history_rows(ledger, running="r1", current="r1", limit=5)
    assert [r["release"] for r in rows] == ["r1", "r0"] and rows[0]["marks"] == ["running", "current"]
    assert rows[0]["median"] == 200.0


def test_history_line():
    rows = t.history_rows([t.entry("abc", "rolled back", {"tok_s": {"median": 12400.0, "p10": 12000.0, "p90": 12800.0,
                                                                    "n": 16}, "q_hs": {"median": 7.0}},
                                   "git 1234567", reason="throughput gate: 12.4K", now=0)], current="abc")
    line = t.history_line(rows[0])
    assert line.startswith("abc ") and "rolled back" in line and "12.4K (12.0K-12.8K, 16)" in line
    assert "git 1234567" in line and "q_hs=7.0" in line and "<- current" in line and "[throughput gate" in line
