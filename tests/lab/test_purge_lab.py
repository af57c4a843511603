"""The purge deletes only a torchinductor cache (issue 13 item 3), on a real container: a cache
that is a mount point is emptied and stays mounted; a cache directory holding a checkpoint is
refused before the stop, naming it, and the trainer keeps running. Lab container 236."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "236"
CACHE = "/var/cache/dflash-trainer/inductor"  # the role's default
KEY = "cabm7qpgiyjpkp7if2jwvf7dvibbkcxzvaxvrwcbwndsspltizml"  # a key as inductor names it: ab/ holds it


@pytest.fixture(scope="module")
def deploy(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    base = tmp_path_factory.mktemp("purge")
    inv = base / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"p": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))

    def run(**changes):
        extra = {"trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer"),
                 "trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
                 "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}, "trainer_force_restart": True}
        extra.update(changes)
        (base / "extra.json").write_text(json.dumps(extra))
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        return subprocess.run(["ansible-playbook", "-i", str(inv), "deploy.yml", "-l", "p", "-e",
                               "@%s" % (base / "extra.json")], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300, check=False)

    res = run()
    assert res.returncode == 0, res.stdout[-3000:]
    yield run
    lab.ct(CT, "umount", CACHE)


def main_pid(lab):
    return lab.ct(CT, "systemctl", "show", "dflash-trainer", "-p", "MainPID", "--value").stdout.strip()


def test_a_cache_that_is_a_mount_point_is_emptied_not_removed(lab, deploy):
    setup = lab.ct(CT, "sh", "-c", "mkdir -p %s && mount -t tmpfs -o mode=0700 tmpfs %s && mkdir -p %s/ab %s/locks "
                   "&& echo x > %s/ab/%s.so && echo '{}' > %s/memoizer_cache.json" % ((CACHE,) * 5 + (KEY, CACHE)))
    assert setup.returncode == 0, setup.stderr
    res = deploy()
    assert res.returncode == 0, res.stdout[-3000:]
    assert lab.ct(CT, "mountpoint", "-q", CACHE).returncode == 0
    # what was there before the stop is gone (the new trainer may have begun to refill it: its own two-character
    # directory is ab/ one start in 1024, so the file is what is looked for there, not the directory)
    left = lab.ct(CT, "ls", "-A", CACHE).stdout.split()
    assert not {"locks", "memoizer_cache.json"} & set(left), left
    assert lab.ct(CT, "test", "-e", "%s/ab/%s.so" % (CACHE, KEY)).returncode == 1, left


def test_a_directory_holding_a_checkpoint_is_never_purged(lab, deploy):
    assert lab.ct(CT, "sh", "-c", "echo weights > %s/checkpoint.pt && mkdir -p %s/ab" % (CACHE, CACHE)).returncode == 0
    before = main_pid(lab)
    res = deploy()
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "trainer_inductor_cache_dir" in out and "checkpoint.pt" in out and "refused before any change" in out
    assert main_pid(lab) == before  # refused before the stop: the trainer was never touched
    assert lab.ct(CT, "cat", "%s/checkpoint.pt" % CACHE).stdout.strip() == "weights"


def test_a_corpus_of_two_character_directories_is_never_purged(lab, deploy):
    """en/ de/ fr/ pass a look at the top level; the purge judges every entry at every depth, refuses,
    deletes nothing, and the trainer is brought back."""
    corpus = "/srv/dflash-corpus"
    make = ("rm -rf {c} && mkdir -p {c}/en {c}/de {c}/fr && for l in en de fr; do echo text-$l > {c}/$l/train.txt; "
            "done && find {c} -exec stat -c '%n %s %Y %a' {{}} + | sort").format(c=corpus)
    before = lab.ct(CT, "sh", "-c", make).stdout
    res = deploy(trainer_inductor_cache_dir=corpus)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "trainer_inductor_cache_dir" in out or "refused to purge" in out, out[-3000:]
    assert "train.txt" in out and ("nothing was deleted" in out or "refused before any change" in out), out[-3000:]
    after = lab.ct(CT, "sh", "-c", "find %s -exec stat -c '%%n %%s %%Y %%a' {} + | sort" % corpus).stdout
    assert after == before
    assert lab.ct(CT, "systemctl", "is-active", "dflash-trainer").stdout.strip() == "active"


def test_after_a_purge_the_cache_is_roots_and_0700(lab, deploy):
    lab.ct(CT, "sh", "-c", "umount %s 2>/dev/null; rm -rf %s; mkdir -m 0755 %s && mkdir %s/ab" % ((CACHE,) * 4))
    res = deploy()
    assert res.returncode == 0, res.stdout[-3000:]
    assert lab.ct(CT, "stat", "-c", "%u %a", CACHE).stdout.split() == ["0", "700"]
