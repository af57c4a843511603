"""The field, in the lab (issue 8): check mode on a first deploy changes nothing (container 260,
unprivileged as Proxmox creates them by default); a non-root operator whose sudo allows only
extras/dflash-pct-wrapper deploys and reads status through it (260), and the wrapper refuses a
container not listed (231), `pct stop` and `pct push`; GPUs seen as through LXC passthrough (231),
and the node's view naming holders by container and unit (231 with a neighbour in 232; the
operator's 260). The wrapper reaches only unprivileged containers: tests/lab/test_wrapper_lab.py."""
import json
import os
import re
import subprocess
import sys

import pytest

from labkit import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = os.path.join(ROOT, "lab", "lab.py")
CT = "260"       # unprivileged, fresh at the start of this module, then the operator's container
OTHER = "231"    # exists, never listed for the operator
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}, "trainer_target_hosts": "all",
        "trainer_src": os.path.join(ROOT, "examples", "trainer")}


def lab_cmd(*args):
    subprocess.run([sys.executable, LAB, *args], check=True, stdout=subprocess.DEVNULL)


def playbook(inv_path, play, limit, *args, **extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(["ansible-playbook", "-i", inv_path, play, "-l", limit, *args,
                           "-e", json.dumps(dict(FAST, **extra))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def field(lab, tmp_path_factory):
    lab_cmd("down", "--ids", CT)  # a first deploy: nothing of ours in the container
    lab_cmd("up", "--fresh", "--unprivileged", "--ids", CT)  # the wrapper reaches unprivileged containers only
    lab_cmd("up", "--fresh", "--ids", OTHER)
    lab_cmd("allow", "--ids", OTHER, "--remove")
    lab_cmd("allow", "--ids", CT)
    base = tmp_path_factory.mktemp("field")
    root_inv = base / "root.json"
    root_inv.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    op = lab.facts["operator"]
    op_vars = dict(lab.conn_vars(), ansible_user=op["ssh_user"], pct_sudo=True, pct_path=op["pct_path"])
    op_inv = base / "operator.json"
    op_inv.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)},
                                                    "other": {"proxmox_vmid": int(OTHER)}}, "vars": op_vars}}))
    return str(root_inv), str(op_inv)


def leftovers(lab):
    res = lab.ct(CT, "sh", "-c", "ls -d /opt/dflash-trainer /etc/systemd/system/dflash-trainer.service "
                 "/etc/dflash-trainer /usr/local/lib/dflash-trainer /run/dflash-trainer* /root/.ansible 2>/dev/null; true")
    return res.stdout.split()


def test_check_mode_on_a_first_deploy_says_what_it_would_do_and_changes_nothing(lab, field):
    root_inv, _op_inv = field
    assert leftovers(lab) == []
    res = playbook(root_inv, "deploy.yml", "ct", "--check", "--diff",
                   trainer_env={"FAKE_TRAINER_STARTUP_S": "0.3", "FIELD_SECRET": "s3cr3t-check-mode"})
    out = " ".join((res.stdout + res.stderr).split())  # the callback wraps long messages
    assert res.returncode == 0, out[-4000:]
    assert "would restart dflash-trainer: release switched to " in out, out[-4000:]
    assert "trainer not running" in out and "unit file changed" in out
    assert "s3cr3t-check-mode" not in out
    assert leftovers(lab) == []
    assert lab.ct(CT, "systemctl", "cat", "dflash-trainer").returncode != 0  # no unit, loaded or not


def test_operator_deploys_and_reads_status_through_the_sudo_wrapper(lab, field):
    _root_inv, op_inv = field
    res = playbook(op_inv, "deploy.yml", "ct")
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, out[-4000:]
    assert "dflash-trainer ready: release " in out
    assert lab.ct(CT, "systemctl", "is-active", "dflash-trainer").stdout.strip() == "active"
    res = playbook(op_inv, "playbooks/status.yml", "ct")
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert "unit dflash-trainer: active/running" in res.stdout
    res = playbook(op_inv, "deploy.yml", "ct")  # a no-op through the wrapper too
    assert res.returncode == 0 and "left running: release" in res.stdout, res.stdout[-3000:]


def test_operator_reads_the_nodes_view_over_plain_ssh(lab, field):
    """The node's view runs on the node as the operator: no pct, and no sudo rule of the
    collection's (the lab's nvidia-smi stand-in has its own, for the containers' state)."""
    _root_inv, op_inv = field
    lab_cmd("node-gpus", "--ids", CT)
    try:
        res = playbook(op_inv, "deploy.yml", "ct", trainer_force_restart=True, trainer_gpu_host_view=True)
        out = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 0, out[-4000:]
        assert "GPU 0: 60000 MiB held by dflash-trainer in CT %s" % CT in out, out[-4000:]
        assert "GPU 7: 30000 MiB held by dflash-trainer in CT %s" % CT in out
    finally:
        lab_cmd("node-gpus")


def test_the_wrapper_refuses_a_container_not_listed(lab, field):
    _root_inv, op_inv = field
    res = playbook(op_inv, "playbooks/status.yml", "other")
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "dflash-pct-wrapper: refused: container %s is not in /etc/dflash-trainer/pct-allowed" % OTHER in out, out[-3000:]
    # a refusal of the wrapper is the transport's, like sudo's own: the host is unreachable, not failed
    assert "the pct wrapper on 127.0.0.1 refused the call" in out and "unreachable=1" in out, out[-3000:]


@pytest.mark.parametrize("remote,rc,said", [
    ("sudo -n {w} exec {other} -- true", 77, "refused: container {other} is not in"),
    ("sudo -n {w} stop {ct}", 77, "refused: pct stop is not allowed"),
    ("sudo -n {w} exec {ct} --keep-env 0 -- true", 77, "refused: exec must be: exec {ct} -- COMMAND"),
    ("sudo -n {w} push {ct} /etc/shadow /root/shadow", 77, "refused: pct push is not allowed"),
    ("sudo -n {w} pull {ct} /etc/shadow /tmp/shadow", 77, "refused: pct pull is not allowed"),
    ("sudo -n /usr/sbin/pct status {ct}", 1, "sudo: a password is required"),
    ("sudo -n {w} status {ct}", 0, ""),
])
def test_the_operator_over_ssh(lab, field, remote, rc, said):
    op = lab.facts["operator"]
    argv = ["ssh", "-p", str(lab.port), "-i", lab.key, "-o", "StrictHostKeyChecking=yes",
            "-o", "UserKnownHostsFile=" + lab.facts["known_hosts"], "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
            "%s@%s" % (op["ssh_user"], lab.host), remote.format(w=op["pct_path"], ct=CT, other=OTHER)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == rc, (res.returncode, res.stderr)
    assert said.format(ct=CT, other=OTHER) in res.stderr
    if rc == 0:
        assert res.stdout == "status: running\n"
    assert lab.pct("status", CT).stdout == "status: running\n"


PT = "231"  # GPUs seen as through LXC passthrough: compute-apps shows host PIDs, [Not Found]


@pytest.fixture(scope="module")
def passthrough(lab, field, tmp_path_factory):
    lab_cmd("up", "--fresh", "--ids", PT)
    assert lab.ct(PT, "python3", "-m", "fakegpu", "config", "--passthrough", "host-pids", "--clear-foreign").returncode == 0
    inv = tmp_path_factory.mktemp("pt") / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"pt": {"proxmox_vmid": int(PT)}}, "vars": lab.conn_vars()}}))
    yield str(inv)
    lab.ct(PT, "python3", "-m", "fakegpu", "config", "--passthrough", "off", "--clear-foreign")


def test_proof_and_drain_never_need_the_containers_pids(lab, passthrough):
    # a deploy (the first, or a restart when the container already runs one: reruns), then a restart
    for extra in ({"trainer_force_restart": True}, {"trainer_force_restart": True}):
        res = playbook(passthrough, "deploy.yml", "pt", **extra)
        out = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 0, out[-4000:]
        assert "dflash-trainer ready: release " in out
    main_pid = lab.ct(PT, "systemctl", "show", "-p", "MainPID", "--value", "dflash-trainer").stdout.strip()
    apps = lab.ct(PT, "nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader").stdout.splitlines()
    assert apps and all(row.split(", ")[1] == "[Not Found]" for row in apps)
    pids = {row.split(", ")[0] for row in apps}
    assert main_pid not in pids
    for pid in pids:
        assert lab.ct(PT, "test", "-e", "/proc/%s" % pid).returncode != 0


NEIGHBOUR = "232"  # another tenant on the node's GPUs


def node_smi_apps():
    """The lab node's nvidia-smi (lab/node.py): every holder under its host PID."""
    res = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, check=False)
    return res.stdout.splitlines() if res.returncode == 0 else []


@pytest.fixture
def neighbour(lab, passthrough):
    """Container 232 shares the node's GPUs with 231: its `other-tenant` unit holds 20000 MiB on
    GPU 7 (inside 231 that memory shows in memory.used and in no process of 231's)."""
    lab_cmd("up", "--fresh", "--ids", NEIGHBOUR)
    lab_cmd("node-gpus", "--ids", PT, NEIGHBOUR)
    lab.ct(NEIGHBOUR, "systemctl", "stop", "other-tenant")
    lab.ct(NEIGHBOUR, "systemctl", "reset-failed", "other-tenant")
    assert lab.ct(NEIGHBOUR, "systemd-run", "--unit=other-tenant", "python3", "-m", "fakegpu", "alloc",
                  "--gpu", "7", "--mib", "20000", "--hold").returncode == 0
    assert wait_for(lambda: any(row.endswith(", 20000") for row in node_smi_apps()), timeout=20)
    lab.ct(PT, "python3", "-m", "fakegpu", "config", "--foreign", "7=20000")
    yield
    lab.ct(PT, "systemctl", "stop", "leftover")
    lab.ct(NEIGHBOUR, "systemctl", "stop", "other-tenant")
    lab.ct(PT, "python3", "-m", "fakegpu", "config", "--clear-foreign")
    lab_cmd("node-gpus")


def test_another_tenants_memory_is_not_our_trainers(lab, passthrough, neighbour):
    """With the node's view on, another container's memory on a trainer GPU passes the pre-flight and the
    drain gate, is never counted as the trainer's, and every GPU is named by container and unit."""
    res = playbook(passthrough, "deploy.yml", "pt", trainer_force_restart=True, trainer_drain_timeout_s=10,
                   trainer_gpu_host_view=True)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, out[-4000:]
    assert "dflash-trainer ready: release " in out
    assert "GPU 7: 30000 MiB held by dflash-trainer in CT %s; 20000 MiB by other-tenant in CT %s" % (PT, NEIGHBOUR) \
        in out, out[-4000:]
    assert "GPU 0: 60000 MiB held by dflash-trainer in CT %s" % PT in out
    # read twice on the node: by the pre-flight (the stop reuses it) and after the proof
    assert out.count("TASK [dflash.trainer.trainer : Read the node's view of the GPUs") == 2, out[-4000:]
    # the proof's own figure for GPU 7 is the trainer's 30000, the neighbour's 20000 held before the start
    assert re.search(r"7'*: 30000\}", out) and \
        "(not counted for the trainer: GPU 7 20000 MiB held before the start)" in out, out[-3000:]
    assert lab.ct(NEIGHBOUR, "systemctl", "is-active", "other-tenant").stdout.strip() == "active"


def test_a_holder_in_our_own_container_is_named_before_the_stop(lab, passthrough, neighbour):
    res = playbook(passthrough, "deploy.yml", "pt", trainer_gpu_host_view=True)  # a running, proved trainer
    assert res.returncode == 0, res.stdout[-3000:]
    before = lab.ct(PT, "systemctl", "show", "dflash-trainer", "-p", "MainPID,InvocationID").stdout
    lab.ct(PT, "systemctl", "reset-failed", "leftover")
    assert lab.ct(PT, "systemd-run", "--unit=leftover", "python3", "-m", "fakegpu", "alloc",
                  "--gpu", "6", "--mib", "4000", "--hold").returncode == 0
    assert wait_for(lambda: any(row.endswith(", 4000") for row in node_smi_apps()), timeout=20)
    res = playbook(passthrough, "deploy.yml", "pt", trainer_force_restart=True, trainer_gpu_host_view=True)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode != 0
    assert ("pre-flight refused the release (the running trainer is untouched): memory on the trainer's GPUs that "
            "is not the trainer's, in its own container: GPU 6: 4000 MiB held by leftover in CT %s; the drain gate "
            "would fail after the stop" % PT) in out, out[-3000:]
    assert lab.ct(PT, "systemctl", "show", "dflash-trainer", "-p", "MainPID,InvocationID").stdout == before


def test_another_tenants_memory_never_strands_the_trainer(lab, passthrough):
    """Until item 3 attributes memory to its owner, the drain gate cannot tell another tenant's
    memory from ours: the forced restart fails, but the release that ran is started again and
    proved - never left stopped."""
    lab.ct(PT, "python3", "-m", "fakegpu", "config", "--clear-foreign")
    res = playbook(passthrough, "deploy.yml", "pt")  # a running, proved trainer to begin with
    assert res.returncode == 0, res.stdout[-3000:]
    lab.ct(PT, "python3", "-m", "fakegpu", "config", "--foreign", "7=20000")
    try:
        res = playbook(passthrough, "deploy.yml", "pt", trainer_force_restart=True, trainer_drain_timeout_s=5)
        out = res.stdout + res.stderr
        assert res.returncode != 0
        assert "GPU 7 20000 MiB" in out and "Restored: release" in out and "runs again and is proved ready" in out, \
            out[-3000:]
        state = lab.ct(PT, "systemctl", "show", "dflash-trainer", "-p", "ActiveState", "--value").stdout.strip()
        assert state == "active"
    finally:
        lab.ct(PT, "python3", "-m", "fakegpu", "config", "--clear-foreign")
