"""dflash.trainer.concise: ansible-playbook's output without the tasks a run skips, the banner of a task
that speaks while it runs printed when it starts (before its words)."""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Run in a process of its own: Ansible's plugin loader installs its collection finder once per process,
# and the unit tests import the collection as a plain package (conftest.py).
DRIVE = r"""
import json, sys
from types import SimpleNamespace
from ansible.playbook.task import Task
from ansible.plugins.loader import callback_loader, init_plugin_loader

init_plugin_loader([sys.argv[1]])


class Screen:
    verbosity = 0

    def __init__(self):
        self.lines = []

    def banner(self, msg, **_):
        self.lines.append(msg)

    def display(self, msg, **_):
        self.lines.append(msg)


def callback(verbosity=0, **options):
    cb = callback_loader.get("dflash.trainer.concise")
    cb.set_options(direct=options)
    cb._display = Screen()
    cb._display.verbosity = verbosity
    cb._play = SimpleNamespace(strategy="linear")
    return cb


def run(cb, name, action, words=False):
    task = Task.load(dict(name=name, action=action, args={}))
    cb.v2_playbook_on_task_start(task, False)
    if words:
        cb._display.display("[gpu-host] restart job: proving")
    cb.v2_runner_on_skipped(SimpleNamespace(task=task, host=SimpleNamespace(get_name=lambda: "gpu-host"),
                                            result={"skipped": True}))
    return cb._display.lines


def said(action, result):
    result = dict(result)
    callback()._clean_results(result, action)
    return sorted(result)


module = sys.modules[type(callback()).__module__]
print(json.dumps({
    "said_lines": said("dflash.trainer.trainer_node_gpus", {"msg": ["GPU 0: held by 200/dflash-trainer"],
                       "lines": ["GPU 0: held by 200/dflash-trainer"], "has_lines": True, "foreign_mib": {},
                       "_ansible_verbose_always": True}),
    "said_failure": said("dflash.trainer.trainer_doctor", {"failed": True, "msg": "doctor: 1 does not hold",
                         "lines": ["x python3"], "record": "/r.json"}),
    "said_plain": said("ansible.builtin.command", {"msg": "m", "lines": ["a"], "rc": 0}),
    "speaking": sorted(module.SPEAKING_ACTIONS),
    "plain_skipped": run(callback(), "Report what check mode would restart", "ansible.builtin.debug"),
    "speaking_skipped": run(callback(), "Watch the restart job", "dflash.trainer.trainer_restart", words=True),
    "verbose": run(callback(verbosity=3), "Report what check mode would restart", "ansible.builtin.debug"),
    "asked": run(callback(display_skipped_hosts=True), "Report what check mode would restart",
                 "ansible.builtin.debug"),
}))
"""


@pytest.fixture(name="driven", scope="module")
def fixture_driven():
    proc = subprocess.run([sys.executable, "-c", DRIVE, os.path.join(REPO, "collections")], capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(proc.stdout.splitlines()[-1])


def test_every_action_that_speaks_while_it_runs_is_named(driven):
    """An action plugin that prints while its task runs (the watch's phases, a group's waits, a warning)
    gets its banner first: a new one missing from SPEAKING_ACTIONS would print before its banner."""
    speaking = set()
    for path in glob.glob(os.path.join(REPO, "plugins", "action", "*.py")):
        with open(path, encoding="utf-8") as f:
            if re.search(r"\b(say_start|run_held|display\.display|display\.warning)\(", f.read()):
                speaking.add("dflash.trainer." + os.path.basename(path)[:-3])
    assert speaking and sorted(speaking) == driven["speaking"]


def test_a_skipped_task_is_left_out(driven):
    assert driven["plain_skipped"] == []


def test_a_speaking_task_shows_its_banner_when_it_starts_then_skipping_if_skipped(driven):
    # the banner before any word of its action
    assert driven["speaking_skipped"] == ["TASK [Watch the restart job]", "[gpu-host] restart job: proving",
                                          "skipping: [gpu-host]"]


def test_from_vvv_every_banner_comes_when_its_task_starts(driven):
    """-vvv says a task's connection lines while it runs: they come under its banner, as by default."""
    assert driven["verbose"] == ["TASK [Report what check mode would restart]", "skipping: [gpu-host]"]


def test_every_skipped_task_is_shown_when_asked(driven):
    assert driven["asked"] == ["TASK [Report what check mode would restart]", "skipping: [gpu-host]"]


PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: A branch not taken
      ansible.builtin.debug:
        msg: never
      when: false
    - name: A lock task not needed
      dflash.trainer.trainer_lock:
        state: release
      when: false
    - name: A task that runs
      ansible.builtin.debug:
        msg: ran
"""


@pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="needs ansible-playbook")
def test_the_checkouts_configuration_uses_it(tmp_path):
    """ansible-playbook with the checkout's ansible.cfg: a skipped task is not shown, a skipped task of a
    speaking action says skipping under its banner, a task that ran shows its banner and result."""
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "local"))
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(book)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "A branch not taken" not in out
    assert re.search(r"TASK \[A lock task not needed\] \**\nskipping: \[localhost\]", out), out
    assert re.search(r"TASK \[A task that runs\] \**\nok: \[localhost\]", out), out
    assert out.count("skipping:") == 1, out


def test_a_saying_actions_answer_is_its_words_alone(driven):
    """The node's view and a watch say their lines as their msg: the rest of the answer (its lines again
    included) is left out; a failure keeps its lines beside its message; another action's answer is whole."""
    assert driven["said_lines"] == ["_ansible_verbose_always", "msg"]
    assert driven["said_failure"] == ["lines", "msg"]
    assert "rc" in driven["said_plain"] and "lines" in driven["said_plain"]
