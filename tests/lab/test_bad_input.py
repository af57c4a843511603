"""Bad input never reaches the target (issue 10): a table of mistyped variables and inventory
values, each run as a real playbook against lab container 215 with a proved trainer running.

Every row records the container's state before and after - releases, `current`, `last_good`, the
unit and environment files (sha256), the files under /etc/systemd, the trainer's MainPID and
InvocationID, /workspace and the lock - asserts it unchanged, the run failed, and its message names
the variable (or the program) and says why.
"""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "215"
STOPPED_CT = "216"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}, "trainer_target_hosts": "all"}
SECRET = "s3cr3t-value-"

STATE_SCRIPT = r"""
cd /opt/dflash-trainer 2>/dev/null && echo "releases=$(ls releases | tr '\n' ' ')" && echo "current=$(readlink current)" \
  && echo "last_good=$(cat last_good 2>/dev/null)"
echo "unit=$(sha256sum /etc/systemd/system/dflash-trainer.service 2>&1)"
echo "env=$(sha256sum /etc/dflash-trainer/trainer.env 2>&1)"
echo "systemd=$(find /etc/systemd /usr/local/lib/dflash-trainer -newer /etc/hostname -printf '%p %s\n' 2>/dev/null | sort | tr '\n' ' ')"
echo "pid=$(systemctl show dflash-trainer -p MainPID -p InvocationID -p ActiveState --value | tr '\n' ' ')"
echo "workspace=$(ls -A /workspace | tr '\n' ' ')"
echo "lock=$(ls -d /run/dflash-trainer.deploy.lock 2>/dev/null)"
echo "tmp=$(ls -A /tmp | grep -v '^ansible' | tr '\n' ' ')"
echo "python=$(sha256sum /usr/bin/python3.11 2>&1) $(readlink /usr/bin/python3)"
echo "shadow=$(sha256sum /etc/shadow 2>&1)"
echo "passwd=$(sha256sum /etc/passwd 2>&1)"
echo "root=$(find /root -printf '%p %s %T@\n' 2>/dev/null | sort | sha256sum)"
echo "planted=$(find /data /workspace/checkpoints -printf '%p %s %T@\n' 2>/dev/null | sort | sha256sum)"
"""

# Files and links the rows below aim at, planted in the container once: a checkpoint where a cache
# could be named, a home's ssh keys, foreign files where ours could go, symlinked parents.
PLANT_SCRIPT = r"""
set -e
mkdir -p /workspace/checkpoints /root/.ssh /data/user /data/tool /srv/notes
echo weights > /workspace/checkpoints/checkpoint.pt
echo 'ssh-ed25519 AAAA lab' > /root/.ssh/authorized_keys
echo 'notes of a person' > /workspace/notes.txt
echo 'KEY=value' > /data/app.env
printf '#!/bin/sh\necho tool\n' > /data/tool/run
echo 'someone else' > /workspace/other.log.1
echo 'data' > /workspace/data.bin
echo 'x' > /srv/notes/todo.txt
echo 'not a lock' > /run/dflash-trainer.other
chown 1000:1000 /data/user
ln -sfn /opt/dflash-trainer /data/rl
ln -sfn /etc /data/etclink
ln -sfn /etc/shadow /workspace/link.log
"""


def state(lab, ct=CT):
    res = lab.ct(ct, "bash", "-c", STATE_SCRIPT)
    assert res.returncode == 0, res.stderr
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)


@pytest.fixture(scope="module")
def target(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT, STOPPED_CT],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["pct", "stop", STOPPED_CT], check=False, capture_output=True)
    planted = lab.ct(CT, "sh", "-c", PLANT_SCRIPT)
    assert planted.returncode == 0, planted.stderr
    base = tmp_path_factory.mktemp("bad-input")
    conn = lab.conn_vars()
    inv = base / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {
        "bi": {"proxmox_vmid": int(CT)},
        "bi-no-vmid": {},
        "bi-text-vmid": {"proxmox_vmid": "ct215"},
        "bi-unknown-vmid": {"proxmox_vmid": 999},
        "bi-stopped": {"proxmox_vmid": int(STOPPED_CT)},
        "bi-no-python": {"proxmox_vmid": int(CT), "ansible_python_interpreter": "/usr/bin/python3.99"},
    }, "vars": dict(conn, trainer_src=os.path.join(ROOT, "examples", "trainer"))}}))
    res = run(str(inv), base, "deploy.yml", "bi", {})
    assert res.returncode == 0, res.stdout[-3000:]
    return str(inv), base


def run(inv, base, playbook, limit, extra):
    path = base / "extra.json"
    path.write_text(json.dumps(dict(FAST, **extra)))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(["ansible-playbook", "-i", inv, playbook, "-l", limit, "-e", "@%s" % path],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def src_tree(base, kind):
    dst = base / ("src-" + kind)
    if dst.exists():
        return str(dst)
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), dst)
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(dst / "trainer.sock"))
        s.close()
    elif kind == "fifo":
        os.mkfifo(str(dst / "queue"))
    elif kind == "device":
        os.mknod(str(dst / "null"), 0o600 | 0o020000, os.makedev(1, 3))
    elif kind == "loop":
        os.symlink("b", str(dst / "a"))
        os.symlink("a", str(dst / "b"))
    elif kind == "outside":
        os.symlink("../../../../../../../../etc", str(dst / "etc"))
    return str(dst)


# (id, playbook, host, extra vars, words the message must hold). The variable's name is the first word.
ROWS = [
    ("cache-is-release-root", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "/opt/dflash-trainer"},
     ["trainer_inductor_cache_dir", "every release would be deleted"]),
    ("cache-is-release-root-restart", "playbooks/restart.yml", "bi", {"trainer_inductor_cache_dir": "/opt/dflash-trainer"},
     ["trainer_inductor_cache_dir", "every release would be deleted"]),
    ("cache-is-workspace", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "/workspace"},
     ["trainer_inductor_cache_dir", "system directory"]),
    ("cache-holds-log", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "/data/run",
                                             "trainer_log_path": "/data/run/trainer.log"},
     ["trainer_inductor_cache_dir", "log"]),
    ("cache-is-slash", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "/"}, ["trainer_inductor_cache_dir", "system directory"]),
    ("cache-is-tmp", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "/tmp"}, ["trainer_inductor_cache_dir", "system directory"]),
    ("cache-is-opt", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "/opt"}, ["trainer_inductor_cache_dir", "system directory"]),
    ("cache-relative", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "torchinductor_root"},
     ["trainer_inductor_cache_dir", "relative path"]),
    ("cache-dotdot", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "/tmp/x/../../opt"}, ["trainer_inductor_cache_dir", "'..'"]),
    ("root-space", "deploy.yml", "bi", {"trainer_root": "/opt/dflash trainer"}, ["trainer_root", "' '"]),
    ("root-quote", "deploy.yml", "bi", {"trainer_root": "/opt/dflash'x\""}, ["trainer_root", "characters"]),
    ("root-semicolon", "deploy.yml", "bi", {"trainer_root": "/opt/x;touch /tmp/pwned"}, ["trainer_root", "';'"]),
    ("root-subst", "deploy.yml", "bi", {"trainer_root": "/opt/$(touch /tmp/pwned)"}, ["trainer_root", "'$'"]),
    ("log-newline", "deploy.yml", "bi", {"trainer_log_path": "/workspace/a\nb.log"}, ["trainer_log_path", "'\\n'"]),
    ("log-relative", "deploy.yml", "bi", {"trainer_log_path": "trainer.log"}, ["trainer_log_path", "relative path"]),
    ("log-in-release-root", "deploy.yml", "bi", {"trainer_log_path": "/opt/dflash-trainer/trainer.log"},
     ["trainer_log_path", "inside trainer_root"]),
    ("envfile-dotdot", "deploy.yml", "bi", {"trainer_env_file": "/etc/dflash-trainer/../../x.env"}, ["trainer_env_file", "'..'"]),
    ("unit-slash", "deploy.yml", "bi", {"trainer_unit_name": "a/b"}, ["trainer_unit_name", "'/'"]),
    ("unit-traversal", "deploy.yml", "bi", {"trainer_unit_name": "../x"}, ["trainer_unit_name", "outside /etc/systemd/system"]),
    ("unit-at", "deploy.yml", "bi", {"trainer_unit_name": "trainer@1"}, ["trainer_unit_name", "'@'"]),
    ("unit-space", "deploy.yml", "bi", {"trainer_unit_name": "my trainer"}, ["trainer_unit_name", "characters"]),
    ("unit-suffix", "deploy.yml", "bi", {"trainer_unit_name": "dflash-trainer.service"},
     ["trainer_unit_name", "without the suffix (dflash-trainer)"]),
    ("unit-not-ours", "deploy.yml", "bi", {"trainer_unit_name": "systemd-journald"},
     ["trainer_unit_name", "did not write", "systemd-journald.service"]),
    ("unit-not-ours-restart", "playbooks/restart.yml", "bi", {"trainer_unit_name": "systemd-logind"},
     ["trainer_unit_name", "did not write"]),
    ("gpus-empty", "deploy.yml", "bi", {"trainer_gpus": []}, ["trainer_gpus", "empty"]),
    ("gpus-duplicate", "deploy.yml", "bi", {"trainer_gpus": [0, 1, 1]}, ["trainer_gpus", "GPU 1 more than once"]),
    ("gpus-negative", "deploy.yml", "bi", {"trainer_gpus": [0, -1]}, ["trainer_gpus", "not a GPU index"]),
    ("gpus-beyond-count", "deploy.yml", "bi", {"trainer_gpus": [0, 8, 9]}, ["trainer_gpus", "GPU 8, 9", "does not list"]),
    ("gpu-min-above-memory", "deploy.yml", "bi", {"trainer_gpu_min_mib": 10000000}, ["trainer_gpu_min_mib", "above the memory of GPU 0"]),
    ("timeout-negative", "deploy.yml", "bi", {"trainer_drain_timeout_s": -5}, ["trainer_drain_timeout_s", "out of range"]),
    ("hold-over-deadline", "deploy.yml", "bi", {"trainer_ready_hold_s": 400, "trainer_ready_stall_s": 5,
                                                "trainer_ready_timeout_s": 300}, ["trainer_ready_hold_s", "not shorter than"]),
    ("stall-over-hold", "deploy.yml", "bi", {"trainer_ready_hold_s": 5, "trainer_ready_stall_s": 20},
     ["trainer_ready_stall_s", "longer than trainer_ready_hold_s"]),
    ("keep-zero", "deploy.yml", "bi", {"trainer_release_keep": 0}, ["trainer_release_keep", "out of range"]),
    ("regex-broken", "deploy.yml", "bi", {"trainer_ready_regex": "tok/s ("}, ["trainer_ready_regex", "does not compile"]),
    ("regex-empty", "deploy.yml", "bi", {"trainer_ready_regex": ""}, ["trainer_ready_regex", "every line"]),
    ("error-regex-matches-all", "deploy.yml", "bi", {"trainer_error_regexes": ["NCCL error", ".*"]},
     ["trainer_error_regexes[1]", "every line"]),
    ("command-empty", "deploy.yml", "bi", {"trainer_command": []}, ["trainer_command", "empty"]),
    ("command-string", "deploy.yml", "bi", {"trainer_command": "python3 train.py"}, ["trainer_command", "not a list"]),
    ("env-1mib", "deploy.yml", "bi", {"trainer_env": {"HF_TOKEN": SECRET + "x" * (1024 * 1024)}},
     ["trainer_env['HF_TOKEN']", "bytes long", "not shown"]),
    ("src-file", "deploy.yml", "bi", {"trainer_src": os.path.join(ROOT, "examples", "trainer", "trainer.py")},
     ["trainer_src", "not a directory"]),
    ("src-missing", "deploy.yml", "bi", {"trainer_src": "/nonexistent/dflash"}, ["trainer_src", "does not exist"]),
    ("src-socket", "deploy.yml", "bi", {"trainer_src": "@socket"}, ["trainer_src", "a socket at trainer.sock"]),
    ("src-fifo", "deploy.yml", "bi", {"trainer_src": "@fifo"}, ["trainer_src", "a FIFO at queue"]),
    ("src-device", "deploy.yml", "bi", {"trainer_src": "@device"}, ["trainer_src", "a device node at null"]),
    ("src-symlink-loop", "deploy.yml", "bi", {"trainer_src": "@loop"}, ["trainer_src", "symlink loop"]),
    ("src-symlink-outside", "deploy.yml", "bi", {"trainer_src": "@outside"}, ["trainer_src", "points outside the tree"]),
    ("inventory-no-vmid", "deploy.yml", "bi-no-vmid", {}, ["proxmox_vmid", "not set"]),
    ("inventory-text-vmid", "deploy.yml", "bi-text-vmid", {}, ["proxmox_vmid", "not a container id"]),
    ("inventory-unknown-vmid", "deploy.yml", "bi-unknown-vmid", {}, ["999", "does not exist"]),
    ("inventory-stopped-ct", "deploy.yml", "bi-stopped", {}, [STOPPED_CT, "not running"]),
    ("inventory-no-python", "deploy.yml", "bi-no-python", {}, ["/usr/bin/python3.99", "not found"]),
    # issue 13: each probe that was accepted (or failed only after the damage) ...
    ("launcher-is-python", "deploy.yml", "bi", {"trainer_launcher_path": "/usr/bin/python3"},
     ["trainer_launcher_path", "lies in /usr"]),
    # (the argument spec's choices refuse these first, in Ansible's words: no "accepted:" line)
    ("restart-policy-injects-directive", "deploy.yml", "bi",
     {"trainer_restart_policy": "always\nExecStartPre=/bin/sh -c id"}, ["must be one of", "trainer_restart_policy"]),
    ("restart-sec-newline", "deploy.yml", "bi", {"trainer_restart_sec": "\n5"}, ["trainer_restart_sec", "not a number"]),
    ("stop-timeout-exponent", "deploy.yml", "bi", {"trainer_stop_timeout_s": "1e3"},
     ["trainer_stop_timeout_s", "not a number"]),
    ("env-file-is-shadow", "deploy.yml", "bi", {"trainer_env_file": "/etc/shadow"}, ["trainer_env_file", "lies in /etc"]),
    ("log-is-passwd", "deploy.yml", "bi", {"trainer_log_path": "/etc/passwd"}, ["trainer_log_path", "lies in /etc"]),
    ("env-file-is-the-unit", "deploy.yml", "bi", {"trainer_env_file": "/etc/systemd/system/dflash-trainer.service"},
     ["trainer_env_file", "unit file"]),
    ("cache-is-ssh", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "/root/.ssh"},
     ["trainer_inductor_cache_dir", "dot-directory"]),
    ("cache-is-checkpoints", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "/workspace/checkpoints"},
     ["trainer_inductor_cache_dir", "does not look like a torchinductor cache", "checkpoint.pt"]),
    ("cache-is-checkpoints-restart", "playbooks/restart.yml", "bi",
     {"trainer_inductor_cache_dir": "/workspace/checkpoints"}, ["trainer_inductor_cache_dir", "checkpoint.pt"]),
    ("cache-via-link-to-release-root", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "/data/rl/cache"},
     ["trainer_inductor_cache_dir", "resolves to /opt/dflash-trainer/cache", "release root"]),
    ("number-underscore", "deploy.yml", "bi", {"trainer_ready_hold_s": "1_0"}, ["trainer_ready_hold_s", "not a number"]),
    ("number-arabic-digit", "deploy.yml", "bi", {"trainer_log_keep": "\u0665"}, ["trainer_log_keep", "not a number"]),
    # ... and what reading the validator as an attacker found
    ("log-via-link-to-etc", "deploy.yml", "bi", {"trainer_log_path": "/data/etclink/passwd"},
     ["trainer_log_path", "resolves to /etc/passwd", "lies in /etc"]),
    ("log-is-link-to-shadow", "deploy.yml", "bi", {"trainer_log_path": "/workspace/link.log"},
     ["trainer_log_path", "resolves to /etc/shadow"]),
    ("log-is-a-persons-file", "deploy.yml", "bi", {"trainer_log_path": "/workspace/notes.txt"},
     ["trainer_log_path", "/workspace/notes.txt exists and was not written by dflash.trainer"]),
    ("log-rotation-is-foreign", "deploy.yml", "bi", {"trainer_log_path": "/workspace/other.log"},
     ["trainer_log_path", "/workspace/other.log.1 exists and was not written"]),
    ("env-file-is-foreign", "deploy.yml", "bi", {"trainer_env_file": "/data/app.env"},
     ["trainer_env_file", "/data/app.env exists and was not written", "not the environment file"]),
    ("launcher-is-foreign", "deploy.yml", "bi", {"trainer_launcher_path": "/data/tool/run"},
     ["trainer_launcher_path", "/data/tool/run exists and was not written", "not the launcher"]),
    ("launcher-is-sitecustomize", "deploy.yml", "bi",
     {"trainer_launcher_path": "/usr/local/lib/python3.11/dist-packages/sitecustomize.py"},
     ["trainer_launcher_path", "lies in /usr"]),
    ("root-is-a-persons-dir", "deploy.yml", "bi", {"trainer_root": "/srv/notes"},
     ["trainer_root", "not a release root", "todo.txt"]),
    ("lock-in-tmp", "deploy.yml", "bi", {"trainer_lock_path": "/tmp/dflash.lock"}, ["trainer_lock_path", "/tmp"]),
    ("job-state-in-tmp", "deploy.yml", "bi", {"trainer_job_state_path": "/tmp/restart.json"},
     ["trainer_job_state_path", "every user of the container can write"]),
    ("job-state-in-users-dir", "deploy.yml", "bi", {"trainer_job_state_path": "/data/user/restart.json"},
     ["trainer_job_state_path", "owned by uid 1000"]),
    ("lock-is-foreign-file", "deploy.yml", "bi", {"trainer_lock_path": "/run/dflash-trainer.other"},
     ["trainer_lock_path", "exists and was not written", "not the deploy lock"]),
    ("cache-is-a-file", "deploy.yml", "bi", {"trainer_inductor_cache_dir": "/workspace/data.bin"},
     ["trainer_inductor_cache_dir", "not a torchinductor cache directory"]),
    ("env-file-in-dot-config", "deploy.yml", "bi", {"trainer_env_file": "/root/.config/trainer.env"},
     ["trainer_env_file", "dot-directory"]),
    ("log-in-crontab", "deploy.yml", "bi", {"trainer_log_path": "/var/spool/cron/crontabs/root"},
     ["trainer_log_path", "lies in /var"]),
    ("log-in-dev-shm", "deploy.yml", "bi", {"trainer_log_path": "/dev/shm/trainer.log"},
     ["trainer_log_path", "kernel file system"]),
    ("restart-policy-unknown", "deploy.yml", "bi", {"trainer_restart_policy": "sometimes"},
     ["must be one of", "trainer_restart_policy"]),
    ("number-exponent", "deploy.yml", "bi", {"trainer_ready_timeout_s": "3e2"},
     ["trainer_ready_timeout_s", "not a number"]),
    ("number-with-space", "deploy.yml", "bi", {"trainer_log_keep": "3 "}, ["trainer_log_keep", "not a number"]),
    ("number-infinite", "deploy.yml", "bi", {"trainer_ready_hold_s": "inf"}, ["trainer_ready_hold_s", "not a number"]),
    ("regex-with-newline", "deploy.yml", "bi", {"trainer_error_regexes": ["NCCL error\nExecStartPre=x"]},
     ["trainer_error_regexes[0]", "control character"]),
    ("unit-name-is-dbus", "deploy.yml", "bi", {"trainer_unit_name": "dbus"}, ["trainer_unit_name", "did not write"]),
    ("rollback-cache-is-checkpoints", "playbooks/rollback.yml", "bi",
     {"trainer_inductor_cache_dir": "/workspace/checkpoints"}, ["trainer_inductor_cache_dir", "checkpoint.pt"]),
    # every directory above a file root writes is root's, writable by root alone; what must outlive a reboot is
    # not on a tmpfs
    ("log-in-users-dir", "deploy.yml", "bi", {"trainer_log_path": "/data/user/trainer.log"},
     ["trainer_log_path", "is in /data/user, owned by uid 1000"]),
    ("env-file-in-users-dir", "deploy.yml", "bi", {"trainer_env_file": "/data/user/trainer.env"},
     ["trainer_env_file", "is in /data/user, owned by uid 1000"]),
    ("env-file-on-tmpfs", "deploy.yml", "bi", {"trainer_env_file": "/run/dflash-trainer/trainer.env"},
     ["trainer_env_file", "lies on a tmpfs (/run)", "lost at reboot"]),
    ("launcher-on-tmpfs", "deploy.yml", "bi", {"trainer_launcher_path": "/run/dflash-trainer/launch"},
     ["trainer_launcher_path", "lies on a tmpfs (/run)"]),
    # names the unit and the launcher own; a key that is NAME=value; a proof without a step; a regex that never ends
    ("env-invocation-id", "deploy.yml", "bi", {"trainer_env": {"INVOCATION_ID": SECRET}},
     ["trainer_env['INVOCATION_ID']", "sets or reads"]),
    ("env-notify-socket", "deploy.yml", "bi", {"trainer_env": {"NOTIFY_SOCKET": "/run/x"}},
     ["trainer_env['NOTIFY_SOCKET']", "sets or reads"]),
    ("env-dflash-release", "deploy.yml", "bi", {"trainer_env": {"DFLASH_RELEASE": "x"}},
     ["trainer_env['DFLASH_RELEASE']", "sets or reads"]),
    ("env-key-holds-value", "deploy.yml", "bi", {"trainer_env": {"HF_TOKEN=" + SECRET: "1"}},
     ["trainer_env (its key number 1)", "it holds '='", "not shown"]),
    ("min-steps-0", "deploy.yml", "bi", {"trainer_ready_min_steps": 0}, ["trainer_ready_min_steps", "out of range"]),
    ("step-regex-backtracks-forever", "deploy.yml", "bi", {"trainer_step_regex": r"^(([a-z ]+)+)+step(\d+)"},
     ["trainer_step_regex", "can hang the restart job", "was stopped"]),
    # node_exporter not installed yet: its textfile directory does not exist, and the collection never makes it
    ("metrics-dir-missing", "deploy.yml", "bi",
     {"trainer_metrics_path": "/var/lib/node_exporter/textfile_collector/dflash_trainer.prom"},
     ["trainer_metrics_path", "lies in /var/lib/node_exporter/textfile_collector, which does not exist",
      "node_exporter"]),
]


def test_table_is_large_enough():
    assert len(ROWS) >= 80
    assert len({r[0] for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_is_refused_and_nothing_changes(lab, target, row):
    inv, base = target
    _rid, playbook, host, extra, words = row
    extra = dict(extra)
    if str(extra.get("trainer_src", "")).startswith("@"):
        extra["trainer_src"] = src_tree(base, extra["trainer_src"][1:])
    before = state(lab)
    res = run(inv, base, playbook, host, extra)
    after = state(lab)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert after == before
    assert "Traceback (most recent call last)" not in out  # a crash (the defaults' error regexes may be printed)
    for word in words:
        assert word in out, "%r not in:\n%s" % (word, out[-3000:])
    assert SECRET not in out
    if words[0].startswith("trainer_"):
        assert "accepted:" in out, out[-3000:]
    assert lab.ct(CT, "test", "-e", "/tmp/pwned").returncode != 0
