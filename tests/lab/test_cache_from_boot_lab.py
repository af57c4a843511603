"""The torchinductor cache belongs to the trainer from boot, on a real container (470) with a container
user (alice, uid 1000): the trainer writes its compiled code only into a root-owned 0700 directory that
systemd makes for the unit (CacheDirectory=) at every start - ours, a Restart= after a crash, a boot -
and alice can make neither that directory nor one above it; a directory she makes at the old default
place (/tmp/torchinductor_root, with a planted kernel) gets nothing of root's; and a cache placed in a
directory every user can write (/tmp) is refused before any change, purge on or off, naming it."""
import json
import os
import subprocess
import sys

import pytest

from labkit import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "470"
CACHE = "/var/cache/dflash-trainer/inductor"
OLD = "/tmp/torchinductor_root"
KEY = "cabm7qpgiyjpkp7if2jwvf7dvibbkcxzvaxvrwcbwndsspltizml"


@pytest.fixture(scope="module")
def deploy(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    assert lab.ct(CT, "sh", "-c", "id -u alice >/dev/null 2>&1 || useradd --uid 1000 --create-home alice").returncode == 0
    base = tmp_path_factory.mktemp("cache")
    inv = base / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"c": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))

    def run(**changes):
        extra = {"trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer"),
                 "trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
                 "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}, "trainer_restart_sec": 1}
        extra.update(changes)
        (base / "extra.json").write_text(json.dumps(extra))
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        return subprocess.run(["ansible-playbook", "-i", str(inv), "deploy.yml", "-l", "c", "-e",
                               "@%s" % (base / "extra.json")], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300, check=False)

    res = run()
    assert res.returncode == 0, res.stdout[-3000:]
    return run


def sh(lab, script, user=None):
    cmd = ["runuser", "-u", user, "--", "sh", "-c", script] if user else ["sh", "-c", script]
    return lab.ct(CT, *cmd)


def show(lab):
    out = lab.ct(CT, "systemctl", "show", "dflash-trainer", "-p", "MainPID", "-p", "NRestarts", "-p",
                 "ActiveState").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def cache_written(lab):
    """The cache is root's and 0700, holds only root's files, and the running trainer wrote its compiled
    code there."""
    st = sh(lab, "stat -c '%%u %%a %%F' %s" % CACHE).stdout.strip()
    others = sh(lab, "find %s -mindepth 1 ! -user root" % CACHE).stdout.strip()
    files = sh(lab, "find %s -mindepth 1 -type f -user root" % CACHE).stdout.strip()
    return st == "0 700 directory" and not others and bool(files)


def test_the_trainer_gets_a_root_0700_cache_made_by_systemd(lab, deploy):
    unit = lab.ct(CT, "cat", "/etc/systemd/system/dflash-trainer.service").stdout.splitlines()
    assert "CacheDirectory=dflash-trainer/inductor" in unit and "CacheDirectoryMode=0700" in unit
    env = lab.ct(CT, "cat", "/etc/dflash-trainer/trainer.env").stdout
    assert 'TORCHINDUCTOR_CACHE_DIR="%s"' % CACHE in env
    assert wait_for(lambda: cache_written(lab), timeout=60)
    # where the new cache goes, and above it, alice can make nothing
    for path in (CACHE + "/ab", "/var/cache/dflash-trainer/x", "/var/cache/dflash-trainer-x"):
        res = sh(lab, "mkdir %s" % path, user="alice")
        assert res.returncode != 0 and "Permission denied" in res.stderr, (path, res.stderr)


def test_alices_directory_at_the_old_place_gets_nothing_and_a_restart_remakes_the_cache(lab, deploy):
    """alice makes /tmp/torchinductor_root (as she could after a boot) with a kernel in it; the cache is
    widened (0777); after a crash systemd's Restart= makes it root's and 0700 again before the trainer runs,
    and the trainer writes there - nothing of root's appears in alice's directory, her kernel is untouched."""
    plant = "mkdir -p {o}/ab && chmod 0777 {o} && echo 'planted' > {o}/ab/{k}.py".format(o=OLD, k=KEY)
    assert sh(lab, plant, user="alice").returncode == 0
    before = show(lab)
    assert before["ActiveState"] == "active", before
    assert sh(lab, "chmod 0777 %s" % CACHE).returncode == 0  # systemd makes it 0700 again at the next start
    assert lab.ct(CT, "kill", "-9", before["MainPID"]).returncode == 0

    def restarted():
        s = show(lab)
        return s if s["ActiveState"] == "active" and s["MainPID"] not in ("0", before["MainPID"]) else None
    after = wait_for(restarted, timeout=60)
    assert after and int(after["NRestarts"]) > int(before["NRestarts"]), after
    assert wait_for(lambda: cache_written(lab), timeout=60)
    assert sh(lab, "find %s -user root" % OLD).stdout == ""
    assert sh(lab, "cat %s/ab/%s.py" % (OLD, KEY)).stdout.strip() == "planted"


def test_a_boot_remakes_the_cache_before_the_trainer_starts(lab, deploy):
    assert sh(lab, "rm -rf /var/cache/dflash-trainer").returncode == 0
    assert lab.pct("stop", CT).returncode == 0
    assert lab.pct("start", CT).returncode == 0
    assert wait_for(lambda: show(lab).get("ActiveState") == "active", timeout=120)
    assert wait_for(lambda: cache_written(lab), timeout=60)
    assert sh(lab, "stat -c '%u %a' /var/cache/dflash-trainer").stdout.split() == ["0", "755"]


@pytest.mark.parametrize("purge", [True, False])
def test_a_cache_in_tmp_is_refused_before_any_change_purge_or_not(lab, deploy, purge):
    before = show(lab)
    unit = lab.ct(CT, "sha256sum", "/etc/systemd/system/dflash-trainer.service", "/etc/dflash-trainer/trainer.env").stdout
    res = deploy(trainer_inductor_cache_dir=OLD, trainer_purge_inductor_cache=purge)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "trainer_inductor_cache_dir" in out and "%s is in /tmp (mode 1777), a directory every user can write" % OLD \
        in out and "refused before any change" in out, out[-3000:]
    assert show(lab)["MainPID"] == before["MainPID"]
    assert lab.ct(CT, "sha256sum", "/etc/systemd/system/dflash-trainer.service",
                  "/etc/dflash-trainer/trainer.env").stdout == unit
    assert sh(lab, "find %s -user root" % OLD).stdout == ""
