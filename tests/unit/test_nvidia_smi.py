# -*- coding: utf-8 -*-
"""nvidia-smi argv and CSV parsing, from fixtures written to the real tool's formats."""

import os

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.target import nvidia_smi as smi

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "nvidia_smi")


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


def test_argv():
    assert smi.query_gpu_argv("/usr/bin/nvidia-smi") == [
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu",
        "--format=csv,noheader,nounits",
    ]
    assert smi.list_argv() == ["nvidia-smi", "-L"]


@pytest.mark.parametrize("name", ["h200x8_query_gpu.txt", "h200x8_query_gpu_header_units.txt"])
def test_query_gpu_h200(name):
    gpus = smi.parse_query_gpu(fixture(name))
    assert [g["index"] for g in gpus] == list(range(8))
    assert gpus[0] == {
        "index": 0,
        "uuid": "GPU-3f1a2b00-1c2d-4e5f-8a9b-c0ffee000000",
        "name": "NVIDIA H200",
        "memory_used_mib": 130013,
        "memory_total_mib": 143771,
        "utilization_gpu_pct": 100,
        "errors": [],
    }
    assert smi.memory_by_index(gpus) == {0: 130013, 1: 130013, 2: 130013, 3: 130013, 4: 130013,
                                         5: 0, 6: 0, 7: 0}


@pytest.mark.parametrize("name,index,field,expected_errors", [
    ("h100x2_query_gpu_na.txt", 1, "utilization_gpu_pct", ["utilization.gpu: [N/A]"]),
    ("h100_mig_query_gpu_insufficient.txt", 0, "memory_used_mib",
     ["memory.used: [Insufficient Permissions]", "utilization.gpu: [N/A]"]),
    ("lost_gpu_query_gpu.txt", 0, "memory_total_mib",
     ["memory.used: [GPU is lost]", "memory.total: [GPU is lost]", "utilization.gpu: [GPU is lost]"]),
    ("lost_gpu_query_gpu.txt", 1, "memory_used_mib",
     ["memory.used: [GPU requires reset]", "utilization.gpu: [Unknown Error]"]),
])
def test_query_gpu_error_values(name, index, field, expected_errors):
    gpus = {g["index"]: g for g in smi.parse_query_gpu(fixture(name))}
    assert gpus[index][field] is None
    assert gpus[index]["errors"] == expected_errors


def test_h100_total_and_good_row():
    gpus = smi.parse_query_gpu(fixture("h100x2_query_gpu_na.txt"))
    assert gpus[0]["memory_total_mib"] == 81559
    assert gpus[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert gpus[0]["errors"] == []


def test_cells_are_stripped_and_odd_spacing_tolerated():
    text = "  0 ,GPU-a,  NVIDIA H200 ,  12 MiB,143771 MiB ,  7 %  \n\n"
    (gpu,) = smi.parse_query_gpu(text)
    assert (gpu["name"], gpu["memory_used_mib"], gpu["utilization_gpu_pct"]) == ("NVIDIA H200", 12, 7)


def test_header_column_order_is_followed():
    text = ("uuid, index, memory.used [MiB], name, memory.total [MiB], utilization.gpu [%]\n"
            "GPU-a, 3, 100 MiB, NVIDIA H200, 143771 MiB, 1 %\n")
    (gpu,) = smi.parse_query_gpu(text)
    assert (gpu["index"], gpu["uuid"], gpu["memory_used_mib"]) == (3, "GPU-a", 100)


def test_malformed_row_raises():
    with pytest.raises(smi.NvidiaSmiError):
        smi.parse_query_gpu("0, GPU-a, NVIDIA H200, lots, 143771, 0\n")
    with pytest.raises(smi.NvidiaSmiError):
        smi.parse_query_gpu("0, GPU-a\n")


def test_join_processes_by_uuid():
    gpus = smi.parse_query_gpu(fixture("h200x8_query_gpu.txt"))
    apps, malformed = smi.parse_node_apps(fixture("h200x8_compute_apps_uuid_pid_mib.txt"))
    assert malformed == []
    for app in apps:  # as read_gpus names them: pid 1234 is visible here, the host PIDs are not
        app["process_name"] = "python3" if app["pid"] == 1234 else None
    apps.append({"pid": 1, "process_name": "x", "gpu_uuid": "GPU-elsewhere", "used_memory_mib": 5,
                 "errors": []})
    joined = smi.join_processes(gpus, apps)
    assert joined[4]["processes"] == [{"pid": 1234, "process_name": "python3", "used_memory_mib": 130004}]
    assert joined[0]["processes"][0]["process_name"] is None
    assert joined[5]["processes"] == []
    assert "processes" not in gpus[0]  # input untouched


def test_lxc_empty_process_list_keeps_memory():
    gpus = smi.join_processes(smi.parse_query_gpu(fixture("h200x8_query_gpu.txt")),
                              smi.parse_node_apps(NODE_HEADER)[0])
    assert gpus[0]["memory_used_mib"] == 130013
    assert gpus[0]["processes"] == []


def test_list_plain_and_mig():
    gpus = smi.parse_list(fixture("h200x8_list.txt"))
    assert [(g["index"], g["name"]) for g in gpus][:2] == [(0, "NVIDIA H200"), (1, "NVIDIA H200")]
    assert gpus[7]["uuid"] == "GPU-3f1a2b07-1c2d-4e5f-8a9b-c0ffee000007"
    mig = smi.parse_list(fixture("h100_mig_list.txt"))
    assert len(mig) == 2
    assert [m["profile"] for m in mig[0]["mig"]] == ["1g.10gb", "1g.10gb", "3g.40gb"]
    assert mig[0]["mig"][2] == {"profile": "3g.40gb", "device": 2,
                                "uuid": "MIG-2d7a3c4e-5f60-7182-93a4-b5c6d7e8f90a"}
    assert mig[1]["mig"] == []


def test_list_rejects_garbage():
    with pytest.raises(smi.NvidiaSmiError):
        smi.parse_list(fixture("no_devices.txt"))


@pytest.mark.parametrize("rc,out,err,expected", [
    (0, "0, GPU-a, X, 1, 2, 3\n", "", None),
    (9, fixture("driver_not_loaded.txt"), "",
     "nvidia-smi failed (exit 9: driver not loaded): NVIDIA-SMI has failed because it couldn't "
     "communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
     " - the node's fault, not the trainer's: " + smi.NODE_FAULTS[9]),
    (12, "", "NVML library not found\n", "nvidia-smi failed (exit 12: NVML not found): NVML library not found"),
    (2, "", "", "nvidia-smi failed (exit 2: invalid argument): (no output)"),
    (3, "", "", "nvidia-smi failed (exit 3: not supported): (no output)"),
    (4, "", "", "nvidia-smi failed (exit 4: no permission): (no output)"),
    (6, fixture("no_devices.txt"), "", "nvidia-smi failed (exit 6: not found): No devices were found"),
    (15, "", "", "nvidia-smi failed (exit 15: GPU fell off the bus): (no output) - the node's fault, not the "
     "trainer's: " + smi.NODE_FAULTS[15]),
    (8, "", "", "nvidia-smi failed (exit 8: external power cables not attached): (no output)"),
    # 14 (infoROM corrupted) comes with valid output: no failure, only a warning (warning_message)
    (14, "0, GPU-a, X, 1, 2, 3\n", "", None),
    (14, "", "", "nvidia-smi failed (exit 14: infoROM corrupted): (no output)"),
    (14, fixture("no_devices.txt"), "", "nvidia-smi failed (exit 14): No devices were found"),
    (255, fixture("nvml_mismatch.txt"), "",
     "nvidia-smi failed (exit 255: other error): Failed to initialize NVML: Driver/library version mismatch"),
    (0, fixture("no_devices.txt"), "", "nvidia-smi failed (exit 0): No devices were found"),
    (0, "", fixture("nvml_mismatch.txt"),
     "nvidia-smi failed (exit 0): Failed to initialize NVML: Driver/library version mismatch"),
    (42, "x", "", "nvidia-smi failed (exit 42: unknown exit status): x"),
])
def test_failure_message(rc, out, err, expected):
    assert smi.failure_message(rc, out, err) == expected


def test_ranges():
    assert smi.index_ranges([0, 1, 2, 3, 5, 7, 6]) == "0-3, 5-7"
    assert smi.index_ranges([]) == ""


class FakeRun(object):
    """Stands in for AnsibleModule.run_command: answers by query kind."""

    def __init__(self, gpu=(0, "", ""), apps=(0, "", "")):
        self.answers = {"--query-gpu": gpu, "--query-compute-apps": apps}
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        return self.answers[argv[1].split("=")[0]]


def test_read_gpus_joins_and_calls_twice():
    run = FakeRun(gpu=(0, fixture("h200x8_query_gpu.txt"), ""),
                  apps=(0, fixture("h200x8_compute_apps_uuid_pid_mib.txt"), ""))
    gpus, warnings = smi.read_gpus(run, "/usr/bin/nvidia-smi", name_of=lambda pid: "python3" if pid == 1234 else None)
    assert warnings == []
    assert len(run.calls) == 2 and all(isinstance(a, list) for a in run.calls)
    assert gpus[4]["processes"][0]["pid"] == 1234 and gpus[4]["processes"][0]["process_name"] == "python3"
    # no name is asked of nvidia-smi: it prints names unquoted (a name could forge a row)
    assert run.calls[1] == ["/usr/bin/nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv"]


def test_a_process_name_cannot_forge_a_row_in_the_containers_read():
    """What the old query (with process_name) would have printed for a process named
    'a, x, 1\n<pid>, p': the new query never asks for names, and a stray line is malformed."""
    forged = ("gpu_uuid, pid, used_gpu_memory [MiB]\n"
              "GPU-3f1a2b04-1c2d-4e5f-8a9b-c0ffee000004, 777, 20000 MiB\n"
              "1234, p\n")
    run = FakeRun(gpu=(0, fixture("h200x8_query_gpu.txt"), ""), apps=(0, forged, ""))
    gpus, warnings = smi.read_gpus(run, name_of=lambda pid: None)
    assert warnings and "malformed" in warnings[0] and "'1234, p'" in warnings[0]
    assert all(not g["processes"] for g in gpus)  # nothing guessed


def test_read_gpus_failure_and_process_warning():
    with pytest.raises(smi.NvidiaSmiError, match=r"^nvidia-smi failed \(exit 9: driver not loaded\): NVIDIA-SMI"):
        smi.read_gpus(FakeRun(gpu=(9, fixture("driver_not_loaded.txt"), "")))
    gpus, warnings = smi.read_gpus(FakeRun(gpu=(0, fixture("h200x8_query_gpu.txt"), ""), apps=(3, "", "")))
    assert warnings == ["process list unavailable: nvidia-smi failed (exit 3: not supported): (no output)"]
    assert gpus[0]["processes"] == [] and gpus[0]["memory_used_mib"] == 130013
    run = FakeRun(gpu=(0, fixture("h200x8_query_gpu.txt"), ""))
    smi.read_gpus(run, processes=False)
    assert len(run.calls) == 1


@pytest.mark.parametrize("rc", sorted(smi.EXIT_CODES))
def test_every_documented_exit_status_is_named(rc):
    """nvidia-smi(1) RETURN VALUE: each status has words; only 9 and 15 are the node's fault; only 14
    is a warning."""
    assert smi.exit_meaning(rc) != "unknown exit status"
    assert (rc in smi.NODE_FAULTS) == (rc in (9, 15))
    assert (rc in smi.WARNING_CODES) == (rc == 14)


def test_read_gpus_exit_14_uses_the_output_and_warns():
    run = FakeRun(gpu=(14, fixture("h200x8_query_gpu.txt"), ""),
                  apps=(14, fixture("h200x8_compute_apps_uuid_pid_mib.txt"), ""))
    gpus, warnings = smi.read_gpus(run, name_of=lambda pid: None)
    assert len(gpus) == 8 and gpus[4]["memory_used_mib"] == 130013
    assert gpus[4]["processes"][0]["pid"] == 1234  # the process list counted too
    assert warnings == [smi.WARNING_CODES[14]] and "infoROM" in warnings[0]
    node_gpus, node_warnings = smi.read_node_gpus(run)
    assert node_gpus[4]["processes"][0]["pid"] == 1234 and node_warnings == [smi.WARNING_CODES[14]]


@pytest.mark.parametrize("rc,node_fault", [(15, True), (9, True), (4, False), (255, False), (12, False)])
def test_read_gpus_failure_says_whose_fault(rc, node_fault):
    for read in (smi.read_gpus, smi.read_node_gpus):
        with pytest.raises(smi.NvidiaSmiError) as info:
            read(FakeRun(gpu=(rc, "Unable to determine the device handle for GPU 0000:18:00.0: GPU is lost.\n", "")))
        assert info.value.rc == rc and info.value.node_fault is node_fault
        assert ("the node's fault" in str(info.value)) is node_fault


def test_locate(tmp_path):
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n")
    assert smi.locate(str(exe), lambda n: None) is None       # not executable
    exe.chmod(0o755)
    assert smi.locate(str(exe), lambda n: None) == str(exe)
    assert smi.locate("nvidia-smi", lambda n: "/usr/bin/" + n) == "/usr/bin/nvidia-smi"


# ---------------------------------------------------------------------------------------------
# read_gpus through the bounded runner against a fake nvidia-smi that replays the fixtures

import stat

from ansible_collections.dflash.trainer.plugins.module_utils.target.command import Runner


def fake_smi(tmp_path, gpu_fixture, apps_fixture="h200x8_compute_apps_uuid_pid_mib.txt", rc=0):
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=*) cat '%s'; exit %d ;;\n"
        "  --query-compute-apps=*) cat '%s' ;;\n"
        "esac\n" % (os.path.join(FIXTURES, gpu_fixture), rc, os.path.join(FIXTURES, apps_fixture)))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_read_gpus_runs_nvidia_smi(tmp_path):
    smi_path = fake_smi(tmp_path, "h200x8_query_gpu.txt", "h200x8_compute_apps_uuid_pid_mib.txt")
    gpus, warnings = smi.read_gpus(Runner(10.0), smi_path)
    assert warnings == [] and len(gpus) == 8 and gpus[4]["memory_used_mib"] == 130013
    # names come from this machine's /proc (nvidia-smi is never asked for them)
    assert gpus[4]["processes"] == [{"pid": 1234, "process_name": smi.proc_comm(1234), "used_memory_mib": 130004}]


def test_read_gpus_driver_not_loaded(tmp_path):
    said = r"^nvidia-smi failed \(exit 9: driver not loaded\): NVIDIA-SMI has failed"
    with pytest.raises(smi.NvidiaSmiError, match=said):
        smi.read_gpus(Runner(10.0), fake_smi(tmp_path, "driver_not_loaded.txt", rc=9))


# ---------------------------------------------------------------------------------------------
# the node's process query: numbers and UUIDs only, every line a row of exactly that shape

NODE_HEADER = "gpu_uuid, pid, used_gpu_memory [MiB]\n"
U5 = "GPU-3f1a2b00-1c2d-4e5f-8a9b-c0ffee000005"


def test_node_apps_argv_asks_for_no_name():
    assert smi.query_node_apps_argv("/usr/bin/nvidia-smi") == [
        "/usr/bin/nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv"]
    assert "name" not in smi.query_node_apps_argv()[1]


def test_node_apps_real_format():
    text = NODE_HEADER + "%s, 81234, 30000 MiB\n%s, 91234, [N/A]\nMIG-7c0b1e2d-0000-5e5e-9a9a-00000000abcd, 5, 0 MiB\n" % (
        U5, U5)
    apps, malformed = smi.parse_node_apps(text)
    assert malformed == []
    assert apps == [
        {"gpu_uuid": U5, "pid": 81234, "used_memory_mib": 30000, "errors": []},
        {"gpu_uuid": U5, "pid": 91234, "used_memory_mib": None, "errors": ["used_memory: [N/A]"]},
        {"gpu_uuid": "MIG-7c0b1e2d-0000-5e5e-9a9a-00000000abcd", "pid": 5, "used_memory_mib": 0, "errors": []},
    ]
    assert smi.parse_node_apps(NODE_HEADER) == ([], [])  # no process: the header alone


@pytest.mark.parametrize("text,why", [
    ("", "no header"),
    ("%s, 81234, 30000 MiB\n" % U5, "not the header"),  # noheader: the columns are unknown
    ("gpu_uuid, pid, used_gpu_memory\n", "not the header"),  # nounits
    ("pid, process_name, gpu_uuid, used_gpu_memory [MiB]\n", "not the header"),  # another query
    (NODE_HEADER + "%s, 81234\n" % U5, "2 fields, not 3"),
    (NODE_HEADER + "%s, 81234, 30000 MiB, x\n" % U5, "4 fields, not 3"),
    (NODE_HEADER + "x, 81234, 30000 MiB\n", "gpu_uuid is not"),
    (NODE_HEADER + "%s, [N/A], 30000 MiB\n" % U5, "pid is not a number"),
    (NODE_HEADER + "%s, -5, 30000 MiB\n" % U5, "pid is not a number"),
    (NODE_HEADER + "%s, 81234, 30000\n" % U5, "neither"),
    (NODE_HEADER + "%s, 81234, 30 GiB\n" % U5, "neither"),
    (NODE_HEADER + NODE_HEADER, "gpu_uuid is not"),  # a second header is no row
])
def test_node_apps_malformed_lines_are_reported_never_read(text, why):
    apps, malformed = smi.parse_node_apps(text)
    assert apps == [] and len(malformed) == 1 and why in malformed[0], malformed


def test_node_apps_a_forged_name_is_malformed_not_a_row():
    """What a tenant's name `a, x, 1\\n<pid>, p` would print in a query with names: none of it
    is a row of the node's query."""
    text = NODE_HEADER + "%s, 777, 20000 MiB\n777, a, x, 1\n81234, p, %s, 20000\n" % (U5, U5)
    apps, malformed = smi.parse_node_apps(text)
    assert [a["pid"] for a in apps] == [777]
    assert [m.split(":")[0] for m in malformed] == ["line 3", "line 4"]
    msg = smi.malformed_message(malformed)
    assert msg.startswith('nvidia-smi --query-compute-apps printed 2 malformed lines (expected "gpu_uuid, pid, '
                          'used_gpu_memory [MiB]" rows); not read as rows: line 3: ')
    assert "\n" not in msg
    assert smi.malformed_message(["line %d: x" % i for i in range(5)]).endswith("line 2: x; and 2 more")


class NodeRun(object):
    """The node's nvidia-smi: refuses any process query but the node's (it must never ask for names)."""

    def __init__(self, apps=(0, NODE_HEADER, ""), gpu=None):
        self.gpu = gpu or (0, fixture("h200x8_query_gpu.txt"), "")
        self.apps = apps
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        if argv[1].startswith("--query-gpu="):
            return self.gpu
        assert argv == smi.query_node_apps_argv(argv[0])
        return self.apps


def test_read_node_gpus_joins_rows_without_names():
    gpus = smi.parse_query_gpu(fixture("h200x8_query_gpu.txt"))
    u4 = gpus[4]["uuid"]
    run = NodeRun(apps=(0, NODE_HEADER + "%s, 81234, 30000 MiB\n%s, 99, 5 MiB\n" % (u4, U5), ""))
    got, warnings = smi.read_node_gpus(run, "/usr/bin/nvidia-smi")
    assert len(run.calls) == 2
    assert got[4]["processes"] == [{"pid": 81234, "process_name": None, "used_memory_mib": 30000}]
    assert warnings == ["process list: pid 99 holds 5 MiB on %s, a GPU --query-gpu did not list (not attributed)"
                        % U5]


@pytest.mark.parametrize("apps,match", [
    ((3, "", ""), r"^nvidia-smi failed \(exit 3: not supported\)"),
    ((0, NODE_HEADER + "81234, p, GPU-a, 20000\n", ""), r"^nvidia-smi --query-compute-apps printed 1 malformed line "),
    ((0, "", ""), r"no header"),
])
def test_read_node_gpus_an_unreadable_process_list_is_an_error(apps, match):
    """On the node the process list is what counts: never an empty list in its place."""
    with pytest.raises(smi.NvidiaSmiError, match=match):
        smi.read_node_gpus(NodeRun(apps=apps))


def test_read_node_gpus_hang_is_an_error():
    from ansible_collections.dflash.trainer.plugins.module_utils.target.command import CommandTimeout

    def run(argv):
        if argv[1].startswith("--query-gpu="):
            return 0, fixture("h200x8_query_gpu.txt"), ""
        raise CommandTimeout(argv, 30)
    with pytest.raises(smi.NvidiaSmiError, match="did not answer"):
        smi.read_node_gpus(run)
