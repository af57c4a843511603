"""The node's view (module_utils/_node_gpu.py): cgroup lines of Proxmox VE, plain LXC, cgroup v1
and the node's own processes; memory split by holder; the messages users read."""
import pytest

from ansible_collections.dflash.trainer.plugins.module_utils._node_gpu import (
    attribute,
    cgroup_path,
    foreign_by_gpu,
    lines,
    mib_by_index,
    owner,
    preflight_problem,
    proof_problem,
    who,
)


@pytest.mark.parametrize("text,want", [
    # Proxmox VE 8 (pve-container: lxc/<vmid> + inner "ns")
    ("0::/lxc/200/ns/system.slice/dflash-trainer.service\n", (200, "dflash-trainer.service")),
    # plain LXC 5 (the lab)
    ("0::/lxc.payload.231/system.slice/other-tenant.service\n", (231, "other-tenant.service")),
    # LXC's suffix for a cgroup left by an earlier start (seen in the lab)
    ("0::/lxc.payload.200-2/system.slice/dflash-trainer.service\n", (200, "dflash-trainer.service")),
    # hybrid v1 + v2 (these machines): the v2 line decides
    ("12:pids:/lxc.payload.200/system.slice/x.service\n1:name=systemd:/lxc.payload.200/system.slice/x.service\n"
     "0::/lxc.payload.200/system.slice/dflash-trainer.service\n", (200, "dflash-trainer.service")),
    # cgroup v1 only (an old node): the first line naming a container
    ("12:cpuset:/\n11:pids:/lxc/201/ns/system.slice/t.service\n", (201, "t.service")),
    # the node's own processes
    ("0::/system.slice/xorg.service\n", (None, "xorg.service")),
    ("0::/user.slice/user-0.slice/session-3.scope\n", (None, "session-3.scope")),
    # a shell attached to the container (lxc-attach / pct exec): in the container, in no unit
    ("0::/lxc.payload.200\n", (200, None)),
    ("0::/lxc/200/ns\n", (200, None)),
    # a unit's own sub-cgroup: the innermost unit
    ("0::/lxc/200/ns/system.slice/dflash-trainer.service/worker.scope\n", (200, "worker.scope")),
    # a container id is digits only; lxcfs-like names are not containers
    ("0::/lxc.monitor.200\n", (None, None)),
    ("", (None, None)),
    ("garbage\n\x00\xff", (None, None)),
])
def test_owner(text, want):
    assert owner(text) == want


def test_cgroup_path_prefers_v2_and_ignores_bad_lines():
    assert cgroup_path("x\n3:memory:/a\n0::/b\n") == "/b"
    assert cgroup_path("3:memory:relative\n") is None


def gpu(index, used, procs, uuid=None):
    return {"index": index, "uuid": uuid or "GPU-%d" % index, "memory_used_mib": used, "memory_total_mib": 81559,
            "processes": [{"pid": pid, "process_name": name, "used_memory_mib": mib} for pid, name, mib in procs]}


OWNERS = {
    1001: (200, "dflash-trainer.service"),
    1002: (200, "dflash-trainer.service"),
    2001: (231, "other-tenant.service"),
    3001: (200, "leftover.service"),
    4001: (None, "xorg.service"),
}


def test_attribute_splits_memory_by_holder():
    gpus = [
        gpu(5, 50000, [(1001, "python3", 30000), (2001, "python3", 20000)]),
        gpu(6, 31000, [(1002, "python3", 30000)]),  # 1000 MiB no process accounts for
        gpu(7, 5000, [(3001, "python3", 4000), (4001, "Xorg", 1000)]),
        gpu(0, 9000, [(9999, "[Not Found]", 9000)]),  # exited between the reads: unlisted
    ]
    split = {a["index"]: a for a in attribute(gpus, OWNERS, 200, "dflash-trainer")}
    assert (split[5]["trainer_mib"], split[5]["foreign_mib"], split[5]["unlisted_mib"]) == (30000, 20000, 0)
    assert (split[6]["trainer_mib"], split[6]["unlisted_mib"]) == (30000, 1000)
    assert (split[7]["same_ct_mib"], split[7]["foreign_mib"], split[7]["trainer_mib"]) == (4000, 1000, 0)
    assert (split[0]["unlisted_mib"], split[0]["holders"]) == (9000, [])
    assert foreign_by_gpu(list(split.values())) == {5: 20000, 7: 1000}
    assert foreign_by_gpu(list(split.values()), [5, 6]) == {5: 20000}
    # the unit given with its suffix is the same unit
    assert attribute(gpus, OWNERS, 200, "dflash-trainer.service")[0]["trainer_mib"] == 30000
    # another container with the same unit name is another tenant
    assert attribute(gpus, OWNERS, 231, "dflash-trainer")[0]["foreign_mib"] == 30000


def test_lines_name_holders_by_container_and_unit():
    gpus = [gpu(5, 50000, [(2001, "python3", 20000), (1001, "python3", 30000)]),
            gpu(6, 31000, [(1002, "python3", 30000)]), gpu(7, 5000, [(3001, "python3", 4000), (4001, "Xorg", 1000)]),
            gpu(1, 0, [])]
    got = lines(attribute(gpus, OWNERS, 200, "dflash-trainer"))
    assert got == [
        "GPU 5: 30000 MiB held by dflash-trainer in CT 200; 20000 MiB by other-tenant in CT 231",
        "GPU 6: 30000 MiB held by dflash-trainer in CT 200; 1000 MiB by no process nvidia-smi lists",
        "GPU 7: 4000 MiB held by leftover in CT 200; 1000 MiB by xorg on the node",
        "GPU 1: 0 MiB, no holder",
    ]


def test_who_prefers_the_process_for_scopes_and_unknown_units():
    assert who({"pid": 5, "name": "bash", "vmid": 200, "unit": None}) == "pid 5 (bash) in CT 200"
    assert who({"pid": 5, "name": "bash", "vmid": None, "unit": "session-3.scope"}) == "pid 5 (bash) on the node"
    assert who({"pid": 5, "name": None, "vmid": 200, "unit": "x.socket"}) == "x.socket in CT 200"


def test_preflight_problem_names_our_containers_other_holders_only():
    gpus = [gpu(5, 50000, [(1001, "python3", 30000), (2001, "python3", 20000)]),
            gpu(7, 5000, [(3001, "python3", 4000), (4001, "Xorg", 1000)])]
    split = attribute(gpus, OWNERS, 200, "dflash-trainer")
    assert preflight_problem(split, [5], 1024) is None  # the trainer's and another tenant's: fine
    msg = preflight_problem(split, [5, 7], 1024)
    assert msg == ("memory on the trainer's GPUs that is not the trainer's, in its own container: "
                   "GPU 7: 4000 MiB held by leftover in CT 200; the drain gate would fail after the stop")
    assert preflight_problem(split, [5, 7], 4000) is None  # at the drain gate's limit: it drains


def test_proof_problem_when_the_node_disagrees():
    gpus = [gpu(5, 50000, [(1001, "python3", 30000), (2001, "python3", 20000)]),
            gpu(7, 20000, [(2001, "python3", 20000)])]
    split = attribute(gpus, OWNERS, 200, "dflash-trainer")
    assert proof_problem(split, [5], 1024) is None
    assert proof_problem(split, [5, 7, 3], 1024) == (
        "the node's nvidia-smi contradicts the proof (below 1024 MiB): GPU 7: the trainer holds 0 MiB; "
        "GPU 3: not on the node")


def test_mib_by_index_reads_a_module_argument():
    assert mib_by_index({"7": 20000, "5": "100"}) == {7: 20000, 5: 100}
    assert mib_by_index(None) == {} and mib_by_index({}) == {}
