"""The play's deploy lock token and holder, made by the entry point's input check (trainer_validate's action
plugin): kept across the role's runs in one play, new otherwise; the holder named "$USER on <controller>"."""
import os
import re
import subprocess
import sys

import pytest

from ansible_collections.dflash.trainer.plugins.action.trainer_validate import play_lock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_given_token_is_kept():
    assert play_lock("abc123", {"USER": "ada"}, "ctl") == ("abc123", "ada on ctl")


def test_a_new_token_is_20_of_a_to_z_and_digits_and_new_each_time():
    tokens = {play_lock(None, {}, "n")[0] for _i in range(50)} | {play_lock("", {}, "n")[0]}
    assert len(tokens) == 51
    assert all(re.fullmatch(r"[a-z0-9]{20}", t) for t in tokens), tokens


@pytest.mark.parametrize("environ, owner", [
    ({"USER": "ada"}, "ada on gpu-ctl"),
    ({}, "root on gpu-ctl"),  # cron, systemd timers: no USER
    ({"USER": ""}, "root on gpu-ctl"),
])
def test_the_holder_is_the_user_on_the_controller(environ, owner):
    assert play_lock("t", environ, "gpu-ctl")[1] == owner


PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: first run's check
      dflash.trainer.trainer_validate:
        entry: restart
        variables: {}
      register: first
    - name: second run's check, as the role's entry points pass it
      dflash.trainer.trainer_validate:
        entry: restart
        variables: {}
        lock_token: "{{ first.lock_token | default(omit) }}"
      register: second
    - name: a read-only entry point takes no lock
      dflash.trainer.trainer_validate:
        entry: status
        variables: {}
      register: status
    - name: assert
      ansible.builtin.assert:
        that:
          - first.lock_token is match('^[a-z0-9]{20}$')
          - second.lock_token == first.lock_token
          - first.lock_owner == 'tester on ' ~ lookup('ansible.builtin.pipe', 'uname -n')
          - status.lock_token is not defined and status.lock_owner is not defined
"""


def test_the_action_returns_the_token_and_keeps_it_for_a_second_run(tmp_path):
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    if not os.path.exists(playbook):
        pytest.skip("ansible-playbook is not beside this Python")
    (tmp_path / "play.yml").write_text(PLAY)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), USER="tester", ANSIBLE_NOCOLOR="1")
    res = subprocess.run([playbook, "-i", "localhost,", "-c", "local", "-e",
                          "ansible_python_interpreter=%s" % sys.executable, str(tmp_path / "play.yml")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok=4" in res.stdout and "failed=0" in res.stdout, res.stdout


def git(cwd, *argv):
    subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *argv], check=True,
                   capture_output=True)


def test_the_source_is_described_by_its_commit_and_whether_it_has_changes(tmp_path):
    from ansible_collections.dflash.trainer.plugins.action.trainer_validate import describe_source
    src = tmp_path / "src"
    (src / "trainer").mkdir(parents=True)
    assert describe_source(str(src / "trainer")) == ""  # not a checkout
    git(src, "init", "-q")
    (src / "trainer" / "run.sh").write_text("echo 1\n")
    (src / "other.txt").write_text("x\n")
    assert describe_source(str(src / "trainer")) == ""  # a checkout with no commit yet
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert describe_source(str(src / "trainer")) == "git %s" % head
    (src / "other.txt").write_text("changed outside trainer_src\n")
    assert describe_source(str(src / "trainer")) == "git %s" % head  # only changes under trainer_src count
    (src / "trainer" / "new.py").write_text("print(1)\n")
    assert describe_source(str(src / "trainer")) == "git %s dirty" % head  # untracked counts too
    assert describe_source(str(tmp_path / "missing")) == ""
