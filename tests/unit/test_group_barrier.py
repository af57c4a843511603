"""A trainer group's barriers folded into the task after them (group_barrier: plugin_utils/_group.py), and the
group's other judgements folded into the tasks that carry them out - each judged on the controller before the task
does anything: a failed member's previous result fails the next task on every member with the barrier's words
and runs nothing, even where the task ignores its own failures; a group not whole is refused by its input check;
the check after the jobs is skipped unless every member's job proved it; the task that marks the group's release
good carries the group's verdict and runs only when it says good."""
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

from ansible_collections.dflash.trainer.plugins.action import trainer_install, trainer_plan, trainer_restart
from ansible_collections.dflash.trainer.plugins.action import trainer_validate
from ansible_collections.dflash.trainer.plugins.plugin_utils._group import after_job, end_failure, judged, verdict

from role_tasks import tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
M = ["g0", "g1"]
ACTIONS = {"dflash.trainer.trainer_plan": trainer_plan.ActionModule,
           "dflash.trainer.trainer_install": trainer_install.ActionModule,
           "dflash.trainer.trainer_restart": trainer_restart.ActionModule,
           "dflash.trainer.trainer_validate": trainer_validate.ActionModule}
PROVED = {"started": True, "finished": True, "result": {"ok": True, "outcome": "step 9 at 12 s"}}
DIED = {"started": True, "finished": True, "result": {"ok": False, "msg": "exited 1\nTraceback"}}


def group_tasks():
    with open(os.path.join(ROOT, "roles", "trainer", "tasks", "group.yml")) as fh:
        return list(tasks(yaml.safe_load(fh)))


def folded(key):
    """(task name, action, args) of every task of group.yml whose group_barrier has ``key``."""
    out = []
    for task in group_tasks():
        action = next((k for k in task if k in ACTIONS), None)
        if action and key in (task[action].get("group_barrier") or {}):
            out.append((task["name"], action, dict(task[action])))
    return out


class Display(object):
    def __init__(self):
        self.lines = []

    def display(self, line, **_kw):
        self.lines.append(line)

    def warning(self, line, **_kw):
        self.lines.append(line)


def action_of(name, args, me, hostvars, check_mode=False, play_hosts=None, ignore_errors=True, extra=None):
    """The action of ``name`` for member ``me`` -> (action, task_vars, calls): ``calls`` records every module the
    action runs (an answer from ``extra['module']``, else nothing may run)."""
    task = Task()
    task.args = dict(args)
    task.ignore_errors = ignore_errors
    context = PlayContext()
    context.check_mode = check_mode
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent"), has_native_async=False)
    action = ACTIONS[name](task, connection, context, DataLoader(), Templar(loader=DataLoader()), None)
    calls = []

    def execute(module_name=None, module_args=None, task_vars=None, **_kw):
        calls.append((module_name, dict(module_args or action._task.args)))
        if extra is None or "module" not in extra:
            raise AssertionError("the module ran: %s" % (module_args or action._task.args,))
        return dict(extra["module"])

    action._execute_module = execute
    hosts = list(play_hosts if play_hosts is not None else M)
    task_vars = dict(hostvars.get(me, {}), hostvars=hostvars, inventory_hostname=me, groups={"tg": M},
                     ansible_play_hosts=hosts, ansible_play_hosts_all=hosts, **(extra or {}).get("vars", {}))
    return action, task_vars, calls


def members(**each):
    return dict((m, dict({"trainer_group": "tg", "group_names": ["tg"]}, **each.get(m, {}))) for m in M)


# ---- judged: pure ----------------------------------------------------------------------------------------------

def _registered(hostvars):
    return lambda var: dict((m, hostvars[m].get(var) or {}) for m in hostvars)


def test_a_barrier_a_member_failed_stops_with_its_words_and_one_every_member_passed_goes_on():
    spec = {"results": "__r", "phase": "the upload", "then": "nothing was stopped on any member"}
    hv = {"g0": {"__r": {"changed": True}}, "g1": {"__r": {"failed": True, "msg": "no space left\nmore"}}}
    out = judged(spec, "tg", "g0", M, _registered(hv), alive=M)
    assert out["stop"] == ("trainer group: the upload failed on 1 of 2 members - g1: no space left; "
                           "nothing was stopped on any member")
    assert out["fields"]["barrier"]["members"] == ["g1"] and out["skip"] is None
    hv["g1"]["__r"] = {"skipped": True}  # a member with nothing to do in the phase passed it
    assert judged(spec, "tg", "g0", M, _registered(hv), alive=M)["stop"] is None
    gone = judged(spec, "tg", "g0", M, _registered({"g0": hv["g0"]}), alive=["g0"])
    assert gone["stop"].startswith("trainer group: the upload failed on 1 of 2 members - g1: not in this run")
    left = judged(spec, "tg", "g0", M, _registered(hv), alive=["g0"])
    assert "g1: left the run (a task failed or it became unreachable)" in left["stop"]


def test_a_group_not_whole_or_with_a_stray_host_stops_before_anything():
    out = judged({"whole": True}, "tg", "g0", M, _registered({}), in_run=["g0"], own={"g0": "tg", "g1": "tg"})
    assert out["stop"] == ("trainer group tg is deployed as one: g1 is not in this run (--limit, or unreachable); "
                           "run it on the whole group (-l tg); nothing was changed")
    stray = judged({"whole": True}, "tg", "g0", M, _registered({}), in_run=M, own={"g0": "tg", "g1": ""})
    assert "g1 is in its inventory group but its trainer_group is empty" in stray["stop"]
    assert judged({"whole": True}, "tg", "g0", M, _registered({}), in_run=M, own={"g0": "tg", "g1": "tg"}) == \
        {"stop": None, "skip": None, "fields": {}}


def test_the_check_after_the_jobs_is_skipped_unless_every_members_job_proved_it():
    spec = {"results": "__trainer_group_relock", "phase": "taking the lock back", "jobs": True}
    hv = {"g0": {"__trainer_group_relock": {}, "__trainer_job_start": PROVED},
          "g1": {"__trainer_group_relock": {}, "__trainer_job_start": DIED}}
    for m in M:
        hv[m]["__trainer_group_relock"] = {"changed": False, "lock_holder": "play"}
    out = judged(spec, "tg", "g0", M, _registered(hv), alive=M)
    assert out["stop"] is None and out["skip"].startswith("not every member's job proved it (")
    assert "g1: exited 1" in out["skip"]
    hv["g1"]["__trainer_job_watch"] = PROVED  # the watch's outcome counts over the call that started the job
    assert judged(spec, "tg", "g0", M, _registered(hv), alive=M) == \
        {"stop": None, "skip": None, "fields": {"barrier": {"failed": False, "members": [],
                                                            "words": "trainer group: every member passed taking "
                                                                     "the lock back"}}}


def test_the_verdict_is_the_groups_on_every_job_and_check_and_says_what_follows():
    hv = {m: {"__trainer_job_start": PROVED, "__trainer_group_check": {"still": {"ok": True}}} for m in M}
    mine = {"plan": {"release": "r2", "rollback_release": "r1"}, "unit": "dflash-trainer", "watch_s": 60}
    out = judged({"verdict": "restart"}, "tg", "g0", M, _registered(hv), alive=M, mine=mine)
    assert out["stop"] is None and out["skip"] is None
    fields = out["fields"]
    assert fields["good"] and fields["report"] and fields["watch"] and not (fields["rollback"] or fields["fail"])
    assert fields["said"] == ["trainer group: every member (g0, g1) proved: release r2",
                              "dflash-trainer ready: step 9 at 12 s"]
    hv["g1"]["__trainer_group_check"] = {"still": {"ok": False, "msg": "the main pid 42 proved is gone"}}
    back = judged({"verdict": "restart"}, "tg", "g0", M, _registered(hv), alive=M, mine=mine)
    assert back["skip"].startswith("nothing to mark good: trainer group: 1 of 2 members no longer ran")
    assert back["fields"]["rollback"] and not back["fields"]["good"] and back["fields"]["members"] == ["g1"]
    # the rollback's verdict ends the run, saying what the restart's was and what runs now
    hv["g1"]["__trainer_group_check"] = {"still": {"ok": True}}
    mine["done"] = back["fields"]
    rolled = judged({"verdict": "rollback"}, "tg", "g0", M, _registered(hv), alive=M, mine=mine)["fields"]
    assert rolled["good"] and rolled["fail"] and not rolled["report"]
    assert rolled["failure"].startswith("trainer group: 1 of 2 members no longer ran what was proved")
    assert "Every member was put back on release r1 and proved again" in rolled["failure"]
    # the fields are after_job's, over verdict's judgement of every member's job and check
    hv["g1"]["__trainer_group_check"] = {"still": {"ok": True}}
    fields = judged({"verdict": "restart"}, "tg", "g0", M, _registered(hv), mine=mine)["fields"]
    judged_jobs = verdict(M, {m: PROVED for m in M}, {m: {"still": {"ok": True}} for m in M})
    assert dict((k, v) for k, v in fields.items() if k != "said") == after_job("restart", judged_jobs, "r1", None, 60)


def test_the_run_ends_with_the_rollbacks_words_when_it_ran_else_the_restarts():
    restart = {"fail": True, "failure": "trainer group: ... every member was stopped."}
    assert end_failure(restart, {"skipped": True}) == restart["failure"]
    assert end_failure(dict(restart, fail=False, rollback=True), {"fail": True, "failure": "rolled back"}) == \
        "rolled back"
    assert end_failure({"fail": False, "watch": True}, {"skipped": True}) is None
    assert end_failure({"fail": False}, {}) is None


# ---- every folded barrier of group.yml, through its action -------------------------------------------------------

BARRIERS = folded("results")


def test_every_barrier_of_the_group_is_folded_into_a_task_after_it():
    phases = [args["group_barrier"]["phase"] for _name, _action, args in BARRIERS]
    assert phases == ["taking the lock", "the upload", "the pre-flight", "the install", "taking the lock back",
                      "taking the lock back"]
    assert [n for n, _a, _args in folded("whole")] and len(folded("verdict")) == 2


@pytest.mark.parametrize("name, action, args", BARRIERS, ids=[b[2]["group_barrier"]["phase"] + ": " + b[0][:40]
                                                              for b in BARRIERS])
def test_a_failed_members_previous_result_fails_the_next_task_with_the_barriers_words_and_runs_nothing(
        name, action, args):
    spec = args["group_barrier"]
    args["group_barrier"] = dict(spec, holder="play") if "holder" in spec else spec
    var = spec["results"]
    hv = members(g0={var: {"changed": True}}, g1={var: {"failed": True, "msg": "boom\nTraceback"}})
    words = "trainer group: %s failed on 1 of 2 members - g1: boom; %s" % (spec["phase"], spec["then"])
    for me in M:
        act, task_vars, calls = action_of(action, args, me, hv)
        out = act.run(task_vars=task_vars)
        assert out["failed"] is True and out["msg"] == words, (name, out)
        assert calls == [] and "group_barrier" not in act._task.args
        # the task ignores its own failures (judged by the barrier after it): never this one
        assert act._task.ignore_errors is False
        assert out.get("lock_holder") == ("play" if "holder" in spec else None)


def test_a_barrier_every_member_passed_lets_the_task_run_as_without_it():
    (name, action, args), = [b for b in BARRIERS if b[1] == "dflash.trainer.trainer_install"]
    var = args["group_barrier"]["results"]
    hv = members(g0={var: {"changed": True}}, g1={var: {"skipped": True}})
    act, task_vars, calls = action_of(action, args, "g1", hv, extra={"module": {"changed": True, "unit_changed": True}})
    out = act.run(task_vars=task_vars)
    assert not out.get("failed") and out == {"changed": True, "unit_changed": True}, (name, out)
    assert len(calls) == 1 and "group_barrier" not in calls[0][1] and act._task.ignore_errors is True


def _jobs(g1_job, g1_check=None):
    hv = members(g0={"__trainer_group_relock": {"changed": False}, "__trainer_job_start": PROVED},
                 g1={"__trainer_group_relock": {"changed": False}, "__trainer_job_start": g1_job})
    for m in M:
        hv[m]["__trainer_group_check"] = {"still": {"ok": True}}
        hv[m]["__trainer_group_plan"] = {"release": "r2", "rollback_release": "r1"}
    if g1_check is not None:
        hv["g1"]["__trainer_group_check"] = g1_check
    return hv


def test_the_check_runs_only_once_every_members_job_proved_it():
    for _name, action, args in folded("jobs"):
        act, task_vars, calls = action_of(action, args, "g0", _jobs(DIED))
        out = act.run(task_vars=task_vars)
        assert out["skipped"] is True and "g1: exited 1" in out["skip_reason"] and calls == []
        act, task_vars, calls = action_of(action, args, "g0", _jobs(PROVED), extra={"module": {"still": {"ok": True}}})
        out = act.run(task_vars=task_vars)
        assert out["still"] == {"ok": True} and [c[1]["operation"] for c in calls] == ["check"]


def test_the_task_that_marks_the_release_good_carries_the_verdict_and_runs_only_when_it_says_good():
    (_n, action, restart), (_m, _a, rollback) = folded("verdict")
    display = Display()
    trainer_restart.display, saved = display, trainer_restart.display
    try:
        unit = {"vars": {"trainer_unit_name": "dflash-trainer", "trainer_watch_s": 0}}
        act, task_vars, calls = action_of(action, restart, "g0", _jobs(PROVED),
                                          extra=dict(unit, module={"changed": True, "release": "r2"}))
        out = act.run(task_vars=task_vars)
        assert out["good"] and out["report"] and not (out["rollback"] or out["stop"] or out["fail"] or out["watch"])
        assert out["release"] == "r2" and [c[1]["operation"] for c in calls] == ["good"]
        assert display.lines == ["[g0] trainer group: every member (g0, g1) proved: release r2",
                                 "[g0] dflash-trainer ready: step 9 at 12 s"]
        act, task_vars, calls = action_of(action, restart, "g0", _jobs(DIED), extra=unit)
        back = act.run(task_vars=task_vars)
        assert back["skipped"] and back["rollback"] and not back["good"] and calls == []
        assert back["words"] == "trainer group: 1 of 2 members failed their proof - g1: exited 1"
        hv = _jobs(PROVED, g1_check={"still": {"ok": False, "msg": "GPU 1 no longer held"}})
        for m in M:
            hv[m]["__trainer_group_done"] = back
        act, task_vars, calls = action_of(action, rollback, "g1", hv, extra=unit)
        worse = act.run(task_vars=task_vars)
        assert worse["skipped"] and worse["fail"] and calls == []
        assert worse["failure"] == ("trainer group: 1 of 2 members failed their proof - g1: exited 1. The rollback to "
                                    "release r1 failed too - trainer group: 1 of 2 members no longer ran what was "
                                    "proved when every member was proved - g1: proved by its own job, then at the "
                                    "group's check: GPU 1 no longer held: each member is left as its rollback job "
                                    "ended.")
    finally:
        trainer_restart.display = saved


def _validated_vars():
    with open(os.path.join(ROOT, "roles", "trainer", "defaults", "main.yml")) as fh:
        variables = yaml.safe_load(fh)
    variables.update(trainer_src=os.path.join(ROOT, "examples", "trainer"), ansible_connection="dflash.trainer.pct",
                     proxmox_vmid=200, trainer_group="tg", groups={"tg": M}, inventory_hostname="g0")
    return variables


def test_a_group_not_whole_in_this_run_is_refused_by_its_input_check():
    (_name, action, args), = folded("whole")
    args = dict(args, variables=_validated_vars())
    args.pop("lock_token", None)
    act, task_vars, _calls = action_of(action, args, "g0", members(), play_hosts=["g0"])
    out = act.run(task_vars=task_vars)
    assert out["failed"] and out["msg"].startswith("trainer group tg is deployed as one: g1 is not in this run")
    act, task_vars, _calls = action_of(action, args, "g0", members())
    out = act.run(task_vars=task_vars)
    assert not out.get("failed") and out["problems"] == [] and out["lock_token"], out
    bad = dict(args, variables=dict(_validated_vars(), trainer_unit_name="x.service"))
    act, task_vars, _calls = action_of(action, bad, "g0", members(), play_hosts=["g0"])
    out = act.run(task_vars=task_vars)  # the inputs first: their words, not the group's
    assert out["failed"] and "trainer_unit_name" in out["msg"] and "deployed as one" not in out["msg"]


@pytest.mark.parametrize("bad, words", [
    ("x", "must be a dict"), ({"result": "__r"}, "unknown key(s) result"), ({"verdict": "both"}, "verdict must be"),
    ({"jobs": True}, "jobs needs results"),
])
def test_a_bad_group_barrier_is_refused_with_words(bad, words):
    act, task_vars, calls = action_of("dflash.trainer.trainer_install", {"group_barrier": bad}, "g0", members())
    with pytest.raises(AnsibleActionFail) as exc:
        act.run(task_vars=task_vars)
    assert str(exc.value).startswith("group_barrier") and words in str(exc.value) and calls == []


PLAYBOOK = """
- hosts: tg
  gather_facts: false
  tasks:
    - name: The phase (g1 fails it, ignored - judged by the barrier after it)
      ansible.builtin.set_fact:
        __phase: "{{ {'failed': true, 'msg': 'no space left'} if inventory_hostname == 'g1' else {'changed': true} }}"
    - name: The next phase, its barrier first
      dflash.trainer.trainer_install:
        unit: u
        unit_path: /nonexistent/u.service
        unit_content: ""
        launcher_path: /nonexistent/launch
        launcher_content: ""
        env_path: /nonexistent/env
        env_content: ""
        group_barrier: {results: __phase, phase: the phase, then: nothing was stopped on any member}
      ignore_errors: true  # its own failures: never its barrier's
    - name: After the barrier
      ansible.builtin.debug:
        msg: went on
"""


@pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="needs ansible-playbook")
def test_a_failed_barrier_stops_every_member_through_ansible_even_where_the_task_ignores_errors(tmp_path):
    """Through ansible-playbook itself: the strategy reads the worker's task back, so the task's ignore_errors,
    set false by the action, stops every member there (the words said on each); no task after it runs."""
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "children": {"tg": {"hosts": {"g0": {}, "g1": {}}, "vars": {"trainer_group": "tg"}}},
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "local"))
    proc = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    words = "trainer group: the phase failed on 1 of 2 members - g1: no space left; nothing was stopped on any member"
    assert "fatal: [g0]: FAILED! => changed: false msg: '%s'" % words in out, proc.stdout
    assert "fatal: [g1]: FAILED! => changed: false msg: '%s'" % words in out and "...ignoring" not in out, proc.stdout
    assert "went on" not in out and "g0 : ok=1 changed=0 unreachable=0 failed=1" in out, proc.stdout
