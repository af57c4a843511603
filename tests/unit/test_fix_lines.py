"""Every refusal's suggested fix is a line of its own that can be pasted as is: a shell reads it into the
words meant (shlex, POSIX rules), and Ansible's -e reads each word back into the value meant - a path with
a space, a regex with backslashes and quotes, a host pattern with '*' and '&' included."""
import json
import shlex

import pytest
from ansible.parsing.splitter import parse_kv

from ansible_collections.dflash.trainer.plugins.filter.target_guard import trainer_target_problem
from ansible_collections.dflash.trainer.plugins.module_utils.plan.fix import extra_vars, fix_line
from ansible_collections.dflash.trainer.plugins.module_utils.plan.decide import make_plan
from ansible_collections.dflash.trainer.plugins.module_utils.proof.progress_elsewhere import elsewhere_words
from ansible_collections.dflash.trainer.plugins.plugin_utils._validate import group_problems
from dflash_trainer.check_log import _tries_text

VALUES = ["/workspace/progress.jsonl", "/data/my runs/progress.log", r"\biter\s+(\d+)", "it's $HOME `x`",
          "gpu*:&rack1:!old", "a=b", "{not json", 12, 2.5, "", "é ü"]


def read_e(words):
    """The variables ansible-playbook's -e words give (key=value through Ansible's own parser, else JSON)."""
    argv = shlex.split(words)
    got = {}
    assert len(argv) % 2 == 0 and argv[::2] == ["-e"] * (len(argv) // 2), argv
    for arg in argv[1::2]:
        got.update(json.loads(arg) if arg.startswith("{") else parse_kv(arg, check_raw=False))
    return got


def fix_lines(msg):
    """The lines of ``msg`` that follow a line ending in ':' and are indented more: its suggested fixes."""
    lines = msg.splitlines()
    return [b.strip() for a, b in zip(lines, lines[1:])
            if a.rstrip().endswith(":") and len(b) - len(b.lstrip()) > len(a) - len(a.lstrip())]


@pytest.mark.parametrize("value", VALUES)
def test_extra_vars_give_the_value_back_through_a_shell_and_ansible(value):
    got = read_e(extra_vars(("trainer_x", value)))
    # a number as key=value arrives as its text, as any -e key=value does; the role's checks convert it
    assert got == {"trainer_x": value if isinstance(value, str) else str(value)} or got == {"trainer_x": value}
    assert "\n" not in extra_vars(("trainer_x", value))


def test_several_settings_on_one_line():
    words = extra_vars(("trainer_ready_stall_s", 12), ("trainer_step_regex", r"\biter (\d+)"))
    assert read_e(words) == {"trainer_ready_stall_s": "12", "trainer_step_regex": r"\biter (\d+)"}
    assert fix_line(words) == "\n    " + words


@pytest.mark.parametrize("path", ["/workspace/progress.jsonl", "/data/my runs/it's.log"])
def test_the_progress_elsewhere_fix(path):
    words = "no progress in this start's log after 30 s: " + elsewhere_words((path, "step=3 tok/s=1"))
    [fix] = fix_lines(words)
    assert read_e(fix) == {"trainer_progress_path": path}


def test_the_rollback_refusal_names_a_release_to_paste():
    status = dict(running=True, running_release="r2", current_release="r2", last_good="r2",
                  releases=["r2", "r1", "r0"], health={"ok": True}, last_job=None)
    refused = make_plan({"entry": "rollback"}, status)["refused"]
    [fix] = fix_lines(refused)
    assert read_e(fix) == {"trainer_rollback_release": "r1"} and "r1, r0" in refused
    alone = make_plan({"entry": "rollback"}, dict(status, releases=["r2"]))["refused"]
    assert not fix_lines(alone) and "no other release is on the target" in alone and "<id>" not in alone


@pytest.mark.parametrize("pattern", ["gpu", "gpu*:&rack1"])
def test_the_target_guard_fix(pattern):
    msg = trainer_target_problem(pattern, "trainer_hosts", ["lab-200"], None, [])
    [fix] = fix_lines(msg)
    assert read_e(fix) == {"trainer_target_hosts": pattern}


def test_the_group_member_refusal_gives_the_whole_group_deploy():
    v = {"trainer_group": "rack 1", "groups": {"rack 1": ["a", "b"]}, "inventory_hostname": "a"}
    [problem] = group_problems(v, "restart")
    [fix] = fix_lines(str(problem))
    assert shlex.split(fix) == ["ansible-playbook", "dflash.trainer.deploy", "-l", "rack 1"]


@pytest.mark.parametrize("change", [{"trainer_step_regex": r"\biter (\d+)"}, {"trainer_ready_regex": "it's"},
                                    {"trainer_ready_stall_s": 12, "trainer_ready_hold_s": 36.0}])
def test_check_log_tries_are_pasteable(change):
    got = read_e(_tries_text(change))
    assert set(got) == set(change)
    for k, v in change.items():
        assert got[k] == v if isinstance(v, str) else float(got[k]) == v, (k, got[k])
