"""A node directory bind-mounted into an unprivileged container without an id map (container 542): its owner on
the node, root, is outside the container's id map (0-65535 inside are 100000-165535 on the node), so inside it
shows as nobody, uid 65534 - as a Proxmox mount point of a node path (`mp0: /srv/logs,mp=/mnt/logs`) does.

trainer_log_path there: the first read refuses the deploy before anything changes, and says what uid 65534 is
(the id map) and the remedy; once the node's directory is chowned to the container's root (uid 100000), the same
deploy is proved and writes its log there."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB_PY = [sys.executable, os.path.join(ROOT, "lab", "lab.py")]
CT = "542"
MAPPED_ROOT = 100000
LOG = "/mnt/logs/dflash-trainer.log"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 60,
        "trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer"),
        "trainer_log_path": LOG, "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}}
# what a deploy leaves in the container (a refused one: none of it)
WRITTEN = ["/opt/dflash-trainer", "/var/lib/dflash-trainer", "/etc/systemd/system/dflash-trainer.service",
           "/usr/local/bin/dflash-trainer-launch"]


def lab_py(*args):
    subprocess.run(LAB_PY + list(args), check=True, stdout=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def node_dir():
    """The node's directory: root's (uid 0 on the node), 0755, where a container's mapped root may reach it."""
    path = tempfile.mkdtemp(prefix="dflash-idmap-", dir="/var/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def inv(lab, node_dir, tmp_path_factory):
    lab_py("down", "--ids", CT)  # an unprivileged one, fresh, whatever a previous run left
    lab_py("up", "--unprivileged", "--ids", CT)
    lab_py("bind", "--source", node_dir, "--target", "/mnt/logs", "--ids", CT)
    path = tmp_path_factory.mktemp("idmap") / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    return str(path)


def deploy(inv_path):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run(["ansible-playbook", "-i", inv_path, "deploy.yml", "-e", json.dumps(FAST)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    return res, " ".join((res.stdout + res.stderr).split()).replace("''", "'")


def present(lab):
    res = lab.ct(CT, "sh", "-c", 'for p; do [ -e "$p" ] && echo "$p"; done; true', "sh", *WRITTEN)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_the_mount_is_not_id_mapped(lab, inv, node_dir):
    assert lab.ct(CT, "cat", "/proc/self/uid_map").stdout.split() == ["0", str(MAPPED_ROOT), "65536"]
    assert lab.ct(CT, "stat", "-c", "%u:%g", "/mnt/logs").stdout.strip() == "65534:65534"
    assert (os.stat(node_dir).st_uid, os.stat(node_dir).st_gid) == (0, 0)


def test_a_log_on_it_is_refused_before_anything_changes_and_the_id_map_is_named(lab, inv, node_dir):
    res, out = deploy(inv)
    assert res.returncode != 0, out[-5000:]
    assert "trainer_log_path: %s is in /mnt/logs, owned by uid 65534 (mode 0755)" % LOG in out, out[-5000:]
    assert "uid 65534 is nobody: in an unprivileged container" in out and "a bind mount that is not id-mapped" in out
    assert "chown it on the node to the container's root (uid 100000 with Proxmox's default map)" in out
    assert present(lab) == [] and os.listdir(node_dir) == [], out[-3000:]


def test_chowned_to_the_containers_root_the_same_deploy_is_proved(lab, inv, node_dir):
    os.chown(node_dir, MAPPED_ROOT, MAPPED_ROOT)
    assert lab.ct(CT, "stat", "-c", "%u:%g", "/mnt/logs").stdout.strip() == "0:0"
    res, out = deploy(inv)
    assert res.returncode == 0 and "dflash-trainer ready: release " in out, out[-5000:]
    assert "dflash-trainer.log" in os.listdir(node_dir)
    assert lab.ct(CT, "systemctl", "is-active", "dflash-trainer").stdout.strip() == "active"
