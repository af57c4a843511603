"""The chart of the optimization loop (issue 16 item 2): `history --plot` from a ledger fixture
(tests/unit/fixtures/ledger/incident.json: 21.5K, a crash at import rolled back, a 12.5K release
the gate rolled back, a release that failed with its rollback, the running 19.8K one). The rows
are made by the collection's own history_rows, as trainer_status returns them; the tests read the
drawn chart back (SVG text and element ids, the figure's data), not just that a file exists."""
from __future__ import annotations

import os
import struct
import xml.etree.ElementTree as ET

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.release import ledger as ld
from ansible_collections.dflash.trainer.plugins.module_utils.proof import throughput as t
from dflash_trainer import __main__ as cli
from dflash_trainer import plot
from dflash_trainer.results import HostResult, RunResult, TrainerStatus

LEDGER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "ledger", "incident.json")
EXPERIMENTS = os.path.join(os.path.dirname(LEDGER), "experiments.json")
RUNNING = "e5c0ffee00000005"
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def entries():
    return ld.read_ledger(LEDGER)


@pytest.fixture
def rows(entries):
    return t.history_rows(entries, running=RUNNING, current=RUNNING, limit=50)


# --- data shaping (pure) ---------------------------------------------------------------------------

def test_points_are_oldest_first_with_the_ledgers_figures(entries, rows):
    pts = plot.points(rows)
    assert [p.release for p in pts] == [e["release"] for e in entries]
    assert [p.verdict for p in pts] == [e["verdict"] for e in entries]
    assert [p.median for p in pts] == [(e["figures"].get("tok_s") or {}).get("median") for e in entries]
    assert pts[2].median is None and pts[2].p10 is None  # crashed at import: no figure
    assert pts[0].at.isoformat() == entries[0]["at"].replace("Z", "+00:00")
    assert all(p.threshold is None for p in pts)  # no ratio, no threshold


def test_only_the_newest_entry_of_the_running_release_is_running(rows):
    pts = plot.points(t.history_rows(ld.read_ledger(LEDGER), running="b2c0ffee00000002", limit=50))
    assert [p.index for p in pts if p.running] == [5]  # b2 appears at 1, 3 and 5
    assert [p.index for p in plot.points(rows) if p.running and p.current] == [7]


def test_thresholds_follow_the_gate_rule_of_the_collection(entries, rows):
    """ratio x the median of the entry before that was proved, where the gate judges it (another release),
    as proof.throughput.previous_proved and gate judge it."""
    pts = plot.points(rows, min_ratio=0.9)
    for i, p in enumerate(pts):
        prev = t.previous_proved(entries[:i])
        judged = prev is not None and prev["release"] != p.release
        want = round(0.9 * prev["figures"]["tok_s"]["median"], 1) if judged else None
        assert p.threshold == want, (i, p.threshold, want)
        if p.median is not None and prev is not None:  # the chart's bar is the gate's own
            refused = t.gate(t.compare(entries[i]["figures"], entries[:i], p.release), 0.9)
            assert bool(refused) == (want is not None and p.median < want), i
    assert pts[0].threshold is None and pts[4].threshold == round(0.9 * 21310.5, 1)
    assert pts[3].threshold is None and pts[5].threshold is None  # re-proofs of b2 right after b2's proof
    # the gate refused release d4 below its threshold and let e5 through above it
    assert pts[4].median < pts[4].threshold and pts[7].median >= pts[7].threshold
    assert t.gate(t.compare(entries[4]["figures"], entries[:4], entries[4]["release"]), 0.9)
    assert t.gate(t.compare(entries[7]["figures"], entries[:7], entries[7]["release"]), 0.9) is None


def test_an_experiment_is_a_point_of_its_own_labelled_with_its_configuration():
    """The same release with another command or environment: its own point, its own label, never a
    gate threshold against itself, and the running ring on the installed configuration's point."""
    entries = ld.read_ledger(EXPERIMENTS)
    ledger_rows = t.history_rows(entries, running="b2c0ffee00000002", running_config="9e1d4470", limit=50)
    pts = plot.points(ledger_rows, min_ratio=0.9)
    assert [(p.release[:2], p.config) for p in pts] == [("a1", None), ("b2", None), ("b2", "3fa1c2d9"),
                                                        ("b2", "9e1d4470"), ("c3", "9e1d4470")]
    assert plot.point_label(pts[3]) == "b2c0ffee\ngit 2b3c4d5\nconfig 9e1d4470"
    assert plot.point_label(pts[4]).endswith("\nconfig 9e1d4470\nno tok/s")
    assert plot.point_label(pts[0]) == "a1c0ffee\ngit 1a2b3c4"  # an entry of before: no configuration line
    assert [p.index for p in pts if p.running] == [3]
    # a bar where the release changed (c3's, though it failed before any figure), none for b2's experiments
    assert [p.threshold is not None for p in pts] == [False, True, False, False, True]


def test_labels_and_sources():
    assert plot.short_source("git 4d5e6f7 dirty") == "git 4d5e6f7+"
    assert plot.short_source("git 4d5e6f7") == "git 4d5e6f7"
    assert plot.short_source("content f6c0ffee00000006") == "content f6c0ffee"
    assert plot.short_source(None) == "-"
    p = plot.Point(0, "c3c0ffee00000003", None, "rolled back", None, None, None, None, "git 3c4d5e6")
    assert plot.point_label(p) == "c3c0ffee\ngit 3c4d5e6\nno tok/s"


def test_sparkline_scales_between_min_and_max_and_marks_missing_figures(rows):
    assert plot.sparkline([1, 2, None, 8]) == "▁▂·█"
    assert plot.sparkline([5, 5]) == "▅▅"
    assert plot.sparkline([None]) == "·"
    line = plot.sparkline_line(rows)
    assert line.startswith("tok/s per release, oldest → newest: ██·█▂█▁▇ ") and "(9.9K … 21.5K" in line
    assert plot.sparkline_line([]) is None


@pytest.mark.parametrize("path,fmt", [("h.png", "png"), ("a/h.SVG", "svg"), ("h.html", "html")])
def test_format_from_the_extension(path, fmt):
    assert plot.chart_format(path) == fmt


def test_an_unknown_extension_is_refused_naming_the_accepted_ones():
    with pytest.raises(ValueError, match=r"\.html, \.png, \.svg"):
        plot.chart_format("history.pdf")


# --- the drawn chart --------------------------------------------------------------------------------

def svg_tree(text):
    return ET.fromstring(text[text.index("<svg"):text.index("</svg>") + len("</svg>")])


def by_id(root):
    return {e.get("id"): e for e in root.iter() if e.get("id")}


def texts(element):
    return [e.text for e in element.iter(SVG + "text") if e.text]


def test_svg_has_a_point_a_label_and_a_band_per_release_and_the_threshold(rows, tmp_path):
    path = str(tmp_path / "history.svg")
    assert plot.render({"gpu-host": plot.points(rows, 0.9)}, path, 0.9) == "svg"
    root = svg_tree(open(path, encoding="utf-8").read())
    ids = by_id(root)
    pts = plot.points(rows, 0.9)
    assert sorted(i for i in ids if i.startswith("point-")) == sorted("point-%d" % p.index for p in pts)
    for p in pts:  # every point labelled with its release id and source
        assert texts(ids["label-%d" % p.index])[:2] == [p.release[:8], plot.short_source(p.source)]
    assert {i for i in ids if i.startswith("band-")} == {"band-%d" % p.index for p in pts if p.p10 is not None}
    assert [i for i in ids if i.startswith("running-")] == ["running-7"]
    # one dashed segment of the gate threshold per release that had a previous good one
    assert len(list(ids["gate-threshold"].iter(SVG + "path"))) == sum(p.threshold is not None for p in pts)
    words = texts(root)
    assert "gate: 90% of the previous good median" in words and "gpu-host" in words
    for legend in ("proved", "rolled back", "failed", "running", "p10–p90"):
        assert legend in words


def test_without_a_ratio_no_threshold_is_drawn(rows, tmp_path):
    path = str(tmp_path / "history.svg")
    plot.render({"gpu-host": plot.points(rows)}, path)
    assert "gate-threshold" not in by_id(svg_tree(open(path, encoding="utf-8").read()))


def test_the_figure_holds_the_ledgers_numbers(rows):
    pts = plot.points(rows, 0.9)
    fig = plot.figure({"gpu-host": pts}, 0.9)
    (ax,) = fig.axes
    artists = {a.get_gid(): a for a in ax.get_children() if a.get_gid()}
    line = artists["median-line"]
    measured = [p for p in pts if p.median is not None]
    assert list(line.get_xdata()) == [p.index for p in measured]
    assert list(line.get_ydata()) == [p.median for p in measured]
    assert list(artists["point-4"].get_ydata()) == [12450.8] and artists["point-4"].get_marker() == "v"
    assert artists["point-6"].get_marker() == "X"
    segments = artists["gate-threshold"].get_segments()
    assert [s[0][1] for s in segments] == [p.threshold for p in pts if p.threshold is not None]
    assert ax.get_ylim()[0] < min(p.p10 for p in measured)
    assert [tick.get_text() for tick in ax.get_xticklabels()][0] == pts[0].at.strftime("%m-%d %H:%M")


def test_one_row_per_host(rows):
    fig = plot.figure({"a": plot.points(rows), "b": plot.points(rows[:2]), "empty": []})
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["a", "b"]
    with pytest.raises(ValueError, match="no release measured"):
        plot.figure({"a": []})


def test_html_is_a_self_contained_page_with_the_svg_inline_and_the_table(rows, tmp_path):
    path = str(tmp_path / "history.html")
    plot.render({"gpu-host": plot.points(rows, 0.9)}, path, 0.9)
    page = open(path, encoding="utf-8").read()
    assert page.startswith("<!DOCTYPE html>") and "<?xml" not in page
    assert "<script" not in page and "<link" not in page and "src=" not in page  # nothing fetched
    assert len(by_id(svg_tree(page))) > 8
    for e in ld.read_ledger(LEDGER):
        assert "<td>%s</td>" % e["release"] in page  # full ids in the table
    assert "ModuleNotFoundError: No module named &#x27;flash_attn&#x27;" in page


def test_the_chart_and_its_table_tell_experiments_apart(tmp_path):
    rows = t.history_rows(ld.read_ledger(EXPERIMENTS), limit=50)
    path = str(tmp_path / "history.html")
    plot.render({"gpu-host": plot.points(rows)}, path)
    page = open(path, encoding="utf-8").read()
    assert "<th>config</th>" in page and page.count("<td>9e1d4470</td>") == 2 and page.count("<td>3fa1c2d9</td>") == 1
    labels = [texts(by_id(svg_tree(page))["label-%d" % i]) for i in range(5)]
    assert [lab[2] if len(lab) > 2 else None for lab in labels] == [
        None, None, "config 3fa1c2d9", "config 9e1d4470", "config 9e1d4470"]


def test_png_is_a_png_of_the_figures_size(rows, tmp_path):
    path = str(tmp_path / "history.png")
    plot.render({"gpu-host": plot.points(rows)}, path)
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width > 800 and 300 < height < 1000
    assert not [n for n in os.listdir(str(tmp_path)) if ".tmp-" in n]


# --- the CLI ---------------------------------------------------------------------------------------

def history_result(rows):
    return RunResult(ok=True, rc=0, status="successful",
                     hosts={"gpu-host": HostResult(host="gpu-host", ok=True, status=TrainerStatus(history=rows))})


def test_history_prints_a_sparkline_under_the_table(rows):
    text = cli.describe(history_result(rows))
    lines = text.splitlines()
    table = lines.index(next(line for line in lines if line.strip().startswith("RELEASE")))
    assert lines[table + 1 + len(rows)].strip().startswith("tok/s per release, oldest → newest: ██·█▂█▁▇")


def test_cli_history_plot_writes_the_chart_and_asks_for_the_whole_ledger(rows, tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_run(playbook, **kwargs):
        seen.update(kwargs, playbook=playbook)
        return history_result(rows)

    monkeypatch.setattr(cli.api, "run_playbook_live", fake_run)
    path = str(tmp_path / "h.svg")
    assert cli.main(["history", "-l", "gpu-host", "-q", "--plot", path, "-e", "trainer_min_tokps_ratio=0.9"]) == 0
    assert seen["playbook"] == "history" and seen["extravars"]["trainer_history_count"] == cli.PLOT_HISTORY
    ids = by_id(svg_tree(open(path, encoding="utf-8").read()))
    assert "gate-threshold" in ids and len([i for i in ids if i.startswith("point-")]) == len(rows)
    assert "chart: %s (gpu-host: 8 releases)" % path in capsys.readouterr().err


def test_cli_plot_without_history_writes_nothing_and_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli.api, "run_playbook_live", lambda playbook, **kw: history_result([]))
    path = tmp_path / "h.png"
    assert cli.main(["history", "-q", "--plot", str(path)]) == 1
    assert not path.exists() and "no release measured yet" in capsys.readouterr().err


@pytest.mark.parametrize("argv,words", [
    (["history", "--plot", "h.pdf"], "one of .html, .png, .svg"),
    (["status", "--plot", "h.png"], "only go with history"),
    (["history", "--plot", "h.png", "--min-tokps-ratio", "1.5"], "between 0 and 1"),
])
def test_cli_plot_usage_errors_come_before_any_run(argv, words, monkeypatch, capsys):
    monkeypatch.setattr(cli.api, "run_playbook_live", lambda *a, **k: pytest.fail("ran a playbook"))
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_without_matplotlib_the_cli_says_how_to_install_it(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    monkeypatch.setattr(cli.api, "run_playbook_live", lambda *a, **k: pytest.fail("ran a playbook"))
    with pytest.raises(plot.PlotUnavailable, match=r"pip install 'dflash-trainer\[plot\]'"):
        plot.require_matplotlib()
    with pytest.raises(SystemExit):
        cli.main(["history", "--plot", "h.png"])
    assert "the chart needs matplotlib" in capsys.readouterr().err
    # the table and the sparkline need no matplotlib
    assert "tok/s per release" in cli.describe(history_result(t.history_rows(ld.read_ledger(LEDGER))))
