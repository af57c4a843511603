"""Inputs that looked well formed and were not safe (plugin_utils/_validate.py): reserved
environment names, a key that holds NAME=value (never echoed), trainer_ready_min_steps 0, and
regexes that backtrack without end - refused on the controller, the matching timed in a child
process the controller kills at the budget."""
import os
import time

import pytest
import yaml

from ansible_collections.dflash.trainer.plugins.plugin_utils import _validate as v
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import (
    DEFAULT_ERROR_REGEXES,
    DEFAULT_READY_REGEX,
    DEFAULT_STEP_REGEX,
    DEFAULT_TOKPS_REGEX,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def problems(**changes):
    with open(os.path.join(ROOT, "roles", "trainer", "defaults", "main.yml")) as fh:
        d = yaml.safe_load(fh)
    d.update(trainer_src=os.path.join(ROOT, "examples", "trainer"), ansible_connection="dflash.trainer.pct",
             proxmox_vmid=200)
    d.update(changes)
    return [str(p) for p in v.check(d, "main")]


SECRET = "hf_s3cr3tValueNobodyMaySee"
LAUNCHER_MATCH_CHARS = "MATCH_CHARS = %d" % v.REGEX_LINE_CHARS


@pytest.mark.parametrize("key", ["INVOCATION_ID", "NOTIFY_SOCKET", "MAINPID", "LISTEN_FDS", "LISTEN_PID",
                                 "DFLASH_RELEASE", "DFLASH_RELEASE_DIR", "SYSTEMD_EXEC_PID", "JOURNAL_STREAM"])
def test_reserved_environment_names_are_refused_without_the_value(key):
    got = problems(trainer_env={key: SECRET})
    assert len(got) == 1 and got[0].startswith("trainer_env[%r]" % key), got
    assert "sets or reads" in got[0] and SECRET not in got[0]


def test_the_trainers_own_names_pass():
    assert problems(trainer_env={"HF_TOKEN": SECRET, "NCCL_DEBUG": "INFO", "MY_INVOCATION_ID": "x"}) == []


@pytest.mark.parametrize("key", ["HF_TOKEN=" + SECRET, "=" + SECRET, SECRET + "=", "A B=" + SECRET,
                                 "X " * 40 + SECRET])
def test_a_key_holding_a_value_is_never_echoed(key):
    got = problems(trainer_env={"OK": "1", key: "v"})
    assert len(got) == 1 and "its key number 2" in got[0], got
    assert SECRET not in got[0] and "HF_TOKEN" not in got[0]


def test_a_plain_bad_name_is_still_shown():
    got = problems(trainer_env={"MY-NAME": "v"})
    assert len(got) == 1 and "trainer_env['MY-NAME']" in got[0]


@pytest.mark.parametrize("value, ok", [(0, False), ("0", False), (1, True), (2, True)])
def test_min_steps_at_least_one(value, ok):
    got = problems(trainer_ready_min_steps=value)
    assert (got == []) == ok, got
    if not ok:
        assert got[0].startswith("trainer_ready_min_steps: is out of range") and "from 1 to" in got[0]


def test_the_default_regexes_are_not_slow():
    """What lets the checks skip timing them (PROVED_LINEAR): every one of the collection's own regexes."""
    items = [("ready", DEFAULT_READY_REGEX), ("step", DEFAULT_STEP_REGEX), ("tokps", DEFAULT_TOKPS_REGEX)]
    items += [("error%d" % i, rx) for i, rx in enumerate(DEFAULT_ERROR_REGEXES)]
    assert v.slow_regexes(items) == {}
    assert {rx for _label, rx in items} == v.PROVED_LINEAR


def test_only_regexes_the_user_set_are_timed(monkeypatch):
    timed = []
    monkeypatch.setattr(v, "slow_regexes", lambda items: timed.extend(items) or {})
    assert problems() == []
    assert timed == []  # the defaults: no timing child
    assert problems(trainer_step_regex=r"iter (\d+)") == []
    assert timed == [("trainer_step_regex", r"iter (\d+)")]


@pytest.mark.parametrize("var", ["trainer_step_regex", "trainer_tokps_regex", "trainer_ready_regex"])
def test_the_findings_regex_is_refused_within_the_budget(var):
    rx = r"^(([a-z ]+)+)+step(\d+)"  # 12 s on 18 characters, x9 per 2 more: it never ends on a real line
    t0 = time.monotonic()
    got = [p for p in problems(**{var: rx}) if p.startswith(var)]
    took = time.monotonic() - t0
    assert len(got) == 1 and "can hang the restart job" in got[0] and "was stopped" in got[0], got
    assert took < v.REGEX_START_S + 3 * v.REGEX_LINE_BUDGET_S + 5, took  # killed at the budget, not waited out


@pytest.mark.parametrize("rx", [r"step=(\d+)+x", r"(\w+\s?)+$", r".*.*.*=(\d+)", r"(a|a)*b(\d)", r"^(\d+)*$"])
def test_exponential_and_cubic_regexes_are_refused(rx):
    assert list(v.slow_regexes([("r", rx)])) == ["r"]


def test_every_regex_variable_is_timed_and_named():
    bad = r"(x+x+)+y(\d)"
    got = problems(trainer_error_regexes=["Traceback", bad], trainer_measure_regexes={"q": bad})
    labels = sorted(p.split(":")[0] for p in got)
    assert labels == ["trainer_error_regexes[1]", "trainer_measure_regexes['q']"], got


def test_a_slow_one_does_not_hide_the_next():
    got = v.slow_regexes([("a", r"^(([a-z ]+)+)+step(\d+)"), ("b", r"step=(\d+)"), ("c", r"(x+x+)+y")])
    assert sorted(got) == ["a", "c"]


def test_adversarial_lines_are_as_long_as_the_launchers_cut():
    lines = v.adversarial_lines(r"step=(\d+)+x")
    assert lines and all(len(line) == v.REGEX_LINE_CHARS for line in lines)
    assert any(line.startswith("step=00") for line in lines)
    with open(os.path.join(ROOT, "roles", "trainer", "files", "dflash-trainer-launch"), encoding="utf-8") as fh:
        assert LAUNCHER_MATCH_CHARS in fh.read()
