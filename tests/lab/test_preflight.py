"""Pre-flight before the stop (issue 7 item 3), on lab container 218: a release whose command has
no exec bit, one that fails at import (trainer_preflight_command) and a GPU held by a stranger are
refused while the running trainer keeps its MainPID and InvocationID and `current` stays put."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "218"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
        "trainer_target_hosts": "all"}


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    base = tmp_path_factory.mktemp("preflight")
    conn = lab.conn_vars()
    path = base / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"pf": {"proxmox_vmid": int(CT)}}, "vars": conn}}))
    res = deploy(str(path), tree(base, "good"))
    assert res.returncode == 0, res.stdout[-3000:]
    return str(path), base


def deploy(inv_path, src, **extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    extra = dict(FAST, trainer_src=src, **extra)
    return subprocess.run(["ansible-playbook", "-i", inv_path, "deploy.yml", "-l", "pf", "-e", json.dumps(extra)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def tree(base, name):
    dst = base / name
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), dst)
    (dst / "VERSION").write_text(name + "\n")
    (dst / "fault.env").write_text("STARTUP_S=0.3\n")  # the stand-in's own knob file: a quick start
    return str(dst)


def running(lab):
    out = lab.ct(CT, "systemctl", "show", "dflash-trainer", "-p", "MainPID", "-p", "InvocationID",
                 "-p", "ActiveState").stdout
    cur = lab.ct(CT, "readlink", "/opt/dflash-trainer/current").stdout.strip()
    return out, cur


def test_release_without_exec_bit_is_refused_before_the_stop(lab, inv):
    inv_path, base = inv
    src = tree(base, "noexec")
    os.chmod(os.path.join(src, "run.sh"), 0o644)
    before = running(lab)
    res = deploy(inv_path, src)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "pre-flight refused the release" in out and "./run.sh" in out and "not executable (mode 0644)" in out, out[-3000:]
    assert running(lab) == before
    assert "ActiveState=active" in before[0]


def test_release_failing_at_import_is_refused_with_its_output(lab, inv):
    inv_path, base = inv
    src = tree(base, "import-error")
    with open(os.path.join(src, "trainer.py"), "a") as fh:
        fh.write("\nimport flash_attn_missing_module  # noqa\n")
    before = running(lab)
    res = deploy(inv_path, src, trainer_preflight_command=["python3", "-c", "import trainer"])
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "trainer_preflight_command exited with status 1" in out, out[-3000:]
    assert "ModuleNotFoundError: No module named 'flash_attn_missing_module'" in out
    assert running(lab) == before


def test_gpu_held_by_a_stranger_is_refused_before_the_stop(lab, inv):
    inv_path, base = inv
    # held until the finally below ends it (a 120 s hold ran out under a deploy that a loaded machine made slower)
    holder = subprocess.Popen(["pct", "exec", CT, "--", "python3", "-c",
                               "import fakegpu, sys, time; fakegpu.allocate(5, 5000); print('held', flush=True); "
                               "time.sleep(86400)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = running(lab)
        res = deploy(inv_path, tree(base, "stranger"))
        out = res.stdout + res.stderr
        assert res.returncode != 0
        assert "not the running trainer's" in out and "on GPU 5" in out, out[-3000:]
        assert running(lab) == before
    finally:
        holder.kill()
        holder.wait()
        lab.ct(CT, "pkill", "-f", "fakegpu.allocate")


def test_good_release_with_preflight_passes_and_restarts(lab, inv):
    inv_path, base = inv
    before = running(lab)
    res = deploy(inv_path, tree(base, "good2"), trainer_preflight_command=["python3", "-c", "import trainer"])
    assert res.returncode == 0, res.stdout[-3000:]
    after = running(lab)
    assert after != before and "ActiveState=active" in after[0]
