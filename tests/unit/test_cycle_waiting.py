"""The restart job's steps say what they still wait for (module_utils/_cycle.py), so the watcher
can print e.g. "draining, held: 0 (2 s of 60)"."""
import pytest

from ansible_collections.dflash.trainer.plugins.module_utils._cycle import StepFailed, drain, ours

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


def test_drain_with_an_allowance_returns_the_sample_the_proof_subtracts():
    now = [0.0]
    details = drain(FakeRun([50000, 20500, 20500]), "nvidia-smi", gpus=[0], timeout_s=30, interval_s=1,
                    allowance={0: 20000}, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + 1))
    assert details["gpus_mib"] == {0: 20500}


def test_memory_held_before_the_start_is_not_the_trainers():
    assert ours({5: 50000, 6: 30000, 7: None}, {5: 20000, 7: 100}) == {5: 30000, 6: 30000, 7: None}
    assert ours({5: 10000}, {5: 20000}) == {5: 0}  # the other tenant freed some: never negative
    assert ours({5: 1}, None) == {5: 1}
