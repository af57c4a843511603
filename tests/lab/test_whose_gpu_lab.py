"""Whose GPU memory, on a real container (473): the proof counts only the memory the trainer unit's own
processes hold (nvidia-smi's processes, by control group). A trainer that holds GPUs 0-4 of trainer_gpus
[0..7] is not proved because a stranger process (another unit of the container) allocated on 5-7 after the
start: the proof fails naming 5-7. The stranger's allocation is made while the new trainer is held stopped
(SIGSTOP) right after its start, so the order never depends on the machine's speed."""
import json
import os
import subprocess
import sys

import pytest

from labkit import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "473"
UNIT = "dflash-trainer"


@pytest.fixture(scope="module")
def play(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    base = tmp_path_factory.mktemp("whose")
    inv = base / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"w": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))

    def start(**changes):
        extra = {"trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer"),
                 "trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 60,
                 "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}}
        extra.update(changes)
        (base / "extra.json").write_text(json.dumps(extra))
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        return subprocess.Popen(["ansible-playbook", "-i", str(inv), "deploy.yml", "-l", "w", "-e",
                                 "@%s" % (base / "extra.json")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    yield start
    lab.ct(CT, "systemctl", "stop", "stranger")


def show(lab):
    out = lab.ct(CT, "systemctl", "show", UNIT, "-p", "MainPID", "-p", "InvocationID", "-p", "ActiveState").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_a_trainer_proved_by_its_own_processes_says_so(lab, play):
    proc = play()
    out = " ".join(proc.communicate(timeout=600)[0].split())
    assert proc.returncode == 0, out[-4000:]
    assert "GPU memory counted: memory held by the processes of /system.slice/%s.service" % UNIT in out, out[-3000:]


def test_a_strangers_memory_after_the_start_never_proves_the_trainer(lab, play):
    before = show(lab)
    proc = play(trainer_force_restart=True, trainer_env={"FAKE_TRAINER_STARTUP_S": "0.3",
                                                         "FAKE_TRAINER_FAULT": "partial_alloc"})
    try:
        # the new start: hold every process of the unit, then let a stranger allocate on GPUs 5-7
        def new_start():
            s = show(lab)
            return s if s.get("InvocationID") not in ("", before["InvocationID"]) and s.get("MainPID") not in (
                "0", None) else None
        started = wait_for(new_start, timeout=300)
        assert started, show(lab)
        assert lab.ct(CT, "systemctl", "kill", "--signal=SIGSTOP", UNIT).returncode == 0
        lab.ct(CT, "systemctl", "reset-failed", "stranger")
        assert lab.ct(CT, "systemd-run", "--unit=stranger", "python3", "-m", "fakegpu", "alloc", "--gpu", "5,6,7",
                      "--mib", "30000", "--hold").returncode == 0

        def strangers_rows():
            rows = lab.ct(CT, "nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader").stdout
            return [r for r in rows.splitlines() if r.endswith(", 30000 MiB")]
        assert wait_for(lambda: len(strangers_rows()) >= 3, timeout=60)
        assert lab.ct(CT, "systemctl", "kill", "--signal=SIGCONT", UNIT).returncode == 0
        # once the failed start is stopped (rollback), the stranger goes: the drain may then bring the last good back
        assert wait_for(lambda: show(lab).get("MainPID") != started["MainPID"], timeout=300)
        lab.ct(CT, "systemctl", "stop", "stranger")
        out = " ".join(proc.communicate(timeout=600)[0].split())
    finally:
        if proc.poll() is None:
            proc.kill()
        lab.ct(CT, "systemctl", "kill", "--signal=SIGCONT", UNIT)
        lab.ct(CT, "systemctl", "stop", "stranger")
    assert proc.returncode != 0, out[-4000:]
    assert "GPU 5 holds 0 MiB, GPU 6 holds 0 MiB, GPU 7 holds 0 MiB" in out, out[-4000:]
    assert "counted as the trainer's: memory held by the processes of /system.slice/%s.service" % UNIT in out
