"""The doctor's judgement (plugins/plugin_utils/_doctor.py) from recorded answers of a node and a container,
and the CLI's output of it (dflash_trainer/doctor.py)."""
import json
import os
import subprocess

import pytest

from ansible_collections.dflash.trainer.plugins.plugin_utils import _doctor
from dflash_trainer import doctor
from dflash_trainer.results import RunResult, HostResult


def out(**sections):
    """A script's stdout: each (rc, text) as the scripts' sections print them."""
    return "".join("%s%s\n%s\n%s%s %s\n" % (_doctor.SECTION, n, t, _doctor.SECTION_RC, n, rc)
                   for n, (rc, t) in sections.items())


NODE = dict(id=(0, "0\nroot"), pct=(0, ""), version=(0, "pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8.8-2-pve)"),
            status=(0, "status: running"),
            list=(0, "VMID       Status     Lock         Name\n490        running                 ct490"),
            cgroup=(0, "cgroup /sys/fs/cgroup/lxc/490\npopulated 1\nfrozen 0\n"
                       "cgroup /sys/fs/cgroup/lxc/490/ns\npopulated 1\nfrozen 0"),
            nodesmi=(0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n"
                        "GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-3)"))
DEV = "\n".join(["nvidiactl chr", "nvidia-uvm chr", "nvidia-uvm-tools chr", "nvidia0 chr", "nvidia1 chr"])
CT = dict(pid1=(0, "systemd"), systemd=(0, "running"), python=(0, ""),
          smi=(0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)"),
          dev=(0, DEV), df=(0, "/opt\nFilesystem 1024-blocks Used Available Capacity Mounted on\n"
                               "/dev/loop0 104857600 1048576 52428800 2% /"), date=(0, "1000.5"))


def judge(node=None, ct=None, node_res=None, ct_res=None, **kw):
    node_res = node_res if node_res is not None else {"rc": 0, "stdout": out(**dict(NODE, **(node or {})))}
    ct_res = ct_res if ct_res is not None else {"rc": 0, "stdout": out(**dict(CT, **(ct or {})))}
    kw = dict(dict(vmid="490", host="pve1", user="root"), **kw)
    return _doctor.report(_doctor.judge(node_res, ct_res, 1000.0, 1001.0, **kw))


def marks(rep):
    return {c["name"]: c["mark"] for c in rep["checks"]}


def test_a_healthy_node_and_container_hold_every_assumption():
    rep = judge()
    assert set(marks(rep).values()) == {"✓"} and rep["exit_code"] == 0 and not rep["failed"]
    assert [c["name"] for c in rep["checks"]] == ["ssh", "privilege", "pct", "container", "lock", "cgroup", "pct exec",
                                                  "systemd", "python", "nvidia-smi", "GPU pairing", "device nodes",
                                                  "free space", "clock"]
    assert "pve-manager/8.2.4" in rep["lines"][2]
    assert "/sys/fs/cgroup/lxc/490/ns, Proxmox VE's layout" in rep["lines"][5]
    assert "2 GPU(s)" in rep["lines"][9] and "numbered alike" in rep["lines"][10] and "51200 MiB free" in rep["lines"][12]


@pytest.mark.parametrize("msg,words", [
    ("host key of pve1 was not accepted (ssh): No ED25519 host key is known for pve1 - add the node's key", "ssh-keyscan"),
    ("authentication to pve1 failed (ssh): root@pve1: Permission denied (publickey).", "ssh-copy-id"),
    ("Task failed: host pve1 is unreachable (ssh): ssh: connect to host pve1 port 22: No route to host", "ansible_port"),
])
def test_a_node_not_reached_is_the_first_cross_and_exit_3(msg, words):
    rep = judge(node_res={"unreachable": True, "msg": msg}, ct_res={"skipped": True})
    assert rep["checks"][0]["mark"] == "✗" and words in rep["checks"][0]["remedy"]
    assert not rep["checks"][0]["detail"].startswith("Task failed")
    assert set(c["mark"] for c in rep["checks"][1:]) == {"?"} and rep["exit_code"] == 3


def test_a_login_that_runs_nothing_is_named():
    rep = judge(node_res={"rc": 1, "stdout": "This account is currently not available.\n", "stderr": ""})
    assert rep["checks"][0]["mark"] == "✗" and "ran no command" in rep["checks"][0]["detail"]


@pytest.mark.parametrize("node,sudo,words", [
    (dict(id=(0, "1000\ndflash")), False, "set pct_sudo: true"),
    (dict(id=(0, "1000\ndflash"), sudo=(1, "sudo: a password is required")), True, "NOPASSWD"),
    (dict(id=(0, "1000\ndflash"), sudo=(127, "sh: 1: sudo: not found")), True, "apt install sudo"),
])
def test_privilege_without_root_needs_a_sudo_rule(node, sudo, words):
    rep = judge(node=node, sudo=sudo)
    assert marks(rep)["privilege"] == "✗" and words in rep["checks"][1]["remedy"] and rep["exit_code"] == 1


def test_sudo_allowed_holds():
    assert marks(judge(node=dict(id=(0, "1000\ndflash"), sudo=(0, "/usr/sbin/pct")), sudo=True))["privilege"] == "✓"


def test_pct_missing():
    rep = judge(node=dict(pct=(1, "")))
    assert marks(rep)["pct"] == "✗" and "pct_path" in rep["checks"][2]["remedy"]


@pytest.mark.parametrize("status,words,remedy", [
    ((0, "status: stopped"), "not running (status: stopped)", "pct start 490"),
    ((2, "Configuration file 'nodes/pve1/lxc/490.conf' does not exist"), "no container 490", "proxmox_vmid"),
    ((5, "container '490' not running!"), "not running", "pct start 490"),
])
def test_a_container_missing_or_stopped_skips_the_checks_inside(status, words, remedy):
    rep = judge(node=dict(status=status), ct_res={"unreachable": True, "msg": "container 490 is not running"})
    c = rep["checks"][3]
    assert c["mark"] == "✗" and words in c["detail"] and remedy in c["remedy"]
    assert [m for n, m in marks(rep).items() if n in ("pct exec", "systemd", "clock")] == ["?"] * 3
    assert sum(1 for c in rep["checks"] if c["mark"] == "✗") == 1  # one fault, one line


def test_a_proxmox_lock_is_named_and_the_checks_inside_go_on():
    rep = judge(node=dict(list=(0, "VMID Status Lock Name\n490 running backup ct490")))
    assert marks(rep)["lock"] == "✗" and "lock: backup" in rep["checks"][4]["detail"]
    assert "pct unlock 490" in rep["checks"][4]["remedy"] and marks(rep)["clock"] == "✓"


def test_a_lock_not_readable_through_a_wrapper_is_not_checked():
    rep = judge(node=dict(list=(77, "dflash-pct-wrapper: refused: pct list is not allowed")))
    assert marks(rep)["lock"] == "?" and rep["exit_code"] == 0


@pytest.mark.parametrize("ct,name,words", [
    (dict(pid1=(0, "init")), "systemd", "not systemd"),
    (dict(systemd=(1, "starting")), "systemd", "still booting"),
    (dict(systemd=(1, "Failed to connect to bus: No such file or directory")), "systemd", "is-system-running answers"),
    (dict(python=(1, "")), "python", "no executable /usr/bin/python3"),
    (dict(smi=(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")), "nvidia-smi",
     "exit 9: driver not loaded"),
    (dict(smi=(15, "Unable to determine the device handle for GPU0000:1B:00.0: GPU is lost.")), "nvidia-smi",
     "exit 15: GPU fell off the bus"),
    (dict(smi=(127, "sh: nvidia-smi: not found")), "nvidia-smi", "not found"),
    (dict(dev=(0, DEV.replace("nvidia-uvm chr\n", ""))), "device nodes", "/dev/nvidia-uvm is missing"),
    (dict(dev=(0, DEV.replace("nvidia-uvm chr", "nvidia-uvm empty"))), "device nodes", "an empty file"),
    (dict(dev=(0, "nvidiactl chr\nnvidia-uvm chr")), "device nodes", "no /dev/nvidiaN"),
    (dict(df=(0, "/opt\nFilesystem 1024-blocks Used Available Capacity Mounted on\n/dev/x 100 90 1000 99% /")),
     "free space", "0 MiB free"),
    (dict(date=(0, "1010.0")), "clock", "+9.0 s"),
    (dict(date=(0, "990.0")), "clock", "-10.0 s"),
])
def test_each_fault_inside_the_container_is_one_cross_with_its_remedy(ct, name, words):
    rep = judge(ct=ct)
    bad = [c for c in rep["checks"] if c["mark"] == "✗"]
    assert [c["name"] for c in bad] == [name] and words in bad[0]["detail"] and bad[0]["remedy"], bad
    assert rep["exit_code"] == 1 and rep["summary"].startswith("1 of 14 assumptions do not hold: ✗ %s" % name)


def test_nvidia_smi_exit_14_with_output_is_a_warning_not_a_failure():
    rep = judge(ct=dict(smi=(14, CT["smi"][1])))
    assert marks(rep)["nvidia-smi"] == "✓" and "infoROM" in rep["checks"][9]["detail"]
    assert marks(rep)["GPU pairing"] == "✓"  # its GPUs listed with the warning


def test_the_node_fault_remedy_of_exit_9_says_where():
    rep = judge(ct=dict(smi=(9, "NVIDIA-SMI has failed")))
    assert "on the node" in rep["checks"][9]["remedy"]


def test_a_pct_exec_failure_after_a_running_status_is_named():
    rep = judge(ct_res={"unreachable": True, "msg": "Task failed: command timed out after 30 s"})
    assert marks(rep)["pct exec"] == "✗" and "command timed out" in rep["checks"][6]["detail"]
    assert marks(rep)["systemd"] == "?"


def test_a_frozen_container_is_one_cross_and_is_not_entered():
    """A suspend-mode backup (or lxc-freeze) freezes the container: pct exec would hang in it until the connection's
    timeout, so the doctor does not ask inside, and says why on one line."""
    frozen = dict(cgroup=(0, "cgroup /sys/fs/cgroup/lxc/490\npopulated 1\nfrozen 1\n"
                             "cgroup /sys/fs/cgroup/lxc/490/ns\npopulated 1\nfrozen 1"))
    node_res = {"rc": 0, "stdout": out(**{**NODE, **frozen})}
    assert _doctor.enter(node_res) is False and _doctor.enter({"rc": 0, "stdout": out(**NODE)}) is True
    assert _doctor.enter({"unreachable": True, "msg": "x"}) is False
    rep = judge(node=frozen, ct_res={"skipped": True})
    bad = [c for c in rep["checks"] if c["mark"] == "✗"]
    assert [c["name"] for c in bad] == ["cgroup"] and "container 490 is frozen" in bad[0]["detail"]
    assert "lxc-unfreeze -n 490" in bad[0]["remedy"] and "suspend" in bad[0]["remedy"]
    assert {c["detail"] for c in rep["checks"][6:]} == {"not checked: the container is frozen"}
    # plain LXC's layout on a hybrid host (the lab's): the v1 freezer says it
    hybrid = ("cgroup /sys/fs/cgroup/unified/lxc.payload.490\npopulated 1\nfrozen 0\n"
              "cgroup /sys/fs/cgroup/freezer/lxc.payload.490\nfreezer.state %s")
    rep = judge(node=dict(cgroup=(0, hybrid % "THAWED")))
    assert marks(rep)["cgroup"] == "✓" and "/sys/fs/cgroup/unified/lxc.payload.490, LXC's layout" in rep["lines"][5]
    for state in ("FROZEN", "FREEZING"):
        rep = judge(node=dict(cgroup=(0, hybrid % state)), ct_res={"skipped": True})
        assert marks(rep)["cgroup"] == "✗" and (
            "frozen (/sys/fs/cgroup/freezer/lxc.payload.490: freezer.state %s)" % state) in rep["lines"][5]
        assert _doctor.enter({"rc": 0, "stdout": out(**{**NODE, "cgroup": (0, hybrid % state)})}) is False
    # no cgroup where the node view looks: not judged a fault, said
    rep = judge(node=dict(cgroup=(0, "")))
    assert marks(rep)["cgroup"] == "?" and "would attribute none of its processes" in rep["lines"][5]


def test_the_container_is_asked_only_when_the_node_says_enter_and_its_answer_is_a_raw_result():
    """container_answer: ask() once when ``enter``, never else ({}: what a skipped raw task left the judge); the
    answer shaped as the raw task registered it (failed_when: false) or its unreachable result."""
    asked = []

    def ask():
        asked.append(1)
        return _doctor.answered({"rc": 0, "stdout": out(**CT), "stderr": ""})

    frozen = {"rc": 0, "stdout": out(**{**NODE, "cgroup": (0, "cgroup /sys/fs/cgroup/lxc/490\nfrozen 1")})}
    assert _doctor.container_answer(frozen, ask) == {} and _doctor.container_answer({"unreachable": True}, ask) == {}
    assert asked == []
    ct = _doctor.container_answer({"rc": 0, "stdout": out(**NODE)}, ask)
    assert asked == [1] and ct["failed"] is False and "msg" not in ct
    assert _doctor.answered({"rc": 127, "stdout": "", "stderr": "sh: not found"}) == {
        "rc": 127, "stdout": "", "stderr": "sh: not found", "failed": False, "msg": "non-zero return code"}
    assert _doctor.unreachable("Task failed: x") == {"unreachable": True, "msg": "Task failed: x"}
    assert judge(ct_res=ct)["exit_code"] == 0
    assert judge(ct_res=_doctor.unreachable("Task failed: gone"))["lines"][6].startswith("✗ pct exec     gone - ")


def test_the_script_of_each_place_takes_its_defaults_for_empty_values():
    from ansible_collections.dflash.trainer.plugins.filter.doctor import trainer_doctor_script

    assert _doctor.script("container", trainer_root="", python=None) == _doctor.container_script() == \
        trainer_doctor_script("container")
    assert _doctor.script("container", trainer_root="/r", python="/p", nvidia_smi="/n") == \
        _doctor.container_script("/r", "/p", "/n")
    assert _doctor.script("node", vmid="490", pct_path="", sudo=0) == _doctor.node_script("490") == \
        trainer_doctor_script("node", vmid="490")
    assert _doctor.script("node", vmid="490", sudo=True) == _doctor.node_script("490", sudo=True) != \
        _doctor.node_script("490")


@pytest.mark.parametrize("nodesmi,mark,words", [
    ((0, "GPU 0: H (UUID: GPU-9)\nGPU 3: H (UUID: GPU-2)\nGPU 5: H (UUID: GPU-1)"), "✓",
     "by UUID: GPU 0 is the node's GPU 5, GPU 1 is the node's GPU 3"),
    ((0, "GPU 0: H (UUID: GPU-1)\nGPU 1: H (UUID: GPU-7)"), "✗", "the node does not list the container's GPU 1 (GPU-2)"),
    ((127, "sh: 1: nvidia-smi: not found"), "?", "no nvidia-smi on the node"),
    ((6, "No devices were found"), "?", "answered exit 6: No devices were found"),
    ((0, "garbage"), "?", "not paired"),
])
def test_the_gpus_are_paired_with_the_nodes_by_uuid(nodesmi, mark, words):
    """The container numbers the GPUs it was given 0..k-1, the node by slot: only the UUID pairs them."""
    rep = judge(node=dict(nodesmi=nodesmi))
    c = rep["checks"][10]
    assert c["name"] == "GPU pairing" and c["mark"] == mark and words in c["detail"], c
    assert sum(1 for c in rep["checks"] if c["mark"] == "✗") == (1 if mark == "✗" else 0)
    if mark == "✗":
        assert "trainer_node_nvidia_smi" in c["remedy"]


def test_sections_survive_missing_ends_and_crlf():
    assert _doctor.sections("junk\r\n@@dflash-doctor a\r\nx\r\n@@dflash-doctor-rc a 3\r\n@@dflash-doctor b\ny") == {
        "a": (3, "x"), "b": (None, "y")}


def test_the_scripts_quote_what_they_are_given(tmp_path):
    """The container script runs in sh with a root holding spaces and quotes; its sections come back."""
    root = tmp_path / "it's a root"
    script = _doctor.container_script(str(root / "sub"), python="/bin/sh", nvidia_smi="/bin/false")
    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
    sec = _doctor.sections(res.stdout)
    assert sec["df"][1].splitlines()[0] == str(tmp_path) and sec["python"][0] == 0 and sec["smi"][0] == 1
    node = _doctor.node_script("490; touch %s" % (tmp_path / "x"), pct_path="/bin/echo", sudo=False)
    res = subprocess.run(["sh", "-c", node], capture_output=True, text=True, check=False)
    assert not (tmp_path / "x").exists() and "status 490; touch" in _doctor.sections(res.stdout)["status"][1]


# ---- the CLI's output ----------------------------------------------------------------------------

def event(host, rep):
    return {"event": "runner_on_ok", "event_data": {"host": host, "res": {"ansible_facts": {"__trainer_doctor": rep}}}}


def test_the_cli_prints_one_line_per_assumption_and_the_remedy_under_a_cross():
    rep = judge(node=dict(list=(0, "VMID Status Lock Name\n490 running backup ct490")))
    host, found = doctor.report_of(event("gpu-node1-trainer", rep))
    assert doctor.report_of({"event": "runner_on_ok", "event_data": {"res": {"ansible_facts": {"x": 1}}}}) is None
    result = RunResult(ok=False, rc=2, status="failed", hosts={host: HostResult(host=host)})
    text = doctor.text(result, {host: found})
    lines = text.splitlines()
    assert lines[0] == "gpu-node1-trainer: 1 of 14 assumptions do not hold"
    assert lines[1] == "  ✓ ssh          root@pve1 reached, host key accepted"
    assert lines[5] == "  ✗ lock         container 490 is locked by Proxmox (lock: backup)"
    assert lines[6] == "      remedy: wait for the backup to end, or `pct unlock 490` on the node if nothing holds it"
    assert len(lines) == 1 + 14 + 1
    assert doctor.run_exit(result, {host: found}) == 1


def test_the_cli_exit_codes():
    ok = judge()
    down = judge(node_res={"unreachable": True, "msg": "host pve1 is unreachable (ssh): x"})
    hosts = {h: HostResult(host=h) for h in ("a", "b")}
    result = RunResult(ok=False, rc=2, status="failed", hosts=hosts)
    assert doctor.run_exit(result, {"a": ok, "b": ok}) == 0
    assert doctor.run_exit(result, {"a": ok, "b": down}) == 3
    assert doctor.run_exit(result, {"a": judge(ct=dict(python=(1, ""))), "b": down}) == 1
    # no host judged: the run's own code (no host matched: refused, 2)
    refused = RunResult(ok=False, rc=2, status="failed", refused=True, reason="no host matched the pattern 'x'")
    assert doctor.run_exit(refused, {}) == refused.exit_code != 0
    assert "no host matched" in doctor.text(refused, {})


# -- doctor --record: what a node answered, replayed --------------------------------------------------------
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "doctor")


def test_a_record_keeps_only_what_the_judge_reads_and_replays_to_the_same_lines():
    node_res = {"rc": 0, "stdout": out(**NODE), "stderr": "", "changed": False, "invocation": {"x": 1}}
    ct_res = {"rc": 0, "stdout": out(**CT)}
    rec = _doctor.record(node_res, ct_res, 1000.0, 1001.0, vmid="490", host="pve1", user="root", sudo=False)
    assert set(rec["node"]) == {"rc", "stdout", "stderr"} and rec["params"]["vmid"] == "490"
    assert rec["lines"] == judge()["lines"] == _doctor.replay(json.loads(json.dumps(rec)))["lines"]


def test_a_record_masks_the_trainers_environment_values():
    ct = dict(CT)
    ct["python"] = (1, "cannot run /usr/bin/python3 with HF_TOKEN=hf_secret_value_123")
    rec = _doctor.record({"rc": 0, "stdout": out(**NODE)}, {"rc": 0, "stdout": out(**ct)}, 1000.0, 1001.0,
                         secrets=["hf_secret_value_123"], vmid="490", host="pve1", user="root")
    text = json.dumps(rec)
    assert "hf_secret_value_123" not in text and "HF_TOKEN=***" in text


def test_a_record_of_another_version_is_refused_saying_so():
    with pytest.raises(ValueError, match="version 99"):
        _doctor.replay({"version": 99})


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(FIXTURES) if f.endswith(".json")))
def test_every_recorded_node_replays_to_the_lines_it_printed(name):
    """tests/unit/fixtures/doctor/*.json: `dflash-trainer doctor --record DIR` against the lab, healthy and with
    each fault it can inject - a user's recorded node goes here, its lines corrected to what they should say."""
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as fh:
        rec = json.load(fh)
    assert _doctor.replay(rec)["lines"] == rec["lines"]


def test_the_cli_makes_the_record_directory_and_passes_it_on(tmp_path):
    from dflash_trainer import __main__ as cli
    where = cli.record_dir(str(tmp_path / "rec" / "here"))
    assert where == str(tmp_path / "rec" / "here") and os.path.isdir(where)
    assert oct(os.stat(where).st_mode & 0o777) == "0o700"
