"""The collection runs from an installed copy, not from this checkout (issue 9 item 7), on lab
container 223: `ansible-galaxy collection build` -> install the tarball into a fresh
collections path -> `ansible-playbook dflash.trainer.deploy` with a configuration, a working
directory and a collections path that are all outside the checkout; every task runs from the
installed role, the trainer is proved. Then the API and CLI as `pip install` gives them (a clean
venv, run outside the checkout) read that trainer's status through the installed collection."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
CT = "223"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 60,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}}


def run(argv, cwd, env, timeout=300):
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(lab, tmp_path_factory):
    """(work dir, environment, installed collection root); the inventory is work/hosts.json."""
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    work = str(tmp_path_factory.mktemp("installed"))
    colls = os.path.join(work, "colls")
    with open(os.path.join(work, "ansible.cfg"), "w") as fh:
        fh.write("[defaults]\ncollections_path = %s\ninventory = %s\n" % (colls, os.path.join(work, "hosts.json")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    env.update(ANSIBLE_CONFIG=os.path.join(work, "ansible.cfg"), ANSIBLE_HOME=os.path.join(work, "home"),
               ANSIBLE_NOCOLOR="1", PATH=BIN + os.pathsep + env.get("PATH", ""))
    res = run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--output-path", work, ROOT], work, env)
    assert res.returncode == 0, res.stdout + res.stderr
    tarball = re.search(r"(/\S+\.tar\.gz)", res.stdout).group(1)
    res = run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--offline", tarball, "-p", colls], work, env)
    assert res.returncode == 0, res.stdout + res.stderr
    inventory = {"trainer_hosts": {"hosts": {"installed": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}
    with open(os.path.join(work, "hosts.json"), "w") as fh:
        json.dump(inventory, fh)
    return work, env, os.path.join(colls, "ansible_collections", "dflash", "trainer")


def test_deploy_runs_from_the_installed_collection(lab, installed):
    work, env, root = installed
    src = os.path.join(work, "trainer-src")
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), src)
    with open(os.path.join(src, "VERSION"), "w") as fh:
        fh.write("installed %s\n" % os.path.basename(work))
    res = run([os.path.join(BIN, "ansible-playbook"), "dflash.trainer.deploy", "-vv",
               "-e", json.dumps(dict(FAST, trainer_src=src))], work, env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "running playbook inside collection dflash.trainer" in out
    paths = set(re.findall(r"^task path: (\S+?):\d+$", out, re.M))
    assert paths and all(p.startswith(root + os.sep) for p in paths), sorted(paths)
    assert any("/roles/trainer/tasks/" in p for p in paths)
    for checkout_path in ("roles", "playbooks", "plugins", "collections"):
        assert os.path.join(ROOT, checkout_path) not in out
    state = lab.ct(CT, "systemctl", "show", "dflash-trainer", "-p", "ActiveState").stdout.strip()
    assert state == "ActiveState=active"
    current = lab.ct(CT, "readlink", "/opt/dflash-trainer/current").stdout.strip()
    assert current.startswith("/opt/dflash-trainer/releases/") or current.startswith("releases/"), current


def test_pip_installed_cli_reads_status_through_the_installed_collection(lab, installed, tmp_path):
    work, env = installed[0], installed[1]
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "dflash_trainer"), src / "dflash_trainer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), src)
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", str(venv)], work, env).returncode == 0
    res = run([str(venv / "bin" / "pip"), "install", "-q", str(src)], work, env)
    assert res.returncode == 0, res.stderr[-3000:]
    shutil.rmtree(src)
    cli_env = dict(env, PATH=str(venv / "bin") + os.pathsep + os.environ.get("PATH", ""))
    res = run([str(venv / "bin" / "dflash-trainer"), "status", "--json"], work, cli_env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads(res.stdout[res.stdout.index("{"):])
    assert result["ok"] is True
    status = result["hosts"]["installed"]["status"]
    current = lab.ct(CT, "readlink", "/opt/dflash-trainer/current").stdout.strip()
    assert status["current_release"] and status["current_release"] in current
    assert status["running_release"] == status["current_release"] and status["active_state"] == "active"
