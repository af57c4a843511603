"""A real unprivileged user of the container (alice, uid 1000) against every path the collection
writes, deletes or runs as root: container 243, with a proved trainer running.

Each probe is a path alice controls - a directory of hers, a file she planted in a sticky shared
directory (1777) where ours would go, an empty directory she made in /tmp for the release root,
a program of hers for nvidia-smi or the pre-flight - or one that does not survive a reboot (/run:
a tmpfs), or another application's deploy root. Every probe is run as a real deploy and must be
refused before any change, naming the variable and the offending directory or file with its owner
and mode; the container's state (releases, ``current``, the unit, the environment file, the
launcher, the trainer's MainPID, everything under alice's and the shared directories, with owners)
is the same before and after, no program of hers ran (each leaves a mark when run), and no file of
root's appeared under a path of hers. One placement that looks like the probes is harmless and is
accepted: the job state directly in the sticky shared directory (root creates it anew, O_EXCL,
then renames it into place), where root's own file stays root's.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "243"
ALICE = 1000
SHARED_STATE = "/data/shared/dflash-restart.json"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}, "trainer_target_hosts": "all",
        "trainer_src": os.path.join(ROOT, "examples", "trainer"), "trainer_job_state_path": SHARED_STATE}

# root's part: alice, a shared sticky directory, another application's deploy root
SETUP = r"""
set -e
id -u alice >/dev/null 2>&1 || useradd --uid 1000 --create-home --shell /bin/bash alice
chmod 0755 /home/alice
mkdir -p /data/shared /srv/app/releases/20260101120000
chmod 1777 /data/shared
echo 'app v1' > /srv/app/releases/20260101120000/app.rb
ln -sfn releases/20260101120000 /srv/app/current
"""
# alice's part, as alice: her directories and programs (each marks that it ran, and as whom), a
# log planted where ours would go, carrying our marker line, an empty "release root" in /tmp
ALICE_SETUP = r"""
set -e
mark='#!/bin/sh
touch "/tmp/alice-ran-$(basename "$0")-as-$(id -u)"
exec /usr/bin/nvidia-smi "$@"
'
mkdir -p /home/alice/bin /home/alice/dflash /tmp/alice-bin /tmp/alice-root
for p in /home/alice/bin/alice-check /home/alice/bin/nvidia-smi /tmp/alice-bin/nvidia-smi; do
  printf '%s' "$mark" > "$p"; chmod 0755 "$p"
done
mkdir -p /home/alice/py
printf 'import os\nopen("/tmp/alice-ran-sitecustomize-as-%d" % os.getuid(), "w").close()\n' > /home/alice/py/sitecustomize.py
printf '%s' "$mark" > /home/alice/bin/python3; chmod 0755 /home/alice/bin/python3
printf '==> dflash.trainer start invocation=%s release=r pid=1 time=t <==\n' \
  0123456789abcdef0123456789abcdef > /data/shared/trainer.log
"""
STATE = r"""
cd /opt/dflash-trainer && echo "releases=$(ls releases | tr '\n' ' ')" && echo "current=$(readlink current)"
echo "unit=$(sha256sum /etc/systemd/system/dflash-trainer.service 2>&1)"
echo "env=$(sha256sum /etc/dflash-trainer/trainer.env 2>&1)"
echo "launcher=$(sha256sum /usr/local/lib/dflash-trainer/launch 2>&1)"
echo "pid=$(systemctl show dflash-trainer -p MainPID -p InvocationID -p ActiveState --value | tr '\n' ' ')"
echo "app=$(readlink /srv/app/current) $(ls -A /srv/app /srv/app/releases | tr '\n' ' ')"
echo "alice=$(find /home/alice /tmp/alice-bin /tmp/alice-root /data/shared /run/dflash-trainer \
  -printf '%p %u %m %s %T@\n' 2>/dev/null | sort | sha256sum)"
echo "ran=$(ls /tmp | grep '^alice-ran-' | tr '\n' ' ')"
echo "roots=$(find /home/alice /tmp/alice-bin /tmp/alice-root /data/shared/trainer.log -user root 2>/dev/null \
  | tr '\n' ' ')"
"""

# (id, variables, words the refusal says)
PROBES = [
    ("log-in-alices-dir", {"trainer_log_path": "/home/alice/dflash/trainer.log"},
     ["trainer_log_path", "is in /home/alice, owned by uid 1000 (mode 0755)"]),
    ("log-planted-in-a-shared-sticky-dir", {"trainer_log_path": "/data/shared/trainer.log"},
     ["trainer_log_path", "/data/shared/trainer.log is in /data/shared (mode 1777), a directory every user can write"]),
    ("env-file-in-alices-dir", {"trainer_env_file": "/home/alice/dflash/trainer.env"},
     ["trainer_env_file", "is in /home/alice, owned by uid 1000", "before root loads it"]),
    ("launcher-in-alices-dir", {"trainer_launcher_path": "/home/alice/dflash/launch"},
     ["trainer_launcher_path", "is in /home/alice, owned by uid 1000", "before root runs it"]),
    ("metrics-in-alices-dir", {"trainer_metrics_path": "/home/alice/dflash/trainer.prom"},
     ["trainer_metrics_path", "is in /home/alice, owned by uid 1000"]),
    ("env-file-on-run", {"trainer_env_file": "/run/dflash-trainer/trainer.env"},
     ["trainer_env_file", "lies on a tmpfs (/run): it is lost at reboot"]),
    ("launcher-on-run", {"trainer_launcher_path": "/run/dflash-trainer/launch"},
     ["trainer_launcher_path", "lies on a tmpfs (/run)"]),
    ("root-is-alices-empty-dir-in-tmp", {"trainer_root": "/tmp/alice-root"},
     ["trainer_root", "/tmp/alice-root is in /tmp (mode 1777), a directory every user can write"]),
    ("root-is-another-apps-deploy-root", {"trainer_root": "/srv/app"},
     ["trainer_root", "/srv/app exists and is not a release root of dflash.trainer",
      "releases/ holds 20260101120000, which has no .dflash-release"]),
    ("nvidia-smi-is-alices-in-tmp", {"trainer_nvidia_smi": "/tmp/alice-bin/nvidia-smi"},
     ["trainer_nvidia_smi", "/tmp/alice-bin/nvidia-smi, which belongs to uid 1000",
      "a program run as root must be a file root owns"]),
    ("preflight-is-alices", {"trainer_preflight_command": ["/home/alice/bin/alice-check"]},
     ["trainer_preflight_command", "/home/alice/bin/alice-check, which belongs to uid 1000"]),
    ("preflight-found-on-a-path-through-alices-dir",
     {"trainer_preflight_command": ["alice-check"],
      "trainer_env": dict(FAST["trainer_env"], PATH="/home/alice/bin:/usr/sbin:/usr/bin:/sbin:/bin")},
     ["trainer_preflight_command", "alice-check resolves to /home/alice/bin/alice-check, which belongs to uid 1000"]),
    # the environment chooses what root's processes run or import: every search entry is judged
    ("path-runs-alices-python3-first",
     {"trainer_env": dict(FAST["trainer_env"], PATH="/home/alice/bin:/usr/bin:/bin")},
     ["trainer_env.PATH: /home/alice/bin is in /home/alice, owned by uid 1000 (mode 0755)",
      "root's processes (the pre-flight, the launcher, the trainer) would run or import what that user puts there"]),
    ("pythonpath-imports-alices-sitecustomize",
     {"trainer_env": dict(FAST["trainer_env"], PYTHONPATH="/home/alice/py")},
     ["trainer_env.PYTHONPATH: /home/alice/py is in /home/alice, owned by uid 1000"]),
    ("ld-preload-from-a-shared-sticky-dir",
     {"trainer_env": dict(FAST["trainer_env"], LD_PRELOAD="/tmp/alice-bin/hook.so")},
     ["trainer_env.LD_PRELOAD: /tmp/alice-bin/hook.so is in /tmp (mode 1777), which every user can write"]),
]


def ansible_env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


def deploy(inv, tmp, **extra):
    path = tmp / "extra.json"
    path.write_text(json.dumps(dict(FAST, **extra)))
    res = subprocess.run(["ansible-playbook", "-i", str(inv), "deploy.yml", "-l", "ct", "-e", "@%s" % path],
                         cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=300, check=False)
    return res.returncode, " ".join((res.stdout + res.stderr).split())


def state(lab):
    res = lab.ct(CT, "bash", "-c", STATE)
    assert res.returncode == 0, res.stderr
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)


@pytest.fixture(scope="module")
def ct(lab, tmp_path_factory):
    """243, fresh, with alice and her paths, and a proved trainer (the job state in /data/shared)."""
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    res = lab.ct(CT, "sh", "-c", SETUP)
    assert res.returncode == 0, res.stderr
    res = lab.ct(CT, "runuser", "-u", "alice", "--", "sh", "-c", ALICE_SETUP)
    assert res.returncode == 0, res.stderr
    tmp = tmp_path_factory.mktemp("container-user")
    inv = tmp / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    rc, out = deploy(inv, tmp)
    assert rc == 0, out[-4000:]
    assert "dflash-trainer ready: release " in out, out[-4000:]
    return inv, tmp


def test_the_job_state_in_a_shared_sticky_directory_is_roots_own_file(lab, ct):
    """Harmless, so accepted: root created it anew there, and nobody but root can replace it."""
    got = lab.ct(CT, "stat", "-c", "%u %a", SHARED_STATE).stdout.split()
    assert got == ["0", "600"]
    assert json.loads(lab.ct(CT, "cat", SHARED_STATE).stdout)["job_id"]
    # alice cannot replace it (sticky) nor read it (0600)
    res = lab.ct(CT, "runuser", "-u", "alice", "--", "sh", "-c", "mv -f /data/shared/trainer.log %s" % SHARED_STATE)
    assert res.returncode != 0 and "Operation not permitted" in res.stderr, res.stderr
    assert lab.ct(CT, "runuser", "-u", "alice", "--", "cat", SHARED_STATE).returncode != 0


@pytest.mark.parametrize("probe", PROBES, ids=[p[0] for p in PROBES])
def test_a_path_of_another_user_is_refused_and_nothing_changes(lab, ct, probe):
    inv, tmp = ct
    _pid, variables, words = probe
    before = state(lab)
    assert before["ran"] == "" and before["roots"] == "", before
    rc, out = deploy(inv, tmp, **variables)
    after = state(lab)
    assert rc != 0, out[-4000:]
    assert "refused before any change on the target" in out, out[-4000:]
    for word in words:
        assert word in out, "%r not in:\n%s" % (word, out[-4000:])
    assert after == before
    assert "Traceback" not in out
