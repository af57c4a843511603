"""Whose GPU memory (module_utils/proof/unit_gpu.py, job.cycle.prove): the proof counts the memory the trainer unit's
processes hold - nvidia-smi's processes attributed by control group - never memory another process allocated
after the start; where nvidia-smi cannot say whose memory it is, today's baseline rule, said in words."""
import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl
from ansible_collections.dflash.trainer.plugins.module_utils.proof import unit_gpu as ug
from ansible_collections.dflash.trainer.plugins.module_utils.job.cycle import StepFailed, compile_regexes, prove
from ansible_collections.dflash.trainer.plugins.module_utils.proof.readiness import Expectations

UNIT_CG = "/system.slice/t.service"
INV = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
HEADER = "index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]"
APPS_HEADER = "gpu_uuid, pid, used_gpu_memory [MiB]"
REGEXES = compile_regexes(tl.DEFAULT_READY_REGEX, tl.DEFAULT_STEP_REGEX, tl.DEFAULT_TOKPS_REGEX,
                          list(tl.DEFAULT_ERROR_REGEXES))
GROUPS = {100: UNIT_CG, 101: UNIT_CG + "/worker", 200: "/user.slice/user-1000.slice/session-3.scope",
          300: "/system.slice/t.service-other.service"}


def gpu(index, used, procs=()):
    return {"index": index, "uuid": "GPU-%d" % index, "memory_used_mib": used,
            "processes": [{"pid": p, "process_name": None, "used_memory_mib": m} for p, m in procs]}


@pytest.mark.parametrize("text,path", [
    ("0::/system.slice/t.service\n", "/system.slice/t.service"),
    ("12:memory:/x\n1:name=systemd:/system.slice/t.service\n0::/system.slice/t.service\n", "/system.slice/t.service"),
    ("12:memory:/system.slice/t.service\n1:name=systemd:/system.slice/t.service\n", "/system.slice/t.service"),
    ("", None), ("garbage", None),
])
def test_cgroup_path(text, path):
    assert ug.cgroup_path(text) == path


def test_in_group_is_the_unit_or_below_it_never_a_prefix_of_another_name():
    assert ug.in_group(UNIT_CG, UNIT_CG) and ug.in_group(UNIT_CG + "/w", UNIT_CG)
    assert not ug.in_group("/system.slice/t.service-other.service", UNIT_CG)
    assert not ug.in_group(None, UNIT_CG) and not ug.in_group(UNIT_CG, "")


def test_only_the_units_processes_memory_counts():
    gpus = [gpu(0, 31000, [(100, 30000), (200, 1000)]), gpu(1, 20000, [(101, 20000)]),
            gpu(5, 40000, [(200, 40000)]), gpu(6, 40000, [(300, 40000)]), gpu(7, 0)]
    mib, rule = ug.unit_memory(gpus, UNIT_CG, GROUPS.get)
    assert rule == ug.BY_PROCESS
    assert mib == {0: 30000, 1: 20000, 5: 0, 6: 0, 7: 0}


@pytest.mark.parametrize("gpus,warnings", [
    ([gpu(0, 30000), gpu(1, 0)], ()),  # lists no processes (LXC passthrough)
    ([gpu(0, 30000, [(3000100, 30000)])], ()),  # a host PID this container cannot see
    ([gpu(0, 30000, [(100, None)])], ()),  # no memory per process ([N/A])
    ([gpu(0, 30000, [(100, 30000)])], ("process list unavailable: ...",)),
])
def test_where_nvidia_smi_cannot_say_whose_memory_it_is_the_baseline_rule_applies(gpus, warnings):
    assert ug.unit_memory(gpus, UNIT_CG, GROUPS.get, warnings) == (None, ug.BY_BASELINE)


def test_the_rules_words():
    assert ug.rule_words(ug.BY_PROCESS, [], UNIT_CG).startswith("memory held by the processes of %s" % UNIT_CG)
    words = ug.rule_words(ug.BY_BASELINE, [gpu(0, 1)], UNIT_CG)
    assert words.startswith("the container's nvidia-smi lists no processes (as through LXC passthrough): each "
                            "GPU's memory less what it held before the start")
    assert "cannot attribute" in ug.rule_words(ug.BY_BASELINE, [gpu(0, 1, [(5, 1)])], UNIT_CG)


def test_cgroup_of_reads_this_process_and_none_for_an_invisible_pid():
    import os
    assert ug.cgroup_of(os.getpid()) is not None or not os.path.exists("/proc/self/cgroup")
    assert ug.cgroup_of(4194305) is None


class Node(object):
    """A running unit on 8 GPUs: the trainer (pid 100, in the unit's control group) holds ``ours`` GPUs;
    from ``stranger_at`` seconds on a stranger (pid 200, a login's) holds 40000 MiB on ``theirs``."""

    def __init__(self, log, ours, theirs=(), stranger_at=0.0, list_processes=True):
        self.t, self.log, self.steps = 0.0, log, 0
        self.ours, self.theirs, self.stranger_at, self.list_processes = ours, theirs, stranger_at, list_processes
        log.write_text(tl.marker_line(INV, "r1", 100, "t") + "\n")

    def clock(self):
        return self.t

    def sleep(self, s):
        self.t += s
        with open(str(self.log), "a") as fh:
            while self.t >= 0.3 + self.steps * 0.25:
                self.steps += 1
                fh.write("step=%d loss=2.0 tok/s=2000.0\n" % self.steps)

    def holders(self, index):
        out = [(100, 30000)] if index in self.ours else []
        if index in self.theirs and self.t >= self.stranger_at:
            out.append((200, 40000))
        return out

    def __call__(self, argv):
        if "show" in argv:
            assert "ControlGroup" in ",".join(argv)
            return 0, ("ActiveState=active\nSubState=running\nInvocationID=%s\nNRestarts=0\nMainPID=100\n"
                       "Result=success\nExecMainCode=0\nExecMainStatus=0\nControlGroup=%s\n" % (INV, UNIT_CG)), ""
        if any(a.startswith("--query-compute-apps") for a in argv):
            rows = [APPS_HEADER] + (["GPU-%d, %d, %d MiB" % (i, p, m) for i in range(8) for p, m in self.holders(i)]
                                    if self.list_processes else [])
            return 0, "\n".join(rows) + "\n", ""
        rows = ["%d, GPU-%d, NVIDIA H200, %d MiB, 143771 MiB, 0 %%" % (i, i, sum(m for _p, m in self.holders(i)))
                for i in range(8)]
        return 0, "\n".join(rows) + "\n", ""


def _expect(**kw):
    base = dict(invocation_id=INV, gpus=list(range(8)), min_mib=1024, min_steps=2, hold_s=2, stall_s=2, timeout_s=10)
    base.update(kw)
    return Expectations(**base)


def _prove(node, tmp_path, baseline=None):
    return prove(node, "systemctl", "nvidia-smi", "t.service", str(tmp_path / "trainer.log"), _expect(), REGEXES,
                 interval_s=0.5, clock=node.clock, sleep=node.sleep, baseline=baseline, cgroup_of=GROUPS.get)


def test_a_stranger_allocating_after_the_start_never_proves_the_trainer(tmp_path):
    """The trainer holds GPUs 0-4 of trainer_gpus 0-7; another process allocates on 5-7 after the start:
    not proved, and the verdict names the GPUs the trainer itself does not hold."""
    node = Node(tmp_path / "trainer.log", ours=range(5), theirs=(5, 6, 7), stranger_at=0.5)
    with pytest.raises(StepFailed) as exc:
        _prove(node, tmp_path, baseline={i: 0 for i in range(8)})
    assert exc.value.msg.startswith("GPU 5 holds 0 MiB, GPU 6 holds 0 MiB, GPU 7 holds 0 MiB"), exc.value.msg
    assert "counted as the trainer's: memory held by the processes of %s" % UNIT_CG in exc.value.msg
    assert exc.value.details["gpus_mib"] == {0: 30000, 1: 30000, 2: 30000, 3: 30000, 4: 30000, 5: 0, 6: 0, 7: 0}


def test_the_trainer_holding_every_gpu_is_proved_by_its_own_processes(tmp_path):
    node = Node(tmp_path / "trainer.log", ours=range(8), theirs=(7,), stranger_at=0.5)
    proof = _prove(node, tmp_path)
    assert proof["gpus_mib"] == {i: 30000 for i in range(8)}  # the stranger's 40000 on GPU 7 is not the trainer's
    assert proof["gpu_memory"].startswith("memory held by the processes of %s" % UNIT_CG)


def test_where_the_container_lists_no_processes_the_baseline_rule_is_used_and_said(tmp_path):
    """Today's rule (a GPU's reading less its baseline): memory another process allocated after the start
    cannot be told from the trainer's there - the proof says so."""
    node = Node(tmp_path / "trainer.log", ours=range(5), theirs=(5, 6, 7), stranger_at=0.0, list_processes=False)
    proof = _prove(node, tmp_path, baseline={i: 0 for i in range(8)})
    assert proof["gpus_mib"][7] == 40000
    assert proof["gpu_memory"].startswith("the container's nvidia-smi lists no processes")
