"""The wait speaks (lab container 461): a restart whose trainer takes longer to start than the first
watch shows, in ansible-playbook's own output, each phase of its restart job once and in order as it
begins, what the proof waits for, and its end - never Ansible's "FAILED - RETRYING" of an until
loop; the checkout's ansible.cfg (stdout callback dflash.trainer.concise) leaves out the tasks the run
skipped and prints the watch's banner before its lines."""
import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.lab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CT = "461"
PHASES = ["stopping", "draining", "purging", "starting", "proving", "done"]


def deploy(inv, tmp, **extra):
    path = tmp / "extra.json"
    path.write_text(json.dumps(dict({
        "trainer_target_hosts": "all", "trainer_ready_hold_s": 3, "trainer_ready_stall_s": 3,
        "trainer_src": os.path.join(ROOT, "examples", "trainer")}, **extra)))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(["ansible-playbook", "-i", str(inv), "deploy.yml", "-l", "ct", "-e", "@%s" % path],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_a_restart_says_each_phase_once_in_order_and_never_failed_retrying(lab, tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "lab.py"), "up", "--fresh", "--ids", CT],
                   check=True, stdout=subprocess.DEVNULL)
    inv = tmp_path / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"ct": {"proxmox_vmid": int(CT)}}, "vars": lab.conn_vars()}}))
    # the trainer takes 12 s to start: longer than the first watch (10 s, riding with the job's start),
    # so the watch task runs too - on any machine, however fast
    res = deploy(inv, tmp_path, trainer_env={"FAKE_TRAINER_STARTUP_S": "12"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    said = re.findall(r"^\[ct\] restart job: (\w[\w ]*?)(?: \(at [\d.]+ s\))?$", out, re.M)
    assert [s for s in said if s in PHASES] == PHASES, out[-4000:]  # each once, in order
    assert re.search(r"^\[ct\] restart job: proving: waiting for: .*\([\d.]+ s of 900\)$", out, re.M), out[-4000:]
    assert re.search(r"^\[ct\] restart job: ended: ready: release \w+ proved \(pid \d+, step \d+", out, re.M), \
        out[-4000:]
    assert "Watch the restart job" in out  # the watch task ran: its lines are its own, not a start's
    assert "FAILED - RETRYING" not in out
    # the lines come under the watch task's own banner, in order: banner, then its lines
    assert out.index("Watch the restart job") < out.rindex("[ct] restart job: done")
    # a task the run skipped is left out (this one is skipped on every host of no trainer group)
    assert "Leave a member of a trainer group to its group's play" not in out, out[-4000:]
    assert out.count("skipping:") <= 3, out  # only under the banner of a task that speaks
