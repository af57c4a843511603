"""The restart job's wiring (module_utils/job/steps.py): the steps bound to the module's
parameters (with fake systemd/GPU functions), the release layout on a temporary root, the job's
state file, the job's entry with fake steps, the detached start, the waiter's judges and what the
module returns. No test here sleeps or calls systemd."""
import ast
import json
import os
import select
import stat

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.job import steps as rs
from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import START_TIMEOUT_S, STOP_MARGIN_S, StepFailed
from ansible_collections.dflash.trainer.plugins.module_utils.job.state import observe_job, outcome_words, read_state, write_state
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import (
    DEFAULT_READY_REGEX,
    DEFAULT_STEP_REGEX,
    DEFAULT_TOKPS_REGEX,
)
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import DONE, FAILED, TIMEOUT, Outcome

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def params(tmp_path, **over):
    p = dict(operation="run", job_id="j1", state_path=str(tmp_path / "state" / "restart.json"), wait_s=30,
             unit="dflash-trainer", root=str(tmp_path / "root"), log_path=str(tmp_path / "trainer.log"),
             purge_dir="", gpus=[0, 1], drain_max_mib=1024, gpu_foreign_mib={}, drain_timeout_s=60,
             stop_timeout_s=30, min_mib=1024, ready_regex=DEFAULT_READY_REGEX, step_regex=DEFAULT_STEP_REGEX,
             tokps_regex=DEFAULT_TOKPS_REGEX, error_regexes=[], min_steps=2, hold_s=10, stall_s=5, timeout_s=300,
             interval_s=1, tail_lines=20, nvidia_smi="nvidia-smi", rollback=True, reasons=["code changed"],
             owner="alice", lock_path="", lock_token="", lock_lease_s=30, measure_s=None, measure_regexes={},
             min_tokps_ratio=0, source="", env_file=None)
    p.update(over)
    return p


# --- Steps: each step calls its job.cycle function with the module's parameters ---------------------

class Calls(object):
    """Stands in for one job.cycle function: records (args, kwargs), returns or raises ``out``."""

    def __init__(self, out=None):
        self.out, self.calls = out, []

    def __call__(self, *args, **kw):
        self.calls.append((args, kw))
        if isinstance(self.out, Exception):
            raise self.out
        return self.out


def test_steps_stop_start_and_purge_pass_the_unit_and_the_bounds(tmp_path, monkeypatch):
    p = params(tmp_path, stop_timeout_s=45, purge_dir="/cache/inductor")
    fakes = dict(stop=Calls({"stopped": True}), start=Calls({"invocation_id": "inv"}), purge=Calls(True))
    for name, fake in fakes.items():
        monkeypatch.setattr(rs, name, fake)
    steps = rs.Steps(p, "/bin/systemctl", "/bin/nvidia-smi", tick=None)
    assert steps.stop() == {"stopped": True}
    (run, systemctl, unit), _kw = fakes["stop"].calls[0]
    assert (systemctl, unit, run.bound()) == ("/bin/systemctl", "dflash-trainer", 45 + STOP_MARGIN_S)
    assert steps.start() == {"invocation_id": "inv"}
    (_run, systemctl, unit), kw = fakes["start"].calls[0]
    assert (systemctl, unit, kw["start_run"].bound()) == ("/bin/systemctl", "dflash-trainer", START_TIMEOUT_S)
    assert steps.purge() is True and fakes["purge"].calls == [(("/cache/inductor",), {})]


def test_a_refused_purge_is_a_failed_step_in_the_purges_words(tmp_path):
    """The purge (target.inductor_cache) refuses a directory that is not a cache: the job's step fails with
    its words (the job then brings the trainer back), and nothing is deleted."""
    cache = tmp_path / "ckpt"
    cache.mkdir()
    (cache / "checkpoint.pt").write_text("weights")
    steps = rs.Steps(params(tmp_path, purge_dir=str(cache)), "/bin/systemctl", "/bin/nvidia-smi", tick=None)
    with pytest.raises(StepFailed) as exc:
        steps.purge()
    assert exc.value.msg.startswith("refused to purge %s: " % cache) and "checkpoint.pt" in exc.value.msg
    assert "nothing was deleted" in exc.value.msg and (cache / "checkpoint.pt").read_text() == "weights"


def test_steps_drain_keeps_what_the_gpus_held_as_the_proofs_baseline(tmp_path, monkeypatch):
    ticks = []
    p = params(tmp_path, gpu_foreign_mib={"1": 500}, drain_max_mib=2048, drain_timeout_s=7)
    fake = Calls({"gpus_mib": {0: 10, 1: 510}})
    monkeypatch.setattr(rs, "drain", fake)
    steps = rs.Steps(p, "systemctl", "/bin/nvidia-smi", tick=ticks.append)
    assert steps.baseline is None
    assert steps.drain() == {"gpus_mib": {0: 10, 1: 510}}
    assert steps.baseline == {0: 10, 1: 510}
    (_run, nvidia_smi), kw = fake.calls[0]
    assert nvidia_smi == "/bin/nvidia-smi"
    assert (kw["gpus"], kw["max_mib"], kw["timeout_s"], kw["allowance"]) == ([0, 1], 2048, 7, {1: 500})
    assert kw["tick"] == ticks.append

    # a drain that fails still leaves its memory as the baseline of a start that goes ahead anyway
    monkeypatch.setattr(rs, "drain", Calls(StepFailed("GPU memory still held", gpus_mib={0: 9000})))
    with pytest.raises(StepFailed):
        steps.drain()
    assert steps.baseline == {0: 9000}


def test_steps_prove_hands_over_the_baseline_the_expectations_and_the_measure(tmp_path, monkeypatch):
    p = params(tmp_path, measure_s=60.0, measure_regexes={"q_hs": r"q_hs=(\d+)"}, min_mib=4096, interval_s=0.5)
    fake = Calls({"ready": True})
    monkeypatch.setattr(rs, "prove", fake)
    steps = rs.Steps(p, "systemctl", "smi", tick=None)
    steps.baseline = {0: 100}
    assert steps.prove("inv-1", 3) == {"ready": True}
    (_run, systemctl, smi, unit, log_path, expect, regexes), kw = fake.calls[0]
    assert (systemctl, smi, unit, log_path) == ("systemctl", "smi", "dflash-trainer", p["log_path"])
    assert (expect.invocation_id, expect.n_restarts, expect.min_mib) == ("inv-1", 3, 4096)
    assert regexes is steps.regexes and regexes["error_regexes"] == []
    assert (kw["baseline"], kw["measure_s"], kw["extra_regexes"], kw["interval_s"]) == (
        {0: 100}, 60.0, {"q_hs": r"q_hs=(\d+)"}, 0.5)


def test_steps_refuse_a_pattern_that_does_not_compile(tmp_path):
    with pytest.raises(StepFailed) as exc:
        rs.Steps(params(tmp_path, error_regexes=["("]), "systemctl", "smi", tick=None)
    assert "invalid error_regexes entry '('" in exc.value.msg


@pytest.mark.parametrize("shown, words", [
    ({"ActiveState": "active", "SubState": "running", "MainPID": "4242"}, "dflash-trainer is running (pid 4242)"),
    (StepFailed("Unable to read unit dflash-trainer: boom"),
     "the unit's state is unknown (Unable to read unit dflash-trainer: boom)"),
])
def test_steps_unit_state_in_words(tmp_path, monkeypatch, shown, words):
    monkeypatch.setattr(rs, "show", Calls(shown))
    assert rs.Steps(params(tmp_path), "systemctl", "smi", tick=None).unit_state() == words


def test_steps_unit_state_of_a_stopped_unit(tmp_path, monkeypatch):
    monkeypatch.setattr(rs, "show", Calls({"ActiveState": "failed", "SubState": "failed", "MainPID": "0",
                                           "Result": "exit-code"}))
    words = rs.Steps(params(tmp_path), "systemctl", "smi", tick=None).unit_state()
    assert words == "dflash-trainer is stopped (ActiveState=failed, SubState=failed, Result=exit-code)"


# --- Layout: the release root ------------------------------------------------------------------

def test_layout_switches_marks_good_and_keeps_the_ledger_masked(tmp_path):
    root = tmp_path / "root"
    for rid in ("r1", "r2"):
        (root / "releases" / rid).mkdir(parents=True)
    layout = rs.Layout(str(root), secrets=["hunter22"])
    assert (layout.current(), layout.last_good(), layout.ledger()) == (None, None, [])
    layout.switch("r1")
    layout.mark_good("r1")
    layout.switch("r2")
    assert (layout.current(), layout.last_good()) == ("r2", "r1")
    assert os.readlink(str(root / "current")) == os.path.join("releases", "r2")
    layout.record([{"release": "r2", "verdict": "failed", "reason": "token hunter22 printed"}])
    assert layout.ledger_path == str(root / "ledger.json")
    entries = layout.ledger()
    assert [e["release"] for e in entries] == ["r2"] and "hunter22" not in json.dumps(entries)


# --- JobRecord: the state file ------------------------------------------------------------------

class FakeKeeper(object):
    def __init__(self):
        self.renewals = 0

    def renew(self):
        self.renewals += 1


class Ticker(object):
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def test_job_record_writes_phases_masks_secrets_and_says_what_it_waits_for_every_2_s(tmp_path):
    p = params(tmp_path, reasons=["env changed"])
    mono, keeper = Ticker(1000.0), FakeKeeper()
    record = rs.JobRecord(p, os.getpid(), secrets=["s3cr3t-token"], keeper=keeper, clock=lambda: 1234.0,
                          monotonic=mono)
    record.save()
    state = read_state(p["state_path"])
    assert (state["job_id"], state["pid"], state["owner"], state["reasons"], state["phase"], state["done"]) == (
        "j1", os.getpid(), "alice", ["env changed"], "starting job", False)
    assert state["started"] == 1234.0 and state["pid_start"] is not None
    assert stat.S_IMODE(os.stat(p["state_path"]).st_mode) == 0o600

    record.on_phase("stopping", release="s3cr3t-token-release")
    state = read_state(p["state_path"])
    assert (state["phase"], state["phase_at"], state["waiting"], state["release"]) == ("stopping", 1234.0, None, "***-release")
    assert keeper.renewals == 1

    record.tick(waiting="GPU 0 holds 9000 MiB")
    assert read_state(p["state_path"])["waiting"] == "GPU 0 holds 9000 MiB"
    mono.t += 1.9
    record.tick(waiting="GPU 0 holds 5000 MiB")  # too soon: not written
    assert read_state(p["state_path"])["waiting"] == "GPU 0 holds 9000 MiB"
    mono.t += 0.1
    record.tick(waiting="GPU 0 holds 100 MiB")
    assert read_state(p["state_path"])["waiting"] == "GPU 0 holds 100 MiB"
    mono.t += 5
    record.tick()  # nothing to say: nothing written
    assert read_state(p["state_path"])["waiting"] == "GPU 0 holds 100 MiB"

    record.finish({"ok": True, "outcome": "ready"})
    state = read_state(p["state_path"])
    assert (state["done"], state["phase"], state["finished"], state["result"]) == (True, "done", 1234.0,
                                                                                   {"ok": True, "outcome": "ready"})
    # where the job's time went: each phase and the end, in seconds since the record was made
    assert state["timeline"] == [["stopping", 0.0], ["finished", 7.0]]


# --- run_restart: the job's entry ----------------------------------------------------------------

class FakeSteps(object):
    """The cycle's steps without systemd: ``fail_prove`` makes the first proof fail."""

    made = []

    def __init__(self, p, systemctl, nvidia_smi, tick, fail_prove=None):
        self.args = (systemctl, nvidia_smi)
        self.tick, self.fail_prove, self.calls = tick, fail_prove, []
        FakeSteps.made.append(self)

    def _do(self, name, value):
        self.calls.append(name)
        return value

    def stop(self):
        return self._do("stop", {})

    def drain(self):
        self.tick(waiting="GPUs to drain")
        return self._do("drain", {})

    def purge(self):
        return self._do("purge", True)

    def start(self):
        return self._do("start", {"invocation_id": "inv", "n_restarts": 0})

    def prove(self, invocation_id, n_restarts, reproof=False):
        if self.fail_prove and "prove" not in self.calls:  # the first proof fails, the rollback's passes
            self.calls.append("prove")
            raise StepFailed(self.fail_prove, log_tail=["HF_TOKEN=" + self.fail_prove])
        return self._do("prove", {"main_pid": 7, "step": 3, "tok_s": 100.0, "invocation_id": invocation_id})

    def unit_state(self):
        return "dflash-trainer is stopped (inactive/dead)"


def release_root(tmp_path, current="r2", last_good=None):
    root = tmp_path / "root"
    for rid in ("r1", "r2"):
        (root / "releases" / rid).mkdir(parents=True)
    layout = rs.Layout(str(root))
    layout.switch(current)
    if last_good:
        layout.mark_good(last_good)
    return root


def test_run_restart_proves_marks_good_and_records_the_outcome(tmp_path):
    root = release_root(tmp_path, current="r2", last_good="r1")
    released = []
    p = params(tmp_path, root=str(root), purge_dir="/cache")
    result = rs.run_restart(p, "/bin/systemctl", "/bin/smi", pid=os.getpid(), make_steps=FakeSteps,
                            release_lock=lambda *a: released.append(a))
    steps = FakeSteps.made[-1]
    assert steps.args == ("/bin/systemctl", "/bin/smi")
    assert steps.calls == ["stop", "drain", "purge", "start", "prove"]
    assert result["ok"] and result["release"] == "r2" and result["outcome"].startswith("ready: release r2 proved")
    assert rs.Layout(str(root)).last_good() == "r2"
    state = read_state(p["state_path"])
    assert (state["done"], state["phase"], state["result"]["ok"], state["job_id"]) == (True, "done", True, "j1")
    assert state["waiting"] is None  # said while draining, cleared by the next phase
    assert released == []  # no lock_path: nothing to release


def test_run_restart_rolls_back_masks_secrets_and_frees_the_lock(tmp_path):
    root = release_root(tmp_path, current="r2", last_good="r1")
    env = tmp_path / "env"
    env.write_text('HF_TOKEN="hf_abcdefgh"\n')
    released = []

    def steps(*args):
        return FakeSteps(*args, fail_prove="no progress hf_abcdefgh")

    p = params(tmp_path, root=str(root), env_file=str(env), lock_path=str(tmp_path / "lock"), lock_token="")
    result = rs.run_restart(p, "systemctl", "smi", pid=os.getpid(), make_steps=steps,
                            release_lock=lambda *a: released.append(a))
    assert not result["ok"] and result["failed_phase"] == "proving" and result["rolled_back"]
    assert "hf_abcdefgh" not in json.dumps(result) and "***" in result["msg"]
    saved = open(p["state_path"]).read()
    assert "hf_abcdefgh" not in saved and json.loads(saved)["done"]
    assert released == [(str(tmp_path / "lock"), "")]
    assert rs.Layout(str(root)).current() == "r1" and result["outcome"].startswith("Rolled back: the last good release r1")
    assert FakeSteps.made[-1].calls == ["stop", "drain", "start", "prove", "stop", "drain", "start", "prove"]


def test_run_restart_with_a_bad_pattern_stops_nothing(tmp_path):
    released = []
    p = params(tmp_path, root=str(release_root(tmp_path)), tokps_regex="(", lock_path="/run/lock", lock_token="")
    result = rs.run_restart(p, "systemctl", "smi", pid=os.getpid(), release_lock=lambda *a: released.append(a))
    assert not result["ok"] and result["outcome"].startswith("nothing was stopped: invalid tokps_regex '('")
    assert result["msg"] == result["outcome"][len("nothing was stopped: "):]
    assert read_state(p["state_path"])["result"] == result and released == [("/run/lock", "")]


def test_run_restart_that_crashes_still_records_an_outcome(tmp_path):
    def broken(*_args):
        raise RuntimeError("no steps")

    p = params(tmp_path, root=str(release_root(tmp_path)))
    result = rs.run_restart(p, "systemctl", "smi", pid=os.getpid(), make_steps=broken)
    assert result == dict(ok=False, msg="restart job crashed: RuntimeError('no steps')",
                          outcome="restart job crashed: RuntimeError('no steps')")
    assert read_state(p["state_path"])["done"] is True


# --- detach: the job runs in a detached grandchild -------------------------------------------------

def test_detach_runs_the_job_in_a_new_session_with_no_streams():
    read_end, write_end = os.pipe()

    def job():
        info = dict(pid=os.getpid(), sid=os.getsid(0), cwd=os.getcwd(),
                    stdout=os.readlink("/proc/self/fd/1"))
        os.write(write_end, json.dumps(info).encode())
        raise SystemExit(0)  # as exit_json does: the grandchild still ends quietly

    pid = rs.detach(job)
    os.close(write_end)
    ready = select.select([read_end], [], [], 30)[0]
    assert ready, "the detached job did not run"
    info = json.loads(os.read(read_end, 4096).decode())
    os.close(read_end)
    assert pid.isdigit() and int(pid) == info["pid"] != os.getpid()
    # a session of its own (the first child's: the grandchild leads none, so never gets a terminal)
    assert info["sid"] not in (os.getsid(0), info["pid"])
    assert info["cwd"] == "/" and info["stdout"] == os.devnull


def test_the_detached_job_needs_no_import_after_the_fork():
    """The job is a fork of the module's process: everything it runs must be imported when the
    module loads (the payload's files are gone once the module has answered)."""
    late = []
    for rel in ("plugins/modules/trainer_restart.py", "plugins/module_utils/job/steps.py"):
        tree = ast.parse(open(os.path.join(ROOT, rel)).read())
        top = set(id(n) for n in tree.body)
        late += ["%s:%d" % (rel, n.lineno) for n in ast.walk(tree)
                 if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top]
    assert late == []


# --- the judges of the state file, and what the module returns ------------------------------------

def test_job_recorded_judge():
    judge = rs.job_recorded("j1")
    assert judge({"job_id": "j1", "phase": "stopping"}, 0).state == DONE
    assert judge({"job_id": "j1", "phase": "stopping"}, 0).value == {"job_id": "j1", "phase": "stopping"}
    assert judge({"job_id": "j0"}, 0).words == "restart job j1 to record itself"
    assert judge({}, 3).state == "waiting"


def test_job_ended_judge():
    judge = rs.job_ended("j1")
    assert judge(({"job_id": "j1", "done": True}, True), 0).state == DONE
    died = judge(({"job_id": "j1", "phase": "starting"}, False), 0)
    assert (died.state, died.value) == (FAILED, {"job_id": "j1", "phase": "starting"})
    assert died.words == "restart job j1 died in phase starting without an outcome"
    running = judge(({"job_id": "j1", "phase": "draining", "waiting": "GPU 3"}, True), 0)
    assert (running.state, running.words) == ("waiting", "draining, GPU 3")
    assert judge(({"job_id": "j0", "phase": "x"}, True), 0).value is None
    assert judge((None, False), 0).words == "not started"


def test_observe_job_reads_the_state_file_and_asks_whether_it_lives(tmp_path):
    path = str(tmp_path / "restart.json")
    asked = []
    assert observe_job(path, alive=lambda s: asked.append(s) or False) == (None, False) and asked == [None]
    write_state(path, {"job_id": "j1", "phase": "proving"})
    assert observe_job(path, alive=lambda s: True) == ({"job_id": "j1", "phase": "proving"}, True)


def test_a_job_that_ends_between_the_reads_is_never_taken_for_dead(tmp_path):
    """The job wrote phase done, then (while the waiter looked at its process) its outcome, and exited: the waiter
    read the state before the outcome and found the process gone - 'died in phase done without an outcome' (seen
    in a CI run). observe_job looks at the process first, then reads the state it judges: the outcome."""
    path = str(tmp_path / "restart.json")
    write_state(path, {"job_id": "j1", "phase": "done", "pid": 4242})
    ended = {"job_id": "j1", "phase": "done", "done": True, "result": {"ok": True}}

    def alive(state):  # the job finishes and exits while its process is looked at
        write_state(path, ended)
        return False
    state, running = observe_job(path, alive=alive)
    assert state == ended and rs.job_ended("j1")((state, running), 0).state == "done"
    # a job that really died: gone when looked at, and its state (read after) has no outcome
    write_state(path, {"job_id": "j2", "phase": "proving", "pid": 4242})
    state, running = observe_job(path, alive=lambda s: False)
    assert rs.job_ended("j2")((state, running), 0).words.startswith("restart job j2 died in phase proving")


def test_job_message_adds_the_outcome_once():
    assert rs.job_message({}) == "restart failed"
    assert rs.job_message({"msg": "no progress", "outcome": "Rolled back: r1"}) == "no progress\n\nRolled back: r1"
    assert rs.job_message({"msg": "nothing was stopped: x", "outcome": "nothing was stopped: x"}) == \
        "nothing was stopped: x"


def test_summary_of_a_finished_job():
    assert rs.summary({"ok": True, "outcome": "ready"}) == (
        True, dict(changed=True, finished=True, phase="done", result={"ok": True, "outcome": "ready"}))
    ok, fields = rs.summary({"ok": False, "msg": "bad", "outcome": "Rolled back"}, job="words")
    assert not ok and fields["msg"] == "bad\n\nRolled back" and fields["job"] == "words" and fields["finished"]


def outcome(state, words="", value=None, snapshot=None):
    return Outcome(state, words, value, snapshot, 0.0, 1)


def test_wait_report_for_each_outcome():
    done_state = {"job_id": "j1", "done": True, "owner": "alice", "started_at": "t",
                  "result": {"ok": False, "msg": "no progress", "outcome": "Rolled back"}}
    ok, fields = rs.wait_report(outcome(DONE, value=done_state), "/s.json")
    assert not ok and fields == dict(changed=True, finished=True, phase="done", result=done_state["result"],
                                     job=outcome_words(done_state), msg="no progress\n\nRolled back",
                                     timeline=[], waiting="")
    ok, fields = rs.wait_report(outcome(DONE, value={"job_id": "j1", "done": True, "result": {"ok": True}}), "/s.json")
    assert ok and "msg" not in fields and fields["result"] == {"ok": True}
    ok, fields = rs.wait_report(outcome(DONE, value={"job_id": "j1", "done": True}), "/s.json")
    assert not ok and fields["result"] == {} and fields["msg"] == "restart failed"
    ok, fields = rs.wait_report(outcome(FAILED, "restart job j1 died in phase x without an outcome",
                                        {"job_id": "j1", "phase": "x"}), "/s.json")
    assert not ok and fields == dict(msg="restart job j1 died in phase x without an outcome (state /s.json)",
                                     finished=True, phase="x", result={}, timeline=[], waiting="")
    assert rs.wait_report(outcome(TIMEOUT, "not started"), "/s.json") == (
        True, dict(changed=False, finished=False, phase="not started", job="", timeline=[], waiting=""))
    # the watcher's lines: the job's timeline and what its phase waits for, from the state it read
    state = {"job_id": "j1", "phase": "proving", "timeline": [["stopping", 0.1], ["proving", 2.0]],
             "waiting": "GPUs held 3/8"}
    fields = rs.wait_report(outcome(TIMEOUT, "proving", state, snapshot=(state, True)), "/s.json")[1]
    assert fields["timeline"] == state["timeline"] and fields["waiting"] == "GPUs held 3/8"
    running = {"job_id": "j1", "phase": "proving", "pid": -1}
    assert rs.wait_report(outcome(TIMEOUT, "proving", running), "/s.json")[1]["job"] == outcome_words(running)
