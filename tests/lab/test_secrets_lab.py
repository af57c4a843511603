"""A secret planted in trainer_env (issue 8 item 4) reaches the trainer's environment and appears in
none of: ansible-playbook -vvv output, the container's journal, the release directory,
ansible-runner's artifacts, the CLI's --json. Lab container 226."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "226"
SECRET = "hf_s3cr3t_%s" % os.getpid()


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    path = tmp_path_factory.mktemp("secret") / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"sec": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    return str(path)


def extra():
    return {"trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer"),
            "trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 30,
            "trainer_force_restart": True,
            "trainer_env": {"HF_TOKEN": SECRET, "FAKE_TRAINER_STARTUP_S": "0.3"},
            "trainer_preflight_command": ["python3", "-c", "import os; assert os.environ['HF_TOKEN']"]}


def test_secret_is_used_but_never_shown(lab, inv, tmp_path):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    vars_file = tmp_path / "extra.json"
    vars_file.write_text(json.dumps(extra()))
    res = subprocess.run(["ansible-playbook", "-vvv", "-i", inv, "deploy.yml", "-l", "sec", "-e", "@%s" % vars_file],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-3000:]
    assert SECRET not in res.stdout + res.stderr

    # the trainer really has it
    pid = lab.ct(CT, "systemctl", "show", "dflash-trainer", "-p", "MainPID", "--value").stdout.strip()
    assert SECRET.encode() in subprocess.run(["pct", "exec", CT, "--", "cat", "/proc/%s/environ" % pid],
                                             capture_output=True, check=True).stdout
    journal = lab.ct(CT, "journalctl", "--no-pager", "-o", "cat").stdout
    assert journal and SECRET not in journal
    found = lab.ct(CT, "grep", "-rl", SECRET, "/opt/dflash-trainer", "/workspace", "/run/dflash-trainer",
                   "/usr/local/lib/dflash-trainer")
    assert found.stdout.strip() == "", found.stdout

    # ansible-runner's artifacts and the CLI's --json
    private = tmp_path / "runner"
    private.mkdir()
    out = subprocess.run([sys.executable, "-c", (
        "import json, sys, dflash_trainer; r = dflash_trainer.deploy(limit='sec', inventory=sys.argv[1], "
        "extravars=json.load(open(sys.argv[2])), private_data_dir=sys.argv[3]); print(json.dumps(r.to_dict()))"),
        inv, str(vars_file), str(private)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        check=False)
    assert out.returncode == 0 and json.loads(out.stdout)["ok"], out.stdout[-2000:] + out.stderr[-2000:]
    assert SECRET not in out.stdout + out.stderr
    leaked = subprocess.run(["grep", "-rl", SECRET, str(private)], capture_output=True, text=True, check=False)
    assert leaked.stdout.strip() == "", leaked.stdout
    cli = subprocess.run([sys.executable, "-m", "dflash_trainer", "deploy", "-i", inv, "-l", "sec", "-e",
                          "@%s" % vars_file, "--json"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert cli.returncode == 0, cli.stdout[-2000:] + cli.stderr[-2000:]
    assert SECRET not in cli.stdout + cli.stderr


def test_a_printed_secret_is_masked_in_output_state_and_ledger(lab, inv, tmp_path):
    """Issue 13 item 6: a pre-flight that prints its token, then a trainer that fails printing it:
    the play's output says *** instead; the job state file and the ledger hold no secret and are 0600."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")

    def play(**changes):
        vars_file = tmp_path / "extra.json"
        vars_file.write_text(json.dumps(dict(extra(), **changes)))
        return subprocess.run(["ansible-playbook", "-i", inv, "deploy.yml", "-l", "sec", "-e", "@%s" % vars_file],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)

    res = play(trainer_preflight_command=["sh", "-c", "echo using token $HF_TOKEN; exit 1"])
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "trainer_preflight_command exited with status 1" in out, out[-3000:]
    assert "using token ***" in out and SECRET not in out

    res = play(trainer_command=["sh", "-c", "echo auth with $HF_TOKEN; echo RuntimeError: token $HF_TOKEN refused; exit 1"],
               trainer_preflight_command=[])
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "RuntimeError: token *** refused" in out, out[-3000:]
    assert SECRET not in out
    for path in ("/var/lib/dflash-trainer/restart.json", "/opt/dflash-trainer/ledger.json"):
        mode = lab.ct(CT, "stat", "-c", "%a", path).stdout.strip()
        assert mode == "600", (path, mode)
        text = lab.ct(CT, "cat", path).stdout
        assert "***" in text and SECRET not in text, path
    # the release was the last good one, its new command failed: the job put back the configuration
    # it was proved with (the unit, whose ExecStart holds the command) and proved it again - never a
    # stopped trainer; status says it runs, healthy, with no secret in what it shows
    assert "runs again with the configuration it was proved with (unit file restored)" in out, out[-3000:]
    unit = lab.ct(CT, "cat", "/etc/systemd/system/dflash-trainer.service").stdout
    assert "RuntimeError: token" not in unit and "run.sh" in unit
    status = subprocess.run(["ansible-playbook", "-i", inv, "playbooks/status.yml", "-l", "sec", "-e",
                             "trainer_target_hosts=all"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert status.returncode == 0 and "active/running" in status.stdout, status.stdout[-2000:]
    assert SECRET not in status.stdout + status.stderr
