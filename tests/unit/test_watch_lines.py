"""The watch's lines (plugins/plugin_utils/_watch.py): each phase once, as it begins, with when; what
the phase waits for each time it changes (and again after REPEAT_S); the job's words at the end."""
from ansible_collections.dflash.trainer.plugins.plugin_utils import _watch
from ansible_collections.dflash.trainer.plugins.plugin_utils._watch import lines


def test_each_phase_is_said_once_as_it_begins():
    r1 = {"timeline": [["stopping", 0.05], ["draining", 1.2]], "waiting": "", "finished": False}
    out, seen, said, at = lines(r1, 0, "", 10.0, None)
    assert out == ["stopping (at 0.1 s)", "draining (at 1.2 s)"] and seen == 2
    r2 = dict(r1, timeline=r1["timeline"] + [["proving", 3.0]], waiting="GPUs held 3/8")
    out, seen, said, at = lines(r2, seen, said, 11.0, at)
    assert out == ["proving (at 3.0 s)", "proving: GPUs held 3/8"] and seen == 3 and at == 11.0
    # the same wait is not said again until it changes, or REPEAT_S passed
    out, seen, said, at = lines(r2, seen, said, 12.0, at)
    assert out == []
    out, _s, _w, _a = lines(r2, seen, said, 11.0 + _watch.REPEAT_S, at)
    assert out == ["proving: GPUs held 3/8"]
    r3 = dict(r2, waiting="step 12, holding (2 s of 4)")
    assert lines(r3, seen, said, 13.0, at)[0] == ["proving: step 12, holding (2 s of 4)"]


def test_the_end_says_the_jobs_words_and_any_phase_not_said_yet():
    done = {"timeline": [["stopping", 0.1], ["proving", 3.0], ["done", 9.5], ["finished", 9.6]], "finished": True,
            "job": "restart job j1 (started by alice) ended: ready", "waiting": "held"}
    out, seen, _said, _at = lines(done, 1, "", 20.0, None)
    assert out == ["proving (at 3.0 s)", "done (at 9.5 s)", "ended: ready"]
    assert seen == 4


def test_a_result_without_a_timeline_says_nothing_and_never_fails():
    assert lines({}, 0, "", 1.0, None)[0] == []
    assert lines({"timeline": "x", "waiting": None}, 0, "", 1.0, None)[0] == []
    assert lines({"timeline": [["x"], ["starting", "?"]]}, 0, "", 1.0, None)[0] == ["starting"]
