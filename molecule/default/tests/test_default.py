"""What really runs in the container after converge + idempotence (testinfra, via Ansible)."""
import os
import subprocess
import sys

ROOT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.path.abspath(os.path.join(os.path.dirname(__file__), "../../..")))
sys.path.insert(0, os.path.join(ROOT, "collections"))

from ansible_collections.dflash.trainer.plugins.module_utils.target.marks import MARKER_NAME  # noqa: E402
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import (  # noqa: E402
    DEFAULT_EXCLUDES, KIND_FILE, scan_tree)

UNIT = "dflash-trainer"
TRAINER_ROOT = "/opt/dflash-trainer"
LOG = "/workspace/trainer.log"
# The platform is unprivileged (molecule.yml): root inside is this uid/gid on the lab host.
MAPPED_ROOT = 100000


def show(host, *props):
    out = host.check_output("systemctl show %s %s" % (UNIT, " ".join("-p " + p for p in props)))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_unit_active_and_running(host):
    svc = host.service(UNIT)
    assert svc.is_running
    assert svc.is_enabled  # trainer_unit_enabled: starts again when the container boots
    props = show(host, "ActiveState", "SubState", "NRestarts", "NeedDaemonReload")
    assert props == {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "NeedDaemonReload": "no"}


def test_trainer_survived_the_ansible_sessions_and_started_once(host):
    """Converge + idempotence ran two Ansible sessions; exactly one start marker means no restart."""
    markers = host.check_output("grep -c '^==> dflash.trainer start ' %s" % LOG)
    assert markers.strip() == "1"
    main_pid = show(host, "MainPID")["MainPID"]
    assert main_pid != "0"
    assert host.process.get(pid=int(main_pid)).ppid == 1  # owned by systemd, not by a session


def test_every_gpu_holds_memory(host):
    out = host.check_output("nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits")
    used = {int(i): int(m) for i, m in (line.split(", ") for line in out.splitlines())}
    assert sorted(used) == list(range(8))
    assert all(mib >= 1024 for mib in used.values()), used


def test_current_is_the_deployed_release(host):
    expected = scan_tree(os.path.join(ROOT, "examples/trainer"), DEFAULT_EXCLUDES).release_id
    target = host.file(TRAINER_ROOT + "/current").linked_to
    assert os.path.basename(target) == expected
    assert host.file(target + "/run.sh").mode & 0o111  # run.sh stayed executable


def test_running_process_runs_current(host):
    """The trainer process (the launcher's child) was started from, and runs in, current."""
    main_pid = show(host, "MainPID")["MainPID"]
    trainer_pid = host.check_output("pgrep -P %s" % main_pid).split()[0]
    environ = host.check_output("tr '\\0' '\\n' < /proc/%s/environ" % trainer_pid)
    running = dict(line.split("=", 1) for line in environ.splitlines() if "=" in line)["DFLASH_RELEASE"]
    current = os.path.basename(host.file(TRAINER_ROOT + "/current").linked_to)
    assert running == current
    assert host.check_output("readlink /proc/%s/cwd" % trainer_pid) == TRAINER_ROOT + "/releases/" + current
    assert host.file(TRAINER_ROOT + "/last_good").content_string.strip() == current


def test_environment_file_is_private(host):
    env = host.file("/etc/dflash-trainer/trainer.env")
    assert env.mode == 0o600
    assert env.user == "root"


def test_connection_is_the_one_requested(host):
    """The scenario runs over dflash.trainer.pct, or over proxmox_pct_remote when asked."""
    wanted = os.environ.get("DFLASH_CONNECTION") or "dflash.trainer.pct"
    hostvars = host.ansible.get_variables()
    assert hostvars["ansible_connection"] == wanted
    if wanted == "dflash.trainer.pct":  # the lab's non-root operator, through the sudo pct wrapper
        user = host.ansible("debug", "var=ansible_user", check=False)["ansible_user"]  # templated
        assert (user, hostvars["pct_sudo"], hostvars["pct_path"]) == ("dflash", True, "/usr/local/sbin/dflash-pct-wrapper")


# --- the unprivileged container: what the lab host (this machine, the controller) sees -------

def init_pid(host):
    """Host PID of the container's init, from LXC on the lab host."""
    vmid = str(host.ansible.get_variables()["proxmox_vmid"])
    out = subprocess.run(["lxc-info", "-n", vmid, "-p", "-H"], capture_output=True, text=True, check=True).stdout
    return int(out)


def test_container_is_unprivileged(host):
    assert host.file("/proc/self/uid_map").content_string.split() == ["0", str(MAPPED_ROOT), "65536"]
    assert host.file("/proc/self/gid_map").content_string.split() == ["0", str(MAPPED_ROOT), "65536"]
    st = os.stat("/proc/%d" % init_pid(host))
    assert (st.st_uid, st.st_gid) == (MAPPED_ROOT, MAPPED_ROOT)  # systemd, root inside


def test_release_bytes_modes_and_owners(host):
    """Every file of examples/trainer is in current with its sha256 and mode, owned by root
    inside and, on the lab host, by the mapped root."""
    want = {e.relpath: ("%o" % e.mode, e.payload)
            for e in scan_tree(os.path.join(ROOT, "examples/trainer"), DEFAULT_EXCLUDES).entries if e.kind == KIND_FILE}
    current = host.file(TRAINER_ROOT + "/current").linked_to
    stats = host.check_output("cd %s && find . -type f -printf '%%m %%u:%%g %%P\\n'", current)
    sums = host.check_output("cd %s && find . -type f -print0 | xargs -0r sha256sum", current)
    digest = {path[2:]: h for h, path in (line.split(None, 1) for line in sums.splitlines())}
    have = {}
    for line in stats.splitlines():
        mode, owner, path = line.split(" ", 2)
        assert owner == "root:root", line
        have[path] = (mode, digest[path])
    assert {p: v for p, v in have.items() if p != MARKER_NAME} == want
    host_root = "/proc/%d/root" % init_pid(host)
    for path in sorted(have) + [""]:
        st = os.lstat(os.path.join(host_root + current, path))
        assert (st.st_uid, st.st_gid) == (MAPPED_ROOT, MAPPED_ROOT), (path, st.st_uid, st.st_gid)


def test_trainer_runs_as_the_mapped_root_on_the_lab_host(host):
    main_pid = show(host, "MainPID")["MainPID"]
    trainer_pid = host.check_output("pgrep -P %s" % main_pid).split()[0]
    ns = os.readlink("/proc/%d/ns/pid" % init_pid(host))
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.readlink("/proc/%s/ns/pid" % pid) != ns:
                continue
            with open("/proc/%s/status" % pid) as fh:
                status = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        if status["NSpid"].split()[-1] == trainer_pid:
            found.append((int(pid), status["Uid"].split(), status["Gid"].split()))
    assert len(found) == 1, found
    _pid, uids, gids = found[0]
    assert set(uids) == {str(MAPPED_ROOT)} and set(gids) == {str(MAPPED_ROOT)}, found
