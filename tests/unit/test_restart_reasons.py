"""The deploy's restart decision (module_utils/_restart_reasons.py), row by row."""
import pytest

from ansible_collections.dflash.trainer.plugins.module_utils._restart_reasons import restart_reasons

HEALTHY = {"ok": True, "words": "running release r1, proved 3 s ago (unit restarts: 0)"}
RUNNING = {"running": True, "running_release": "r1", "last_good": "r1", "health": HEALTHY}


def before(**changes):
    return dict(RUNNING, **changes)


@pytest.mark.parametrize("kw, want", [
    # nothing changed, the running trainer is the proved one: left alone
    ({"before": before()}, []),
    ({"before": before(health=None)}, []),  # an older target without a ledger read: last_good decides
    ({"before": before(), "force": True}, ["forced (trainer_force_restart)"]),
    ({"before": before(), "switched": True, "release": "r2"},
     ["release switched to r2", "running release r1 is not current r2"]),
    ({"before": before(), "install": {"unit_changed": True, "env_changed": True, "launcher_changed": False}},
     ["unit file changed", "environment changed"]),
    ({"before": {"running": False, "last_good": "r1"}}, ["trainer not running"]),
    ({"before": {}}, ["trainer not running"]),
    # a reboot mid-job: current switched, never proved
    ({"before": before(last_good="r0", last_job={"words": "restart job j (root) interrupted in proving"})},
     ["release r1 runs without a proof on record (last proved: r0; restart job j (root) interrupted in proving)"]),
    ({"before": before(last_good=None)},
     ["release r1 runs without a proof on record (last proved: none; no restart job on record)"]),
    # proved, but this start of it is not the one proved: the words status fails with
    ({"before": before(health={"ok": False, "words": "restarted 62 min after its proof, not proved since (unit restarts: 0)"})},
     ["the running trainer is not the one proved: restarted 62 min after its proof, not proved since (unit restarts: 0)"]),
    ({"before": before(health={"ok": False, "words": "died 23 s after its proof: OOM (unit restarts: 1); running again, not proved since"})},
     ["the running trainer is not the one proved: died 23 s after its proof: OOM (unit restarts: 1); running again, not proved since"]),
])
def test_restart_reasons(kw, want):
    kw.setdefault("release", "r1")
    assert restart_reasons(kw.pop("before"), kw.pop("release"), **kw) == want


def test_the_filter_is_the_function():
    from ansible_collections.dflash.trainer.plugins.filter.restart_reasons import FilterModule
    assert FilterModule().filters()["restart_reasons"] is restart_reasons
