"""The metrics file (issue 16 item 3) is a file the collection writes as root: where it may live,
its mark, and the input check of trainer_metrics_path and the new numbers."""
import os

import pytest
import yaml

from ansible_collections.dflash.trainer.plugins.module_utils.target import ownership as o
from ansible_collections.dflash.trainer.plugins.plugin_utils import _validate as v

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "roles", "trainer", "files", "dflash-trainer-launch")
PROM = "/var/lib/node_exporter/textfile_collector/dflash_trainer.prom"


def defaults(**changes):
    with open(os.path.join(ROOT, "roles", "trainer", "defaults", "main.yml")) as fh:
        d = yaml.safe_load(fh)
    d["trainer_src"] = os.path.join(ROOT, "examples", "trainer")
    d.update(ansible_connection="dflash.trainer.pct", proxmox_vmid=200)
    d.update(changes)
    return d


def problems(**changes):
    return [str(p) for p in v.check(defaults(**changes), "main")]


def test_off_by_default_and_not_managed():
    d = defaults()
    assert d["trainer_metrics_path"] == "" and d["trainer_watch_s"] == 0
    assert problems() == []
    assert "trainer_metrics_path" not in [var for var, _k, _p in o.managed(d)]


@pytest.mark.parametrize("path", [PROM, "/var/lib/prometheus/node-exporter/dflash.prom",
                                  "/var/lib/dflash-trainer/metrics/trainer.prom", "/srv/metrics/trainer.prom"])
def test_accepted_places(path):
    assert problems(trainer_metrics_path=path) == []
    assert ("trainer_metrics_path", "metrics", path) in o.managed(defaults(trainer_metrics_path=path))


@pytest.mark.parametrize("path, words", [
    ("/var/lib/node_exporter/textfile_collector/x.txt", "does not end in .prom"),
    ("/var/lib/node_exporter/textfile_collector/.x.prom", "does not end in .prom"),
    ("relative.prom", "is a relative path"),
    ("/var/lib/node_exporter/../x.prom", "'..' component"),
    ("/etc/x.prom", "lies in /etc"),
    ("/var/lib/apt/x.prom", "lies in /var"),
    ("/var/lib/node_exporter/other/x.prom", "lies in /var"),
    ("/tmp/x.prom", "every user of the container can write"),
    ("/opt/dflash-trainer/m.prom", "lies inside trainer_root"),
])
def test_refused(path, words):
    got = problems(trainer_metrics_path=path)
    assert got and any(p.startswith("trainer_metrics_path") and words in p for p in got), got


def test_the_same_file_as_another_of_ours_is_refused():
    got = problems(trainer_metrics_path="/var/log/t.prom", trainer_log_path="/var/log/t.prom")
    assert any("trainer_metrics_path" in p and "same file as trainer_log_path" in p for p in got), got


def test_a_control_character_is_refused():
    assert any("control character" in p for p in problems(trainer_metrics_path=PROM + "\nx"))


@pytest.mark.parametrize("var, value", [("trainer_watch_s", -1), ("trainer_watch_s", "1e3"),
                                        ("trainer_metrics_interval_s", 0), ("trainer_metrics_window_s", "ten")])
def test_numbers(var, value):
    assert any(p.startswith(var) for p in problems(**{var: value}))


def test_only_the_metrics_file_may_live_in_the_textfile_directory():
    assert o.placement_problem("metrics", PROM) is None
    assert "lies in /var" in o.placement_problem("log", PROM)
    assert "lies in /var" in o.placement_problem("env", "/var/lib/prometheus/node-exporter/x.prom")


def observed(tmp_path, content):
    path = tmp_path / "m.prom"
    if content is not None:
        path.write_text(content)
    facts = o.observe(str(path), "metrics")
    facts["real"] = PROM  # judged as if in the textfile directory (tmp_path lies in /tmp)
    facts["chain"] = []  # and its directories as root's (the StrictModes walk of the real path is not faked)
    return facts


def test_a_file_with_the_launchers_mark_is_ours(tmp_path):
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("dflash_launch_m", LAUNCHER)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("dflash_launch_m", loader))
    loader.exec_module(mod)
    assert mod.METRICS_MARK.startswith(o.METRICS_MARK)
    text = mod.metrics_text({"up": True, "release": "r", "now": 1.0, "window_s": 60.0})
    assert o.judge("trainer_metrics_path", "metrics", observed(tmp_path, text)) is None
    assert o.judge("trainer_metrics_path", "metrics", observed(tmp_path, None)) is None


def test_another_file_is_refused_naming_it(tmp_path):
    why = o.judge("trainer_metrics_path", "metrics", observed(tmp_path, "# HELP node_x\nnode_x 1\n"))
    assert why and "was not written by dflash.trainer" in why and "the trainer's metrics file" in why
