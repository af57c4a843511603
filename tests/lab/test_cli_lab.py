"""The CLI that shows its work, on lab container 224 (issue 9 items 4-6): a deploy with progress
and a summary table; `logs -n 20` (this start's lines only), `logs -f` stopped with Ctrl-C after a
few lines; `deploy --check --diff` with one file changed lists it and the masked environment file,
changing nothing."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "224"
HOST = "cli"
VARS = {"trainer_target_hosts": "all", "trainer_ready_hold_s": 4, "trainer_ready_stall_s": 3,
        "trainer_ready_timeout_s": 60, "trainer_env": {"CLI_TEST_TOKEN": "s3cret-value"}}
STEP = re.compile(r"^step=(\d+) ")


@pytest.fixture(scope="module")
def ct(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    base = tmp_path_factory.mktemp("cli")
    inv = base / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {HOST: {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    src = base / "src"
    shutil.copytree(os.path.join(ROOT, "examples", "trainer"), src)
    return str(inv), src


def cli(inv, *args, timeout=300, extra=None):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    return subprocess.run([sys.executable, "-m", "dflash_trainer", *args, "-i", inv, "-l", HOST,
                           "-e", json.dumps(dict(VARS, **(extra or {})))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def deployed(lab, ct):
    inv, src = ct
    res = cli(inv, "deploy", "-e", "trainer_force_restart=true", extra={"trainer_src": str(src)}, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def test_deploy_shows_its_work(ct, deployed):
    err, out = deployed.stderr, deployed.stdout
    assert "step: Upload the code as an immutable release" in err
    assert "step: Watch the restart job" in err and "restart job: done" in err, err
    assert "FAILED - RETRYING" not in err, err  # the job's phases say what it waits for
    inv, _src = ct
    lines = out.splitlines()
    head = [line for line in lines if line.startswith("summary: deploy, ")]
    assert head and "; inventory %s (given (-i)); Ansible configuration " % inv in head[0], out
    block = lines[lines.index(head[0]) + 1:]
    assert re.match(r"^%s: PROVED \(exit 0\) in \d" % HOST, block[0]), out
    assert re.match(r"^  release \w{16}( \(was \w{16}\))?, source (git \w+|its content)", block[1]), out
    assert any(re.match(r"^  tok/s \d+", line) for line in block), out
    assert any(line.startswith("  restarted because: ") for line in block), out
    assert lines[-1] == "exit status 0: healthy / proved", out
    assert re.search(r"^  release \w+ \((content|git) \w+[^)]*\): [\d.]+K tok/s", out, re.M), out  # the comparison


def test_logs_n_20_prints_this_starts_lines(lab, ct, deployed):
    inv, _src = ct
    deadline = time.monotonic() + 60
    while True:
        res = cli(inv, "logs", "-n", "20")
        assert res.returncode == 0, res.stdout + res.stderr
        lines = res.stdout.splitlines()
        if len(lines) < 20:  # a young start: all of its lines, none of the start before it
            assert lines[0].startswith("dflash trainer starting: release="), res.stdout
        last = STEP.match(lines[-1]) if lines else None
        if last and int(last.group(1)) >= 25 or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert len(lines) == 20 and all(STEP.match(line) for line in lines), res.stdout
    steps = [int(STEP.match(line).group(1)) for line in lines]
    assert steps == list(range(steps[0], steps[0] + 20)), steps
    one = json.loads(cli(inv, "logs", "-n", "1", "--json").stdout.splitlines()[0])
    assert one["invocation"] and one["found"] and not one["ended"] and len(one["lines"]) == 1


def test_logs_follow_shows_lines_appearing_and_stops_on_ctrl_c(lab, ct, deployed):
    inv, _src = ct
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "dflash_trainer", "logs", "-f", "-n", "2", "-i", inv, "-l", HOST,
                             "-e", json.dumps(VARS)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    got, stamps = [], []
    try:
        # each batch is one ansible-playbook run (api.follow_logs): a stuck CLI's bound, not a fast machine's pace
        deadline = time.monotonic() + 300
        while len(got) < 7 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            got.append(line.rstrip("\n"))
            stamps.append(time.monotonic())
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (got, err)
    assert len(got) >= 7 and all(STEP.match(line) for line in got), (got, err)
    steps = [int(STEP.match(line).group(1)) for line in got + rest.splitlines()]
    assert steps == sorted(set(steps)), steps  # only new lines, none twice
    assert stamps[-1] - stamps[0] >= 2.0, stamps  # they appeared over time, not in one read


def test_check_diff_lists_the_changed_file_and_masks_the_environment(lab, ct, deployed):
    inv, src = ct
    before = lab.ct(CT, "readlink", "/opt/dflash-trainer/current").stdout.strip()
    with open(os.path.join(str(src), "trainer.py"), "a") as f:
        f.write("# one more line\n")
    res = cli(inv, "deploy", "--check", "--diff",
              extra={"trainer_src": str(src), "trainer_env": {"CLI_TEST_TOKEN": "n3w-s3cret", "NEW_KEY": "x1"}})
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert re.search(r"^release \w{16} → \w{16}: 0 added, 0 removed, 1 modified$", out, re.M), out
    assert re.search(r"^M trainer\.py \([\d.]+ KiB → [\d.]+ KiB\)$", out, re.M), out
    assert "+CLI_TEST_TOKEN=********" in out or "CLI_TEST_TOKEN=********" in out, out
    assert "+NEW_KEY=********" in out, out
    assert "s3cret" not in out + res.stderr and "x1\n" not in out
    assert lab.ct(CT, "readlink", "/opt/dflash-trainer/current").stdout.strip() == before  # nothing changed


def test_stop_and_start_through_the_cli(lab, ct, deployed):
    """stop: the unit stopped on purpose (exit 0); start: started and proved again (exit 0, PROVED)."""
    inv, _src = ct
    res = cli(inv, "stop", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"^%s: STOPPED \(exit 0\)" % HOST, res.stdout, re.M), res.stdout
    assert lab.ct(CT, "systemctl", "is-active", "dflash-trainer", check=False).stdout.strip() != "active"
    res = cli(inv, "start", "--json", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["exit_code"] == 0 and out["hosts"][HOST]["summary"]["verdict"] == "proved", res.stdout
    assert lab.ct(CT, "systemctl", "is-active", "dflash-trainer", check=False).stdout.strip() == "active"
