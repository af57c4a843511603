"""The restart job's steps say what they still wait for (module_utils/job/cycle.py), so the watcher
can print e.g. "draining, held: 0 (2 s of 60)"."""
import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed, drain, ours
from ansible_collections.dflash.trainer.plugins.module_utils.job.wait import PausedClock

HEADER = "index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]"


class FakeRun(object):
    def __init__(self, mibs):
        self.mibs = list(mibs)

    def __call__(self, argv):
        if any(a.startswith("--query-compute-apps") for a in argv):
            return 0, "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n", ""
        mib = self.mibs.pop(0) if len(self.mibs) > 1 else self.mibs[0]
        return 0, "%s\n0, GPU-a, NVIDIA H200, %d MiB, 143771 MiB, 0 %%\n" % (HEADER, mib), ""


def test_drain_ticks_with_what_it_waits_for_and_fails_at_its_deadline():
    now = [0.0]
    said = []
    with pytest.raises(StepFailed) as err:
        drain(FakeRun([30000]), "nvidia-smi", gpus=[0], timeout_s=3, interval_s=1,
              clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + max(s, 0.5)),
              tick=lambda waiting=None: said.append(waiting))
    assert "GPU memory still held after 3 s: GPU 0 30000 MiB" in err.value.msg
    assert said and said[0] == "held: 0 (0 s of 3)"


def test_drain_returns_once_every_gpu_is_free():
    now = [0.0]
    details = drain(FakeRun([30000, 0, 0]), "nvidia-smi", gpus=[0], timeout_s=30, interval_s=1,
                    clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + 1))
    assert details["samples"] == 3


def test_a_drain_frozen_with_its_container_does_not_count_the_freeze():
    """A suspend-mode backup freezes the container during the drain for 60 s, longer than its 30 s deadline: on
    the wall clock the drain times out; on the restart job's PausedClock the freeze is not counted and the
    drain ends when the memory is free."""
    def frozen_once(now):
        calls = [0]

        def sleep(s):
            calls[0] += 1
            now[0] += 1 + (60 if calls[0] == 2 else 0)
        return sleep
    now = [0.0]
    with pytest.raises(StepFailed) as err:
        drain(FakeRun([30000, 30000, 30000, 0, 0]), "nvidia-smi", gpus=[0], timeout_s=30, interval_s=1,
              clock=lambda: now[0], sleep=frozen_once(now))
    assert "GPU memory still held after" in err.value.msg
    now = [0.0]
    paused = PausedClock(lambda: now[0], frozen_once(now))
    details = drain(FakeRun([30000, 30000, 30000, 0, 0]), "nvidia-smi", gpus=[0], timeout_s=30, interval_s=1,
                    clock=paused.clock, sleep=paused.sleep)
    assert details["samples"] == 5 and paused.paused_s == 60


def test_drain_with_an_allowance_returns_the_sample_the_proof_subtracts():
    now = [0.0]
    details = drain(FakeRun([50000, 20500, 20500]), "nvidia-smi", gpus=[0], timeout_s=30, interval_s=1,
                    allowance={0: 20000}, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + 1))
    assert details["gpus_mib"] == {0: 20500}


def test_memory_held_before_the_start_is_not_the_trainers():
    assert ours({5: 50000, 6: 30000, 7: None}, {5: 20000, 7: 100}) == {5: 30000, 6: 30000, 7: None}
    assert ours({5: 10000}, {5: 20000}) == {5: 0}  # the other tenant freed some: never negative
    assert ours({5: 1}, None) == {5: 1}


class CountedRun(FakeRun):
    """FakeRun that records (time, whether it was the process query) per nvidia-smi call."""

    def __init__(self, mibs, now):
        super().__init__(mibs)
        self.now, self.calls = now, []

    def __call__(self, argv):
        self.calls.append((self.now[0], any(a.startswith("--query-compute-apps") for a in argv)))
        return super().__call__(argv)


@pytest.mark.parametrize("mibs, apps_at, failed", [([30000], [2.0, 3.0], True), ([0], [], False)])
def test_the_drain_reads_the_process_list_only_when_a_reading_can_end_it_at_its_deadline(mibs, apps_at, failed):
    """Memory decides; the process list (a second nvidia-smi call) only names the holders in the
    failure message: the readings before the last interval go without it, a drain that ends at once
    never reads it."""
    now = [0.0]
    run = CountedRun(mibs, now)
    try:
        drain(run, "nvidia-smi", gpus=[0], timeout_s=3, interval_s=1, clock=lambda: now[0],
              sleep=lambda s: now.__setitem__(0, now[0] + s))
    except StepFailed as exc:
        assert failed and "holders: none visible" in exc.msg
    else:
        assert not failed
    assert [t for t, apps in run.calls if apps] == apps_at
    assert [t for t, apps in run.calls if not apps] == ([0.0, 1.0, 2.0, 3.0] if failed else [0.0, 1.0])
