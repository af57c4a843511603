"""An unprivileged lab container (251), as Proxmox creates them by default: uid/gid 0-65535
inside are 100000-165535 on the host. It really is one, keeps its kind across a plain `up`,
pct push/pull/exec work in it, and a deploy of examples/trainer is proved ready there."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = os.path.join(ROOT, "lab", "lab.py")
CT = "251"
MAPPED_ROOT = 100000
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}, "trainer_target_hosts": "all",
        "trainer_src": os.path.join(ROOT, "examples", "trainer")}


def lab_cmd(*args):
    return subprocess.run([sys.executable, LAB, *args], capture_output=True, text=True, timeout=300, check=False)


def init_pid(vmid):
    return int(subprocess.run(["lxc-info", "-n", vmid, "-p", "-H"], capture_output=True, text=True, check=True).stdout)


def status_line(vmid):
    return [line.split() for line in lab_cmd("status").stdout.splitlines() if line.split()[:1] == [vmid]]


@pytest.fixture(scope="module")
def unpriv(lab):
    res = lab_cmd("down", "--ids", CT)  # fresh: a first deploy, whatever a previous run left
    assert res.returncode == 0, res.stderr
    res = lab_cmd("up", "--unprivileged", "--ids", CT)
    assert res.returncode == 0, res.stdout + res.stderr
    return CT


def test_the_container_is_unprivileged(lab, unpriv):
    assert lab.ct(unpriv, "cat", "/proc/self/uid_map").stdout.split() == ["0", str(MAPPED_ROOT), "65536"]
    assert lab.ct(unpriv, "cat", "/proc/self/gid_map").stdout.split() == ["0", str(MAPPED_ROOT), "65536"]
    pid = init_pid(unpriv)
    for path in ("/proc/%d" % pid, "/proc/%d/root/etc/passwd" % pid):  # systemd; a file of the rootfs
        st = os.stat(path)
        assert (st.st_uid, st.st_gid) == (MAPPED_ROOT, MAPPED_ROOT), path
    st = os.stat("/proc/%d/root/usr/bin/passwd" % pid)  # the shift kept the setuid bit
    assert st.st_uid == MAPPED_ROOT and st.st_mode & 0o4000
    for seeded in ("/etc/hostname", "/usr/bin/nvidia-smi", "/var/lib/fakegpu/config.json",
                   "/usr/lib/python3/dist-packages/fakegpu.py"):
        assert lab.ct(unpriv, "stat", "-c", "%u:%g", seeded).stdout.strip() == "0:0", seeded
    assert lab.ct(unpriv, "systemctl", "is-system-running").stdout.strip() in ("running", "degraded")
    assert status_line(unpriv) == [[unpriv, "running", "unprivileged"]]
    with open(os.path.join(os.environ.get("DFLASH_LAB_STATE", "/var/lib/dflash-lab"), "lab.json")) as fh:
        assert unpriv in json.load(fh)["unprivileged"]


def test_a_container_keeps_its_kind(lab, unpriv):
    """A stopped unprivileged container comes back unprivileged from a plain `up`; `up
    --unprivileged` of a privileged one is refused and leaves it as it was."""
    subprocess.run(["lxc-stop", "-n", unpriv, "-k"], check=True, timeout=60)
    assert status_line(unpriv) == [[unpriv, "stopped", "unprivileged"]]
    res = lab_cmd("up", "--ids", unpriv)
    assert res.returncode == 0, res.stdout + res.stderr
    assert lab.ct(unpriv, "cat", "/proc/self/uid_map").stdout.split() == ["0", str(MAPPED_ROOT), "65536"]
    res = lab_cmd("up", "--unprivileged", "--ids", "200")  # the lab fixture's privileged container
    assert res.returncode != 0 and "container 200 exists and is privileged" in res.stderr, res.stderr
    assert lab.ct("200", "cat", "/proc/self/uid_map").stdout.split() == ["0", "0", "4294967295"]


def test_pct_push_pull_exec(lab, unpriv, tmp_path):
    src = tmp_path / "in.bin"
    src.write_bytes(bytes(range(256)) * 100)
    assert lab.pct("push", unpriv, str(src), "/root/pushed.bin", "--perms", "0640").returncode == 0
    assert lab.ct(unpriv, "stat", "-c", "%u:%g %a %s", "/root/pushed.bin").stdout.split() == ["0:0", "640", "25600"]
    st = os.stat("/proc/%d/root/root/pushed.bin" % init_pid(unpriv))
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (MAPPED_ROOT, MAPPED_ROOT, 0o640)
    assert lab.pct("push", unpriv, str(src), "/tmp/nobody.bin", "--user", "65534", "--group", "65534").returncode == 0
    st = os.stat("/proc/%d/root/tmp/nobody.bin" % init_pid(unpriv))
    assert (st.st_uid, st.st_gid) == (MAPPED_ROOT + 65534, MAPPED_ROOT + 65534)
    out = tmp_path / "out.bin"
    assert lab.pct("pull", unpriv, "/root/pushed.bin", str(out)).returncode == 0
    assert out.read_bytes() == src.read_bytes()
    assert lab.ct(unpriv, "sh", "-c", "exit 7").returncode == 7


def test_a_deploy_is_proved_ready_in_the_unprivileged_container(lab, unpriv, tmp_path):
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(unpriv)}}, "vars": lab.conn_vars()}}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run(["ansible-playbook", "-i", str(inv), "deploy.yml", "-l", "ct", "-e", json.dumps(FAST)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, out[-4000:]
    assert "dflash-trainer ready: release " in out, out[-4000:]
    main_pid = lab.ct(unpriv, "systemctl", "show", "-p", "MainPID", "--value", "dflash-trainer").stdout.strip()
    assert main_pid not in ("", "0")
    ns = os.readlink("/proc/%d/ns/pid" % init_pid(unpriv))
    host_pids = [p for p in os.listdir("/proc") if p.isdigit() and in_ns_as(p, ns) == main_pid]
    assert len(host_pids) == 1, host_pids
    assert os.stat("/proc/%s" % host_pids[0]).st_uid == MAPPED_ROOT  # the launcher: root inside


def in_ns_as(pid, ns):
    """pid's number inside the pid namespace ns, None when it lives in another one (or is gone)."""
    try:
        if os.readlink("/proc/%s/ns/pid" % pid) != ns:
            return None
        with open("/proc/%s/status" % pid) as fh:
            return [line.split()[-1] for line in fh if line.startswith("NSpid:")][0]
    except (OSError, IndexError):
        return None
