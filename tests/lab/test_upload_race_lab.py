"""A long upload keeps the lock, on lab container 238: a release that takes longer to arrive than
the lock's lease (10 s here); the play's lease is renewed while it arrives, so a racing deploy started
past the lease is refused - never interleaved - and the first deploy restarts alone.

How long an upload takes is the machine's business, not the test's: once the release's stream is
flowing, the test stops the process in the container that writes it into the module's fifo
(SIGSTOP), so the upload lasts exactly as long as the test holds it, on any machine, and lets it go
on (SIGCONT) once the racing deploy has been answered."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from labkit import holds, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "238"
LEASE = 10
LOCK = "/run/dflash-trainer.deploy.lock"
FAST = {"trainer_target_hosts": "all", "trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2,
        "trainer_ready_timeout_s": 60, "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}, "trainer_lock_lease_s": LEASE}


@pytest.fixture(scope="module")
def env(lab, tmp_path_factory):
    lab_py = [sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT]
    subprocess.run(lab_py, check=True, stdout=subprocess.DEVNULL)
    base = tmp_path_factory.mktemp("upload")
    src = base / "src"
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), str(src))
    inv = base / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"u": {"proxmox_vmid": int(CT)}},
                                       "vars": dict(lab.conn_vars(), trainer_src=str(src))}}))
    res = play(str(inv), base, "first", {})
    out = res.communicate(timeout=300)[0]
    assert res.returncode == 0, out[-3000:]
    yield str(inv), base, src
    shutil.rmtree(str(src), ignore_errors=True)
    subprocess.run(lab_py, check=False, stdout=subprocess.DEVNULL)  # the big release's space back


def play(inv_path, base, name, extra):
    vars_file = base / ("%s.json" % name)
    vars_file.write_text(json.dumps(dict(FAST, **extra)))
    environ = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.Popen(["ansible-playbook", "-i", inv_path, "deploy.yml", "-e", "@%s" % vars_file],
                            cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


# In the container: the pid of the `cat` that writes a release stream into the module's fifo (the
# pct connection's put_stream), once the module unpacking it has made its temporary release
# directory; nothing while either is missing.
WRITER_SCRIPT = r"""
ls -d /opt/dflash-trainer/releases/.tmp-* >/dev/null 2>&1 || exit 1
for p in $(pgrep -x cat); do
    case "$(readlink /proc/$p/fd/1)" in *release-*.tar*) echo "$p"; exit 0;; esac
done
exit 1
"""


def stream_writer(lab):
    out = lab.ct(CT, "sh", "-c", WRITER_SCRIPT)
    return out.stdout.strip() if out.returncode == 0 else None


def main_pid(lab):
    return lab.ct(CT, "systemctl", "show", "-p", "MainPID", "--value", "dflash-trainer").stdout.strip()


def test_a_racing_deploy_during_a_long_upload_is_refused(lab, env):
    inv_path, base, src = env
    with open(str(src / "weights.bin"), "wb") as fh:  # incompressible: it goes over as it is
        block = os.urandom(1024 * 1024)
        for _block in range(1024):
            fh.write(block)
    pid_before = main_pid(lab)
    a = play(inv_path, base, "big", {})
    # A holds the lock and its release is arriving (the module unpacks into releases/.tmp-*)
    writer = wait_for(lambda: stream_writer(lab), timeout=120, interval=0.02)
    assert writer, "the release's stream into the container never began"
    assert lab.ct(CT, "kill", "-STOP", writer).returncode == 0
    try:
        # the upload is held: past the lease the play took, only its renewals keep the lock (there throughout)
        held = holds(lambda: lab.ct(CT, "test", "-e", LOCK).returncode == 0, LEASE + 1, interval=0.5)
        still_uploading = lab.ct(CT, "sh", "-c", "ls -d /opt/dflash-trainer/releases/.tmp-*").returncode == 0
        b = play(inv_path, base, "racer", {"trainer_force_restart": True})
        out_b = b.communicate(timeout=300)[0]
    finally:
        lab.ct(CT, "kill", "-CONT", writer)
    out_a = a.communicate(timeout=600)[0]
    assert held, "A's lock went while its release's stream was held"
    assert still_uploading, "release A's unpacking was not under way while its stream was held"
    assert b.returncode != 0 and "another deploy holds" in out_b, out_b[-3000:]
    assert a.returncode == 0 and "ready: release" in out_a, out_a[-3000:]
    assert main_pid(lab) != pid_before
    assert lab.ct(CT, "test", "-e", LOCK).returncode == 1  # A's job released it; B never took it
