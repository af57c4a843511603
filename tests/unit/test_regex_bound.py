# -*- coding: utf-8 -*-
"""A user's regex that backtracks without end on a real line (one the controller's timing check
cannot foresee) never holds the reading of the log: each line's searches run under a time bound
(plugins/module_utils/proof/trainer_log.py, LineBound), the proof ends as a verdict naming the regex and the line,
at its deadline at the latest."""

import signal
import threading
import time

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl
from ansible_collections.dflash.trainer.plugins.plugin_utils import _validate as validate
from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed, compile_regexes, prove
from ansible_collections.dflash.trainer.plugins.module_utils.proof.readiness import Expectations
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import LineBound, RegexTimeout

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
# needs a digit after "step=" before its nested repeat: the adversarial lines of the timing check
# ("step=" then one repeated character) never reach it, a real line "step=12 qqqq…" backtracks 2^n
CATASTROPHIC = r"step=(\d+)(?:q+q+)+#"
LINE = "step=12" + "q" * 60
GOOD = "2026-12-01 INFO train: step %d loss 2.0 tok/s 1000.0"


def test_the_catastrophic_regex_passes_the_controllers_timing_check():
    assert validate.slow_regexes([("trainer_step_regex", CATASTROPHIC)]) == {}


def test_a_line_it_backtracks_on_ends_the_reading_naming_the_regex_and_the_line():
    a = tl.LogAnalysis(step_regex=CATASTROPHIC, bound=LineBound(line_s=0.2))
    a.add(GOOD % 1)
    began = time.monotonic()
    with pytest.raises(RegexTimeout) as err:
        a.add(LINE)
    assert time.monotonic() - began < 5  # unbounded, it runs for ages
    e = err.value
    assert (e.label, e.pattern, e.line_no, e.line, e.deadline) == ("trainer_step_regex", CATASTROPHIC, 2, LINE, False)
    assert str(e).startswith("trainer_step_regex %r did not finish searching line 2 of this start within 0.2 s"
                             % CATASTROPHIC)
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.parametrize("kwargs,label", [
    (dict(error_regexes=[r"Traceback", CATASTROPHIC]), "trainer_error_regexes[1]"),
    (dict(extra_regexes={"q_hs": CATASTROPHIC}), "trainer_measure_regexes['q_hs']"),
    (dict(ready_regex=CATASTROPHIC), "trainer_ready_regex"),
    (dict(tokps_regex=CATASTROPHIC), "trainer_tokps_regex"),
])
def test_each_of_the_users_regexes_is_bounded_and_named(kwargs, label):
    with pytest.raises(RegexTimeout) as err:
        tl.LogAnalysis(bound=LineBound(line_s=0.2), **kwargs).add(LINE)
    assert err.value.label == label


def test_the_deadline_cuts_the_bound_of_a_line_and_says_so():
    bound = LineBound(line_s=30, deadline=time.monotonic() + 0.3)
    began = time.monotonic()
    with pytest.raises(RegexTimeout) as err:
        tl.LogAnalysis(step_regex=CATASTROPHIC, bound=bound).add(LINE)
    assert time.monotonic() - began < 5
    assert err.value.deadline and str(err.value).startswith("the proof's deadline came while trainer_step_regex")


def test_lines_that_read_in_time_are_read_as_before_and_a_timer_armed_before_is_put_back():
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *_a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        a = tl.LogAnalysis(bound=LineBound(line_s=0.5)).extend(GOOD % i for i in range(1, 50))
        left, _interval = signal.getitimer(signal.ITIMER_REAL)
        assert a.n_steps == 49 and a.tok_s == 1000.0
        assert 20 < left <= 30 and not fired
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        deadline = time.monotonic() + 5
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fired  # the handler that was there is back
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_outside_the_main_thread_the_searches_run_unbounded_and_read_as_before():
    # (signal.signal outside the main thread raises ValueError: the bound is not armed there)
    out = []
    t = threading.Thread(target=lambda: out.append(tl.LogAnalysis(bound=LineBound(line_s=0.01)).extend([GOOD % 3]).n_steps))
    t.start()
    t.join()
    assert out == [1]


def test_a_progress_files_record_is_searched_by_the_error_patterns_under_the_bound():
    a = tl.ProgressAnalysis(error_regexes=[CATASTROPHIC], bound=LineBound(line_s=0.2))
    with pytest.raises(RegexTimeout) as err:
        a.add('{"step": 1, "tok_s": 10.0, "note": "%s"}' % LINE)
    assert err.value.label == "trainer_error_regexes[0]" and err.value.line_no == 1


class Trainer(object):
    """systemctl show: running; nvidia-smi: memory held - only the log can decide."""

    def __call__(self, argv):
        if "show" in argv:
            return 0, ("ActiveState=active\nSubState=running\nInvocationID=%s\nNRestarts=0\nMainPID=4242\n"
                       "Result=success\nExecMainCode=0\nExecMainStatus=0\n" % INV), ""
        return 0, ("index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n"
                   "0, GPU-a, NVIDIA H200, 30000 MiB, 143771 MiB, 0 %\n"), ""


def test_the_proof_ends_as_a_verdict_naming_the_regex_and_the_line_before_its_deadline(tmp_path):
    log = tmp_path / "trainer.log"
    log.write_text(tl.marker_line(INV, "r1", 4242, "t") + "\n" + GOOD % 1 + "\n" + LINE + "\n")
    expect = Expectations(invocation_id=INV, gpus=[0], min_mib=1024, min_steps=2, hold_s=3, stall_s=2,
                          timeout_s=3, ready_regex=tl.DEFAULT_READY_REGEX)
    regexes = compile_regexes(tl.DEFAULT_READY_REGEX, CATASTROPHIC, tl.DEFAULT_TOKPS_REGEX,
                              list(tl.DEFAULT_ERROR_REGEXES))
    began = time.monotonic()
    with pytest.raises(StepFailed) as err:
        prove(Trainer(), "systemctl", "nvidia-smi", "t.service", str(log), expect, regexes, interval_s=0.2)
    took = time.monotonic() - began
    assert took < expect.timeout_s + 1.5, took  # the bound of the line (2 s) is cut at the deadline
    msg = err.value.msg
    assert msg.startswith("the proof stopped reading the log: trainer_step_regex %r did not finish searching line "
                          "2 of this start" % CATASTROPHIC), msg
    assert err.value.details["regex"] == "trainer_step_regex" and err.value.details["line"] == 2
    assert GOOD % 1 in err.value.details["log_tail"]
