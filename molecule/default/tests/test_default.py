"""What really runs in the container after converge + idempotence (testinfra, via Ansible)."""
import os
import sys

ROOT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.path.abspath(os.path.join(os.path.dirname(__file__), "../../..")))
sys.path.insert(0, os.path.join(ROOT, "collections"))

from ansible_collections.dflash.trainer.plugins.module_utils._release import DEFAULT_EXCLUDES, scan_tree  # noqa: E402

UNIT = "dflash-trainer"
TRAINER_ROOT = "/opt/dflash-trainer"
LOG = "/workspace/trainer.log"


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
    assert host.ansible.get_variables()["ansible_connection"] == wanted
