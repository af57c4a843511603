"""The experiment is the unit of history: the configuration id (module_utils/target/config_id.py) beside the
release id in every ledger entry, and the comparison with the entry before it that was proved
(module_utils/proof/throughput.py), whichever release and configuration it ran."""
import hashlib
import itertools
import json
import os
import stat

import pytest

from ansible_collections.dflash.trainer.plugins.filter.systemd_quote import systemd_env_file, systemd_exec_argv
from ansible_collections.dflash.trainer.plugins.module_utils.target import config_id as c
from ansible_collections.dflash.trainer.plugins.module_utils.job import steps as rs
from ansible_collections.dflash.trainer.plugins.module_utils.release import ledger as ld
from ansible_collections.dflash.trainer.plugins.module_utils.proof import throughput as t
from ansible_collections.dflash.trainer.plugins.module_utils.job.restart import RestartJob
from ansible_collections.dflash.trainer.plugins.plugin_utils._reads import history_lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LEDGER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "ledger", "experiments.json")
KEY = bytes(range(32))
ARGV = ["./run.sh", "--lr", "3e-4"]
ENV = {"HF_TOKEN": "hf_secretsecret", "DFLASH_PIN": "4711", "PYTHONUNBUFFERED": "1",
       "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_root"}
LAUNCHER = ["/usr/local/lib/dflash-trainer/launch", "--root", "/opt/dflash-trainer", "--log", "/workspace/t.log",
            "--log-max-mib", "512", "--log-keep", "3"]


# --- the id --------------------------------------------------------------------------------------------

def test_the_same_configuration_gives_the_same_short_id():
    a = c.config_id(ARGV, ENV, KEY)
    assert a == c.config_id(list(ARGV), dict(reversed(list(ENV.items()))), KEY)  # order of the mapping: none
    assert len(a) == c.ID_LEN == 8 and int(a, 16) >= 0


@pytest.mark.parametrize("argv,env", [
    (ARGV, dict(ENV, DFLASH_PIN="4712")),                    # one value
    (ARGV, dict(ENV, NCCL_ALGO="Ring")),                     # one more variable
    (ARGV, {k: v for k, v in ENV.items() if k != "HF_TOKEN"}),  # one fewer
    (ARGV, dict(ENV, TORCHINDUCTOR_CACHE_DIR="/var/cache/ind")),  # the role's own entries count too
    (["./run.sh", "--lr", "1e-4"], ENV),                     # the command
    (["./run.sh", "--lr 3e-4"], ENV),                        # its words, not its text
    (ARGV + [""], ENV),
])
def test_a_changed_command_or_environment_is_another_id(argv, env):
    assert c.config_id(argv, env, KEY) != c.config_id(ARGV, ENV, KEY)


def test_names_and_values_cannot_be_shifted_into_each_other():
    assert c.config_id(ARGV, {"A": "B=C"}, KEY) != c.config_id(ARGV, {"A=B": "C"}, KEY)
    assert c.config_id(["a b"], {}, KEY) != c.config_id(["a", "b"], {}, KEY)


def test_no_value_can_be_read_back_without_the_key():
    """A 4-digit secret is 10,000 guesses: an unkeyed hash of the argv and the environment gives it away
    in milliseconds. The keyed id matches no guess made without the key, and another key gives another id."""
    cid = c.config_id(ARGV, ENV, KEY)

    def unkeyed(pin):
        msg = json.dumps({"argv": ARGV, "env": sorted([k, v] for k, v in dict(ENV, DFLASH_PIN=pin).items())},
                         ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        return hashlib.sha256(msg.encode()).hexdigest()[:c.ID_LEN]

    guesses = ["%04d" % i for i in range(10000)]
    assert cid not in {unkeyed(g) for g in guesses}
    assert c.config_id(ARGV, ENV, os.urandom(32)) != cid
    # with the key the guess works - which is why the key stays on the target, beside the values it protects
    assert [g for g in guesses if c.config_id(ARGV, dict(ENV, DFLASH_PIN=g), KEY) == cid] == ["4711"]
    assert not any(v in cid for v in ENV.values() if len(v) >= 3)


def test_an_id_needs_a_key():
    with pytest.raises(ValueError):
        c.config_id(ARGV, ENV, b"")


# --- the key on the target -----------------------------------------------------------------------------

def test_the_key_is_made_once_private_and_kept(tmp_path):
    root = str(tmp_path)
    assert c.read_key(root) is None
    key = c.ensure_key(root)
    assert len(key) == 32 and c.ensure_key(root) == key == c.read_key(root)
    assert stat.S_IMODE(os.stat(c.key_path(root)).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [c.KEY_NAME]  # no temporary file left


def test_a_key_made_meanwhile_by_another_job_stands(tmp_path):
    root = str(tmp_path)
    theirs = b"\x01" * 32

    def urandom(n):  # another job publishes its key while this one writes its own
        with open(c.key_path(root), "w") as fh:
            fh.write(theirs.hex())
        return b"\x02" * n

    assert c.ensure_key(root, urandom=urandom) == theirs


def test_a_symlinked_or_malformed_key_is_never_used(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text(("ab" * 32) + "\n")
    (tmp_path / "root").mkdir()
    os.symlink(str(target), c.key_path(str(tmp_path / "root")))
    assert c.read_key(str(tmp_path / "root")) is None and c.ensure_key(str(tmp_path / "root")) is None
    (tmp_path / "r2").mkdir()
    (tmp_path / "r2" / c.KEY_NAME).write_text("not hex")
    assert c.read_key(str(tmp_path / "r2")) is None


# --- what systemd runs ---------------------------------------------------------------------------------

TRICKY = ["./run.sh", "a b", 'q"uote', "back\\slash", "50%", "$HOME", "tab\there".replace("\t", " "), "--", "é"]


def test_exec_start_reads_back_what_the_role_writes():
    unit = "[Service]\nType=exec\nExecStart=%s\nWorkingDirectory=/opt\n" % systemd_exec_argv(LAUNCHER + ["--"] + TRICKY)
    words = c.exec_start(unit)
    assert words == LAUNCHER + ["--"] + TRICKY
    assert c.trainer_argv(words) == TRICKY  # the first "--" ends the launcher's options
    assert c.exec_start("[Service]\nExecStart=/bin/a \\\n  'b c' d\n") == ["/bin/a", "b c", "d"]
    assert c.exec_start("[Service]\nExecStart=-/bin/true x\n") == ["/bin/true", "x"]
    assert c.exec_start("[Service]\nType=simple\n") is None
    with pytest.raises(ValueError):
        c.split_exec('"/bin/a')


def install(tmp_path, argv=None, env=None, launcher=None):
    argv, env = ARGV if argv is None else argv, ENV if env is None else env
    launcher = LAUNCHER if launcher is None else launcher
    root, unit, env_file = tmp_path / "root", tmp_path / "trainer.service", tmp_path / "trainer.env"
    root.mkdir(exist_ok=True)
    unit.write_text("[Service]\nExecStart=%s\nEnvironmentFile=%s\n" % (systemd_exec_argv(launcher + ["--"] + argv),
                                                                       env_file))
    env_file.write_text(systemd_env_file(env))
    return str(root), str(unit), str(env_file)


def test_the_installed_configuration(tmp_path):
    root, unit, env_file = install(tmp_path)
    # a reader never makes the key
    assert c.installed_config(root, unit, env_file) == (None, "no configuration key in %s" % root)
    cid, why = c.installed_config(root, unit, env_file, create=True)
    assert why is None and cid == c.config_id(ARGV, ENV, c.read_key(root))
    assert c.installed_config(root, unit, env_file) == (cid, None)
    # the launcher's own options are not the experiment; the trainer's command and environment are
    install(tmp_path, launcher=LAUNCHER[:-2] + ["--log-keep", "9"])
    assert c.installed_config(root, unit, env_file)[0] == cid
    install(tmp_path, env=dict(ENV, DFLASH_PIN="1234"))
    assert c.installed_config(root, unit, env_file)[0] not in (None, cid)
    install(tmp_path, argv=ARGV + ["--compile"])
    assert c.installed_config(root, unit, env_file)[0] not in (None, cid)
    os.unlink(env_file)
    assert c.installed_config(root, unit, env_file)[0] is None
    assert c.installed_config(root, str(tmp_path / "none.service"), None)[0] is None


def test_the_job_reads_the_unit_and_environment_it_installed(tmp_path):
    root, unit, env_file = install(tmp_path)
    p = {"root": root, "unit": "dflash-trainer", "env_file": "/nowhere",
         "install": {"unit_path": unit, "env_path": env_file}}
    cid = c.job_config_id(p)
    assert cid and cid == c.installed_config(root, unit, env_file)[0]
    assert c.job_config_id({"root": None, "unit": "x", "env_file": None}) is None


# --- the ledger keeps the id, never a value ------------------------------------------------------------

class Steps(object):
    def __init__(self, medians):
        self.medians = list(medians)

    def stop(self):
        return {}

    drain = stop

    def purge(self):
        return True

    def start(self):
        return {"invocation_id": "inv", "n_restarts": 0}

    def prove(self, invocation_id, n_restarts, reproof=False):
        return {"main_pid": 42, "step": 7, "tok_s": 1.0, "figures": {
            "tok_s": {"median": self.medians.pop(0), "p10": 1.0, "p90": 2.0, "n": 9, "window_s": 10.0}}}

    def unit_state(self):
        return "running"


def deploy(tmp_path, release, env, median, ratio=None):
    """A deploy of ``release`` with ``env``: install, then a restart job that writes the real ledger."""
    root, unit, env_file = install(tmp_path, env=env)
    os.makedirs(os.path.join(root, "releases", release), exist_ok=True)
    if c.read_key(root) is None:  # a known key and clock: the test reads the same ledger on every run
        with open(c.key_path(root), "w") as fh:
            fh.write(KEY.hex())
    layout = rs.Layout(root, secrets=sorted({v for v in env.values() if len(v) >= 3}))
    layout.switch(release)
    p = {"root": root, "unit": "u", "env_file": env_file, "install": {"unit_path": unit, "env_path": env_file}}
    return RestartJob(Steps([median, median]), layout, purge=False, source="git 1234567", min_tokps_ratio=ratio,
                      config_id=lambda: c.job_config_id(p), clock=lambda: 1796052000.0).run(), layout


def test_an_environment_only_deploy_is_its_own_entry_compared_with_the_one_before(tmp_path):
    first, layout = deploy(tmp_path, "r1", ENV, 20000.0)
    second, layout = deploy(tmp_path, "r1", dict(ENV, DFLASH_PIN="4712"), 18000.0, ratio=0.95)
    entries = layout.ledger()
    assert [(e["release"], e["verdict"]) for e in entries] == [("r1", "proved"), ("r1", "proved")]
    a, b = entries[0]["config"], entries[1]["config"]
    assert a and b and a != b
    cmp = second["comparison"]
    assert (cmp["config"], cmp["previous_config"], cmp["previous_release"], cmp["change_pct"]) == (b, a, "r1", -10.0)
    assert "previous r1: 20.0K (-10%%), config %s vs %s (command or environment changed)" % (b, a) in cmp["words"]
    # the gate judges a change of code: an experiment with the same release is compared, not refused
    assert second["ok"]
    # no value, short or long, reaches the ledger; the ids are whole (never masked)
    text = open(layout.ledger_path).read()
    assert not any(v in text for v in ("hf_secretsecret", "4711", "4712"))
    rows = t.history_rows(entries, running="r1", current="r1", running_config=b)
    assert [r["config"] for r in rows] == [b, a] and [r["marks"] for r in rows] == [["running", "current"], ["current"]]
    assert rows[0]["vs"]["words"] == "config %s vs %s: -10%% (command or environment changed)" % (b, a)
    assert rows[1]["vs"] is None
    assert rows[0]["line"].startswith("r1%s%s  " % (" " * 16, b))
    assert "(config %s vs %s: -10%%" % (b, a) in rows[0]["line"]


def test_the_same_deploy_twice_is_the_same_configuration(tmp_path):
    deploy(tmp_path, "r1", ENV, 20000.0)
    second, layout = deploy(tmp_path, "r1", ENV, 20100.0)
    a, b = [e["config"] for e in layout.ledger()]
    assert a == b and "(nothing changed)" in second["comparison"]["words"]


# --- the comparison ------------------------------------------------------------------------------------

def proved(release, config, median, now, **kw):
    return t.entry(release, t.PROVED, {"tok_s": {"median": median, "n": 9}}, "git 1234567", now=now, config=config,
                   **kw)


@pytest.mark.parametrize("release,config,words", [
    ("r2", "aaaa0001", "code changed"),
    ("r1", "bbbb0002", "command or environment changed"),
    ("r2", "bbbb0002", "code, command or environment changed"),
    ("r1", "aaaa0001", "nothing changed"),
    ("r1", None, "same code; configuration not recorded"),
])
def test_what_changed_in_words(release, config, words):
    assert t.what_changed(release, config, proved("r1", "aaaa0001", 1.0, 1)) == words


def test_compare_with_the_previous_configuration_in_time():
    ledger = [proved("r1", "aaaa0001", 21000.0, 1), proved("r1", "bbbb0002", 19000.0, 2),
              t.entry("r2", "failed", {}, reason="boom", now=3, config="cccc0003")]
    cmp = t.compare({"tok_s": {"median": 20900.0, "n": 9, "window_s": 10.0}}, ledger, "r2", "git 7654321",
                    config="bbbb0002")
    assert cmp["words"] == ("release r2 (git 7654321): 20.9K tok/s (median of 9 samples over 10 s) — previous r1: "
                            "19.0K (+10%), config bbbb0002 vs bbbb0002 (code changed), best 21.0K")
    assert (cmp["previous_release"], cmp["previous_config"], cmp["previous_at"]) == ("r1", "bbbb0002", ledger[1]["at"])
    # no previous proof: the configuration is still named
    cmp = t.compare({"tok_s": {"median": 1.0, "n": 1, "window_s": 1.0}}, [], "r1", config="aaaa0001")
    assert cmp["words"].endswith("no previous good release measured, config aaaa0001, best 1")


def test_the_gate_refuses_a_slower_release_not_a_slower_experiment():
    ledger = [proved("r1", "aaaa0001", 20000.0, 1)]
    new_code = t.compare({"tok_s": {"median": 12000.0, "n": 9}}, ledger, "r2", config="aaaa0001")
    assert t.gate(new_code, 0.9).startswith("throughput gate: 12.0K tok/s is 60% of the previous good release r1")
    knob = t.compare({"tok_s": {"median": 12000.0, "n": 9}}, ledger, "r1", config="bbbb0002")
    assert knob["change_pct"] == -40.0 and t.gate(knob, 0.9) is None


def test_old_entries_without_a_configuration_still_read():
    ledger = ld.read_ledger(LEDGER)
    assert "config" not in ledger[0] and ledger[-1]["config"]
    rows = t.history_rows(ledger, running="b2c0ffee00000002", current="b2c0ffee00000002", limit=50)
    by_at = {r["at"]: r for r in rows}
    old = by_at[ledger[0]["at"]]
    assert old["config"] is None and old["line"].startswith("a1c0ffee00000001  ?         2026-")
    first_known = by_at[ledger[2]["at"]]  # the first entry with an id, after two without
    assert first_known["vs"]["words"] == "config %s vs unknown: +1%% (same code; configuration not recorded before)" \
        % ledger[2]["config"]
    # the experiment: same release, another configuration, its own row compared with the one before it
    exp = by_at[ledger[3]["at"]]
    assert (exp["release"], exp["config"]) == (ledger[2]["release"], ledger[3]["config"]) != \
        (ledger[2]["release"], ledger[2]["config"])
    assert exp["vs"]["config"] == ledger[2]["config"] and "command or environment changed" in exp["vs"]["words"]
    # the running mark: the running release's rows of the installed configuration only
    rows = t.history_rows(ledger, running="b2c0ffee00000002", running_config=ledger[3]["config"], limit=50)
    assert [r["config"] for r in rows if "running" in r["marks"]] == [ledger[3]["config"]]
    cmp = t.compare({"tok_s": {"median": 1.0, "n": 1}}, ledger[:2], "x", config="dddd0004")
    assert "config dddd0004 vs unknown (code changed; configuration not recorded before)" in cmp["words"]


def test_the_history_header_names_the_columns_of_the_lines():
    header = t.HISTORY_HEADER
    line = t.history_rows([proved("b2c0ffee00000002", "aaaa0001", 21000.0, 1)])[0]["line"]
    for col, value in (("CONFIG", "aaaa0001"), ("WHEN", "1970-01-01T00:00:01Z"), ("VERDICT", "proved"),
                       ("TOK/S", "21.0K"), ("SOURCE", "git 1234567")):
        assert line.index(value) == header.index(col), col
    assert history_lines({"history": [{"line": line}]}) == [header, line]  # the role's table prints the same header
    with open(os.path.join(ROOT, "roles", "trainer", "tasks", "history.yml")) as fh:
        assert "show: history" in fh.read()  # ... as the lines its read returns (trainer_status's show)


def test_history_rows_keep_every_field_of_old_rows():
    row = t.history_rows([t.entry("r", "failed", {}, reason="boom", now=0)])[0]
    assert set(row) >= {"release", "config", "at", "verdict", "reason", "median", "p10", "p90", "n", "source",
                        "marks", "extra", "died", "vs", "line"}
    assert list(itertools.islice(t.history_rows([]), 1)) == []


def test_a_rollback_records_the_configuration_each_start_ran(tmp_path):
    """The failed release keeps the id of what it ran; the re-proof of the last good release is read again
    after the rollback (which may have put its proved environment back)."""
    root = tmp_path / "root"
    for rid in ("old", "new"):
        (root / "releases" / rid).mkdir(parents=True)
    layout = rs.Layout(str(root))
    layout.switch("old")
    layout.mark_good("old")
    layout.switch("new")
    ids = iter(["cccc0003", "aaaa0001"])
    steps = Steps([10000.0, 20000.0])
    layout.record([proved("old", "aaaa0001", 20000.0, 1)])
    res = RestartJob(steps, layout, purge=False, min_tokps_ratio=0.9, config_id=lambda: next(ids)).run()
    assert res["rolled_back"] and res["comparison"]["config"] == "cccc0003"
    assert [(e["release"], e["verdict"], e["config"]) for e in layout.ledger()[1:]] == [
        ("new", "rolled back", "cccc0003"), ("old", "proved", "aaaa0001")]


def test_a_configuration_that_cannot_be_read_leaves_the_entry_without_one(tmp_path):
    def broken():
        raise OSError("gone")

    layout = rs.Layout(str(tmp_path))
    (tmp_path / "releases" / "r1").mkdir(parents=True)
    layout.switch("r1")
    res = RestartJob(Steps([1.0]), layout, purge=False, config_id=broken).run()
    assert res["ok"] and "config" not in layout.ledger()[0] and res["comparison"]["config"] is None
