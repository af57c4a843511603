"""A user's regex that backtracks without end on the trainer's real lines (container 420).

The error regex below passes the controller's timing check (its adversarial lines never put a
digit run and a blank after ``step=``), yet on the example trainer's own progress line
(``step=1 loss=2.1 tok/s=41250.0 queue_target=8 queue_drafter=2``) one search would run for
ages. The restart job reads each line under a time bound: the forced restart's proof ends as a
verdict naming the regex and the line (never a job held in "proving" with its lease lapsing),
the rollback's proof the same, the trainer is left running and the deploy lock free - the next
deploy with the default regexes proves it.
"""
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.dflash.trainer.plugins.plugin_utils import _validate
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import DEFAULT_ERROR_REGEXES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CT = "420"
CATASTROPHIC = r"step=\d+ (?:[a-z_=.0-9 /]+[a-z_=.0-9 /]+)+#"
FAST = {"trainer_ready_hold_s": 2, "trainer_ready_stall_s": 2, "trainer_ready_timeout_s": 60,
        "trainer_env": {"FAKE_TRAINER_STARTUP_S": "0.3"}, "trainer_target_hosts": "all",
        "trainer_src": os.path.join(ROOT, "examples", "trainer")}


def ansible_env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


def deploy(inv, tmp, **extra):
    path = tmp / "extra.json"
    path.write_text(json.dumps(dict(FAST, **extra)))
    res = subprocess.run(["ansible-playbook", "-i", str(inv), "deploy.yml", "-l", "ct", "-e", "@%s" % path],
                         cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=600, check=False)
    return res.returncode, " ".join((res.stdout + res.stderr).split())


@pytest.fixture(scope="module")
def ct(lab, tmp_path_factory):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    tmp = tmp_path_factory.mktemp("regex-bound")
    inv = tmp / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    rc, out = deploy(inv, tmp)
    assert rc == 0 and "dflash-trainer ready: release " in out, out[-4000:]
    yield inv, tmp
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "down", "--ids", CT],
                   check=False, stdout=subprocess.DEVNULL)


def unit(lab):
    res = lab.ct(CT, "systemctl", "show", "dflash-trainer", "-p", "ActiveState", "-p", "SubState", "--value")
    return res.stdout.split()


def test_a_regex_that_hangs_on_a_real_line_ends_the_proof_naming_it_and_leaves_the_trainer_running(lab, ct):
    inv, tmp = ct
    assert _validate.slow_regexes([("trainer_error_regexes[x]", CATASTROPHIC)]) == {}  # the check cannot see it
    errors = list(DEFAULT_ERROR_REGEXES) + [CATASTROPHIC]
    label = "trainer_error_regexes[%d]" % (len(errors) - 1)
    rc, out = deploy(inv, tmp, trainer_error_regexes=errors, trainer_force_restart=True)
    assert rc != 0, out[-4000:]
    assert "the proof stopped reading the log: %s" % label in out, out[-6000:]
    assert "did not finish searching line" in out and "step=1 loss=" in out, out[-6000:]
    assert "Traceback" not in out
    # the trainer runs (the rollback started it again) and the job is over
    assert unit(lab) == ["active", "running"]
    # the lock is free and the trainer recovers: the next deploy with the default regexes proves it
    rc, out = deploy(inv, tmp, trainer_force_restart=True)
    assert rc == 0 and "dflash-trainer ready: release " in out, out[-4000:]
