"""bench/field.py's verdicts: ratios to the floor of the same run and pct delay."""
import importlib.util
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "field.py")
_SPEC = importlib.util.spec_from_file_location("field_bench", _PATH)
field = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(field)


def _row(case, ours, delay=0.0, plain=10.0):
    return {"case": case, "delay_s": delay, "speedup": round(plain / ours, 2),
            "ours": {"wall_median": ours, "wall_min": ours, "calls": 1},
            "plain": {"wall_median": plain, "wall_min": plain, "calls": 7}}


ROWS = [_row("no-op deploy", 1.2), _row("forced restart", 5.5), _row("status", 1.3),
        _row("floor: one remote call", 1.0), _row("no-op deploy", 2.8, delay=0.5),
        _row("floor: one remote call", 2.0, delay=0.5)]


def test_floors_are_per_delay():
    assert field.floors(ROWS) == {0.0: 1.0, 0.5: 2.0}


@pytest.mark.parametrize("row, own_s, ratio, words", [
    (ROWS[0], 3.0, 1.2, "1.20× the floor (≤ 1.3×: met)"),
    (ROWS[2], 3.0, 1.3, "1.30× the floor (≤ 1.2×: MISSED)"),
    (ROWS[4], 3.0, 1.4, "1.40× the floor (≤ 1.3×: MISSED)"),  # against the 0.5 s floor, not the 0 s one
    (ROWS[1], 3.0, 5.5, "the floor + trainer's own (3.00 s) + 1.50 s (≤ 1.5 s: met)"),
    (ROWS[1], 2.9, 5.5, "the floor + trainer's own (2.90 s) + 1.60 s (≤ 1.5 s: MISSED)"),
])
def test_verdicts(row, own_s, ratio, words):
    got_ratio, got_words = field.verdict(row, field.floors(ROWS)[row["delay_s"]], own_s)
    assert got_ratio == pytest.approx(ratio)
    assert got_words == words


def test_no_floor_no_verdict():
    assert field.verdict(ROWS[0], None, 3.0) == (None, "")
    assert field.verdict(ROWS[3], 1.0, 3.0) == (None, "")


def test_table_has_a_verdict_per_row():
    lines = field.table(ROWS, 3.0).splitlines()
    assert len(lines) == 2 + len(ROWS)
    assert "MISSED" in lines[2 + 4] and "met" in lines[2 + 0]


def test_a_paired_floor_wins_over_the_delays_floor():
    """Each of our runs comes right after a floor run of its own: the row's ratio is to those (the machine's
    speed drifting during the run moves both), the delay's floor only when none was paired."""
    row = _row("no-op deploy", 1.2)
    row["ours"]["floor_median"] = 1.0
    assert field.verdict(row, 0.6, 3.0) == (pytest.approx(1.2), "1.20× its paired floor (1.00 s) (≤ 1.3×: met)")
    row = _row("forced restart", 6.0)
    row["ours"]["floor_median"] = 1.5
    assert field.verdict(row, 1.0, 3.0)[1] == "its paired floor (1.50 s) + trainer's own (3.00 s) + 1.50 s (≤ 1.5 s: met)"
