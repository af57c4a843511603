"""bench/README.md's result tables are the runs' own files under bench/results/ (bench/report.py)."""
import importlib.util
import json
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
_SPEC = importlib.util.spec_from_file_location("bench_report", os.path.join(ROOT, "bench", "report.py"))
report = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(report)


def test_the_readme_tables_are_the_results_files():
    with open(report.README) as fh:
        text = fh.read()
    names = [m.group("name") for m in report.BLOCK.finditer(text)]
    assert sorted(names) == sorted(report.RENDER), names  # every results file has its table
    assert report.render(text) == text, "run: python bench/report.py"


def test_a_changed_figure_is_caught(tmp_path):
    with open(report.results_file("field.json")) as fh:
        doc = json.load(fh)
    doc["rows"][0]["ours"]["wall_median"] += 1.0
    (tmp_path / "field.json").write_text(json.dumps(doc))
    with open(report.results_file("group-*.json")) as fh:
        (tmp_path / "group-2000-01-01.json").write_text(fh.read())
    with open(report.results_file("refusal.json")) as fh:
        (tmp_path / "refusal.json").write_text(fh.read())
    with open(report.README) as fh:
        text = fh.read()
    assert report.render(text, str(tmp_path)) != text


def test_a_missing_results_file_says_which(tmp_path):
    with pytest.raises(LookupError, match="bench/results/field.json"):
        report.render("<!-- results:field.json -->\nx\n<!-- /results:field.json -->", str(tmp_path))
