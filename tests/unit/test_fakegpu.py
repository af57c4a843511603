"""fakegpu library and the nvidia-smi stand-in (lab/fakegpu), run on this host."""
import json
import os
import re
import subprocess
import sys
import time

import pytest
from waiting import poll

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKEGPU_DIR = os.path.join(ROOT, "lab", "fakegpu")
SMI = os.path.join(FAKEGPU_DIR, "nvidia-smi")
sys.path.insert(0, FAKEGPU_DIR)

import fakegpu  # noqa: E402

UUID0 = "GPU-d989e0ca-ef15-96e4-6f8d-4ea2f0928e5d"  # seed "lab", index 0: must never change


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKEGPU_STATE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def holder():
    """Start a process that can hold GPU memory; all are killed at teardown."""
    procs = []

    def start():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def set_config(state, **values):
    cfg = {"count": 8, "memory_mib": 81559, "name": "NVIDIA H100 80GB HBM3",
           "release_delay_s": 0, "uuid_seed": "lab"}
    cfg.update(values)
    (state / "config.json").write_text(json.dumps(cfg))


def used(gpu=0):
    return fakegpu.snapshot()[gpu]["used_mib"]


def kill(proc):
    proc.kill()
    proc.wait()


def smi(*args):
    res = subprocess.run([sys.executable, SMI, *args], capture_output=True, text=True, check=False,
                         env=dict(os.environ), timeout=30)
    return res.returncode, res.stdout


# --------------------------------------------------------------------------------------------
# library

def test_defaults_without_config(state):
    cfg = fakegpu.load_config()
    assert (cfg["count"], cfg["memory_mib"], cfg["name"], cfg["release_delay_s"]) == (
        8, 81559, "NVIDIA H100 80GB HBM3", 0)
    gpus = fakegpu.snapshot()
    assert [g["index"] for g in gpus] == list(range(8))
    assert all(g["used_mib"] == 0 and g["util_pct"] == 0 and g["processes"] == [] for g in gpus)


def test_allocation_counts_while_holder_alive(state, holder):
    proc = holder()
    fakegpu.allocate(0, 60000, pid=proc.pid)
    fakegpu.allocate(0, 1000, pid=proc.pid)
    gpu = fakegpu.snapshot()[0]
    assert gpu["used_mib"] == 61000
    assert 97 <= gpu["util_pct"] <= 100
    assert [(p["pid"], p["used_mib"]) for p in gpu["processes"]] == [(proc.pid, 61000)]
    assert used(1) == 0
    records = os.listdir(state / "alloc")
    assert len(records) == 2 and all(r.endswith(".json") for r in records)


def test_released_after_death_with_zero_delay(state, holder):
    proc = holder()
    fakegpu.allocate(3, 5000, pid=proc.pid)
    assert used(3) == 5000
    kill(proc)
    assert used(3) == 0
    assert os.listdir(state / "alloc") == []


def test_exited_but_unreaped_holder_counts_as_dead(state, holder):
    proc = holder()
    fakegpu.allocate(0, 5000, pid=proc.pid)
    proc.kill()  # not waited for: a zombie until reaped
    poll(lambda: used(0) == 0, timeout=5.0)
    proc.wait()


def test_held_for_release_delay_then_released(state, holder):
    set_config(state, release_delay_s=0.5)
    proc = holder()
    fakegpu.allocate(1, 7000, pid=proc.pid)
    kill(proc)
    first = time.monotonic()
    gpu = fakegpu.snapshot()[1]
    assert gpu["used_mib"] == 7000  # first observation of the death starts the delay
    assert gpu["processes"] == [] and gpu["util_pct"] == 0
    poll(lambda: used(1) == 0, timeout=5)
    assert time.monotonic() - first >= 0.45


@pytest.mark.parametrize("delay", [None, -1])
def test_never_released_when_delay_null_or_negative(state, holder, delay):
    set_config(state, release_delay_s=delay)
    proc = holder()
    fakegpu.allocate(2, 9000, pid=proc.pid)
    kill(proc)
    assert used(2) == 9000
    # even a death observed long ago keeps the memory (a stuck context)
    for name in os.listdir(state / "alloc"):
        path = state / "alloc" / name
        rec = json.loads(path.read_text())
        assert rec["dead_since"] is not None
        rec["dead_since"] -= 10 ** 6
        path.write_text(json.dumps(rec))
    assert used(2) == 9000
    assert fakegpu.free(gpu=2, everyone=True) == 9000
    assert used(2) == 0


def test_reused_pid_does_not_count(state, holder):
    proc = holder()
    fakegpu.allocate(0, 4000, pid=proc.pid)
    (name,) = os.listdir(state / "alloc")
    path = state / "alloc" / name
    rec = json.loads(path.read_text())
    assert rec["start_time"] == fakegpu.process_start_time(proc.pid)
    rec["start_time"] -= 1  # same pid, another process: the original holder is gone
    path.write_text(json.dumps(rec))
    assert used(0) == 0
    assert proc.poll() is None


@pytest.mark.parametrize("delay", [None, 3600])
def test_record_from_an_earlier_boot_is_dropped_at_once(state, holder, delay):
    """A container restarted with records on disk: their holders died with that boot."""
    set_config(state, release_delay_s=delay)
    proc = holder()
    fakegpu.allocate(0, 4000, pid=proc.pid)
    fakegpu.allocate(1, 2000, pid=proc.pid)
    booted = fakegpu.boot_time()
    assert booted is not None and booted < time.time()
    assert used(0) == 4000  # written after this boot: it counts
    path = next(p for p in (state / "alloc").iterdir() if p.name.startswith("0-"))
    rec = json.loads(path.read_text())
    rec["created"] = booted - 60
    path.write_text(json.dumps(rec))
    assert (used(0), used(1)) == (0, 2000)
    assert not path.exists()


def test_reused_pid_with_stuck_context_keeps_memory_but_no_process(state, holder):
    set_config(state, release_delay_s=None)
    proc = holder()
    fakegpu.allocate(0, 4000, pid=proc.pid)
    (name,) = os.listdir(state / "alloc")
    path = state / "alloc" / name
    rec = json.loads(path.read_text())
    rec["start_time"] += 12345
    path.write_text(json.dumps(rec))
    gpu = fakegpu.snapshot()[0]
    assert gpu["used_mib"] == 4000 and gpu["processes"] == []


def test_out_of_memory(state, holder):
    proc = holder()
    fakegpu.allocate(4, 81000, pid=proc.pid)
    with pytest.raises(fakegpu.OutOfMemory, match=r"^CUDA out of memory\. Tried to allocate 0\.59 GiB"):
        fakegpu.allocate(4, 600, pid=proc.pid)
    assert isinstance(fakegpu.OutOfMemory("x"), RuntimeError)
    assert used(4) == 81000
    fakegpu.allocate(4, 559, pid=proc.pid)  # exactly full is fine
    assert used(4) == 81559


def test_invalid_device_and_dead_pid(state, holder):
    with pytest.raises(fakegpu.InvalidDevice):
        fakegpu.allocate(8, 1)
    proc = holder()
    kill(proc)
    with pytest.raises(ProcessLookupError):
        fakegpu.allocate(0, 1, pid=proc.pid)


def test_free_own_allocations(state, holder):
    fakegpu.allocate(0, 100)
    fakegpu.allocate(1, 200)
    other = holder()
    fakegpu.allocate(1, 300, pid=other.pid)
    assert fakegpu.free(gpu=1) == 200
    assert used(1) == 300 and used(0) == 100
    assert fakegpu.free() == 100
    assert used(0) == 0


def test_snapshot_and_uuid_stability(state):
    a, b = fakegpu.snapshot(), fakegpu.snapshot()
    assert [g["uuid"] for g in a] == [g["uuid"] for g in b]
    assert a[0]["uuid"] == UUID0
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                            g["uuid"]) for g in a)
    assert len({g["uuid"] for g in a}) == 8
    assert set(a[0]) >= {"index", "uuid", "name", "used_mib", "total_mib", "util_pct", "processes"}
    set_config(state, count=2, memory_mib=143771, name="NVIDIA H200", uuid_seed="other")
    c = fakegpu.snapshot()
    assert len(c) == 2 and c[0]["total_mib"] == 143771 and c[0]["name"] == "NVIDIA H200"
    assert c[0]["uuid"] != UUID0


def test_cli_config_alloc_hold_show_free(state):
    env = dict(os.environ, PYTHONPATH=FAKEGPU_DIR)
    out = subprocess.run([sys.executable, "-m", "fakegpu", "config", "--count", "4",
                          "--memory-mib", "1000", "--release-delay", "never"],
                         env=env, capture_output=True, text=True, check=True).stdout
    cfg = json.loads((state / "config.json").read_text())
    assert (cfg["count"], cfg["memory_mib"], cfg["release_delay_s"]) == (4, 1000, None)
    assert json.loads(out)["count"] == 4
    proc = subprocess.Popen([sys.executable, "-m", "fakegpu", "alloc", "--gpu", "1,2",
                             "--mib", "400", "--hold"], env=env, stdout=subprocess.DEVNULL)
    try:
        poll(lambda: used(2) == 400, timeout=5.0)
        assert fakegpu.snapshot()[1]["processes"][0]["pid"] == proc.pid
        show = subprocess.run([sys.executable, "-m", "fakegpu", "show", "--json"], env=env,
                              capture_output=True, text=True, check=True).stdout
        assert json.loads(show)[1]["used_mib"] == 400
        res = subprocess.run([sys.executable, "-m", "fakegpu", "alloc", "--gpu", "1",
                              "--mib", "700"], env=env, capture_output=True, text=True, check=False)
        assert res.returncode == 1 and "CUDA out of memory" in res.stderr
    finally:
        kill(proc)
    assert used(1) == 400  # release delay "never": stuck
    subprocess.run([sys.executable, "-m", "fakegpu", "free"], env=env, check=True,
                   capture_output=True)
    assert used(1) == 0 and used(2) == 0


# --------------------------------------------------------------------------------------------
# nvidia-smi stand-in

def test_smi_list_gpus_exact(state):
    rc, out = smi("-L")
    assert rc == 0
    lines = out.split("\n")
    assert lines[0] == "GPU 0: NVIDIA H100 80GB HBM3 (UUID: %s)" % UUID0
    assert out == "".join("GPU %d: NVIDIA H100 80GB HBM3 (UUID: %s)\n" % (i, fakegpu.gpu_uuid(i))
                          for i in range(8))


def test_smi_query_gpu_header_units(state, holder):
    proc = holder()
    fakegpu.allocate(0, 60000, pid=proc.pid)
    rc, out = smi("--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu",
                  "--format=csv")
    assert rc == 0
    lines = out.split("\n")
    assert lines[0] == ("index, uuid, name, memory.used [MiB], memory.total [MiB], "
                        "utilization.gpu [%]")
    assert lines[1] == "0, %s, NVIDIA H100 80GB HBM3, 60000 MiB, 81559 MiB, 100 %%" % UUID0
    assert lines[2] == "1, %s, NVIDIA H100 80GB HBM3, 0 MiB, 81559 MiB, 0 %%" % fakegpu.gpu_uuid(1)
    assert len(lines) == 10 and lines[-1] == ""


def test_smi_query_gpu_noheader_nounits_and_ids(state, holder):
    proc = holder()
    fakegpu.allocate(3, 1234, pid=proc.pid)
    rc, out = smi("--query-gpu=index,memory.used,memory.free,memory.total,pci.bus_id,count",
                  "--format=csv,noheader,nounits", "-i", "0,3")
    assert rc == 0
    assert out == ("0, 0, 81559, 81559, 00000000:18:00.0, 8\n"
                   "3, 1234, 80325, 81559, 00000000:5D:00.0, 8\n")
    rc, out = smi("--query-gpu=memory.used", "--format=csv,noheader", "--id=3")
    assert (rc, out) == (0, "1234 MiB\n")
    rc, out = smi("--query-gpu=index", "--format=csv,nounits", "-i", "1")
    assert (rc, out) == (0, "index\n1\n")


def test_smi_compute_apps_empty(state):
    rc, out = smi("--query-compute-apps=pid,name,used_memory", "--format=csv")
    assert (rc, out) == (0, "pid, process_name, used_gpu_memory [MiB]\n")
    rc, out = smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader")
    assert (rc, out) == (0, "")
    assert "No running processes found" in smi()[1]


def test_smi_compute_apps_with_holder(state, holder):
    proc = holder()
    fakegpu.allocate(5, 30000, pid=proc.pid)
    rc, out = smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id",
                  "--format=csv")
    assert rc == 0
    header, row, end = out.split("\n")
    assert header == "pid, process_name, used_gpu_memory [MiB], gpu_uuid, gpu_bus_id"
    cells = row.split(", ")
    assert cells[0] == str(proc.pid)
    assert cells[2:] == ["30000 MiB", fakegpu.gpu_uuid(5), "00000000:AB:00.0"]
    assert end == ""
    rc, out = smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    assert (rc, out) == (0, "%d, 30000\n" % proc.pid)
    table = smi()[1]
    assert str(proc.pid) in table and "No running processes found" not in table


def test_smi_bad_field_and_bad_arguments(state):
    rc, out = smi("--query-gpu=index,foo", "--format=csv")
    assert rc == 2
    assert out.splitlines()[0] == 'Field "foo" is not a valid field to query.'
    rc, out = smi("--query-compute-apps=memory.used", "--format=csv")
    assert rc == 2 and 'Field "memory.used" is not a valid field' in out
    assert smi("--bogus")[0] == 2
    assert smi("--query-gpu=index")[0] == 2  # no --format
    assert smi("--query-gpu=index", "--format=xml")[0] == 2
    assert smi("-L", "--query-gpu=index", "--format=csv")[0] == 2
    assert smi("--query-gpu=index", "--format=csv", "-i", "9")[0] == 6


def test_smi_driver_error(state):
    (state / "driver_error").write_text("")
    rc, out = smi("--query-gpu=index", "--format=csv")
    assert rc == 9
    assert out == ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                   "Make sure that the latest NVIDIA driver is installed and running.\n")
    assert smi("-L")[0] == 9


def test_smi_injected_error_values(state, holder):
    set_config(state, errors={"1": "[GPU is lost]"})
    proc = holder()
    fakegpu.allocate(1, 100, pid=proc.pid)
    rc, out = smi("--query-gpu=index,memory.used,memory.total,utilization.gpu",
                  "--format=csv,noheader", "-i", "0,1")
    assert rc == 0
    assert out == ("0, 0 MiB, 81559 MiB, 0 %\n"
                   "1, [GPU is lost], [GPU is lost], [GPU is lost]\n")
    assert fakegpu.snapshot()[1]["error"] == "[GPU is lost]"


def test_smi_in_process_matches_script(state):
    assert fakegpu.smi(["-L"]) == smi("-L")


# --------------------------------------------------------------------------------------------
# hang mode: an nvidia-smi stuck in the driver

def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def fakegpu_cli(*args):
    env = dict(os.environ, PYTHONPATH=FAKEGPU_DIR)
    return subprocess.run([sys.executable, "-m", "fakegpu", *args], env=env, capture_output=True,
                          text=True, check=False, timeout=30)


def test_hang_knob_cli_and_reading(state):
    assert fakegpu.hang_seconds() is None
    assert fakegpu_cli("config", "--hang", "forever").returncode == 0
    assert (state / "hang").read_text() == "forever\n" and fakegpu.hang_seconds() == float("inf")
    assert fakegpu_cli("config", "--hang", "2.5").returncode == 0
    assert fakegpu.hang_seconds() == 2.5
    (state / "hang").write_text("")
    assert fakegpu.hang_seconds() == float("inf")
    (state / "hanging").mkdir()
    (state / "hanging" / "999999").write_text("")
    assert fakegpu_cli("config", "--hang", "-1").returncode == 2  # usage error, knob unchanged
    assert (state / "hang").exists()
    assert fakegpu_cli("config", "--hang", "off").returncode == 0
    assert fakegpu.hang_seconds() is None and fakegpu.hanging_pids() == []
    assert fakegpu.smi(["-L"])[0] == 0  # the library never hangs


def test_smi_hangs_forever_deaf_to_sigterm_until_sigkill(state):
    (state / "hang").write_text("forever\n")
    proc = subprocess.Popen([sys.executable, SMI, "--query-gpu=index", "--format=csv"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        poll(lambda: proc.pid in fakegpu.hanging_pids(), timeout=10.0, what="hanging marker")
        proc.terminate()
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)  # a negative condition: nothing to poll for
        assert alive(proc.pid)
    finally:
        proc.kill()
        out, _err = proc.communicate(timeout=10)
    assert proc.returncode == -9 and out == b""
    assert not alive(proc.pid)


def test_smi_slow_answers_after_the_delay(state):
    (state / "hang").write_text("0.5\n")
    start = time.monotonic()
    rc, out = smi("--query-gpu=index", "--format=csv,noheader")
    assert time.monotonic() - start >= 0.5
    assert (rc, out.splitlines()[:2]) == (0, ["0", "1"])
    assert fakegpu.hanging_pids() == []  # marker removed when it answered


# --------------------------------------------------------------------------------------------
# passthrough: the process view of a GPU passed through to an LXC container; other tenants

def test_passthrough_off_by_default(state, holder):
    assert fakegpu.load_config()["passthrough"] is None and fakegpu.load_config()["foreign_mib"] == {}
    proc = holder()
    fakegpu.allocate(1, 1000, pid=proc.pid)
    assert smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")[1] == "%d, 1000\n" % proc.pid


def test_passthrough_empty_hides_every_process_but_keeps_memory(state, holder):
    set_config(state, passthrough="empty")
    proc = holder()
    fakegpu.allocate(2, 5000, pid=proc.pid)
    assert smi("--query-compute-apps=pid,process_name,used_memory", "--format=csv")[1] == \
        "pid, process_name, used_gpu_memory [MiB]\n"
    assert smi("--query-compute-apps=pid", "--format=csv,noheader")[1] == ""
    assert smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-i", "2")[1] == "2, 5000\n"
    assert "No running processes found" in smi()[1]
    # the host's view is the truth
    assert fakegpu.snapshot()[2]["processes"] == [
        {"pid": proc.pid, "name": fakegpu._process_name(proc.pid), "used_mib": 5000}]


def test_passthrough_host_pids_are_not_found_in_the_container(state, holder):
    set_config(state, passthrough="host_pids")
    proc = holder()
    fakegpu.allocate(3, 7000, pid=proc.pid)
    rc, out = smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv,noheader")
    assert rc == 0
    (row,) = out.splitlines()
    pid, name, mib, uuid = row.split(", ")
    assert int(pid) != proc.pid and not os.path.exists("/proc/%s" % pid)
    assert (name, mib, uuid) == ("[Not Found]", "7000 MiB", fakegpu.gpu_uuid(3))
    assert " %d " % proc.pid not in smi()[1].split("Processes:")[1]
    assert " %s   [Not Found] " % pid in smi()[1]


def test_foreign_memory_counts_in_used_and_against_allocations(state, holder):
    set_config(state, foreign_mib={"4": 80000, "5": 0})
    assert smi("--query-gpu=index,memory.used,memory.free,utilization.gpu", "--format=csv,noheader,nounits",
               "-i", "4,5")[1] == "4, 80000, 1559, 100\n5, 0, 81559, 0\n"
    assert smi("--query-compute-apps=pid", "--format=csv,noheader")[1] == ""  # no process of ours
    proc = holder()
    with pytest.raises(fakegpu.OutOfMemory):
        fakegpu.allocate(4, 2000, pid=proc.pid)
    fakegpu.allocate(4, 1500, pid=proc.pid)
    assert used(4) == 81500
    assert fakegpu.snapshot()[4]["foreign_mib"] == 80000


def test_foreign_holder_under_host_pids(state):
    set_config(state, passthrough="host_pids", foreign_mib={"6": 12000})
    out = smi("--query-compute-apps=pid,name,used_memory", "--format=csv,noheader,nounits")[1]
    assert out == "%d, [Not Found], 12000\n" % (fakegpu.FOREIGN_HOST_PID + 6)


def test_passthrough_and_foreign_cli(state):
    res = fakegpu_cli("config", "--passthrough", "host-pids", "--foreign", "1=300", "--foreign", "2=400")
    assert res.returncode == 0, res.stderr
    cfg = fakegpu.load_config()
    assert (cfg["passthrough"], cfg["foreign_mib"]) == ("host_pids", {"1": 300, "2": 400})
    assert fakegpu_cli("config", "--foreign", "1=0").returncode == 0
    assert fakegpu.load_config()["foreign_mib"] == {"2": 400}
    assert fakegpu_cli("config", "--passthrough", "off", "--clear-foreign").returncode == 0
    cfg = fakegpu.load_config()
    assert (cfg["passthrough"], cfg["foreign_mib"]) == (None, {})
    assert fakegpu_cli("config", "--passthrough", "bogus").returncode == 2
    set_config(state, passthrough="sometimes")
    with pytest.raises(ValueError, match="passthrough must be"):
        fakegpu.load_config()


# --------------------------------------------------------------------------------------------
# the node's view (nvidia-smi on the lab host)

def test_node_view_lists_every_tenants_holders_under_host_pids(state, holder, tmp_path):
    """Two tenants' state dirs on one node: memory adds up per GPU, holders keep their pids (on
    this host the container pid is the host pid), dead holders drop out, and the CSV is the
    nvidia-smi stand-in's."""
    other = tmp_path / "other"
    other.mkdir()
    set_config(state)
    mine, theirs = holder(), holder()
    fakegpu.allocate(5, 30000, pid=mine.pid)
    os.environ["FAKEGPU_STATE_DIR"] = str(other)
    try:
        set_config(other)
        fakegpu.allocate(5, 20000, pid=theirs.pid)
        fakegpu.allocate(7, 1000, pid=theirs.pid)
    finally:
        os.environ["FAKEGPU_STATE_DIR"] = str(state)
    tenants = [(str(state), os.getpid()), (str(other), os.getpid())]  # pytest stands for init
    gpus = fakegpu.node_view(tenants)
    assert [g["used_mib"] for g in gpus] == [0, 0, 0, 0, 0, 50000, 0, 1000]
    assert [(p["pid"], p["used_mib"]) for p in gpus[5]["processes"]] == sorted(
        [(mine.pid, 30000), (theirs.pid, 20000)])
    rc, out = fakegpu.smi(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                          view=lambda: fakegpu.node_view(tenants))
    assert rc == 0 and sorted(out.splitlines()) == sorted(
        ["%d, 30000" % mine.pid, "%d, 20000" % theirs.pid, "%d, 1000" % theirs.pid])
    kill(theirs)
    assert [g["used_mib"] for g in fakegpu.node_view(tenants)] == [0, 0, 0, 0, 0, 30000, 0, 0]
    assert fakegpu.smi(["-L"], view=lambda: fakegpu.node_view([]))[0] == 6  # no tenant: no GPU


def test_a_container_given_some_of_the_nodes_gpus_numbers_them_its_own_way(state, holder, tmp_path):
    """node_slots [5, 3]: the container sees two GPUs, 0 and 1, whose UUIDs and bus ids are the node's
    GPUs 5 and 3; its memory shows on the node at slots 5 and 3, beside a tenant given the node's
    GPUs as they are numbered there."""
    other = tmp_path / "other"
    other.mkdir()
    set_config(state, node_slots=[5, 3])
    mine, theirs = holder(), holder()
    assert [g["index"] for g in fakegpu.snapshot()] == [0, 1]
    assert [g["uuid"] for g in fakegpu.snapshot()] == [fakegpu.gpu_uuid(5, "lab"), fakegpu.gpu_uuid(3, "lab")]
    with pytest.raises(fakegpu.InvalidDevice):
        fakegpu.allocate(2, 100, pid=mine.pid)
    fakegpu.allocate(0, 30000, pid=mine.pid)
    fakegpu.allocate(1, 10000, pid=mine.pid)
    os.environ["FAKEGPU_STATE_DIR"] = str(other)
    try:
        set_config(other)
        fakegpu.allocate(5, 20000, pid=theirs.pid)
    finally:
        os.environ["FAKEGPU_STATE_DIR"] = str(state)
    gpus = fakegpu.node_view([(str(state), os.getpid()), (str(other), os.getpid())])
    assert [g["used_mib"] for g in gpus] == [0, 0, 0, 10000, 0, 50000, 0, 0]
    assert gpus[5]["uuid"] == fakegpu.snapshot()[0]["uuid"] and gpus[3]["uuid"] == fakegpu.snapshot()[1]["uuid"]
    rc, out = fakegpu.smi(["-L"])
    first = "GPU 0: %s (UUID: %s)" % (fakegpu.load_config()["name"], fakegpu.gpu_uuid(5, "lab"))
    assert rc == 0 and out.splitlines()[0] == first
    # the CLI; a slot the node does not have, or one given twice, is refused
    assert fakegpu_cli("config", "--node-slots", "off").returncode == 0
    assert (fakegpu.load_config()["node_slots"], fakegpu.load_config()["count"]) == (None, 8)
    assert fakegpu_cli("config", "--node-slots", "2,x").returncode == 2
    for bad in ([8], [1, 1], []):
        set_config(state, node_slots=bad)
        with pytest.raises(ValueError, match="node_slots must be"):
            fakegpu.load_config()


def test_node_view_keeps_a_dead_holders_memory_within_its_release_delay(state, holder):
    set_config(state, release_delay_s=3600)
    proc = holder()
    fakegpu.allocate(2, 4000, pid=proc.pid)
    kill(proc)
    gpu = fakegpu.node_view([(str(state), os.getpid())])[2]
    assert gpu["used_mib"] == 4000 and gpu["processes"] == []


def test_host_pids_maps_this_namespace():
    mapping = fakegpu.host_pids(fakegpu.pid_namespace(os.getpid()))
    assert mapping[os.getpid()] == os.getpid()
    assert fakegpu.pid_namespace(2 ** 22 + 5) is None


def test_node_view_prints_the_name_a_process_gives_itself_unquoted(state, tmp_path):
    """As the real tool: a process's argv[0], commas and newlines included, reaches a query with
    names raw; the node's own query (numbers and UUIDs) is byte-for-byte the real tool's."""
    set_config(state)
    hostile = subprocess.Popen(["a, x, 1\n4242, p", "-c", "import time; time.sleep(120)"], executable=sys.executable)
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert poll(lambda: fakegpu.argv0_name(hostile.pid) == "a, x, 1\n4242, p", timeout=10)
        fakegpu.allocate(5, 20000, pid=hostile.pid)
        fakegpu.allocate(5, 30000, pid=plain.pid)
        tenants = [(str(state), os.getpid())]
        uuid5 = fakegpu.gpu_uuid(5, "lab")
        rc, out = fakegpu.smi(["--query-compute-apps=pid,process_name,gpu_uuid,used_memory",
                               "--format=csv,noheader,nounits"], view=lambda: fakegpu.node_view(tenants))
        assert rc == 0
        assert "%d, a, x, 1\n4242, p, %s, 20000\n" % (hostile.pid, uuid5) in out
        assert "%d, %s, %s, 30000\n" % (plain.pid, sys.executable, uuid5) in out
        rc, out = fakegpu.smi(["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv"],
                              view=lambda: fakegpu.node_view(tenants))
        rows = sorted([(hostile.pid, 20000), (plain.pid, 30000)])
        assert (rc, out) == (0, "gpu_uuid, pid, used_gpu_memory [MiB]\n" + "".join(
            "%s, %d, %d MiB\n" % (uuid5, pid, mib) for pid, mib in rows))
    finally:
        kill(hostile)
        kill(plain)
    assert fakegpu.argv0_name(hostile.pid) == fakegpu.NOT_FOUND


# --------------------------------------------------------------------------------------------
# nvidia-smi's exit statuses (nvidia-smi(1) RETURN VALUE), per container through config.json

@pytest.mark.parametrize("code", fakegpu.EXIT_CODES)
def test_nvidia_smi_exits_with_each_documented_status(state, code):
    ok_rc, ok_out = smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert ok_rc == 0 and ok_out.startswith("0, ")
    assert fakegpu.main(["config", "--exit-code", str(code)]) == 0
    rc, out = smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert rc == code
    if code == 14:  # infoROM corrupted: the normal answer comes with it
        assert out == ok_out
    else:
        assert out == fakegpu.EXIT_TEXTS[code] + "\n"
    assert fakegpu.main(["config", "--exit-code", "off"]) == 0
    assert smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits") == (0, ok_out)


def test_an_unknown_exit_code_in_config_is_refused(state):
    with pytest.raises(ValueError, match="exit_code"):
        fakegpu.write_config(exit_code=7)  # written, then read back: refused
    with pytest.raises(ValueError, match="exit_code"):
        fakegpu.load_config()
