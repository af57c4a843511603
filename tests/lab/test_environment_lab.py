"""The trainer runs in the environment its run.sh was written for, and a bad environment never
strands it (lab container 247):

- a run.sh that sources "$HOME/..." (it worked under `pct exec`, which keeps the ssh session's
  HOME) is proved with the defaults: the unit gives HOME, USER, LOGNAME, SHELL of root's passwd
  entry, the container's locale from /etc/default/locale, PYTHONUNBUFFERED=1;
- trainer_env PATH "/opt/conda/bin:$PATH" (systemd does not expand $PATH: the stand-in's
  `exec python3` would not be found) and PYTHONHOME pointing nowhere (the launcher's python dies at
  start) are refused by the pre-flight before the stop;
- trainer_env PATH "/opt/conda/bin" alone (a well-formed PATH without python3: run.sh's
  `exec python3` fails, which no check short of running run.sh sees) is rolled back to the previous
  configuration;

either way the previous trainer is running and proved afterwards, and the environment file on disk
is the previous one."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "247"
ENV_FILE = "/etc/dflash-trainer/trainer.env"
BASE_ENV = {"TRAINER_NOTE": "k7Qz-note"}  # a value no message holds (values are secrets: masked)
# (no cache purge: what is judged here is the environment, not the cache)
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
        "trainer_target_hosts": "all", "trainer_purge_inductor_cache": False}
RUN_SH = """#!/bin/bash
set -e
# written for `pct exec 247 -- /root/run.sh`: the user's environment lives under $HOME
source "$HOME/.hidden-env/activate"
exec python3 "$(dirname "$(readlink -f "$0")")/trainer.py" "$@"
"""


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    # what the user's login has: an activate script under root's home, a locale of the container's own
    res = lab.ct(CT, "sh", "-c", "mkdir -p /root/.hidden-env && printf 'export HIDDEN_ENV_ACTIVE=yes\\n' "
                 "> /root/.hidden-env/activate && printf 'LANG=en_GB.UTF-8\\n' > /etc/default/locale")
    assert res.returncode == 0, res.stderr
    base = tmp_path_factory.mktemp("environment")
    path = base / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"envt": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    src = base / "trainer"
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), src)
    (src / "run.sh").write_text(RUN_SH)
    (src / "run.sh").chmod(0o755)
    (src / "fault.env").write_text("STARTUP_S=0.3\n")  # the stand-in's own knob file: a quick start
    return str(path), str(src)


def deploy(inv_path, src, env=None, **extra):
    environ = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    extra = dict(FAST, trainer_src=src, trainer_env=dict(BASE_ENV, **(env or {})), **extra)
    return subprocess.run(["ansible-playbook", "-i", inv_path, "deploy.yml", "-l", "envt", "-e", json.dumps(extra)],
                          cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300, check=False)


def unit(lab):
    out = lab.ct(CT, "systemctl", "show", "dflash-trainer", "-p", "MainPID", "-p", "InvocationID",
                 "-p", "ActiveState").stdout
    return dict(line.split("=", 1) for line in out.split())


def env_file_digest(lab):
    res = lab.ct(CT, "sha256sum", ENV_FILE)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()[0]


def proc_environ(lab, pid):
    res = lab.ct(CT, "cat", "/proc/%s/environ" % pid)
    assert res.returncode == 0, res.stderr
    return dict(kv.split("=", 1) for kv in res.stdout.split("\0") if "=" in kv)


def trainer_pid(lab, launcher_pid):
    """The trainer under the launcher (run.sh exec'd into python3)."""
    res = lab.ct(CT, "pgrep", "-P", launcher_pid)
    assert res.returncode == 0, "no child under the launcher %s" % launcher_pid
    return res.stdout.split()[0]


def last_ledger(lab):
    res = lab.ct(CT, "cat", "/opt/dflash-trainer/ledger.json")
    data = json.loads(res.stdout)
    return (data.get("entries") if isinstance(data, dict) else data)[-1]


def test_a_run_sh_that_sources_from_home_is_proved_with_a_root_login_s_environment(lab, inv):
    inv_path, src = inv
    res = deploy(inv_path, src)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    state = unit(lab)
    assert state["ActiveState"] == "active"
    passwd = lab.ct(CT, "getent", "passwd", "root").stdout.strip().split(":")
    env = proc_environ(lab, trainer_pid(lab, state["MainPID"]))
    assert (env["HOME"], env["USER"], env["LOGNAME"], env["SHELL"]) == (passwd[5], "root", "root", passwd[6])
    assert env["HIDDEN_ENV_ACTIVE"] == "yes"  # run.sh sourced $HOME/.hidden-env/activate
    assert env["LANG"] == "en_GB.UTF-8"  # the container's /etc/default/locale, not the manager's C.UTF-8
    assert env["PYTHONUNBUFFERED"] == "1" and env["TORCHINDUCTOR_CACHE_DIR"]
    assert last_ledger(lab)["verdict"] == "proved"


@pytest.mark.parametrize("env, words", [
    ({"PATH": "/opt/conda/bin:$PATH"}, "trainer_env PATH holds a '$'"),
    ({"PYTHONHOME": "/nonexistent/python-home"},
     "the unit's launcher does not start in the new environment: /usr/bin/python3 -c pass exited with status 1"),
])
def test_an_environment_the_trainer_cannot_start_in_is_refused_before_the_stop(lab, inv, env, words):
    inv_path, src = inv
    res = deploy(inv_path, src)  # the proved configuration (a no-op after the test above)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    before, digest = unit(lab), env_file_digest(lab)
    assert before["ActiveState"] == "active"
    res = deploy(inv_path, src, env=env)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "pre-flight refused the release (the running trainer is untouched)" in out, out[-3000:]
    assert words in out, out[-3000:]
    assert unit(lab) == before  # same MainPID and InvocationID: never stopped
    assert env_file_digest(lab) == digest


def test_an_environment_that_fails_the_trainer_is_rolled_back_to_the_proved_configuration(lab, inv):
    inv_path, src = inv
    res = deploy(inv_path, src)  # the proved configuration (a no-op after the tests above)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    before, digest = unit(lab), env_file_digest(lab)
    res = deploy(inv_path, src, env={"PATH": "/opt/conda/bin"})
    out = res.stdout + res.stderr
    assert res.returncode != 0  # the new configuration failed its proof: the deploy says so
    assert "Rolled back: release" in out, out[-3000:]
    assert "runs again with the configuration it was proved with (environment file restored) and is proved ready" in out
    after = unit(lab)
    assert after["ActiveState"] == "active" and after["InvocationID"] != before["InvocationID"]
    assert env_file_digest(lab) == digest  # the previous environment file is back on disk
    assert proc_environ(lab, trainer_pid(lab, after["MainPID"]))["PATH"] != "/opt/conda/bin"
    assert last_ledger(lab)["verdict"] == "proved"
    # the next deploy of the proved configuration finds it in place: nothing to change
    res = deploy(inv_path, src)
    assert res.returncode == 0 and unit(lab) == after, (res.stdout + res.stderr)[-3000:]
