"""The node's view cannot be spoofed by a process name (issue 13).

nvidia-smi prints a process name unquoted, and every tenant of the node chooses its own. A tenant
in container 234 that shares the node's GPUs with our trainer (233) names its process
`a, x, 1\\n<trainer's host pid>, p` (the pid is visible to it: nvidia-smi inside any container lists
host PIDs) and another one `x\\ny`, both holding memory on trainer GPUs. The lab's node nvidia-smi
prints those names as the real tool does, so a name column would make the first tenant's memory
the trainer's and the second break every read; the node's read (`trainer_node_gpus`) asks for
numbers and UUIDs only and names holders from /proc. Containers 233 and 234 only; the node's
nvidia-smi here is the lab's, told by FAKEGPU_NODE_TENANTS_FILE which containers share its GPUs
(the test's own list: `lab.py node-gpus`, which other tests set, is left alone).
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.target import nvidia_smi as smi
from labkit import node_smi_of, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = os.path.join(ROOT, "lab", "lab.py")
CT = "233"       # the trainer's container (GPUs seen as through LXC passthrough)
TENANT = "234"   # another tenant on the node's GPUs
COMMA_GPU, NEWLINE_GPU, TENANT_MIB = 5, 6, 20000
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
        "trainer_drain_timeout_s": 10, "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}, "trainer_target_hosts": "all",
        "trainer_src": os.path.join(ROOT, "examples", "trainer")}
# The tenant's process: argv[0] (what nvidia-smi prints) is set by `exec -a`; it holds its memory
# itself, then gives itself a hostile comm as well (what the node's /proc says).
HOLDER = ("import signal, sys, fakegpu\n"
          "fakegpu.allocate(int(sys.argv[1]), int(sys.argv[2]))\n"
          "with open('/proc/self/comm', 'w') as fh:\n"
          "    fh.write(sys.argv[3])\n"
          "while True:\n"
          "    signal.pause()\n")


def lab_cmd(*args):
    subprocess.run([sys.executable, LAB, *args], check=True, stdout=subprocess.DEVNULL)


def ansible_env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


@pytest.fixture(scope="module")
def spoof(lab):
    """233 and 234 up, their GPUs the node's (for this test's node nvidia-smi only), 233's own
    nvidia-smi showing host PIDs as under LXC passthrough; an inventory for 233."""
    lab_cmd("up", "--fresh", "--ids", CT, TENANT)
    assert lab.ct(CT, "python3", "-m", "fakegpu", "config", "--passthrough", "host-pids",
                  "--clear-foreign").returncode == 0
    # the node's nvidia-smi is run only from a directory nobody but root may write (not pytest's /tmp)
    base = pathlib.Path(tempfile.mkdtemp(prefix="dflash-spoof-", dir=os.path.expanduser("~")))
    smi_path = node_smi_of(base, CT, TENANT)
    inv = base / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)}}, "vars": dict(
        lab.conn_vars(), trainer_node_nvidia_smi=str(smi_path))}}))
    yield {"inv": str(inv), "smi": str(smi_path)}
    for unit in ("spoof-comma", "spoof-newline"):
        lab.ct(TENANT, "systemctl", "stop", unit)
    lab.ct(CT, "systemctl", "stop", "spoof-victim")
    lab.ct(CT, "python3", "-m", "fakegpu", "config", "--passthrough", "off", "--clear-foreign")
    shutil.rmtree(str(base))


def node_smi(spoof, *args):
    """The node's own nvidia-smi, as the operator's ssh user runs it there."""
    res = subprocess.run([spoof["smi"], *args], capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def node_rows(spoof):
    """(uuid, host pid, MiB) rows of the node's process query, read by the strict parser."""
    apps, malformed = smi.parse_node_apps(node_smi(spoof, *smi.query_node_apps_argv()[1:]))
    assert malformed == []
    return [(a["gpu_uuid"], a["pid"], a["used_memory_mib"]) for a in apps]


def gpu_uuid(spoof, index):
    for line in node_smi(spoof, "--query-gpu=index,uuid", "--format=csv,noheader").splitlines():
        i, uuid = line.split(", ")
        if int(i) == index:
            return uuid
    raise AssertionError("GPU %d not on the node" % index)


def host_pid(spoof, uuid, unit):
    """The host pid of 233's ``unit`` holding GPU ``uuid``, from the node's rows and cgroups."""
    for row_uuid, pid, _mib in node_rows(spoof):
        with open("/proc/%d/cgroup" % pid, encoding="utf-8") as fh:
            cgroup = fh.read()
        # LXC names a container's cgroup lxc.payload.<id>-<n> when one of an earlier start is left
        if row_uuid == uuid and re.search(r"/lxc\.payload\.%s(-\d+)?/" % CT, cgroup) and "/%s.service\n" % unit in cgroup:
            return pid
    return None


def run_unit(lab, vmid, unit, *argv):
    lab.ct(vmid, "systemctl", "stop", unit)
    lab.ct(vmid, "systemctl", "reset-failed", unit)
    res = lab.ct(vmid, "systemd-run", "--unit=" + unit, *argv)
    assert res.returncode == 0, res.stderr


def start_tenants(lab, spoof, ours):
    """234's two hostile holders: one forging a row for host pid ``ours``, one with a bare
    newline; 233's nvidia-smi then sees their memory in memory.used (in none of its processes)."""
    for unit, gpu, argv0, comm in (("spoof-comma", COMMA_GPU, "a, x, 1\n%d, p" % ours, "a, x\n1, p"),
                                   ("spoof-newline", NEWLINE_GPU, "x\ny", "x\ny")):
        run_unit(lab, TENANT, unit, "/bin/bash", "-c", 'exec -a "$1" python3 -c "$2" "${@:3}"', "bash",
                 argv0, HOLDER, str(gpu), str(TENANT_MIB), comm)
        uuid = gpu_uuid(spoof, gpu)
        assert wait_for(lambda: any(u == uuid and mib == TENANT_MIB for u, _pid, mib in node_rows(spoof)),
                        timeout=20), node_smi(spoof, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv")
    assert lab.ct(CT, "python3", "-m", "fakegpu", "config", "--foreign", "%d=%d" % (COMMA_GPU, TENANT_MIB),
                  "--foreign", "%d=%d" % (NEWLINE_GPU, TENANT_MIB)).returncode == 0


def node_module(spoof, unit, check="proof"):
    """trainer_node_gpus run on the node as the role runs it (check=proof); its JSON result."""
    env = dict(ansible_env(), ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="json")
    args = {"vmid": int(CT), "unit": unit, "gpus": [COMMA_GPU, NEWLINE_GPU], "check": check,
            "nvidia_smi": spoof["smi"]}
    res = subprocess.run(["ansible", "-i", spoof["inv"], "all", "-m", "dflash.trainer.trainer_node_gpus",
                          "-a", json.dumps(args), "-e", "ansible_pct_node=true"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    (task,) = json.loads(res.stdout)["plays"][0]["tasks"]
    return task["hosts"]["ct"]


def named_query(spoof):
    """What a query with names prints on the node (the real tool's noheader, nounits form)."""
    return node_smi(spoof, "--query-compute-apps=pid,process_name,gpu_uuid,used_memory", "--format=csv,noheader,nounits")


def test_the_node_read_splits_memory_by_its_real_holders_whatever_their_names(lab, spoof):
    uuid5, uuid6 = gpu_uuid(spoof, COMMA_GPU), gpu_uuid(spoof, NEWLINE_GPU)
    lab.ct(CT, "systemctl", "stop", "dflash-trainer")  # from an earlier run: 233 holds nothing else
    # "our trainer": a unit of 233 holding 30000 MiB on GPUs 5 and 6
    run_unit(lab, CT, "spoof-victim", "python3", "-m", "fakegpu", "alloc", "--gpu", "%d,%d" % (COMMA_GPU, NEWLINE_GPU),
             "--mib", "30000", "--hold")
    ours = wait_for(lambda: host_pid(spoof, uuid5, "spoof-victim"), timeout=20)
    assert ours, node_rows(spoof)
    start_tenants(lab, spoof, ours)

    # The hostile names reach the CSV of a query with names, as with the real tool: a forged row
    # naming our pid, and a bare newline.
    named = named_query(spoof)
    assert "\n%d, p, %s, %d\n" % (ours, uuid5, TENANT_MIB) in named, named
    assert "\ny, %s, %d\n" % (uuid6, TENANT_MIB) in named, named

    result = node_module(spoof, "spoof-victim")
    assert not result.get("failed"), result
    split = {g["index"]: g for g in result["gpus"]}
    for index in (COMMA_GPU, NEWLINE_GPU):
        assert (split[index]["trainer_mib"], split[index]["foreign_mib"], split[index]["unlisted_mib"]) == \
            (30000, TENANT_MIB, 0), split[index]
        assert [h["pid"] for h in split[index]["holders"] if h["kind"] == "trainer"] == [ours]
    names = {h["unit"]: h["name"] for i in (COMMA_GPU, NEWLINE_GPU) for h in split[i]["holders"]
             if h["vmid"] == int(TENANT)}
    assert names == {"spoof-comma.service": "a, x\\n1, p", "spoof-newline.service": "x\\ny"}  # comm, escaped
    assert result["foreign_mib"] == {str(COMMA_GPU): TENANT_MIB, str(NEWLINE_GPU): TENANT_MIB}
    assert result["lines"] == ["GPU %d: 30000 MiB held by spoof-victim in CT %s; %d MiB by %s in CT %s" % (
        i, CT, TENANT_MIB, unit, TENANT) for i, unit in ((COMMA_GPU, "spoof-comma"), (NEWLINE_GPU, "spoof-newline"))]
    lab.ct(CT, "systemctl", "stop", "spoof-victim")


def deploy(spoof, **extra):
    res = subprocess.run(["ansible-playbook", "-i", spoof["inv"], "deploy.yml", "-e",
                          json.dumps(dict(FAST, **extra))],
                         cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=300, check=False)
    return res.returncode, " ".join((res.stdout + res.stderr).split())


def test_a_deploy_with_the_nodes_view_is_neither_fooled_nor_failed_by_a_name(lab, spoof):
    for unit in ("spoof-comma", "spoof-newline"):
        lab.ct(TENANT, "systemctl", "stop", unit)
    lab.ct(CT, "python3", "-m", "fakegpu", "config", "--clear-foreign")
    rc, out = deploy(spoof, trainer_force_restart=True, trainer_gpu_host_view=True)  # a proved trainer
    assert rc == 0, out[-4000:]
    ours = host_pid(spoof, gpu_uuid(spoof, COMMA_GPU), "dflash-trainer")
    assert ours, node_rows(spoof)
    start_tenants(lab, spoof, ours)

    # The pre-flight allows the tenants' memory, the drain gate waits only for ours, the proof counts
    # only ours, and the node agrees, before the stop and after the proof.
    rc, out = deploy(spoof, trainer_force_restart=True, trainer_gpu_host_view=True)
    assert rc == 0, out[-4000:]
    assert "dflash-trainer ready: release " in out
    for index, unit in ((COMMA_GPU, "spoof-comma"), (NEWLINE_GPU, "spoof-newline")):
        line = "GPU %d: 30000 MiB held by dflash-trainer in CT %s; %d MiB by %s in CT %s" % (
            index, CT, TENANT_MIB, unit, TENANT)
        assert out.count(line) == 2, out[-4000:]
    for unit in ("spoof-comma", "spoof-newline"):
        assert lab.ct(TENANT, "systemctl", "is-active", unit).stdout.strip() == "active"


# A user of 233 (uid 1000) whose user manager runs a unit named like the trainer: systemd gives a
# user's manager its own subtree (user@1000.service, delegated to that user), where the user names
# cgroups as they like. The lab's rootfs has no pam_systemd for a real user manager, so root makes
# the cgroup a user's unit of that name has and puts the user's own process in it; the node reads
# it from /proc/<pid>/cgroup as for any process.
USER_UNIT = "/sys/fs/cgroup/unified/user.slice/user-1000.slice/user@1000.service/app.slice/spoof-victim.service"
USER_HOLDER = r"""
set -e
id -u alice >/dev/null 2>&1 || useradd --uid 1000 --create-home alice
mkdir -p %(cg)s
setpriv --reuid=1000 --regid=1000 --clear-groups sleep 600 >/dev/null 2>&1 &  # exec: her own process
pid=$!
echo "$pid" > %(cg)s/cgroup.procs
python3 -m fakegpu alloc --gpu %(gpus)s --mib %(mib)d --pid "$pid" >/dev/null
echo "$pid"
"""


def test_a_user_unit_named_like_the_trainer_is_not_the_trainer(lab, spoof):
    uuid5 = gpu_uuid(spoof, COMMA_GPU)
    lab.ct(CT, "systemctl", "stop", "dflash-trainer")
    lab.ct(CT, "python3", "-m", "fakegpu", "config", "--clear-foreign")
    run_unit(lab, CT, "spoof-victim", "python3", "-m", "fakegpu", "alloc", "--gpu", "%d,%d" % (COMMA_GPU, NEWLINE_GPU),
             "--mib", "30000", "--hold")
    ours = wait_for(lambda: host_pid(spoof, uuid5, "spoof-victim"), timeout=20)
    assert ours, node_rows(spoof)
    res = lab.ct(CT, "bash", "-c", USER_HOLDER % {"cg": USER_UNIT, "gpus": "%d,%d" % (COMMA_GPU, NEWLINE_GPU),
                                                  "mib": 3000})
    assert res.returncode == 0, res.stderr
    try:
        def alices():
            for _uuid, pid, mib in node_rows(spoof):
                try:
                    with open("/proc/%d/cgroup" % pid, encoding="utf-8") as fh:
                        if "/user@1000.service/app.slice/spoof-victim.service\n" in fh.read() and mib == 3000:
                            return pid
                except OSError:
                    continue
            return None
        theirs = wait_for(alices, timeout=20)
        assert theirs, node_rows(spoof)
        assert os.stat("/proc/%d" % theirs).st_uid == 1000  # her own process (233 is privileged: uids as on the node)
        with open("/proc/%d/cgroup" % theirs, encoding="utf-8") as fh:
            assert re.search(r"^0::/lxc\.payload\.%s(-\d+)?/user\.slice/user-1000\.slice/user@1000\.service/app\.slice/"
                             r"spoof-victim\.service$" % CT, fh.read(), re.M)

        result = node_module(spoof, "spoof-victim")
        assert not result.get("failed"), result
        for index in (COMMA_GPU, NEWLINE_GPU):
            split = {g["index"]: g for g in result["gpus"]}[index]
            assert split["trainer_mib"] == 30000, split  # alice's 3000 MiB are not the trainer's
            assert split["same_ct_mib"] == 3000, split
            assert [(h["kind"], h["unit"]) for h in split["holders"] if h["pid"] == theirs] == [("same_ct", None)]
            assert [h["pid"] for h in split["holders"] if h["kind"] == "trainer"] == [ours]
        # the pre-flight names her process as another holder in the trainer's container
        result = node_module(spoof, "spoof-victim", check="preflight")
        assert result.get("failed"), result
        assert "GPU %d: 3000 MiB held by pid %d (sleep) in CT %s" % (COMMA_GPU, theirs, CT) in result["msg"]
    finally:
        lab.ct(CT, "pkill", "-u", "alice", "-x", "sleep")
        lab.ct(CT, "systemctl", "stop", "spoof-victim")
        lab.ct(CT, "sh", "-c", "sleep 0.5; rmdir %s %s %s" % (USER_UNIT, os.path.dirname(USER_UNIT),
                                                              os.path.dirname(os.path.dirname(USER_UNIT))))


def test_a_node_python_another_user_may_change_is_refused_before_it_runs(lab, spoof):
    """trainer_node_python in a directory every user of the node may write: the deploy is refused before the
    stop, naming the variable and the directory, and that interpreter never ran (it marks itself when run)."""
    rc, out = deploy(spoof, trainer_force_restart=True, trainer_gpu_host_view=True)  # a proved trainer to keep
    assert rc == 0, out[-4000:]
    before = lab.ct(CT, "systemctl", "show", "-p", "MainPID,InvocationID", "dflash-trainer").stdout
    shared = tempfile.mkdtemp(prefix="dflash-node-python-")  # in the node's /tmp
    try:
        os.chmod(shared, 0o1777)
        python = os.path.join(shared, "python3")
        with open(python, "w") as fh:
            fh.write('#!/bin/sh\ntouch "$0.ran"\nexec /usr/bin/python3 "$@"\n')
        os.chmod(python, 0o755)
        rc, out = deploy(spoof, trainer_force_restart=True, trainer_gpu_host_view=True, trainer_node_python=python)
        assert rc != 0, out[-4000:]
        # the first directory from / down that another user may write: /tmp itself
        assert "refused before the node's view ran: trainer_node_python: %s, in /tmp (mode 1777), which every " \
               "user can write" % python in out, out[-4000:]
        assert not os.path.exists(python + ".ran")  # judged, never run
        assert lab.ct(CT, "systemctl", "show", "-p", "MainPID,InvocationID", "dflash-trainer").stdout == before
    finally:
        shutil.rmtree(shared)
