"""The read-only entry points - status, logs, history: one trainer_status read each, which checks the inputs first
(plugins/plugin_utils/_input_check.py, shared with trainer_validate), and what they show and decide
(plugins/plugin_utils/_reads.py, through the trainer_status action) - the lines, status's verdict on a host and its
trainer group, the message it fails with. The role's status tasks are run for real too (ansible-playbook, local
connection, the reads registered by hand): what they show, which host fails with which message, the exit code."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml
from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.plugins.action.normal import ActionModule as NormalAction
from ansible.template import Templar, trust_as_template

from ansible_collections.dflash.trainer.plugins.action import trainer_status, trainer_validate
from ansible_collections.dflash.trainer.plugins.plugin_utils._input_check import entry_check
from ansible_collections.dflash.trainer.plugins.module_utils.proof.throughput import HISTORY_HEADER
from ansible_collections.dflash.trainer.plugins.plugin_utils._reads import (
    NO_HISTORY,
    as_expected,
    history_lines,
    log_lines,
    status_lines,
    status_verdict,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE = os.path.join(ROOT, "roles", "trainer")
HEALTHY = {"ok": True, "words": "running release r1, proved 5 min ago (unit restarts 0)"}
DIED = {"ok": False, "words": "died 23 s after its proof: torch.OutOfMemoryError (unit restarts 1)"}
STOPPED = {"ok": False, "stopped": {"by": "me"}, "words": "stopped on purpose by me at 12:00"}


def read(**fields):
    """A status read as trainer_status returns it (a healthy trainer on r1 unless ``fields`` say otherwise)."""
    base = dict(active_state="active", sub_state="running", main_pid=4242, seconds_since_start=3600.5, n_restarts=0,
                running_release="r1", current_release="r1", last_good="r1", drift=False, gpus_mib={"0": 70000},
                last_job={"words": "restart job x-1 ended: ready"}, last_progress_line="step=9 tok/s=10250.3",
                tok_s=10250.3, health=HEALTHY)
    return dict(base, **fields)


# ---- the lines ---------------------------------------------------------------------------------------------------

def test_status_shows_the_unit_the_releases_the_gpus_the_last_job_the_progress_and_the_health():
    assert status_lines("dflash-trainer", read()) == [
        "unit dflash-trainer: active/running, pid 4242, up 3600.5 s, restarts 0",
        "release running r1, current r1, last good r1",
        "GPU MiB {'0': 70000}",
        "last restart: restart job x-1 ended: ready",
        "last progress: step=9 tok/s=10250.3 (10250.3 tok/s)",
        "health: " + HEALTHY["words"],
    ]
    drifted = status_lines("u", read(running_release="r0", drift=True))
    assert drifted[1] == "release running r0, current r1, last good r1 — DRIFT"


def test_status_shows_a_null_as_nothing_and_an_empty_or_missing_value_as_a_dash():
    """As the role's Jinja showed them: a null in a line is nothing; the releases, progress and tok/s read ``-``
    when empty; the uptime, GPU memory and last job ``-`` (or {}) when the read has no such field."""
    empty = read(main_pid=None, seconds_since_start=None, running_release=None, current_release="", last_good=None,
                 gpus_mib=None, last_job={"words": None}, last_progress_line="", tok_s=0.0, health={"words": None})
    assert status_lines("u", empty) == ["unit u: active/running, pid , up  s, restarts 0",
                                        "release running -, current -, last good -", "GPU MiB ", "last restart: ",
                                        "last progress: - (- tok/s)", "health: "]
    bare = {k: v for k, v in read(last_job=None).items() if k not in ("seconds_since_start", "gpus_mib")}
    lines = status_lines("u", bare)
    assert (lines[0], lines[2], lines[3]) == ("unit u: active/running, pid 4242, up - s, restarts 0", "GPU MiB {}",
                                              "last restart: -")
    assert status_lines("u", read(last_job={"job_id": "x"}))[3] == "last restart: -"


def test_logs_shows_the_starts_lines_then_why_the_log_could_not_be_read():
    assert log_lines({"log": {"lines": ["a", "b"], "problem": None}}) == ["a", "b"]
    assert log_lines({"log": {"lines": [], "problem": "log was truncated"}}) == ["log was truncated"]
    assert log_lines({"log": {"lines": ["a"], "problem": ""}}) == ["a"]


def test_history_shows_a_header_each_entry_and_the_drift():
    rows = [{"line": "r2 ... proved"}, {"line": "r1 ... proved"}]
    assert history_lines({"history": rows, "drift": False}) == [HISTORY_HEADER, "r2 ... proved", "r1 ... proved"]
    assert history_lines({"history": [], "drift": False}) == [HISTORY_HEADER, NO_HISTORY]
    assert history_lines({"drift": True, "running_release": "r1", "current_release": "r2"}) == [
        HISTORY_HEADER, NO_HISTORY, "DRIFT: running r1 is not current r2"]


# ---- status's verdict --------------------------------------------------------------------------------------------

def test_a_healthy_or_deliberately_stopped_trainer_passes_and_any_other_fails_naming_its_health():
    assert as_expected(read()) and as_expected(read(health=STOPPED)) and not as_expected(read(health=DIED))
    assert not as_expected({})
    ok = status_verdict("dflash-trainer", read())
    assert ok["ok"] is True and ok["failure"] is None and ok["lines"] == status_lines("dflash-trainer", read())
    assert ok["group_status"] is None and ok["group_failed"] is False
    assert status_verdict("u", read(health=STOPPED))["ok"] is True
    died = status_verdict("dflash-trainer", read(health=DIED))
    assert died["ok"] is False
    assert died["failure"] == "dflash-trainer is not running its proved release healthily: " + DIED["words"]


def test_a_member_shows_its_groups_words_and_fails_with_them_after_its_own_health():
    bad = {"ok": False, "words": "trainer group tg: not proved as one - g1: runs r0", "members": ["g1"]}
    good = {"ok": True, "words": "trainer group tg: proved as one - release r1 on every member (g0, g1)", "members": []}
    unjudged = {"ok": None, "words": "trainer group tg: not judged as one - g1 not read in this run", "members": ["g1"]}
    member = status_verdict("u", read(), bad)
    assert member["ok"] is False and member["failure"] == bad["words"] and member["group_failed"] is True
    assert member["lines"] == status_lines("u", read()) + [bad["words"]] and member["group_status"] == bad
    own_first = status_verdict("u", read(health=DIED), bad)
    assert own_first["failure"].startswith("u is not running its proved release healthily: ")
    for status in (good, unjudged):
        passed = status_verdict("u", read(), status)
        assert passed["ok"] is True and passed["failure"] is None and passed["lines"][-1] == status["words"]
        assert passed["group_failed"] is False


def test_the_action_judges_this_hosts_read_and_its_groups_from_what_every_member_registered():
    hostvars = {"g0": {"st": read()}, "g1": {"st": read(running_release="r0", last_good="r0")}, "h": {"st": read()}}
    groups = {"tg": ["g0", "g1"], "all": ["g0", "g1", "h"]}

    def judged(host, group, in_run=("g0", "g1", "h")):
        return trainer_status.judge("u", {"read": "st", "group": group, "in_run": list(in_run)},
                                    {"hostvars": hostvars, "groups": groups, "inventory_hostname": host})

    alone = judged("h", "")
    assert alone["ok"] is True and alone["group_status"] is None and "ansible_facts" not in alone
    assert alone["changed"] is False and alone["lines"] == status_lines("u", read())
    member = judged("g0", "tg")
    assert member["ok"] is False and member["failure"] == member["group_status"]["words"]
    assert member["failure"] == "trainer group tg: not proved as one - g0: runs r1; g1: runs r0"
    assert member["ansible_facts"] == {trainer_status.GROUP_STATUS_FACT: member["group_status"]}
    part = judged("g0", "tg", in_run=("g0",))
    assert part["ok"] is True and part["group_status"]["ok"] is None
    with pytest.raises(AnsibleActionFail, match="names no inventory group"):
        judged("h", "nope")
    with pytest.raises(AnsibleActionFail, match="verdict needs read"):
        trainer_status.judge("u", {"group": ""}, {})


# ---- the read's own input check ----------------------------------------------------------------------------------

def action(cls, args, role_path=ROLE):
    task = Task()
    task.args = dict(args)
    task._role = SimpleNamespace(_role_path=role_path)
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent"))
    return cls(task, connection, PlayContext(), DataLoader(), Templar(loader=DataLoader()), None)


PLAY = {"trainer_root": "/opt/dflash-trainer", "trainer_unit_name": "dflash-trainer", "trainer_group": "",
        "trainer_log_path": "/workspace/trainer.log", "trainer_ready_stall_s": 99, "inventory_hostname": "h"}
READ = dict(unit="dflash-trainer", trainer_root="/opt/dflash-trainer", log_path="/workspace/trainer.log")


@pytest.fixture
def module_runs(monkeypatch):
    """The module's run (the target's read) replaced: each call recorded, a healthy read returned."""
    calls = []

    def run(self, tmp=None, task_vars=None):
        calls.append(dict(self._task.args))
        return dict(read(log={"lines": ["a"], "problem": "gone"}, history=[{"line": "r1"}]), changed=False)

    monkeypatch.setattr(NormalAction, "run", run)
    return calls


def test_a_refused_input_fails_the_read_with_trainer_validates_message_before_the_module_runs(module_runs):
    bad = dict(PLAY, trainer_root="opt/x", trainer_unit_name="x.service")
    res = action(trainer_status.ActionModule, dict(READ, check="status")).run(task_vars=bad)
    assert module_runs == [] and res["failed"] and res["input_refused"] and res["changed"] is False
    same = action(trainer_validate.ActionModule, {"entry": "status"}).run(task_vars=bad)
    assert res["msg"] == same["msg"] and res["problems"] == same["problems"] and len(res["problems"]) == 2
    assert "trainer_root" in res["msg"] and "trainer_unit_name" in res["msg"]


def test_an_accepted_input_reads_once_without_the_check_options_and_says_whether_it_is_a_member(module_runs):
    res = action(trainer_status.ActionModule, dict(READ, check="status", spec=True)).run(task_vars=PLAY)
    assert not res.get("failed") and res["in_group"] is False and res["as_expected"] is True
    assert module_runs == [READ] and "lines" not in res
    member = action(trainer_status.ActionModule, dict(READ, check="status")).run(
        task_vars=dict(PLAY, trainer_group="tg", groups={"tg": ["h"]}))
    assert member["in_group"] is True


def test_a_watch_is_not_checked(module_runs):
    """A deploy's watch (run.yml) passes no check: the play's variables are not read, even refused ones."""
    res = action(trainer_status.ActionModule, READ).run(task_vars=dict(PLAY, trainer_root="opt/x"))
    assert not res.get("failed") and "in_group" not in res and "input_refused" not in res and len(module_runs) == 1


def test_the_read_returns_the_lines_its_entry_point_shows(module_runs):
    logs = action(trainer_status.ActionModule, dict(READ, check="status", show="log")).run(task_vars=PLAY)
    assert logs["lines"] == ["a", "gone"]
    history = action(trainer_status.ActionModule, dict(READ, check="status", show="history")).run(task_vars=PLAY)
    assert history["lines"] == [HISTORY_HEADER, "r1"]
    with pytest.raises(AnsibleActionFail, match="show must be one of history, log"):
        action(trainer_status.ActionModule, dict(READ, show="status")).run(task_vars=PLAY)
    with pytest.raises(AnsibleActionFail, match="check must be one of status"):
        action(trainer_status.ActionModule, dict(READ, check="main")).run(task_vars=PLAY)
    with pytest.raises(AnsibleActionFail, match="spec needs check"):
        action(trainer_status.ActionModule, dict(READ, spec=True)).run(task_vars=PLAY)
    assert len(module_runs) == 2


def test_the_argument_spec_is_checked_first_with_ansibles_message(tmp_path, module_runs):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "argument_specs.yml").write_text(yaml.safe_dump({"argument_specs": {"status": {"options": {
        "trainer_root": {"type": "path"}, "trainer_log_lines": {"type": "int"}}}}}))
    bad = dict(PLAY, trainer_log_lines="many", trainer_root="opt/x")
    res = action(trainer_status.ActionModule, dict(READ, check="status", spec=True), str(tmp_path)).run(task_vars=bad)
    assert module_runs == [] and res["failed"] and res["input_refused"]
    assert res["msg"].startswith("Validation of arguments failed:\n") and "trainer_log_lines" in res["msg"]
    assert "trainer_root" not in res["msg"]  # the spec refuses first: the collection's checks did not run
    same = action(trainer_validate.ActionModule, {"entry": "status", "spec": True}, str(tmp_path)).run(task_vars=bad)
    assert same["msg"] == res["msg"] and same["argument_errors"] == res["argument_errors"]
    without = action(trainer_status.ActionModule, dict(READ, check="status"), str(tmp_path)).run(task_vars=bad)
    assert without["msg"] != res["msg"] and "trainer_root" in without["msg"]


def test_a_variable_that_cannot_be_templated_refuses_the_inputs():
    templar = Templar(loader=DataLoader())
    variables, problems, refused = entry_check(Task(), templar, {"trainer_root": trust_as_template("{{ nope_undefined }}")}, "status")
    assert refused["failed"] and refused["msg"].startswith("input check failed: trainer_root cannot be templated")
    assert problems == []
    _v, found, none = entry_check(Task(), templar, {}, "status", variables={"trainer_unit_name": "../x"},
                                  more=lambda v: ["more"])
    assert none is None and found[-1] == "more" and len(found) == 2
    outside = entry_check(Task(), templar, {}, "status", spec=True, variables={})[2]
    assert outside["msg"] == "input check failed: spec: true needs a task of the role (its meta/argument_specs.yml)"
    assert entry_check(Task(), templar, {}, "nope", variables={})[2]["msg"].startswith("input check failed: ")


# ---- the role's status tasks, run ----------------------------------------------------------------------------------

def play_status(tmp_path, reads, groups):
    """Run status.yml's tasks after its read on local hosts whose reads are ``reads`` (host -> read), each host's
    trainer_group from ``groups`` -> (rc, {task name: {host: result}})."""
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    if not os.path.exists(ansible):
        pytest.skip("ansible-playbook is not beside this Python")
    with open(os.path.join(ROLE, "tasks", "status.yml"), encoding="utf-8") as fh:
        tasks = yaml.safe_load(fh)
    assert tasks[0]["register"] == "trainer_status_result"
    (tmp_path / "after_read.yml").write_text(yaml.safe_dump(tasks[1:]))
    (tmp_path / "reads.json").write_text(json.dumps(reads))
    members = {}
    for host, group in groups.items():
        if group:
            members.setdefault(group, {})[host] = {}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "trainer_unit_name": "dflash-trainer"},
        "hosts": {h: {"trainer_group": g} for h, g in groups.items()},
        "children": {g: {"hosts": hosts} for g, hosts in members.items()}}}))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": [
        {"ansible.builtin.set_fact": {"trainer_status_result": "{{ (lookup('file', 'reads.json') | from_json)"
                                                               "[inventory_hostname] }}"}},
        {"ansible.builtin.include_tasks": "after_read.yml"}]}]))
    local = tmp_path / "local"
    local.mkdir(mode=0o700)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(local),
               ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    res = subprocess.run([ansible, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=180, check=False)
    out = json.loads(res.stdout[res.stdout.index("{"):])
    return res.returncode, {t["task"]["name"]: t["hosts"] for t in out["plays"][0]["tasks"]}


def test_the_role_shows_every_hosts_lines_and_fails_each_host_with_its_own_message(tmp_path):
    reads = {"g0": read(), "g1": read(health=DIED), "h": read(), "s": read(health=STOPPED)}
    rc, tasks = play_status(tmp_path, reads, {"g0": "tg", "g1": "tg", "h": "", "s": ""})
    shown = {h: r["msg"] for h, r in tasks["Show the trainer's state"].items()}
    words = "trainer group tg: not proved as one - g1: " + DIED["words"]
    assert shown["h"] == status_lines("dflash-trainer", reads["h"])
    assert shown["g0"] == status_lines("dflash-trainer", reads["g0"]) + [words]
    assert shown["g1"][-1] == words and shown["s"][-1] == "health: " + STOPPED["words"]
    failed = {h: r.get("msg") for h, r in tasks["Fail unless the trainer runs its proved release healthily"].items()
              if r.get("failed")}
    assert rc == 2 and failed == {
        "g0": words, "g1": "dflash-trainer is not running its proved release healthily: " + DIED["words"]}
    assert tasks["Judge the trainer and its group"]["g0"]["ansible_facts"]["__trainer_group_status"]["ok"] is False
    (tmp_path / "again").mkdir()
    rc, tasks = play_status(tmp_path / "again", {"g0": read(), "g1": read()}, {"g0": "tg", "g1": "tg"})
    assert rc == 0 and tasks["Show the trainer's state"]["g1"]["msg"][-1].startswith("trainer group tg: proved as one")
