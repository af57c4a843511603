"""What the role shows of a job's end, judged on the controller (plugins/plugin_utils/_watch.py ``outcome``):
the verdict (ok), the proof in one line or what a stop stopped (words), why it failed (fail_msg); and the
failure of a call that was to start a job and did not. The words are those the role's Jinja wrote before."""
import pytest

from ansible_collections.dflash.trainer.plugins.plugin_utils._watch import not_started_msg, outcome, proof_words

PROOF = {"release": "r2", "invocation_id": "abc", "main_pid": 42, "seconds_to_ready": 12.5, "step": 30,
         "tok_s": 9800.5, "gpus_mib": {"0": 1234}}


def test_the_proof_in_one_line():
    assert proof_words("trainer", PROOF, ["forced (trainer_force_restart)", "environment changed"]) == (
        "trainer ready: release r2, invocation abc, pid 42, 12.5 s to ready, step 30, 9800.5 tok/s, "
        "GPU MiB {'0': 1234}; restarted because: forced (trainer_force_restart); environment changed")


def test_the_proofs_optional_parts_and_a_value_not_read():
    proof = dict(PROOF, step=None, baseline_words="GPU0 512 MiB", gpu_memory="by process", paused_s=3)
    assert proof_words("t", proof, []) == (
        "t ready: release r2, invocation abc, pid 42, 12.5 s to ready, step , 9800.5 tok/s, GPU MiB {'0': 1234}"
        " (not counted for the trainer: GPU0 512 MiB held before the start); GPU memory counted: by process"
        "; the proof did not run for 3 s (its container frozen), not counted; restarted because: ")


@pytest.mark.parametrize("job, kind, want", [
    ({"finished": True, "result": {"ok": True, "proof": PROOF, "comparison": {"words": "r2: 9800 tok/s (+2%)"}}},
     "restart", (True, 2, None)),
    ({"finished": True, "result": {"ok": True, "proof": PROOF}}, "restart", (True, 1, None)),
    ({"finished": True, "result": {"ok": True, "outcome": "stopped trainer (release r2, pid 42)"}}, "stop",
     (True, 1, None)),
    ({"finished": True, "msg": "the proof failed: died; rolled back to r1", "result": {"ok": False}}, "restart",
     (False, 0, "the proof failed: died; rolled back to r1")),
    ({"finished": False, "phase": "proving"}, "restart",
     (False, 0, "the restart job did not finish within its budget (phase proving)")),
    ({}, "stop", (False, 0, "the stop job did not finish within its budget (phase ?)")),
])
def test_the_outcome(job, kind, want):
    got = outcome(job, "trainer", ["restart requested"], kind)
    assert (got["ok"], len(got["words"]), got["fail_msg"]) == want
    if kind == "stop" and got["ok"]:
        assert got["words"] == ["stopped trainer (release r2, pid 42)"]


def test_a_call_that_started_nothing():
    refused = {"msg": "pre-flight refused the release", "output": ["line 1", "line 2"], "not_started": True}
    assert not_started_msg(refused) == "pre-flight refused the release\n    line 1\n    line 2"
    unsure = not_started_msg({"msg": "restart job j (pid 7) did not record itself"})
    assert unsure.endswith("(the restart job may have started: it goes on on the target and releases the lock when "
                           "it ends; the next run reports its outcome)")
    assert not_started_msg({}).startswith("the call that starts the restart job failed")
