"""The verdicts the collection's actions return for the role's `when:` (tests/unit/test_one_decider.py), each
seen through a real ad-hoc run on the controller (local connection): the lock released only when the play holds
it, the node's Python refused before the module runs in it, the watch's outcome of a job that ended within the
call that started it, and a call that started nothing failing the watch with its reason."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def adhoc(tmp_path, module, args, check=False):
    """One ad-hoc run of ``module`` with ``args`` (a dict, passed as JSON) -> (rc, the host's result)."""
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    if not os.path.exists(ansible):
        pytest.skip("ansible is not beside this Python")
    local = tmp_path / "local"
    local.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(local),
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    argv = [ansible, "localhost", "-c", "local", "-e", "ansible_python_interpreter=%s" % sys.executable,
            "-m", module, "-a", json.dumps(args)] + (["--check"] if check else [])
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    out = json.loads(res.stdout[res.stdout.index("{"):])
    return res.returncode, out["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_the_lock_is_released_only_when_the_play_holds_it(tmp_path):
    lock = str(tmp_path / "test.lock")
    args = dict(path=lock, token="t1", state="absent", missing_ok=True)
    for holder in ("job", "nobody", "unknown"):
        rc, res = adhoc(tmp_path, "dflash.trainer.trainer_lock", dict(args, holder=holder))
        assert rc == 0 and res.get("skipped") is True and holder in res["skip_reason"], res
    rc, res = adhoc(tmp_path, "dflash.trainer.trainer_lock", dict(args, holder="play"))
    assert rc == 0 and not res.get("skipped"), res
    rc, res = adhoc(tmp_path, "dflash.trainer.trainer_lock", dict(args, holder="play"), check=True)
    assert rc == 0 and res.get("skipped") is True and "check mode" in res["skip_reason"], res


def test_a_node_python_another_user_may_change_is_refused_before_the_module_runs(tmp_path):
    python = tmp_path / "py"  # below /tmp, which any user may write to: described by the action's raw script
    python.write_text("#!/bin/sh\ntouch \"$0.ran\"\n")
    python.chmod(0o755)
    rc, res = adhoc(tmp_path, "dflash.trainer.trainer_node_gpus", dict(python=str(python), vmid=1, unit="u"))
    assert rc != 0 and res["msg"].startswith("refused before the node's view ran: trainer_node_python: "), res
    assert res["has_lines"] is False and "invocation" not in res  # the module never ran
    assert not (tmp_path / "py.ran").exists()  # nor the refused Python


def test_the_watch_of_a_job_that_ended_within_its_start_makes_no_call(tmp_path):
    begun = {"started": True, "finished": True, "job_id": "j1", "reasons": ["restart requested"], "failed": True,
             "msg": "the proof failed: died", "result": {"ok": False}}
    rc, res = adhoc(tmp_path, "dflash.trainer.trainer_restart",
                    dict(operation="wait", begun=begun, unit="u", state_path=str(tmp_path / "none.json"), watch_calls=3))
    assert rc == 0 and res["ok"] is False and res["fail_msg"] == "the proof failed: died", res
    assert "invocation" not in res  # nothing ran on the target
    proved = dict(begun, failed=False, msg=None, result={"ok": True, "proof": {"release": "r1"}})
    rc, res = adhoc(tmp_path, "dflash.trainer.trainer_restart",
                    dict(operation="wait", begun=proved, unit="u", state_path=str(tmp_path / "none.json"), watch_calls=3))
    assert rc == 0 and res["ok"] is True and res["words"][0].startswith("u ready: release r1,"), res


def test_a_call_that_started_nothing_fails_the_watch_with_its_reason(tmp_path):
    begun = {"failed": True, "not_started": True, "lock_holder": "play", "msg": "refused: one restart at a time"}
    rc, res = adhoc(tmp_path, "dflash.trainer.trainer_restart",
                    dict(operation="wait", begun=begun, state_path=str(tmp_path / "none.json"), watch_calls=3))
    assert rc != 0 and res["msg"] == "refused: one restart at a time" and res["not_started"] is True, res
    assert res["lock_holder"] == "play"
