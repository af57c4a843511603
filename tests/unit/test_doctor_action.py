"""The trainer_doctor action (plugins/action/trainer_doctor.py): the doctor's decisions the role carries out, made on
the controller from what the node answered - whether to ask the container (asked, then, over the task's own
connection, as ansible.builtin.raw runs its command; never when the node says not to), its connection failing judged
as the raw task's unreachable result was, the report, the record (the same file the two-task doctor wrote), and the
task failed, with the same message, when an assumption does not hold."""
import json
import os
import time
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.plugins.filter.core import to_nice_json
from ansible.template import Templar

from ansible_collections.dflash.trainer.plugins.action import trainer_doctor
from ansible_collections.dflash.trainer.plugins.action.trainer_doctor import ActionModule, write_record
from ansible_collections.dflash.trainer.plugins.plugin_utils import _doctor
from dflash_trainer import doctor

from test_doctor import CT, FIXTURES, NODE, out

PARAMS = dict(vmid="490", host="pve1", user="root", pct_path="/usr/sbin/pct", sudo=False, python="/usr/bin/python3",
              nvidia_smi="nvidia-smi", trainer_root="/opt/dflash-trainer", node_nvidia_smi="nvidia-smi")
FROZEN = {"cgroup": (0, "cgroup /sys/fs/cgroup/lxc/490\npopulated 1\nfrozen 1")}
STOPPED = "container 490 is not running on pve1: container '490' not running!"


class Connection:
    """The play host's connection as the action sees it (dflash.trainer.pct's shape, no become): each command it
    is given kept, answered (rc, stdout, stderr) or its failure raised."""

    transport = "dflash.trainer.pct"
    allow_executable = True
    become = None
    default_user = None

    def __init__(self, answer=(0, "", "")):
        self.answer, self.commands = answer, []
        self._shell = SimpleNamespace(tmpdir=None)

    def get_option(self, name):
        raise KeyError(name)

    def exec_command(self, cmd, in_data=None, sudoable=True):
        self.commands.append((cmd, in_data, sudoable))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def run(connection=None, check_mode=False, **args):
    task = Task()
    task.args = args
    context = PlayContext()
    context.check_mode = check_mode
    task.check_mode = check_mode
    action = ActionModule(task, connection or Connection(), context, DataLoader(), Templar(loader=DataLoader()), None)
    return action.run(task_vars={"inventory_hostname": "gpu-node1-trainer"})


def node(**sections):
    return {"rc": 0, "stdout": out(**dict(NODE, **sections))}


def container(**sections):
    return (0, out(**dict(CT, **sections)), "")


def test_a_node_that_says_not_to_enter_leaves_the_container_unasked():
    """Frozen (pct exec would hang in it) or not reached: nothing is run over the connection, and the judgement is
    the two-task doctor's with its ask skipped."""
    conn = Connection(AssertionError("the container was asked"))
    res = run(conn, node=node(**FROZEN), **PARAMS)
    report = res["ansible_facts"]["__trainer_doctor"]
    assert conn.commands == [] and res["failed"] is True
    assert report["summary"].startswith("1 of 14 assumptions do not hold: ✗ cgroup")
    assert report["lines"][-1].endswith("not checked: the container is frozen")
    res = run(conn, node={"unreachable": True, "msg": "host pve1 is unreachable (ssh): x"}, **PARAMS)
    assert conn.commands == [] and res["ansible_facts"]["__trainer_doctor"]["exit_code"] == 3


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_node_that_says_enter_has_the_container_asked_once_with_its_script_as_raw_sends_it(check_mode):
    now = time.time()
    conn = Connection(container(date=(0, str(now))))
    params = {**PARAMS, "trainer_root": "/srv/it's", "nvidia_smi": ""}
    res = run(conn, check_mode=check_mode, node=node(), **params)
    # the script alone (no shell around it: raw's executable=False), become allowed as raw's; empty: the default
    assert conn.commands == [(_doctor.container_script("/srv/it's", "/usr/bin/python3", "nvidia-smi"), None, True)]
    report = res["ansible_facts"]["__trainer_doctor"]
    assert not res.get("failed") and res["changed"] is False and "record" not in res
    assert res["msg"] == report["lines"] and len(report["lines"]) == 14 and report["exit_code"] == 0
    assert all(line.startswith("✓") for line in report["lines"]), report["lines"]
    assert report["lines"][-1].startswith("✓ clock        within 5.0 s of the controller's (")
    host, found = doctor.report_of({"event": "runner_on_ok", "event_data": {"host": "h", "res": res}})
    assert host == "h" and found == report


def test_a_connection_failure_is_judged_as_the_raw_tasks_unreachable_result_was():
    """pct exec not reaching the container: the task neither fails with it nor is unreachable; the pct exec check
    is the ✗, in the connection's words, the checks inside not made - the two-task doctor's lines and record."""
    conn = Connection(AnsibleConnectionFailure(STOPPED))
    res = run(conn, node=node(), record_dir="", **PARAMS)
    report = res["ansible_facts"]["__trainer_doctor"]
    assert len(conn.commands) == 1 and "unreachable" not in res and res["failed"] is True
    was = _doctor.report(_doctor.judge(node(), {"unreachable": True, "msg": "Task failed: " + STOPPED}, 1.0, 2.0,
                                       **PARAMS))
    assert report["lines"] == was["lines"] and report["exit_code"] == 1
    assert report["lines"][6] == "✗ pct exec     %s - remedy: see the lines above; the container must run and pct " \
        "exec reach it" % STOPPED
    assert res["msg"] == "doctor: 1 of 14 assumptions do not hold: " + report["lines"][6]
    assert all(line.startswith("? ") and line.endswith("not checked: pct exec failed") for line in report["lines"][7:])


def test_another_error_of_the_connection_fails_the_task_as_it_failed_the_raw_one():
    with pytest.raises(AnsibleError, match="cannot stream"):
        run(Connection(AnsibleError("cannot stream")), node=node(), **PARAMS)


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(FIXTURES) if f.endswith(".json")))
def test_the_action_writes_the_record_the_two_task_doctor_wrote(name, tmp_path, monkeypatch):
    """Each recorded node (tests/unit/fixtures/doctor/: the raw tasks' results, registered) replayed through the
    action, the container answering over the connection what it answered the raw task: the same record, byte for
    byte - the container's answer, the clock around it, the lines."""
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as fh:
        rec = json.load(fh)
    ct = rec["container"]
    if ct.get("unreachable"):
        answer = AnsibleConnectionFailure(ct["msg"][len("Task failed: "):])
    else:
        answer = (ct.get("rc"), ct.get("stdout"), ct.get("stderr"))
    conn = Connection(answer)
    monkeypatch.setattr(trainer_doctor, "time", SimpleNamespace(time=iter([rec["before"], rec["after"]]).__next__))
    res = run(conn, node=rec["node"], record_dir=str(tmp_path), **rec["params"])
    assert len(conn.commands) == (1 if ct else 0)
    written = (tmp_path / "gpu-node1-trainer.json").read_text(encoding="utf-8")
    assert written == to_nice_json(rec) and res["ansible_facts"]["__trainer_doctor"]["lines"] == rec["lines"]


def test_a_record_is_the_json_the_copy_task_wrote_0600_and_replays(tmp_path):
    conn = Connection(container(date=(0, str(time.time())), python=(1, "HF_TOKEN=hf_doctor_secret_1 refused")))
    res = run(conn, node=node(), env={"HF_TOKEN": "hf_doctor_secret_1"}, record_dir=str(tmp_path), **PARAMS)
    path = tmp_path / "gpu-node1-trainer.json"
    assert res["record"] == str(path) and res["changed"] is True
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    text = path.read_text(encoding="utf-8")
    rec = json.loads(text)
    assert text == to_nice_json(rec) and "hf_doctor_secret_1" not in text and "HF_TOKEN=***" in text
    assert _doctor.replay(rec)["lines"] == rec["lines"] == res["ansible_facts"]["__trainer_doctor"]["lines"]
    assert "record" not in res["ansible_facts"]["__trainer_doctor"]


def test_a_record_is_replaced_only_when_it_differs(tmp_path):
    path = str(tmp_path / "h.json")
    assert write_record(path, "{}") is True and write_record(path, "{}") is False
    os.chmod(path, 0o644)
    assert write_record(path, "{}") is True and oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert write_record(path, '{"a": 1}') is True and open(path, encoding="utf-8").read() == '{"a": 1}'
    assert sorted(os.listdir(str(tmp_path))) == ["h.json"]
