"""The node's view (module_utils/target/node_gpu.py): cgroup lines of Proxmox VE, plain LXC, cgroup v1
and the node's own processes; memory split by holder; the messages users read; names a process
gives itself shown escaped, never read; the module on a node whose nvidia-smi refuses name queries."""
import json
import os
import pathlib
import shutil
import stat
import sys
import tempfile

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.dflash.trainer.plugins.module_utils.target.node_gpu import (
    attribute,
    cgroup_path,
    comm_name,
    foreign_by_gpu,
    in_container,
    lines,
    mib_by_index,
    owner,
    preflight_problem,
    printable,
    proof_problem,
    unpaired_problem,
    who,
)
from ansible_collections.dflash.trainer.plugins.modules import trainer_node_gpus


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
    ("0::/user.slice/user-0.slice/session-3.scope\n", (None, None)),  # a login, no system unit
    # a shell attached to the container (lxc-attach / pct exec): in the container, in no unit
    ("0::/lxc.payload.200\n", (200, None)),
    ("0::/lxc/200/ns\n", (200, None)),
    # below a unit: only the unit's own cgroup is the unit
    ("0::/lxc/200/ns/system.slice/dflash-trainer.service/worker.scope\n", (200, None)),
    ("0::/lxc.payload.200/system.slice/dflash-trainer.service/x\n", (200, None)),
    # a user of the container runs a user unit of the trainer's name: in the container, never the unit
    ("0::/lxc.payload.200/user.slice/user-1000.slice/user@1000.service/app.slice/dflash-trainer.service\n",
     (200, None)),
    ("0::/lxc/200/ns/user.slice/user-1000.slice/user@1000.service/app.slice/dflash-trainer.service\n", (200, None)),
    ("0::/lxc/200/ns/user.slice/user-1000.slice/user@1000.service/dflash-trainer.service\n", (200, None)),
    # not where the container's systemd puts its units: no unit
    ("0::/lxc.payload.200/dflash-trainer.service\n", (200, None)),
    ("0::/lxc/200/system.slice/dflash-trainer.service\n", (200, None)),  # Proxmox's path has /ns
    ("0::/lxc.payload.200/app.slice/system.slice/dflash-trainer.service\n", (200, None)),
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/xorg.service\n", (None, None)),
    # a container id is digits only; lxcfs-like names are not containers
    ("0::/lxc.monitor.200\n", (None, None)),
    ("", (None, None)),
    ("garbage\n\x00\xff", (None, None)),
    # a tenant's hand-made sub-cgroup: its container is still the first component, and a name
    # outside systemd's unit alphabet is no unit (it would be shown as one)
    ("0::/lxc/231/ns/x; 1 MiB held by dflash-trainer in CT 200.service\n", (231, None)),
    ("0::/lxc/231/ns/lxc/200/ns/system.slice/dflash-trainer.service\n", (231, None)),  # nested: 231's
    ("0::/lxc.payload.231/system.slice/system-getty.slice/getty@tty1.service\n", (231, "getty@tty1.service")),
    ("0::/system.slice/run-r3f2\\x2d1.scope\n", (None, "run-r3f2\\x2d1.scope")),
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


def test_printable_escapes_what_a_process_may_call_itself():
    assert printable("python3") == "python3"
    assert printable("a, x, 1\n81234, p") == "a, x, 1\\n81234, p"
    assert printable("x\ty\x00\\\udcff") == "x\\ty\\x00\\\\\\udcff"
    assert printable("é-名") == "é-名"
    assert printable("a" * 100) == "a" * 64 + "..."
    assert printable(None) is None
    assert comm_name("python3\n") == "python3"
    assert comm_name("x\ny\n") == "x\\ny"  # the kernel's own newline ends it; one inside is escaped
    assert comm_name(None) is None


def test_names_from_the_node_replace_the_rows_and_never_move_memory():
    gpus = [gpu(5, 50000, [(1001, None, 30000), (2001, None, 20000)])]
    names = {1001: "python3", 2001: "a, x, 1\\n1001, p"}
    (split,) = attribute(gpus, OWNERS, 200, "dflash-trainer", names)
    assert [(h["pid"], h["name"], h["kind"], h["mib"]) for h in split["holders"]] == [
        (1001, "python3", "trainer", 30000), (2001, "a, x, 1\\n1001, p", "foreign", 20000)]
    assert (split["trainer_mib"], split["foreign_mib"]) == (30000, 20000)
    # without names from the node, a row's own name is shown escaped
    (split,) = attribute([gpu(5, 1, [(2001, "x\ny", 1)])], OWNERS, 200, "dflash-trainer")
    assert split["holders"][0]["name"] == "x\\ny"
    assert who({"pid": 2001, "name": "x\\ny", "vmid": 231, "unit": None}) == "pid 2001 (x\\ny) in CT 231"


# ---------------------------------------------------------------------------------------------
# the module, on a node whose nvidia-smi refuses to be asked for names

U = ["GPU-0000000%d-1c2d-4e5f-8a9b-c0ffee000000" % i for i in range(8)]
QUERY_GPU = "".join("%d, %s, NVIDIA H200, %d, 143771, 0\n" % (i, U[i], {5: 50000, 6: 50000}.get(i, 0)) for i in range(8))
CGROUPS = {
    81234: "0::/lxc/200/ns/system.slice/dflash-trainer.service\n",
    91234: "0::/lxc/231/ns/system.slice/spoof-comma.service\n",
    91235: "0::/lxc/231/ns/system.slice/spoof-newline.service\n",
}
COMMS = {81234: "python3\n", 91234: "a, x\n1, p\n", 91235: "x\ny\n"}


@pytest.fixture
def tmp_path():
    """Outside /tmp: the module runs only programs in directories nobody else may write, and
    pytest's tmp_path lies in /tmp (sticky, world-writable)."""
    base = tempfile.mkdtemp(prefix="dflash-node-test-", dir=os.path.expanduser("~"))
    os.chmod(base, 0o700)
    try:
        yield pathlib.Path(base)
    finally:
        shutil.rmtree(base)


@pytest.fixture(autouse=True)
def node_python(monkeypatch):
    """The module judges the interpreter it runs in as the node's python; the one these tests run
    in lies wherever the checkout does (a clone under /tmp: a directory every user may write). The
    module is given a python of the test's own, in a root-only directory of its own."""
    base = tempfile.mkdtemp(prefix="dflash-node-python-", dir=os.path.expanduser("~"))
    os.chmod(base, 0o700)
    python = os.path.join(base, "python3")
    with open(python, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(python, 0o755)
    monkeypatch.setattr(sys, "executable", python)
    yield python
    shutil.rmtree(base)


def node_smi(tmp_path, apps):
    """A node nvidia-smi: --query-gpu answers QUERY_GPU; a process query answers ``apps`` only when
    it is the node's (gpu_uuid,pid,used_memory), else exits 2 as for an invalid field."""
    (tmp_path / "gpu.txt").write_text(QUERY_GPU)
    (tmp_path / "apps.txt").write_text(apps)
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1 $2" in\n'
        "  --query-gpu=*) cat '%s' ;;\n"
        "  '--query-compute-apps=gpu_uuid,pid,used_memory --format=csv') cat '%s' ;;\n"
        "  *) echo 'Invalid combination of input arguments.'; exit 2 ;;\n"
        "esac\n" % (tmp_path / "gpu.txt", tmp_path / "apps.txt"))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def fake_proc(path):
    kind, pid = os.path.basename(path), int(path.split("/")[2])
    if pid not in CGROUPS:
        raise FileNotFoundError(path)
    return (CGROUPS if kind == "cgroup" else COMMS)[pid]


def run_node_module(tmp_path, capsys, monkeypatch, apps, **args):
    monkeypatch.setattr(trainer_node_gpus, "_read", fake_proc)
    args = dict({"vmid": 200, "unit": "dflash-trainer", "gpus": [5, 6], "nvidia_smi": node_smi(tmp_path, apps),
                 "check": "proof"}, **args)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            trainer_node_gpus.main()
    return json.loads(capsys.readouterr().out)


def test_module_splits_by_holder_and_names_from_the_node(tmp_path, capsys, monkeypatch):
    apps = ("gpu_uuid, pid, used_gpu_memory [MiB]\n%s, 81234, 30000 MiB\n%s, 91234, 20000 MiB\n"
            "%s, 81234, 30000 MiB\n%s, 91235, 20000 MiB\n" % (U[5], U[5], U[6], U[6]))
    out = run_node_module(tmp_path, capsys, monkeypatch, apps)
    assert not out.get("failed"), out
    split = {g["index"]: g for g in out["gpus"]}
    assert [(split[i]["trainer_mib"], split[i]["foreign_mib"]) for i in (5, 6)] == [(30000, 20000)] * 2
    assert {h["pid"]: h["name"] for i in (5, 6) for h in split[i]["holders"]} == {
        81234: "python3", 91234: "a, x\\n1, p", 91235: "x\\ny"}
    assert out["lines"] == ["GPU 5: 30000 MiB held by dflash-trainer in CT 200; 20000 MiB by spoof-comma in CT 231",
                            "GPU 6: 30000 MiB held by dflash-trainer in CT 200; 20000 MiB by spoof-newline in CT 231"]
    assert out["foreign_mib"] == {"5": 20000, "6": 20000}


def test_module_fails_on_a_malformed_row_naming_it(tmp_path, capsys, monkeypatch):
    apps = "gpu_uuid, pid, used_gpu_memory [MiB]\n%s, 81234, 30000 MiB\n81234, p, %s, 20000\n" % (U[5], U[5])
    out = run_node_module(tmp_path, capsys, monkeypatch, apps)
    assert out["failed"]
    assert out["msg"].startswith("the node's nvidia-smi --query-compute-apps printed 1 malformed line")
    assert "line 3: '81234, p, %s, 20000' (4 fields, not 3)" % U[5] in out["msg"]


APPS = ("gpu_uuid, pid, used_gpu_memory [MiB]\n%s, 81234, 30000 MiB\n%s, 81234, 30000 MiB\n" % (U[5], U[6]))


def test_the_node_runs_no_nvidia_smi_another_user_may_change(tmp_path, capsys, monkeypatch):
    smi = node_smi(tmp_path, APPS)
    os.chmod(str(tmp_path), 0o1777)  # a sticky directory every user can write, as /tmp
    out = run_node_module(tmp_path, capsys, monkeypatch, APPS, nvidia_smi=smi)
    assert out["failed"] and "gpus" not in out
    assert out["problems"] == ["trainer_node_nvidia_smi: %s, in %s (mode 1777), which every user can write: a program "
                               "run as root must be a file root owns and only root may write, in directories only "
                               "root may write (as sudo's secure_path)" % (smi, tmp_path)]
    assert out["msg"] == "refused to read the node's GPUs: " + out["problems"][0]
    os.chmod(str(tmp_path), 0o700)
    os.chown(smi, 1000, 1000)
    out = run_node_module(tmp_path, capsys, monkeypatch, APPS, nvidia_smi=smi)
    assert out["failed"] and "which belongs to uid 1000" in out["msg"] and "trainer_node_nvidia_smi" in out["msg"]


def test_the_node_python_is_judged_as_the_program_that_runs(tmp_path):
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\n")
    os.chmod(str(python), 0o755)
    smi = node_smi(tmp_path, APPS)
    assert trainer_node_gpus.program_problems(str(python), smi, (0,)) == []
    os.chown(str(python), 1000, 1000)
    (got,) = trainer_node_gpus.program_problems(str(python), smi, (0,))
    assert got.startswith("trainer_node_python: %s, which belongs to uid 1000" % python)
    # the user the module runs as may run its own programs
    assert trainer_node_gpus.program_problems(str(python), smi, (0, 1000)) == []


def test_a_user_unit_of_the_trainers_name_is_not_the_trainer():
    """uid 1000 in container 200 runs `systemctl --user start dflash-trainer`: its memory is
    another holder's in our container (the pre-flight names it), never the trainer's."""
    owners = {pid: owner(text) for pid, text in (
        (1001, "0::/lxc/200/ns/system.slice/dflash-trainer.service\n"),
        (1002, "0::/lxc/200/ns/user.slice/user-1000.slice/user@1000.service/app.slice/dflash-trainer.service\n"))}
    (split,) = attribute([gpu(5, 4000, [(1001, "python3", 1000), (1002, "python3", 3000)])], owners, 200,
                         "dflash-trainer")
    assert (split["trainer_mib"], split["same_ct_mib"]) == (1000, 3000)
    assert proof_problem([split], [5], 2000) is not None
    assert "held by pid 1002 (python3) in CT 200" in preflight_problem([split], [5], 1024)


# ---------------------------------------------------------------------------------------------
# a container given some of the node's GPUs numbers them 0..k-1: paired with the node's by UUID

def test_the_node_view_pairs_the_containers_gpus_by_uuid_and_names_both_numbers():
    gpus = [dict(gpu(i, 0, []), uuid=U[i]) for i in range(8)]
    gpus[5] = dict(gpu(5, 50000, [(1001, "python3", 30000), (2001, "python3", 20000)]), uuid=U[5])
    gpus[3] = dict(gpu(3, 30000, [(1002, "python3", 30000)]), uuid=U[3])
    split = attribute(gpus, OWNERS, 200, "dflash-trainer")
    # the container holds the node's GPUs 5 and 3, as its GPUs 0 and 1
    paired, unpaired = in_container(split, [{"index": 1, "uuid": U[3]}, {"index": 0, "uuid": U[5]}])
    assert unpaired == []
    assert [(a["index"], a["slot"], a["trainer_mib"], a["foreign_mib"]) for a in paired] == [
        (0, 5, 30000, 20000), (1, 3, 30000, 0)]
    assert lines(paired) == [
        "GPU 0 (the node's GPU 5): 30000 MiB held by dflash-trainer in CT 200; 20000 MiB by other-tenant in CT 231",
        "GPU 1 (the node's GPU 3): 30000 MiB held by dflash-trainer in CT 200"]
    assert foreign_by_gpu(paired, [0, 1]) == {0: 20000}  # the container's numbers: the drain reads them so
    assert proof_problem(paired, [0, 1], 1024) is None
    # by the container's index alone, the node's GPUs 0 and 1 would have been judged: nobody's memory there
    assert proof_problem(split, [0, 1], 1024).endswith("GPU 0: the trainer holds 0 MiB; GPU 1: the trainer holds 0 MiB")
    # the same number on both sides is said once
    assert lines(in_container(split, [{"index": 5, "uuid": U[5]}])[0])[0].startswith("GPU 5: 30000 MiB")


def test_a_container_gpu_the_node_does_not_list_is_named_with_its_uuid():
    split = attribute([dict(gpu(5, 0, []), uuid=U[5])], OWNERS, 200, "dflash-trainer")
    paired, unpaired = in_container(split, [{"index": 0, "uuid": U[5]}, {"index": 1, "uuid": "GPU-elsewhere"},
                                            {"index": 2, "uuid": None}])
    assert [a["slot"] for a in paired] == [5]
    assert unpaired == ["GPU 1 (GPU-elsewhere)", "GPU 2 (no UUID)"]
    assert unpaired_problem(unpaired).startswith(
        "the node's nvidia-smi does not list the container's GPU 1 (GPU-elsewhere), GPU 2 (no UUID): the node "
        "view pairs GPUs by UUID")
    assert unpaired_problem([]) is None


def test_module_numbers_the_node_gpus_as_the_container_does(tmp_path, capsys, monkeypatch):
    ct = [{"index": 0, "uuid": U[6], "name": "NVIDIA H200"}, {"index": 1, "uuid": U[5], "name": "NVIDIA H200"}]
    apps = ("gpu_uuid, pid, used_gpu_memory [MiB]\n%s, 81234, 30000 MiB\n%s, 91234, 20000 MiB\n"
            "%s, 81234, 30000 MiB\n" % (U[5], U[5], U[6]))
    out = run_node_module(tmp_path, capsys, monkeypatch, apps, gpus=[0, 1], container_gpus=ct)
    assert not out.get("failed"), out
    assert [(g["index"], g["slot"]) for g in out["gpus"]] == [(0, 6), (1, 5)]
    assert out["foreign_mib"] == {"1": 20000}
    assert out["lines"] == ["GPU 0 (the node's GPU 6): 30000 MiB held by dflash-trainer in CT 200; "
                            "20000 MiB by no process nvidia-smi lists",
                            "GPU 1 (the node's GPU 5): 30000 MiB held by dflash-trainer in CT 200; "
                            "20000 MiB by spoof-comma in CT 231"]
    # a container GPU the node does not list: the proof and the pre-flight fail naming it; a plain read warns
    ct.append({"index": 2, "uuid": "GPU-not-here"})
    for check in ("proof", "preflight"):
        out = run_node_module(tmp_path, capsys, monkeypatch, apps, gpus=None, container_gpus=ct, check=check)
        assert out["failed"] and "does not list the container's GPU 2 (GPU-not-here)" in out["msg"], out
    warned = []
    monkeypatch.setattr(trainer_node_gpus.AnsibleModule, "warn", lambda self, text: warned.append(text))
    out = run_node_module(tmp_path, capsys, monkeypatch, apps, gpus=None, container_gpus=ct, check="none")
    assert not out.get("failed") and any("GPU 2 (GPU-not-here)" in w for w in warned), (out, warned)
