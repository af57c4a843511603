"""The deliberate stop (trainer_restart operation=stop, module_utils/job/stop.py): what it stops and says,
what it records, how status reads it (plan.status.stopped_on_purpose, proof.throughput.health), and the
metrics file's directory that must exist (target.ownership.missing_dir_problem)."""
import json
import os

from ansible_collections.dflash.trainer.plugins.module_utils.target import ownership as o
from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed
from ansible_collections.dflash.trainer.plugins.module_utils.job.result import problems
from ansible_collections.dflash.trainer.plugins.module_utils.plan.status import STOP_KIND, fmt_uptime, stopped_on_purpose
from ansible_collections.dflash.trainer.plugins.module_utils.job.stop import (
    StopJob,
    enable_unit,
    run_stop,
    stop_words,
    what_runs,
)
from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import PROVED, health
from test_restart_job import FakeSteps, Lease  # pylint: disable=wrong-import-order
from test_restart_steps import params  # pylint: disable=wrong-import-order

RUNNING = {"ActiveState": "active", "SubState": "running", "MainPID": "4242", "InvocationID": "inv1",
           "ExecMainStartTimestamp": "Mon 2026-11-30 17:00:00 UTC"}
STOPPED = dict(RUNNING, ActiveState="inactive", SubState="dead", MainPID="0")


class DrainSteps(FakeSteps):
    def drain(self):
        self._step("drain")
        return {"gpus_mib": {0: 3, 1: 0}}


def looked():
    return what_runs(RUNNING, "r1", 3725.4, 812, 10450.0)


# --- what runs, in words ------------------------------------------------------------------------

def test_what_runs_reads_the_running_unit_and_nothing_of_a_stopped_one():
    got = looked()
    assert got["running"] and got["release"] == "r1" and got["main_pid"] == 4242 and got["seconds_up"] == 3725.4
    assert got["step"] == 812 and got["tok_s"] == 10450.0 and got["state_before"] == "active/running"
    idle = what_runs(STOPPED, None, 12.0, 5, 1.0)
    assert not idle["running"] and idle["main_pid"] == 0 and idle["seconds_up"] is None and idle["step"] is None


def test_uptime_in_words():
    assert [fmt_uptime(s) for s in (None, 42, 192, 3725, 180000)] == ["?", "42 s", "3 min 12 s", "1 h 02 min",
                                                                      "2 d 2 h"]


def test_stop_words_name_release_pid_uptime_progress_who_when_and_the_boot():
    words = stop_words("dflash-trainer", dict(looked(), by="ops on laptop", at_words="2026-11-30T18:00:00Z",
                                              gpus_mib={0: 3}, enabled=True))
    for part in ("stopped dflash-trainer: release r1, pid 4242, up 1 h 02 min", "last step 812 at 10450.0 tok/s",
                 "on purpose, by ops on laptop at 2026-11-30T18:00:00Z", "GPUs drained (MiB 0: 3)",
                 "starts again when the container boots", "trainer_stop_disable=true"):
        assert part in words, (part, words)
    disabled = stop_words("u", dict(looked(), disabled=True, enabled=False))
    assert "stays stopped across a reboot" in disabled and "starts again" not in disabled
    assert "was not running (inactive/dead)" in stop_words("u", what_runs(STOPPED))


# --- the job ------------------------------------------------------------------------------------

def test_a_stop_looks_stops_drains_and_says_what_it_stopped():
    steps, phases = DrainSteps(), []
    result = StopJob(steps, looked, "dflash-trainer", owner="alice", enabled=lambda: "enabled",
                     on_phase=lambda name, **kw: phases.append(name), clock=lambda: 1764525600.0).run()
    assert problems(result) == [] and result["ok"] is True
    assert steps.calls == ["stop", "drain"] and phases == ["looking", "stopping", "draining", "done"]
    stopped = result["stopped"]
    assert stopped["by"] == "alice" and stopped["at"] == 1764525600.0 and stopped["at_words"] == "2025-11-30T18:00:00Z"
    assert stopped["gpus_mib"] == {0: 3, 1: 0} and stopped["enabled"] is True and "disabled" not in stopped
    assert result["release"] == "r1" and result["restarted"] is False
    assert result["outcome"].startswith("stopped dflash-trainer: release r1, pid 4242")


def test_a_stop_with_disable_disables_after_the_drain():
    steps, order = DrainSteps(), []
    result = StopJob(steps, looked, "u", disable=lambda: order.append(list(steps.calls)),
                     enabled=lambda: "disabled").run()
    assert result["ok"] and order == [["stop", "drain"]]
    assert result["stopped"]["disabled"] is True and result["stopped"]["enabled"] is False
    assert "stays stopped across a reboot" in result["outcome"]


def test_a_lost_lease_stops_nothing():
    steps = DrainSteps()
    result = StopJob(steps, looked, "u", lease=Lease(0)).run()
    assert steps.calls == [] and result["ok"] is False and result["lease_lost"] is True
    assert "nothing was stopped by it" in result["msg"] and result["stopped"] is None


def test_a_failed_systemctl_stop_is_no_deliberate_stop_on_record():
    result = StopJob(DrainSteps(fail=[("stop", 1, "Unable to stop unit u: timeout")]), looked, "u").run()
    assert result["ok"] is False and result["failed_phase"] == "stopping" and result["stopped"] is None
    assert "Unable to stop unit u" in result["msg"] and problems(result) == []


def test_a_drain_that_fails_after_the_stop_keeps_the_stop_on_record_and_fails():
    result = StopJob(DrainSteps(fail=[("drain", 1, "GPU 1 still holds 70000 MiB")]), looked, "u").run()
    assert result["ok"] is False and result["failed_phase"] == "draining"
    assert result["stopped"]["release"] == "r1" and "GPU 1 still holds" in result["msg"]
    assert "is stopped" in result["outcome"]  # the unit's state follows the reason


def test_an_unexpected_error_is_an_outcome_not_a_crash():
    def boom():
        raise RuntimeError("no /proc")
    result = StopJob(DrainSteps(), boom, "u").run()
    assert result["ok"] is False and "unexpected error: RuntimeError: no /proc" in result["msg"]


def test_run_stop_records_a_stop_job_and_its_outcome(tmp_path):
    p = params(tmp_path, disable=False)

    def make_steps(_p, _systemctl, _smi, _tick):
        return DrainSteps()

    result = run_stop(p, "/bin/false", "smi", pid=os.getpid(), make_steps=make_steps, look_fn=lambda _p, _s: looked())
    state = json.loads(open(p["state_path"]).read())
    assert state["kind"] == STOP_KIND and state["done"] and state["job_id"] == "j1" and state["owner"] == "alice"
    assert state["result"] == json.loads(json.dumps(result)) and result["ok"]
    assert result["stopped"]["enabled"] is None  # the unit file state could not be read (systemctl /bin/false)


def test_run_stop_before_the_stop_step_stops_nothing(tmp_path):
    def broken(*_a):
        raise StepFailed("invalid step_regex '(': missing )")
    result = run_stop(params(tmp_path), "/bin/false", "smi", pid=os.getpid(), make_steps=broken)
    assert result["ok"] is False and result["outcome"].startswith("nothing was stopped")


def test_enable_unit_enables_only_a_disabled_unit():
    calls = []

    def run(argv):
        calls.append(argv[1])
        if argv[1] == "show":
            return 0, "UnitFileState=%s\n" % state[0], ""
        return 0, "", ""
    state = ["enabled"]
    assert enable_unit(run, "systemctl", "u") is False and calls == ["show"]
    state[0] = "disabled"
    assert enable_unit(run, "systemctl", "u") is True and calls[-1] == "enable"


# --- how status reads it ------------------------------------------------------------------------

def stop_state(**stopped):
    base = dict(looked(), by="alice", at=1.0, at_words="2026-11-30T18:00:00Z")
    base.update(stopped)
    return {"kind": STOP_KIND, "job_id": "t-stop-1", "done": True, "result": {"ok": True, "stopped": base}}


def test_a_stop_on_record_holds_while_the_unit_was_not_started_since():
    got = stopped_on_purpose(stop_state(), STOPPED)
    assert got["job_id"] == "t-stop-1"
    assert got["words"] == "stopped on purpose by alice at 2026-11-30T18:00:00Z (release r1, pid 4242, up 1 h 02 min)"
    # no start since the container booted (the unit disabled by the stop): still the stop's doing
    assert stopped_on_purpose(stop_state(), dict(STOPPED, ExecMainStartTimestamp="")) is not None


def test_a_stop_on_record_no_longer_holds_once_the_unit_started_again():
    assert stopped_on_purpose(stop_state(), RUNNING) is None
    later = dict(STOPPED, ExecMainStartTimestamp="Mon 2026-11-30 19:00:00 UTC", ActiveState="failed")
    assert stopped_on_purpose(stop_state(), later) is None  # started by hand, then died: a failure
    restart = {"job_id": "x", "done": True, "result": {"ok": True, "outcome": "ready: ..."}}
    assert stopped_on_purpose(restart, STOPPED) is None
    assert stopped_on_purpose(dict(stop_state(), done=False), STOPPED) is None
    assert stopped_on_purpose(None, STOPPED) is None


def test_health_says_stopped_on_purpose_instead_of_not_running():
    ledger = [{"release": "r1", "verdict": PROVED, "time": 0.0, "at": "x"}]
    stopped = stopped_on_purpose(stop_state(), STOPPED)
    got = health(ledger, "r1", False, now=10.0, state="inactive/dead", stopped=stopped)
    assert got["ok"] is False and got["stopped"] == stopped
    assert got["words"].startswith("stopped on purpose by alice at 2026-11-30T18:00:00Z")
    plain = health(ledger, "r1", False, now=10.0, state="inactive/dead")
    assert plain["words"].startswith("not running (inactive/dead)") and "stopped" not in plain
    running = health(ledger, "r1", True, started_at=-1.0, now=10.0, stopped=stopped)
    assert running["ok"] and "stopped" not in running  # a stop on record never hides a trainer that runs


# --- the metrics file's directory must exist ----------------------------------------------------

PROM = "/var/lib/node_exporter/textfile_collector/dflash_trainer.prom"


def test_a_metrics_file_in_a_directory_that_does_not_exist_is_refused(tmp_path):
    facts = o.observe(str(tmp_path / "no-exporter" / "m.prom"), "metrics")
    assert facts["parent_exists"] is False
    facts.update(real=PROM, chain=[])  # judged as if in the textfile directory, its parents root's
    why = o.judge("trainer_metrics_path", "metrics", facts)
    assert why and "lies in /var/lib/node_exporter/textfile_collector, which does not exist" in why
    assert "node_exporter" in why and "trainer_metrics_path empty" in why
    present = o.observe(str(tmp_path / "m.prom"), "metrics")
    present.update(real=PROM, chain=[])
    assert present["parent_exists"] is True and o.judge("trainer_metrics_path", "metrics", present) is None


def test_only_the_metrics_file_needs_its_directory():
    facts = {"path": "/workspace/new/trainer.log", "real": "/workspace/new/trainer.log", "exists": False,
             "chain": [("/", 0, 0o755), ("/workspace", 0, 0o755)], "parent_exists": False}
    assert o.judge("trainer_log_path", "log", facts) is None
    assert o.missing_dir_problem("log", facts) is None
    assert "does not exist" in o.missing_dir_problem("metrics", facts)
    assert o.missing_dir_problem("metrics", dict(facts, parent_exists=True)) is None
