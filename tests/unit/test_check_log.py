"""dflash-trainer check-log: captured logs replayed through the proof's own log reader and Judge
(the collection's proof.trainer_log / proof.readiness, the role defaults read from roles/trainer/defaults),
on a simulated clock, offline. Fixtures: tests/unit/fixtures/logs/ (tqdm "\\r" redraws, ANSI
colours, Megatron, HF Trainer, an import error, a crash mid-run, a stall captured with journalctl)."""
from __future__ import annotations

import json
import os
import sys

import pytest

import dflash_trainer
from dflash_trainer import api
from dflash_trainer.__main__ import main
from dflash_trainer.results import RunResult, TrainerLog

check_log = sys.modules["dflash_trainer.check_log"]  # the module (dflash_trainer.check_log is the API function)

LOGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "logs")


def log(name):
    return os.path.join(LOGS, name)


@pytest.fixture(scope="module")
def coll():
    return check_log.load_collection()


def check(name, coll, extravars=None, **kw):
    result, _defaults = check_log.check_file(log(name), extravars or {}, coll=coll, **kw)
    return result


def advised(result):
    return [a["variable"] for a in result.advice]


# ---- each fixture: the verdict and the line ---------------------------------------------------------

@pytest.mark.parametrize("name,state,line,variable", [
    # the loading bar (\r redraws) is not the training counter; the step lines prove it
    ("hf_loading_then_steps.log", "ready", 30, None),
    # TorchTitan's colours are taken out before the regexes read the line
    ("torchtitan_ansi.log", "ready", 21, None),
    # HF Trainer: the tqdm bar (redraws) counts; no tok/s anywhere: ready, but nothing measured
    ("hf_trainer_dictlog.log", "ready", 28, "trainer_tokps_regex"),
])
def test_fixture_that_passes(coll, name, state, line, variable):
    result = check(name, coll)
    assert (result.state, result.at_line) == (state, line), result.reason
    assert result.ok and result.reason.startswith("ready: ")
    assert (advised(result)[0] if result.advice else None) == variable
    ready_row = next(r for r in result.lines if r.n == line)
    assert ready_row.step_counted and ready_row.t == result.at_t or ready_row.t <= result.at_t


def test_import_error_fails_at_the_traceback_with_its_reason(coll):
    result = check("import_error.log", coll)
    assert result.state == "failed" and result.error_line == 5
    # the traceback arrives in one burst (as Python prints it): the verdict carries its exception line
    assert "ModuleNotFoundError: No module named 'flash_attn'" in result.reason
    assert {r.t for r in result.lines if 5 <= r.n <= 10} == {next(r.t for r in result.lines if r.n == 5)}
    assert advised(result) == ["trainer_error_regexes"]


def test_crash_mid_run_fails_at_the_ranks_traceback(coll):
    result = check("crash_mid_run.log", coll)
    assert result.state == "failed" and result.error_line == 9
    assert "torch.OutOfMemoryError: CUDA out of memory" in result.reason
    assert [r.step for r in result.lines if r.step_counted] == [1, 2, 3, 4, 5, 6]
    assert [r.n for r in result.lines if r.error] == [9, 14]  # the traceback, then "CUDA out of memory"


def test_stall_captured_with_journalctl(coll):
    result = check("stall_journal.log", coll)
    assert result.journal and result.clock == "timestamps"
    assert result.state == "failed" and result.at_line == 8 and "no progress" in result.reason
    assert result.start_words.startswith("the last start in the log: 5d2c0b3f9a1e4c7d8b6a5f4e3d2c1b0a")
    assert result.lines[0].marker and not result.lines[1].text.startswith("2026-")  # prefixes removed
    # a trainer that never rises again is not "fixed" by a longer stall window
    assert not any(a.get("verified") for a in result.advice)
    assert advised(result) == ["trainer_ready_stall_s"]


def test_megatron_is_proved_with_the_defaults(coll):
    """Megatron-LM prints "[before the start of training step] datetime: …" seconds before its first
    iteration line: a number beside no progress word, so no early word fires on it; the iterations
    (no tok/s: Megatron prints none) prove the trainer."""
    result = check("megatron.log", coll)
    assert result.clock == "timestamps" and result.state == "ready", result.reason
    assert result.ok and not [a for a in result.advice if a.get("verified")]
    assert any(r.step_counted for r in result.lines)
    assert not any("datetime" in r.text and r.step_counted for r in result.lines)


def test_a_capture_of_jsonl_records_is_read_as_the_proof_reads_it(coll, tmp_path):
    # a trainer that prints {"step": N, "tok_s": X} records on stdout: the proof's log reader reads their keys
    path = tmp_path / "jsonl.log"
    path.write_text("loading model\n" + "".join(
        json.dumps({"step": i, "tok_s": 21000.0 + i, "loss": 2.0}) + "\n" for i in range(1, 41)))
    result, _d = check_log.check_file(str(path), {}, coll=coll)
    assert result.ok and result.reason.startswith('ready: {"step": ')
    assert [(r.step, r.tok_s, r.step_counted) for r in result.lines[:3]] == [
        (None, None, False), (1, 21001.0, True), (2, 21002.0, True)]
    assert "trainer_tokps_regex" not in advised(result)


# ---- -e changes the verdict --------------------------------------------------------------------------

def test_step_regex_changes_the_verdict(coll, tmp_path):
    path = tmp_path / "custom.log"
    path.write_text("".join("progress: %d done | %d tok/s\n" % (i, 41000 + i) for i in range(1, 41)))
    before, _d = check_log.check_file(str(path), {}, coll=coll)
    assert not before.ok and not any(r.step_counted for r in before.lines)
    assert "trainer_step_regex" in advised(before)
    after, _d = check_log.check_file(str(path), {"trainer_step_regex": r"progress: (\d+)"}, coll=coll)
    assert after.ok and after.details["step"] == after.lines[after.at_line - 1].step
    # a step regex that reads nothing turns a passing log into a failing one
    broken = check("hf_loading_then_steps.log", coll, {"trainer_step_regex": r"\bepoch (\d+)"})
    assert broken.state == "failed" and not any(r.step_counted for r in broken.lines)


def test_cli_e_key_value_keeps_backslashes_and_changes_the_exit_status(tmp_path, capsys):
    path = tmp_path / "custom.log"
    path.write_text("".join("progress: %d done | %d tok/s\n" % (i, 41000 + i) for i in range(1, 41)))
    assert main(["check-log", str(path)]) == 1
    assert main(["check-log", str(path), "-e", r"trainer_step_regex=progress:\s*(\d+)"]) == 0
    out = capsys.readouterr().out
    assert "verdict: READY at line" in out and r"trainer_step_regex = 'progress:\\s*(\\d+)'" in out


def test_hold_and_stall_from_e(coll):
    short = check("crash_mid_run.log", coll, {"trainer_error_regexes": ["NO-SUCH-ERROR"],
                                              "trainer_ready_hold_s": "2", "trainer_ready_stall_s": "1"})
    assert short.ok and short.variables["trainer_ready_hold_s"] == "2"


# ---- bad input: exit 2, the variable named ----------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (["-e", "trainer_ready_stall_s=abc"], "trainer_ready_stall_s: is not a number"),
    (["-e", "trainer_ready_stall_s=20"], "trainer_ready_stall_s: is longer than trainer_ready_hold_s"),
    (["-e", "trainer_step_regex=step"], "trainer_step_regex: has no capture group"),
    (["-e", "trainer_step_rgex=x"], "did you mean trainer_step_regex?"),
    (["--start", "nope"], "--start nope: no start marker"),
    (["--line-interval-s", "0"], "--line-interval-s"),
])
def test_bad_input_exits_2_naming_it(args, words, capsys):
    assert main(["check-log", log("import_error.log")] + args) == 2
    err = capsys.readouterr().err
    assert err.startswith("dflash-trainer check-log: ") and words in err


def test_bad_e_syntax_and_missing_file(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["check-log", log("import_error.log"), "-e", "novalue"])
    assert e.value.code == 2 and "expected key=value, got 'novalue'" in capsys.readouterr().err
    assert main(["check-log", str(tmp_path / "none.log")]) == 2
    assert "cannot read the log" in capsys.readouterr().err
    (tmp_path / "bin.log").write_bytes(b"\x00\x01step 1\n")
    assert main(["check-log", str(tmp_path / "bin.log")]) == 2


def test_a_fifo_a_device_and_a_directory_are_refused_at_once(capsys, tmp_path):
    """Never blocked on a FIFO with no writer, never reading /dev/zero until memory runs out."""
    os.mkfifo(str(tmp_path / "fifo"))
    for path in (str(tmp_path / "fifo"), "/dev/zero", str(tmp_path)):
        assert main(["check-log", path]) == 2
        assert "%s is not a regular file" % path in capsys.readouterr().err


def test_a_log_past_the_bound_is_refused_naming_the_cut(monkeypatch, capsys, tmp_path):
    check_log = sys.modules["dflash_trainer.check_log"]
    monkeypatch.setattr(check_log, "MAX_LOG_BYTES", 4096)
    monkeypatch.setattr(check_log, "READ_CHUNK", 1000)
    big = tmp_path / "big.log"
    big.write_text("step 1 tok/s 5\n" * 400)  # 5,600 bytes
    assert main(["check-log", str(big)]) == 2
    assert "is larger than 0 MiB: give check-log its last part (tail -c" in capsys.readouterr().err
    big.write_text("step 1 tok/s 5\n" * 200)  # 2,800 bytes: read whole
    assert check_log.read_text(str(big)).count("\n") == 200


def test_vars_file_and_other_variables_are_noted(tmp_path, capsys):
    varfile = tmp_path / "vars.yml"
    varfile.write_text("trainer_error_regexes: ['NO-SUCH-ERROR']\ntrainer_target_hosts: all\n"
                       "trainer_env: {TOKEN: s3cret}\n")
    assert main(["check-log", "-q", log("crash_mid_run.log"), "-e", "@%s" % varfile]) == 1
    out = capsys.readouterr().out
    assert "not used by check-log" in out and "trainer_env" in out and "s3cret" not in out
    assert "verdict: FAILED" in out and "no progress" in out  # no error pattern now: the crash is a stall


# ---- the clock, the lines, the start ----------------------------------------------------------------

def test_timestamps():
    ts = check_log.timestamp
    assert ts("[titan] 2026-12-01 10:00:42,041 - root") - ts("[titan] 2026-12-01 10:00:40,541 - x") == 1.5
    assert ts(" [2026-12-01 10:01:05] iteration 1/ 10") - ts("2026-12-01T10:01:00+0000 h x: y") == 5
    assert ts("Dec  1 10:00:01.250000 host u[1]: x") - ts("Dec  1 10:00:00 host u[1]: x") == 1.25
    assert ts("step 5 [00:01<00:02]") is None and ts("x" * 90 + " 2026-12-01 10:00:00") is None
    body, t, had = check_log.journal_prefix("2026-12-01T10:00:12+0000 gpu-ct dflash-trainer-launch[2231]: step 1")
    assert (body, had) == ("step 1", True) and t is not None
    assert check_log.journal_prefix("[ 12.500000] gpu-ct launch[1]: x")[:2] == ("x", 12.5)
    assert check_log.journal_prefix("step 1: loss 2") == ("step 1: loss 2", None, False)


def test_clock_times_interval_timestamps_and_bursts():
    assert check_log.clock_times([None, None, None], 0.5, "auto") == ([0.5, 1.0, 1.5], "interval")
    times, used = check_log.clock_times([None, 100.0, None, 104.0, 105.0, None], 0.5, "auto")
    assert used == "timestamps" and times == [0.5, 1.0, 3.0, 5.0, 6.0, 6.5]
    assert check_log.clock_times([None, 100.0, None, None], 0.5, "auto")[1] == "interval"  # too few stamps
    assert check_log.clock_times([100.0, 90.0], 1.0, "timestamps")[0] == [1.0, 1.0]  # never back
    with pytest.raises(check_log.BadInput):
        check_log.clock_times([None], 1.0, "timestamps")
    texts = ["a", "Traceback (most recent call last):", '  File "x", line 1', "", "During handling of the above "
             "exception, another exception occurred:", "Traceback (most recent call last):", "    y()",
             "ValueError: bad", "next"]
    groups = check_log.bursts(texts)
    assert groups == [0, 1, 1, 1, 1, 1, 1, 1, 8]
    assert check_log.clock_times([None] * 9, 1.0, "interval", groups)[0] == [1, 2, 2, 2, 2, 2, 2, 2, 3]
    assert check_log.bursts(["[rank1]: Traceback (most recent call last):", "[rank1]:   File 'x'",
                             "[rank1]: KeyError: 'k'", "after"]) == [0, 0, 0, 3]


def test_split_lines_counts_redraws_as_lines():
    import re
    line_end = re.compile(r"\r\n|\n|\r(?!\Z)")
    assert check_log.split_lines("a\rb\r\nc\nlast\r", line_end) == [("a", 1), ("b", 1), ("c", 2), ("last", 3)]


def test_interval_changes_the_clock(coll):
    fast = check("hf_loading_then_steps.log", coll)
    slow = check("hf_loading_then_steps.log", coll, line_interval_s=6)
    assert [r.t for r in slow.lines[:3]] == [6, 12, 18] and [r.t for r in fast.lines[:3]] == [0.5, 1, 1.5]
    assert slow.at_t > fast.at_t and slow.at_line != fast.at_line


def test_markers_pick_the_start(coll, tmp_path):
    T = coll.trainer_log
    old = T.marker_line("a" * 32, "r1", 1, "t")
    new = T.marker_line("b" * 32, "r2", 2, "t")
    steps = "".join("step %d | %d tok/s\n" % (i, 41000) for i in range(1, 40))
    path = tmp_path / "trainer.log"
    path.write_text(old + "\nTraceback (most recent call last):\nImportError: x\n" + new + "\n" + steps)
    last, _d = check_log.check_file(str(path), {}, coll=coll)
    assert last.ok and last.invocation == "b" * 32 and not last.lines[1].ours and last.lines[4].ours
    first, _d = check_log.check_file(str(path), {}, coll=coll, start="a" * 32)
    assert first.state == "failed" and first.error_line == 2
    assert not any(r.ours for r in first.lines[3:])  # the next start's marker ends it


def test_at_end_exit(coll, tmp_path):
    path = tmp_path / "short.log"
    path.write_text("step 1 | 41000 tok/s\nstep 2 | 41000 tok/s\n")
    hang, _d = check_log.check_file(str(path), {}, coll=coll)
    exited, _d = check_log.check_file(str(path), {}, coll=coll, at_end="exit", exit_status=3)
    assert not hang.ok and not exited.ok
    assert "exited with status 3" in exited.reason and exited.advice[0]["variable"] == "(the trainer)"
    assert exited.at_t < hang.at_t


# ---- the report ---------------------------------------------------------------------------------------

def test_text_report_rows_and_json(capsys):
    assert main(["check-log", log("torchtitan_ansi.log")]) == 0
    out = capsys.readouterr().out
    assert "clock: the lines' own timestamps" in out
    row = [line for line in out.splitlines() if line.lstrip().startswith("11 ")][0]
    assert "step 2" in row and "ready-line" in row and "\\x1b[31m" in row  # ANSI shown escaped
    assert "more lines after the verdict (--all shows them)" in out and "verdict: READY at line 21" in out
    assert main(["check-log", "--json", log("hf_trainer_dictlog.log")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"]["state"] == "ready" and data["redraws"] > 50
    assert data["variables"]["trainer_ready_hold_s"] == 10 and data["lines"][0]["n"] == 1
    assert main(["check-log", "-q", "--all", log("import_error.log")]) == 1
    assert "LINE" not in capsys.readouterr().out


def test_help_says_how_it_judges(capsys):
    with pytest.raises(SystemExit):
        main(["check-log", "--help"])
    out = capsys.readouterr().out
    for words in ("--line-interval-s", "synthetic and healthy", "trainer_gpu_min_mib", "synthesised", "journalctl",
                  "exit status: 0 when the proof would pass, 1 when it would fail, 2 on bad input"):
        assert words in " ".join(out.split()), words
    assert "--limit" not in out and "--inventory" not in out


# ---- logs --explain -------------------------------------------------------------------------------------

def test_logs_explain_replays_the_fetched_start(monkeypatch, capsys):
    seen = {}
    lines = ["step %d | loss 7.1 | %d tok/s" % (i, 41000) for i in range(1, 40)]

    def fake_logs(**kw):
        seen.update(kw)
        r = RunResult(ok=True, rc=0, status="successful")
        from dflash_trainer.results import HostResult
        r.hosts["gpu-host"] = HostResult(host="gpu-host", ok=True, log=TrainerLog(
            invocation="c" * 32, release="r1", lines=lines, found=True))
        return r

    monkeypatch.setattr(api, "logs", fake_logs)
    assert main(["logs", "--explain", "-l", "gpu-host", "-e", "trainer_target_hosts=all"]) == 0
    out = capsys.readouterr().out
    assert seen["lines"] == 5000 and "verdict: READY" in out and "gpu-host (start cccc" in out
    assert "the inventory's are not read" in out
    assert main(["logs", "--explain", "-n", "3", "-e", "trainer_ready_hold_s=30"]) == 1
    out = capsys.readouterr().out
    assert seen["lines"] == 3 and "only this start's last 3 lines" in out
    with pytest.raises(SystemExit):
        main(["logs", "--explain", "-f"])


def test_an_installed_collection_is_found_and_its_defaults_read(tmp_path, monkeypatch):
    """Installed (pip package + ansible-galaxy collection): the defaults and the judge come from the
    collection on the collections path, not from a checkout."""
    import sys
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_collection adds the collections path
    base = tmp_path / "colls"
    (base / "ansible_collections" / "dflash").mkdir(parents=True)
    (base / "ansible_collections" / "dflash" / "trainer").symlink_to(api.REPO_ROOT)
    monkeypatch.setattr(api, "REPO_ROOT", str(tmp_path / "site-packages"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ANSIBLE_COLLECTIONS_PATH", str(base))
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    root = check_log.collection_root()
    assert root == str(base / "ansible_collections" / "dflash" / "trainer")
    coll = check_log.load_collection(root)
    assert str(base) in sys.path
    assert check_log.role_defaults(coll.root)["trainer_ready_hold_s"] == check("import_error.log", coll).opts["hold_s"]


def test_the_api_function_mirrors_the_subcommand(tmp_path):
    """dflash_trainer.check_log(file, extravars=...) is check-log: the same replay, its exit_code the
    subcommand's exit status; bad input raises the module's BadInput (exit status 2)."""
    good = dflash_trainer.check_log(os.path.join(LOGS, "megatron.log"))
    assert good.ok and good.exit_code == 0
    bad = dflash_trainer.check_log(os.path.join(LOGS, "import_error.log"))
    assert not bad.ok and bad.exit_code == 1
    assert main(["check-log", os.path.join(LOGS, "import_error.log"), "-q"]) == bad.exit_code
    with pytest.raises(check_log.BadInput, match="trainer_step_rgex"):
        dflash_trainer.check_log(os.path.join(LOGS, "megatron.log"), extravars={"trainer_step_rgex": "x"})


def test_a_regex_that_backtracks_without_end_on_a_line_fails_there_naming_it(tmp_path, capsys):
    # passes the controller's timing check (tests/unit/test_regex_bound.py); a real line hangs it
    rx = r"step=(\d+)(?:q+q+)+#"
    path = tmp_path / "q.log"
    path.write_text("".join("step=%d loss 2.0\n" % i for i in range(1, 4)) + "step=12" + "q" * 60 + "\n"
                    + "".join("step=%d loss 2.0\n" % i for i in range(5, 40)))
    assert main(["check-log", str(path), "-e", "trainer_step_regex=%s" % rx]) == 1
    out = capsys.readouterr().out
    assert ("verdict: FAILED at line 4 (t=2 s): the proof stopped reading the log: trainer_step_regex %r did not "
            "finish searching line 4 of this start within 2 s" % rx) in out, out
    assert "  trainer_step_regex: %s backtracks without end on line 4" % rx in out
    assert "… 35 more lines after the verdict" in out  # not read: the same regex would search them
