"""The trainer_group action (plugins/action/trainer_group.py): every group decision the role carries out, made on
the controller from what every member registered - and where the group stops, it fails by itself with the words."""
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.template import Templar

from ansible_collections.dflash.trainer.plugins.action.trainer_group import ActionModule

M = ["g0", "g1"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(me, hostvars, check_mode=False, play_hosts=None, **args):
    task = Task()
    task.args = args
    context = PlayContext()
    context.check_mode = check_mode
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent"))  # no remote call: no tmp
    action = ActionModule(task, connection, context, DataLoader(), Templar(loader=DataLoader()), None)
    hosts = list(play_hosts if play_hosts is not None else M)
    task_vars = dict(hostvars.get(me, {}), hostvars=hostvars, inventory_hostname=me, groups={"tg": M},
                     ansible_play_hosts=hosts, ansible_play_hosts_all=hosts)
    return action.run(task_vars=task_vars)


def members(**each):
    return dict((m, dict({"trainer_group": "tg", "group_names": ["tg"]}, **each.get(m, {}))) for m in M)


def first_read(upload):
    return {"__trainer_status_before": {"plan": {"release": "r2", "current": "r1", "last_good": "r1",
                                                 "reasons": ["release switched to r2"], "upload": upload}}}


def test_the_plan_is_the_groups_with_each_members_part_and_refuses_by_itself():
    hv = members(g0=first_read(True), g1=first_read(False))
    g0 = run("g0", hv, kind="plan", results="__trainer_status_before", lock_token="tok")
    assert g0["restart"] and g0["upload_here"] and not g0.get("failed") and g0["job_ids"]["restart"].startswith("tok-")
    assert run("g1", hv, kind="plan", results="__trainer_status_before")["upload_here"] is False
    said = run("g0", hv, check_mode=True, kind="plan", results="__trainer_status_before")
    assert said["says"] and said["words"].startswith("would restart trainer group tg on r2")
    split = members(g0=first_read(True), g1={"__trainer_status_before": {"plan": {"release": "r3"}}})
    out = run("g0", split, kind="plan", results="__trainer_status_before")
    assert out["failed"] and "different releases (r2, r3)" in out["msg"]
    gone = run("g0", members(g0=first_read(True), g1={}), kind="plan", results="__trainer_status_before",
               then="nothing was changed on any member")
    assert gone["failed"] and gone["msg"].endswith("g1: did not reach this phase; nothing was changed on any member")


def test_a_plan_says_each_members_first_read_report_before_its_own_words():
    hv = members(g0=first_read(True), g1=first_read(False))
    for m in M:
        hv[m]["__trainer_status_before"]["plan"].update(reasons=[], current="r2", upload=False)
    hv["g1"]["__trainer_status_before"]["report"] = ["last restart job j1: proved release r2"]
    g0, g1 = (run(m, hv, kind="plan", results="__trainer_status_before") for m in M)
    assert g0["msg"] == "trainer group tg left running: release r2 on every member"
    assert g1["msg"] == ["last restart job j1: proved release r2",
                         "trainer group tg left running: release r2 on every member"]
    hv["g1"]["__trainer_status_before"]["plan"].update(reasons=["trainer not running"])
    restart = run("g1", hv, kind="plan", results="__trainer_status_before")
    assert restart["restart"] and restart["msg"] == ["last restart job j1: proved release r2"]  # no words of its own
    assert "msg" not in run("g0", hv, kind="plan", results="__trainer_status_before")


def test_stray_refuses_by_itself():
    hv = members(g1={"trainer_group": ""})
    stray = run("g1", hv, kind="stray")
    assert stray["alone"] and stray["failed"] and "trainer_group is empty" in stray["msg"]
    assert run("g0", hv, kind="stray") == {"alone": False, "refused": None, "changed": False}


def test_the_end_fails_with_the_verdicts_failure_or_the_watchs_barrier_and_passes_a_group_that_stayed_up():
    watch = dict(kind="end", results="__w", phase="the watch (trainer_watch_s=60)", health=True)
    up = {"health": {"ok": True}, "watched_s": 60.0}
    died = {"health": {"ok": False, "words": "restarted by systemd (NRestarts 1)"}, "watched_s": 12.5}
    hv = members(g0={"__w": up, "__trainer_group_done": {"fail": False, "watch": True}},
                 g1={"__w": died, "__trainer_group_done": {"fail": False, "watch": True}})
    for me in M:
        out = run(me, hv, **watch)
        assert out["failed"] and out["msg"] == ("trainer group: the watch (trainer_watch_s=60) failed on 1 of 2 members "
                                                "- g1: did not stay up for 12.5 s after the group's proof: restarted "
                                                "by systemd (NRestarts 1)")
    hv["g1"]["__w"] = up
    assert not run("g1", hv, **watch).get("failed")
    failure = "trainer group: 1 of 2 members failed their proof - g1: exited 1. Every member was put back on release r1"
    for m in M:
        hv[m]["__trainer_group_done"] = {"fail": True, "failure": failure}
        hv[m]["__w"] = {"skipped": True}
    out = run("g0", hv, **watch)
    assert out["failed"] and out["msg"] == failure
    # a rollback that ran ends the run with its own words (the restart's verdict and what the rollback left)
    rolled = failure + " and proved again (trainer group: every member (g0, g1) proved)."
    for m in M:
        hv[m]["__trainer_group_done"] = {"fail": False, "rollback": True, "failure": ""}
        hv[m]["__trainer_group_rollback"] = {"fail": True, "failure": rolled}
    assert run("g1", hv, **watch)["msg"] == rolled
    for m in M:  # a rollback that did not run registered its skip: the restart's verdict ends the run
        hv[m]["__trainer_group_done"] = {"fail": True, "failure": failure}
        hv[m]["__trainer_group_rollback"] = {"skipped": True, "skip_reason": "Conditional result was False"}
    assert run("g1", hv, **watch)["msg"] == failure
    with pytest.raises(AnsibleActionFail, match="kind must be one of stray, plan, end"):
        run("g0", hv, kind="verdict")


PLAYBOOK = """
- hosts: tg
  gather_facts: false
  tasks:
    - name: Read every member
      ansible.builtin.set_fact:
        __trainer_status_before: {plan: {release: r2, current: r2, last_good: r2, reasons: [], upload: false}}
    - name: Plan the group
      dflash.trainer.trainer_group:
        kind: plan
        results: __trainer_status_before
      register: __trainer_group_plan
    - name: Carry the plan out
      ansible.builtin.assert:
        that: __trainer_group_plan.no_op and not __trainer_group_plan.restart
        quiet: true
"""


@pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="needs ansible-playbook")
def test_a_plan_with_words_says_them_alone_and_registers_the_whole_answer(tmp_path):
    """Through the checkout's stdout callback: the words, as a debug task would show them, not the plan's fields."""
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "children": {"tg": {"hosts": {"g0": {}, "g1": {}}, "vars": {"trainer_group": "tg"}}},
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "local"))
    proc = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    for member in ("g0", "g1"):
        said = "ok: [%s] => \n    msg: 'trainer group tg left running: release r2 on every member'\n" % member
        assert said in out, out
    assert "job_ids" not in out and "upload_here" not in out, out
