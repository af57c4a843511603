"""After the proof, on the target (issue 15 item 3, issue 16 item 3): the launcher records a death
of its proved trainer in the ledger, and writes the trainer's state for node_exporter. Its
copies of the collection's pure functions are checked against the originals here."""
import importlib.machinery
import importlib.util
import os
import signal
import subprocess
import sys

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.dflash.trainer.plugins.module_utils.release import ledger as ld
from ansible_collections.dflash.trainer.plugins.module_utils.proof import throughput as tp
from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl

from waiting import poll

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
LAUNCHER = os.path.join(ROOT, "roles", "trainer", "files", "dflash-trainer-launch")
_loader = importlib.machinery.SourceFileLoader("dflash_launch", LAUNCHER)
_spec = importlib.util.spec_from_loader("dflash_launch", _loader)
L = importlib.util.module_from_spec(_spec)
_loader.exec_module(L)
DEFAULTS = yaml.safe_load(open(os.path.join(ROOT, "roles", "trainer", "defaults", "main.yml")))


# --- the copies equal their originals ---------------------------------------------------------------

REASON_CASES = [
    ["step=3 tok/s=1", "Traceback (most recent call last):", '  File "x.py"', "torch.OutOfMemoryError: CUDA out of memory."],
    ["[rank3]: RuntimeError: CUDA error: an illegal memory access", "step=9"],
    ["step=1", "step=2", ""],
    ["ValueError", "KeyError: 'x'", "done"],
    [],
    ["   ", ""],
]


@pytest.mark.parametrize("lines", REASON_CASES)
def test_reason_line_is_the_collections(lines):
    assert L.reason_line(lines) == tl.reason_line(lines)


@pytest.mark.parametrize("text", ["12.4K", "12,400", "1.2e4", "41250.3", "7", "3M", "1G", "12.4.5", "12,40", "nan",
                                  "inf", "", "5m", " 2_000 ", "1e999"])
def test_parse_figure_is_the_collections(text):
    try:
        want = tp.parse_figure(text)
    except ValueError:
        with pytest.raises(ValueError):
            L.parse_figure(text)
    else:
        assert L.parse_figure(text) == want


@pytest.mark.parametrize("line", ["step=12 loss=2.1 tok/s=41250.3 queue_target=3", "iter 5 | 21.5K tok/s | loss 2",
                                  "global_step: 1,204 tokens/s: 12,400", "[7/100] throughput 1.2e4 tok/s",
                                  "no figures here"])
def test_figures_read_with_the_roles_regexes_are_the_collections(line):
    """The launcher reads tok/s and step with the role's regexes as the proof does."""
    import re
    for name in ("trainer_tokps_regex", "trainer_step_regex"):
        rx = re.compile(DEFAULTS[name])
        m = rx.search(line)
        want = None
        if m:
            want, _why = tp.read_figure(m)
        assert L.figure(rx, line) == want, (name, line)


def test_the_job_and_the_launcher_never_lose_each_others_ledger_entries(tmp_path):
    """Two writers, one ledger: the restart job appends verdicts (release.ledger.append_ledger) while
    the launcher records a death (its read-modify-write under its copy of the lock). Racing 40
    writes each, every entry of both is there (without the shared flock, writes get lost)."""
    path = str(tmp_path / "ledger.json")
    n = 40

    def launcher_side():
        for i in range(n):
            with L.ledger_lock(path):
                entries = L.read_ledger(path)
                L.write_ledger(path, entries + [{"release": "launcher-%d" % i, "verdict": "proved"}])

    pid = os.fork()
    if pid == 0:  # the launcher, in a process of its own
        code = 0
        try:
            launcher_side()
        except BaseException:  # pylint: disable=broad-except  # any failure: the parent sees exit 1
            code = 1
        os._exit(code)  # pylint: disable=protected-access
    for i in range(n):
        ld.append_ledger(path, [tp.entry("job-%d" % i, tp.PROVED, {}, now=float(i))], keep=10 * n)
    assert os.waitpid(pid, 0)[1] == 0
    got = sorted(e["release"] for e in ld.read_ledger(path))
    assert got == sorted(["job-%d" % i for i in range(n)] + ["launcher-%d" % i for i in range(n)])
    assert oct(os.stat(path + ".lock").st_mode & 0o777) == "0o600"


def test_the_ledger_the_launcher_writes_is_the_collections(tmp_path):
    path = str(tmp_path / "ledger.json")
    entries = ld.append_ledger(path, [tp.entry("r1", tp.PROVED, {"tok_s": {"median": 10.0}}, "git abc", now=100.0)])
    L.write_ledger(path, entries)
    assert ld.read_ledger(path) == L.read_ledger(path) == entries
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


# --- the decisions ---------------------------------------------------------------------------------

def proved(release="r1", t=1000.0, **kw):
    return dict(tp.entry(release, tp.PROVED, {"tok_s": {"median": 41000.0}}, "git abc", now=t), **kw)


def test_a_death_after_this_starts_proof_is_recorded():
    entries = [proved("r0", 500.0), proved("r1", 1000.0)]
    out = L.death(entries, "r1", started_wall=990.0, now=1180.0, reason="torch.OutOfMemoryError: CUDA out of memory",
                  exit_text="exit status 1", invocation="inv1")
    died = out[-1]["died"]
    assert (died["after_s"], died["reason"], died["exit"], died["count"]) == (
        180.0, "torch.OutOfMemoryError: CUDA out of memory", "exit status 1", 1)
    assert "died" not in out[0] and "died" not in entries[-1]  # a new list; the input is left as it was
    assert tp.died_words(out[-1]) == "proved, then died after 3 min: torch.OutOfMemoryError: CUDA out of memory"


def test_a_start_that_was_never_proved_is_no_death_after_a_proof():
    # the release was proved by an earlier start; this start (by the restart job, say) died in its proof
    assert L.death([proved("r1", 1000.0)], "r1", 2000.0, 2010.0, "x", "exit status 1", "inv2") is None
    # the newest entry of the release is a failure, or there is none
    failed = tp.entry("r1", "failed", now=1000.0, reason="boom")
    assert L.death([proved("r1", 900.0), failed], "r1", 990.0, 1100.0, "x", "exit status 1", "i") is None
    assert L.death([proved("r0", 1000.0)], "r1", 990.0, 1100.0, "x", "exit status 1", "i") is None


def test_systemd_bringing_a_dead_trainer_back_to_die_again_counts():
    first = L.death([proved("r1", 1000.0)], "r1", 990.0, 1030.0, "OOM", "exit status 1", "inv1")
    again = L.death(first, "r1", 1040.0, 1070.0, "OOM again", "killed by SIGKILL", "inv2")
    died = again[-1]["died"]
    assert (died["count"], died["after_s"], died["reason"], died["last_reason"]) == (2, 30.0, "OOM", "OOM again")
    assert tp.died_words(again[-1]).endswith("(2 deaths since the proof)")


def test_exit_words_and_masking():
    assert L.exit_words(1) == "exit status 1"
    assert L.exit_words(-9) == "killed by SIGKILL"
    secrets = L.secrets_of({"HF_TOKEN": "hf_abcdef", "PATH": "/usr/bin", "X": "ab", "DFLASH_RELEASE": "r1"})
    assert secrets == ["hf_abcdef"]
    assert L.mask("RuntimeError: token hf_abcdef refused", secrets) == "RuntimeError: token *** refused"
    # a number as target.secrets.mask does: where it stands alone, never inside another
    assert L.mask("40.3K tok/s, startup 0.3 s", L.secrets_of({"S": "0.3"})) == "40.3K tok/s, startup *** s"


def test_unit_of_reads_the_cgroup():
    assert L.unit_of("0::/system.slice/dflash-trainer.service\n") == "dflash-trainer.service"
    assert L.unit_of("0::/lxc/200/ns/system.slice/t.service\n") == "t.service"
    assert L.unit_of("0::/user.slice/user-0.slice/session-1.scope\n") is None


# --- health: what status says ----------------------------------------------------------------------

def test_health_of_a_trainer_running_its_proof():
    h = tp.health([proved("r1", 1000.0)], "r1", True, started_at=980.0, n_restarts=0, now=1300.0)
    assert h["ok"] and h["words"] == "running release r1, proved 5 min ago (unit restarts: 0)"
    assert h["seconds_since_proof"] == 300.0


def test_health_of_a_trainer_that_died_after_its_proof():
    ledger = L.death([proved("r1", 1000.0)], "r1", 990.0, 1180.0, "torch.OutOfMemoryError: CUDA out of memory",
                     "exit status 1", "inv1")
    h = tp.health(ledger, "r1", True, started_at=1190.0, n_restarts=1, now=1200.0)
    assert not h["ok"]
    assert h["words"] == ("died 3 min after its proof: torch.OutOfMemoryError: CUDA out of memory (unit restarts: 1); "
                          "running again, not proved since")
    h = tp.health(ledger, "r1", False, n_restarts=3, now=1200.0, state="failed/failed")
    assert not h["ok"] and h["words"].endswith("not running (failed/failed)") and h["died"]["after_s"] == 180.0


@pytest.mark.parametrize("ledger, release, running, started_at, words", [
    ([], "r1", True, 10.0, "running release r1 has no proof on record (unit restarts: 0)"),
    ([proved("r1", 1000.0), tp.entry("r1", "failed", reason="boom", now=1100.0)], "r1", True, 1050.0,
     "running release r1, whose last verdict is failed: boom (unit restarts: 0)"),
    ([proved("r1", 1000.0)], "r1", True, 1300.0, "restarted 5 min after its proof, not proved since (unit restarts: 0)"),
    ([proved("r1", 1000.0)], None, False, None, "not running (inactive/dead) (unit restarts: 0)"),
])
def test_health_refuses(ledger, release, running, started_at, words):
    h = tp.health(ledger, release, running, started_at=started_at, n_restarts=0, now=1400.0, state="inactive/dead")
    assert not h["ok"] and h["words"] == words


def test_history_says_proved_then_died():
    ledger = L.death([proved("r1", 1000.0)], "r1", 990.0, 1023.0, "RuntimeError: CUDA error", "exit status 1", "i")
    row = tp.history_rows(ledger)[0]
    assert row["verdict"] == tp.PROVED and row["died"] == "proved, then died after 23 s: RuntimeError: CUDA error"
    assert "[proved, then died after 23 s: RuntimeError: CUDA error]" in row["line"]


# --- metrics ---------------------------------------------------------------------------------------

def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams, name):
    (s,) = fams[name].samples
    return s


def test_metrics_text_parses_as_prometheus_reads_it():
    text = L.metrics_text({"up": True, "release": "r1", "invocation": "inv1", "source": 'git abc "dirty"\\',
                           "proved": True, "verdict": "proved", "tok_s": 41250.3, "tok_s_median": 41000.0,
                           "window_s": 600.0, "proof_median": 40900.0, "step": 1204.0, "restarts": 2, "died": None,
                           "since_proof": 190.5, "now": 1700000000.25})
    assert text.splitlines()[0] == L.METRICS_MARK
    fams = families(text)
    assert sample(fams, "dflash_trainer_up").labels == {"release": "r1", "source": 'git abc "dirty"\\'}
    values = {name: sample(fams, name).value for name in fams}
    assert values == {"dflash_trainer_up": 1, "dflash_trainer_info": 1, "dflash_trainer_proved": 1,
                      "dflash_trainer_last_verdict": 1, "dflash_trainer_tokens_per_second": 41250.3,
                      "dflash_trainer_tokens_per_second_median": 41000.0,
                      "dflash_trainer_proof_tokens_per_second_median": 40900.0, "dflash_trainer_step": 1204,
                      "dflash_trainer_unit_restarts": 2, "dflash_trainer_seconds_since_proof": 190.5,
                      "dflash_trainer_died_after_proof": 0,
                      "dflash_trainer_metrics_updated_timestamp_seconds": 1700000000.25}
    assert sample(fams, "dflash_trainer_last_verdict").labels["verdict"] == "proved"
    assert sample(fams, "dflash_trainer_tokens_per_second_median").labels["window_s"] == "600"
    assert sample(fams, "dflash_trainer_info").labels["invocation"] == "inv1"


def test_metrics_of_a_death_and_of_figures_not_seen_yet():
    text = L.metrics_text({"up": False, "release": "r1", "invocation": "i", "source": None, "proved": False,
                           "verdict": "died after proof", "tok_s": None, "tok_s_median": None, "window_s": 60.0,
                           "proof_median": None, "step": None, "restarts": None, "since_proof": 10.0, "now": 5.0,
                           "died": {"after_s": 23.0, "reason": "torch.OutOfMemoryError: CUDA out of memory.\nx"}})
    fams = families(text)
    assert "dflash_trainer_step" not in fams and "dflash_trainer_tokens_per_second" not in fams
    assert sample(fams, "dflash_trainer_up").value == 0 and sample(fams, "dflash_trainer_died_after_proof").value == 1
    died = sample(fams, "dflash_trainer_died_after_proof_seconds")
    assert died.value == 23 and died.labels["reason"] == "torch.OutOfMemoryError: CUDA out of memory.\nx"


# --- the launcher, run -----------------------------------------------------------------------------

TRAINER = """#!%s
import os, sys, time
ctl = os.environ["CTL"]
i = 0
while not os.path.exists(os.path.join(ctl, "die")):
    print("step=%%d loss=1.0 tok/s=%%s" %% (i, os.environ.get("TOKPS", "12.4K")), flush=True)
    i += 1
    time.sleep(0.05)
print("Traceback (most recent call last):", file=sys.stderr, flush=True)
print("torch.OutOfMemoryError: CUDA out of memory (token %%s)" %% os.environ.get("HF_TOKEN"), file=sys.stderr, flush=True)
sys.exit(1)
""" % sys.executable


@pytest.fixture
def root(tmp_path):
    rel = tmp_path / "releases" / "r1"
    rel.mkdir(parents=True)
    (rel / "trainer.py").write_text(TRAINER)
    (rel / "trainer.py").chmod(0o755)
    (tmp_path / "current").symlink_to("releases/r1")
    (tmp_path / "ctl").mkdir()
    (tmp_path / "prom").mkdir()
    return tmp_path


def start(root, *flags, **env):
    argv = [sys.executable, LAUNCHER, "--root", str(root), "--log", str(root / "t.log"), *flags, "--", "./trainer.py"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, INVOCATION_ID="inv1", CTL=str(root / "ctl"), HF_TOKEN="hf_s3cret",
                                     **env))


def prove(root):
    """What the restart job does once the proof passed: a proved entry for this start."""
    poll(lambda: "step=2" in (root / "t.log").read_text() if (root / "t.log").exists() else False, what="progress")
    ld.append_ledger(str(root / "ledger.json"), [tp.entry("r1", tp.PROVED, {"tok_s": {"median": 12400.0}}, "git abc")])


def test_a_trainer_dying_after_its_proof_is_recorded_in_the_ledger(root):
    proc = start(root)
    try:
        prove(root)
        (root / "ctl" / "die").write_text("")
        assert proc.wait(timeout=20) == 1  # the trainer's own status still
    finally:
        if proc.poll() is None:
            proc.kill()
    entry = ld.read_ledger(str(root / "ledger.json"))[-1]
    assert entry["died"]["reason"] == "torch.OutOfMemoryError: CUDA out of memory (token ***)"
    assert entry["died"]["exit"] == "exit status 1" and entry["died"]["invocation"] == "inv1"
    assert tp.died_words(entry).startswith("proved, then died after ")
    assert "hf_s3cret" not in (root / "ledger.json").read_text()


def test_a_stop_is_not_a_death(root):
    proc = start(root)
    try:
        prove(root)
        proc.send_signal(signal.SIGTERM)  # systemctl stop (the collection's restart included) signals the launcher
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "died" not in ld.read_ledger(str(root / "ledger.json"))[-1]


def test_the_metrics_file_follows_the_trainer_and_says_its_death(root):
    prom = root / "prom" / "dflash_trainer.prom"
    proc = start(root, "--metrics", str(prom), "--metrics-interval-s", "0.1", "--metrics-window-s", "60",
                 "--tokps-regex", DEFAULTS["trainer_tokps_regex"], "--step-regex", DEFAULTS["trainer_step_regex"])

    def value(name):
        fams = families(prom.read_text()) if prom.exists() else {}
        return sample(fams, name).value if name in fams else None
    try:
        first = poll(lambda: value("dflash_trainer_step"), what="a step in the metrics")
        assert value("dflash_trainer_tokens_per_second") == 12400.0 and value("dflash_trainer_proved") == 0
        poll(lambda: (value("dflash_trainer_step") or 0) > first + 3, what="the step to rise in the metrics")
        prove(root)
        poll(lambda: value("dflash_trainer_proved") == 1, what="proved in the metrics")
        assert value("dflash_trainer_proof_tokens_per_second_median") == 12400.0
        (root / "ctl" / "die").write_text("")
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert value("dflash_trainer_up") == 0 and value("dflash_trainer_died_after_proof") == 1
    assert [p.name for p in (root / "prom").iterdir()] == ["dflash_trainer.prom"]  # no temporary file left
    assert oct(prom.stat().st_mode & 0o777) == "0o644"  # node_exporter reads it


def test_a_metrics_file_not_of_ours_is_left_alone(root):
    prom = root / "prom" / "other.prom"
    prom.write_text("# written by someone else\nother_metric 1\n")
    proc = start(root, "--metrics", str(prom), "--metrics-interval-s", "0.1")
    try:
        poll(lambda: (root / "t.log").exists() and "step=3" in (root / "t.log").read_text(), what="progress")
        (root / "ctl" / "die").write_text("")
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert prom.read_text() == "# written by someone else\nother_metric 1\n"


# --- trainer_status watch_s: returns when this start ends -----------------------------------------

def test_watch_returns_when_the_start_ends_or_the_time_is_up():
    from ansible_collections.dflash.trainer.plugins.module_utils.plan import status as ts
    now = [0.0]
    reads = iter(["ActiveState=active\nSubState=running\nInvocationID=a\nMainPID=5\n",
                  "ActiveState=active\nSubState=running\nInvocationID=a\nMainPID=5\n",
                  "ActiveState=activating\nSubState=auto-restart\nInvocationID=a\nMainPID=0\n"])

    def sleep(s):
        now[0] += s
    props, seconds = ts.watch(lambda: (0, next(reads), ""), {"InvocationID": "a"}, 30, clock=lambda: now[0],
                              sleep=sleep)
    assert props["SubState"] == "auto-restart" and seconds == 3.0
    running = "ActiveState=active\nSubState=running\nInvocationID=a\nMainPID=5\n"
    props, seconds = ts.watch(lambda: (0, running, ""), {"InvocationID": "a"}, 2.5, clock=lambda: now[0], sleep=sleep)
    assert props["SubState"] == "running" and seconds == 2.5
