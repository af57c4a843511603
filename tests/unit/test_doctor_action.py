"""The trainer_doctor action (plugins/action/trainer_doctor.py): the doctor's decisions the role carries out, made on
the controller from what the node and the container answered - whether to ask the container, the report, the record
(the same file the copy task wrote), and the task failed, with the same message, when an assumption does not hold."""
import json
import os
import time
from types import SimpleNamespace

from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.plugins.filter.core import to_nice_json
from ansible.template import Templar

from ansible_collections.dflash.trainer.plugins.action.trainer_doctor import ActionModule, write_record
from ansible_collections.dflash.trainer.plugins.plugin_utils import _doctor
from dflash_trainer import doctor

from test_doctor import CT, NODE, out

PARAMS = dict(vmid="490", host="pve1", user="root", pct_path="/usr/sbin/pct", sudo=False, python="/usr/bin/python3",
              nvidia_smi="nvidia-smi", trainer_root="/opt/dflash-trainer", node_nvidia_smi="nvidia-smi")
FROZEN = {"cgroup": (0, "cgroup /sys/fs/cgroup/lxc/490\npopulated 1\nfrozen 1")}


def run(check_mode=False, **args):
    task = Task()
    task.args = args
    context = PlayContext()
    context.check_mode = check_mode
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent"))  # no remote call: no tmp
    action = ActionModule(task, connection, context, DataLoader(), Templar(loader=DataLoader()), None)
    return action.run(task_vars={"inventory_hostname": "gpu-node1-trainer"})


def node(**sections):
    return {"rc": 0, "stdout": out(**dict(NODE, **sections))}


def container(**sections):
    return {"rc": 0, "stdout": out(**dict(CT, **sections))}


def test_the_node_answer_alone_says_whether_to_ask_the_container_and_the_clock_before():
    ahead = time.time()
    res = run(node=node())
    assert res["enter"] is True and ahead <= res["before"] <= time.time() and not res.get("failed")
    assert run(node=node(**FROZEN))["enter"] is False
    assert run(node={"unreachable": True, "msg": "host pve1 is unreachable (ssh): x"})["enter"] is False


def test_every_assumption_holding_is_the_lines_as_the_message_and_the_cli_reads_the_report():
    now = time.time()
    res = run(node=node(date=(0, "")), container=container(date=(0, str(now))), before=now - 1, **PARAMS)
    assert not res.get("failed") and res["changed"] is False and "record" not in res
    report = res["ansible_facts"]["__trainer_doctor"]
    assert res["msg"] == report["lines"] and len(report["lines"]) == 14 and report["exit_code"] == 0
    assert all(line.startswith("✓") for line in report["lines"]), report["lines"]
    host, found = doctor.report_of({"event": "runner_on_ok", "event_data": {"host": "h", "res": res}})
    assert host == "h" and found == report


def test_an_assumption_that_does_not_hold_fails_the_task_with_the_summary_beside_the_lines():
    res = run(node=node(list=(0, "VMID Status Lock Name\n490 running backup ct490")), container=container(),
              before=1000.0, **PARAMS)
    report = res["ansible_facts"]["__trainer_doctor"]
    assert res["failed"] is True and res["msg"] == "doctor: %s" % report["summary"]
    assert res["msg"].startswith("doctor: 1 of 14 assumptions do not hold: ✗ lock ") and res["lines"] == report["lines"]
    # the CLI reads a failed task's report too: its lines and its exit status
    host, found = doctor.report_of({"event": "runner_on_failed", "event_data": {"host": "h", "res": res}})
    assert found["exit_code"] == 1 and found["lines"] == report["lines"]


def test_a_container_not_asked_is_judged_as_skipped():
    res = run(node=node(**FROZEN), container={"skipped": True, "changed": False}, before=1.0, **PARAMS)
    report = res["ansible_facts"]["__trainer_doctor"]
    assert res["failed"] is True and report["summary"].startswith("1 of 14 assumptions do not hold: ✗ cgroup")
    assert report["lines"][-1].endswith("not checked: the container is frozen")


def test_a_record_is_the_json_the_copy_task_wrote_0600_and_replays(tmp_path):
    now = time.time()
    args = dict(node=node(), container=container(date=(0, str(now))), before=now - 1,
                env={"HF_TOKEN": "hf_doctor_secret_1"}, record_dir=str(tmp_path), **PARAMS)
    res = run(**args)
    path = tmp_path / "gpu-node1-trainer.json"
    assert res["record"] == str(path) and res["changed"] is True
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    text = path.read_text(encoding="utf-8")
    rec = json.loads(text)
    assert text == to_nice_json(rec) and "hf_doctor_secret_1" not in text
    assert _doctor.replay(rec)["lines"] == rec["lines"] == res["ansible_facts"]["__trainer_doctor"]["lines"]
    assert "record" not in res["ansible_facts"]["__trainer_doctor"]


def test_a_record_is_replaced_only_when_it_differs(tmp_path):
    path = str(tmp_path / "h.json")
    assert write_record(path, "{}") is True and write_record(path, "{}") is False
    os.chmod(path, 0o644)
    assert write_record(path, "{}") is True and oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert write_record(path, '{"a": 1}') is True and open(path, encoding="utf-8").read() == '{"a": 1}'
    assert sorted(os.listdir(str(tmp_path))) == ["h.json"]
