"""The experiment is the unit of history, on lab container 287: a deploy, then a deploy of the same
release with one trainer_env value changed. The second is not a no-op (it restarts), the ledger keeps
two entries of the one release with different configuration ids and no value of the environment, and
`history` shows both, the second compared with the first ("config B vs A ... command or environment
changed"). A third deploy of the same configuration changes nothing and adds no entry."""
import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "287"
SECRET = "hf_lab_experiment_token"
ENV = {"HF_TOKEN": SECRET, "EXPERIMENT_LR": "3e-4"}  # the knob: a value the trainer's own code would read
FAST = {"trainer_ready_hold_s": 4, "trainer_ready_stall_s": 3, "trainer_ready_timeout_s": 40,
        "trainer_target_hosts": "all", "trainer_src": os.path.join(ROOT, "examples", "trainer"),
        "trainer_min_tokps_ratio": 0.9, "trainer_purge_inductor_cache": False}  # the purge is not what is tested


@pytest.fixture(scope="module")
def inv(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    lab.ct(CT, "rm", "-rf", "/opt/dflash-trainer")  # a ledger of this test's deploys only
    path = tmp_path_factory.mktemp("experiments") / "hosts.json"
    path.write_text(json.dumps({"all": {"hosts": {"exp": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    return str(path)


def playbook(inv_path, name, env, **extra):
    # results as JSON: a long line is printed whole (the YAML form folds it)
    proc_env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                    ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inv_path, name,
                           "-l", "exp", "-e", json.dumps(dict(FAST, trainer_env=env, **extra))],
                          cwd=ROOT, env=proc_env, capture_output=True, text=True, timeout=300, check=False)


def ledger(lab):
    res = lab.ct(CT, "cat", "/opt/dflash-trainer/ledger.json")
    return (json.loads(res.stdout)["entries"], res.stdout) if res.returncode == 0 else ([], "")


def test_an_environment_only_deploy_is_an_entry_of_its_own_compared_with_the_one_before(lab, inv):
    res = playbook(inv, "deploy.yml", ENV)
    assert res.returncode == 0, res.stdout[-3000:]
    (first,), _rest = ledger(lab)
    assert first["verdict"] == "proved" and re.fullmatch(r"[0-9a-f]{8}", first["config"]), first

    # the same release, one value changed: the first read says restart (the environment file differs)
    res = playbook(inv, "deploy.yml", dict(ENV, EXPERIMENT_LR="1e-4"))
    assert res.returncode == 0, res.stdout[-3000:]
    assert "left running" not in res.stdout, res.stdout[-3000:]
    entries, text = ledger(lab)
    assert len(entries) == 2, text
    second = entries[1]
    assert second["release"] == first["release"] and second["verdict"] == "proved"
    assert re.fullmatch(r"[0-9a-f]{8}", second["config"]) and second["config"] != first["config"]
    words = "config %s vs %s (command or environment changed)" % (second["config"], first["config"])
    said = " ".join(res.stdout.split())
    assert words in said and "previous %s: " % first["release"] in said, res.stdout[-3000:]
    # the values are in no entry (the ids are keyed hashes; the key is root's alone, beside the values)
    assert SECRET not in text and "3e-4" not in text and "1e-4" not in text
    key = lab.ct(CT, "stat", "-c", "%a %u", "/opt/dflash-trainer/config.key").stdout.split()
    assert key == ["600", "0"], key

    # history: two rows of the one release, the newer compared with the older
    res = playbook(inv, "playbooks/history.yml", dict(ENV, EXPERIMENT_LR="1e-4"))
    assert res.returncode == 0, res.stdout[-3000:]
    lines = [ln.strip().strip('",') for ln in res.stdout.splitlines() if first["release"] in ln]
    rows = [ln for ln in lines if re.match(r"%s\s+[0-9a-f?]{1,8}\s" % first["release"], ln)]
    assert [r.split()[1] for r in rows] == [second["config"], first["config"]], res.stdout[-3000:]
    assert "(config %s vs %s: " % (second["config"], first["config"]) in rows[0]
    assert "command or environment changed)" in rows[0] and "<- running, current" in rows[0]
    assert "running" not in rows[1]  # the running mark is on the installed configuration's row only
    assert "RELEASE           CONFIG    WHEN" in res.stdout

    # the same configuration again: the no-op (one remote call), no new entry
    res = playbook(inv, "deploy.yml", dict(ENV, EXPERIMENT_LR="1e-4"))
    assert res.returncode == 0 and "left running" in res.stdout, res.stdout[-3000:]
    assert len(ledger(lab)[0]) == 2
