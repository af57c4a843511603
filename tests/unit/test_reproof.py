"""A release brought back with the configuration it was proved with is re-proved: the same conditions held
for the stall window instead of the whole hold, no throughput window after it. Anything else brought back
gets the full proof."""
import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.proof import readiness as rd
from ansible_collections.dflash.trainer.plugins.module_utils.job.restart import RestartJob, proved_before
from ansible_collections.dflash.trainer.plugins.module_utils.job.steps import reproof_settings
from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import PROVED, entry

from test_readiness import INV, Sim, progress
from test_restart_job import FakeLayout, FakeSteps

CFG, OTHER = "aaaa0001", "bbbb0002"


def test_proved_before_needs_a_proof_of_that_release_with_that_configuration():
    ledger = [entry("old", PROVED, {}, now=1, config=CFG), entry("new", "failed", {}, now=2, config=CFG)]
    assert proved_before(ledger, "old", CFG)
    assert not proved_before(ledger, "old", OTHER)  # the environment or command changed since its proof
    assert not proved_before(ledger, "old", None)   # what runs is unknown: never taken for proved
    assert not proved_before(ledger, "new", CFG)    # failed is not proved
    assert not proved_before([], "old", CFG) and not proved_before(ledger, None, CFG)


def test_the_reproof_holds_for_the_stall_window_and_measures_nothing_after_it():
    p = {"hold_s": 10.0, "stall_s": 5.0, "measure_s": 60.0, "min_steps": 2, "min_mib": 1024}
    got = reproof_settings(p)
    assert (got["hold_s"], got["measure_s"]) == (5.0, None)
    assert {k: got[k] for k in ("stall_s", "min_steps", "min_mib")} == {"stall_s": 5.0, "min_steps": 2, "min_mib": 1024}
    assert p["hold_s"] == 10.0 and p["measure_s"] == 60.0  # the full proof's settings are left as they were
    # a hold already shorter than the window stays; settings not given take the proof's defaults
    assert reproof_settings(dict(p, hold_s=3.0, stall_s=3.0))["hold_s"] == 3.0
    assert reproof_settings({})["hold_s"] == min(rd.Expectations(invocation_id="").hold_s,
                                                 rd.Expectations(invocation_id="").stall_s)


def _judge(p):
    return rd.Judge(rd.Expectations(invocation_id=INV, timeout_s=120.0, hold_s=p["hold_s"], stall_s=p["stall_s"]))


def test_the_reproof_still_needs_progress_and_is_ready_a_stall_window_after_it():
    """The judge accepts the re-proof's settings (a hold no shorter than the stall window) and still asks for
    the step counter to rise: a trainer stuck after two steps is never re-proved, a stepping one is, sooner."""
    settings = reproof_settings({"hold_s": 10.0, "stall_s": 5.0})
    sim, j = Sim(), _judge(settings)
    ready_at = None
    for t in range(0, 30):
        sim.say(progress(t + 1))
        v = j.observe(sim.snap(t))
        if v.done:
            ready_at = t
            assert v.state == rd.READY
            break
    assert ready_at == 6  # all conditions from t=1 (step 2), held 5 s; the full proof: t=11
    stuck, j = Sim().say(progress(1), progress(2)), _judge(settings)
    states = [j.observe(stuck.snap(t)).state for t in range(0, 30)]
    assert rd.READY not in states and states[-1] == rd.FAILED


class RecordingSteps(FakeSteps):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.reproofs = []

    def prove(self, invocation_id, n_restarts, reproof=False):
        self.reproofs.append(reproof)
        return super().prove(invocation_id, n_restarts)


@pytest.mark.parametrize("config_now, ledger_config, reproof", [
    (CFG, CFG, True),      # the last good release with the configuration it was proved with
    (OTHER, CFG, False),   # another configuration in place: a full proof
    (None, CFG, False),    # unknown: a full proof
])
def test_the_rollback_re_proves_only_what_the_ledger_proved(config_now, ledger_config, reproof):
    steps = RecordingSteps(fail=[("prove", 1, "not ready")])
    layout = FakeLayout(current="old", last_good="old")
    layout.entries.append(entry("old", PROVED, {}, now=1, config=ledger_config))
    res = RestartJob(steps, layout, release="new", config_id=lambda: config_now).run()
    assert res["rolled_back"] and res["rollback_release"] == "old" and res["rollback_proof"]
    # the failed start got the full proof; the rollback's start a re-proof only when the ledger holds its proof
    assert steps.reproofs == [False, reproof]
    assert steps.calls.count("start") == 2 and steps.calls[-1] == "prove"


def test_a_restore_of_the_release_that_ran_is_re_proved_and_a_failed_reproof_is_a_failed_rollback():
    # our own drain failed before any start: the release that ran (proved with this configuration) comes back
    steps = RecordingSteps(fail=[("drain", 1, "memory held")])
    layout = FakeLayout(current="old", last_good="old")
    layout.entries.append(entry("old", PROVED, {}, now=1, config=CFG))
    res = RestartJob(steps, layout, config_id=lambda: CFG).run()
    assert res["restored"] and steps.reproofs == [True]
    # a re-proof that fails is the rollback's failure, said as such: never taken for good
    steps = RecordingSteps(fail=[("prove", 1, "not ready"), ("prove", 2, "stalled at step 2")])
    layout = FakeLayout(current="old", last_good="old")
    layout.entries.append(entry("old", PROVED, {}, now=1, config=CFG))
    res = RestartJob(steps, layout, release="new", config_id=lambda: CFG).run()
    assert steps.reproofs == [False, True]
    assert not res["ok"] and res["rollback_failure"] == "stalled at step 2" and "FAILED as well" in res["outcome"]
    assert not isinstance(res.get("rollback_proof"), dict) or not res["rollback_proof"]
