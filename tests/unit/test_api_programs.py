"""ansible-playbook found beside the interpreter when it is not on PATH (issue 16 item 1), and a run
that cannot start says why: the API (RunResult.reason), the CLI, the bench scripts.

The subprocess cases run the README's Python example the way the issue found it failing: the
venv's python with a PATH that lacks the venv (cron, a unit, an IDE), and a python with no
ansible-playbook anywhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dflash_trainer import api
from dflash_trainer.__main__ import describe
from dflash_trainer.programs import ProgramNotFound, find_program, program_env, require_program
from dflash_trainer.results import RunResult

ROOT = api.REPO_ROOT
BIN = os.path.dirname(sys.executable)
MINIMAL_PATH = "/usr/bin:/bin"
SITE = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "ansible_runner")))


def tool(directory, name="ansible-playbook"):
    path = os.path.join(str(directory), name)
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\nexit 0\n")
    os.chmod(path, 0o755)
    return path


# --- the lookup, pure ------------------------------------------------------------------------------

def test_path_wins_over_the_interpreters_directory(tmp_path):
    on_path, beside = tmp_path / "path", tmp_path / "venv" / "bin"
    on_path.mkdir()
    beside.mkdir(parents=True)
    want = tool(on_path)
    tool(beside)
    assert find_program("ansible-playbook", {"PATH": str(on_path)}, str(beside / "python")) == want


def test_beside_the_interpreter_when_not_on_path(tmp_path):
    beside = tmp_path / "venv" / "bin"
    beside.mkdir(parents=True)
    want = tool(beside)
    # the interpreter's directory as called: a venv's python is a symlink that must not be resolved
    os.symlink(sys.executable, str(beside / "python"))
    assert find_program("ansible-playbook", {"PATH": str(tmp_path)}, str(beside / "python")) == want
    assert find_program("ansible-playbook", {}, str(beside / "python")) == want


def test_a_file_that_is_not_executable_is_not_the_program(tmp_path):
    path = tool(tmp_path)
    os.chmod(path, 0o644)
    assert find_program("ansible-playbook", {"PATH": "/nonexistent"}, str(tmp_path / "python")) is None


def test_missing_names_the_program_and_every_place_searched(tmp_path):
    with pytest.raises(ProgramNotFound) as e:
        require_program("ansible-playbook", {"PATH": "/nowhere:/else"}, str(tmp_path / "python"))
    words = str(e.value)
    assert words.startswith("ansible-playbook not found")
    assert "/nowhere:/else" in words and str(tmp_path) in words
    assert isinstance(e.value, FileNotFoundError)


def test_program_env_puts_its_directory_first_once():
    env = program_env("/venv/bin/ansible-playbook", {"PATH": "/usr/bin:/bin", "X": "1"})
    assert env == {"PATH": "/venv/bin:/usr/bin:/bin", "X": "1"}
    assert program_env("/usr/bin/ansible-playbook", {"PATH": "/usr/bin:/bin"})["PATH"] == "/usr/bin:/bin"


# --- the reason travels with the result --------------------------------------------------------------

def test_reason_round_trips_and_the_cli_prints_it():
    result = RunResult(ok=False, rc=None, status="failed", reason="the run could not start: ansible-playbook not found")
    assert RunResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    text = describe(result, "gpu-host")
    assert "ansible-playbook not found" in text and "no host matched" not in text


def test_the_run_says_why_it_could_not_start(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python")
    result = api.status(limit="gpu-host")
    assert not result.ok and result.hosts == {} and result.rc is None
    assert result.reason.startswith("the run could not start: ansible-playbook not found"), result.reason
    assert "/nonexistent/bin" in result.reason
    assert result.exit_code == 4 and not result.started  # Ansible could not be started


def test_a_run_without_recap_says_what_ansible_playbook_printed(tmp_path):
    result = api.run_playbook(str(tmp_path / "missing.yml"), inventory={"all": {"hosts": {"localhost": {}}}})
    assert not result.ok and not result.stats
    assert "without a play recap" in result.reason and "missing.yml" in result.reason, result.reason
    assert result.started and not result.refused and result.exit_code == 4, result  # it ended before any play


# --- the README's example, run as the issue ran it ------------------------------------------------

EXAMPLE = """
import json, sys, dflash_trainer
r = dflash_trainer.run_playbook(sys.argv[1], inventory={"all": {"hosts": {"localhost": {
    "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}})
print(json.dumps(r.to_dict()))
"""


def run_example(python, playbook, tmp_path, **env):
    base = {"HOME": os.environ.get("HOME", "/root"), "PATH": MINIMAL_PATH, "LANG": "C.UTF-8",
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp")}
    res = subprocess.run([python, "-c", EXAMPLE, playbook], cwd=str(tmp_path), env=dict(base, **env),
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return RunResult.from_dict(json.loads(res.stdout.splitlines()[-1]))


def ping(tmp_path):
    path = tmp_path / "ping.yml"
    path.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n"
                    "    - ansible.builtin.debug:\n        msg: ran\n")
    return str(path)


@pytest.mark.skipif(not os.path.isfile(os.path.join(BIN, "ansible-playbook")), reason="no ansible-playbook beside python")
def test_the_venvs_python_finds_ansible_playbook_without_the_venv_on_path(tmp_path):
    assert find_program("ansible-playbook", {"PATH": MINIMAL_PATH}, "/nonexistent/python") is None, \
        "ansible-playbook on %s: this test would not show the lookup beside the interpreter" % MINIMAL_PATH
    result = run_example(sys.executable, ping(tmp_path), tmp_path, PYTHONPATH=ROOT)
    assert result.ok and result.reason is None and result.rc == 0, result
    assert list(result.hosts) == ["localhost"] and result.stats["ok"]["localhost"] == 1


def bare_python(tmp_path):
    """A python whose directory holds no ansible-playbook (the base interpreter, linked), with the
    venv's packages on PYTHONPATH: the API imports, ansible-playbook is nowhere."""
    bindir = tmp_path / "bare" / "bin"
    bindir.mkdir(parents=True)
    python = bindir / "python"
    os.symlink(os.path.realpath(getattr(sys, "_base_executable", sys.executable)), str(python))
    return str(python), dict(PYTHONPATH=os.pathsep.join([ROOT, SITE]))


def test_no_ansible_playbook_anywhere_gives_a_reason_naming_it(tmp_path):
    python, env = bare_python(tmp_path)
    result = run_example(python, ping(tmp_path), tmp_path, **env)
    assert not result.ok and result.hosts == {}
    assert "ansible-playbook not found" in result.reason and str(tmp_path / "bare" / "bin") in result.reason, result
    # the CLI says the same and exits 4: Ansible could not be started
    res = subprocess.run([python, "-m", "dflash_trainer", "status", "-l", "gpu-host"], cwd=str(tmp_path),
                         env=dict(env, PATH=MINIMAL_PATH, HOME=os.environ.get("HOME", "/root")),
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 4 and "ansible-playbook not found" in res.stdout, res.stdout + res.stderr
    assert result.exit_code == 4 and not result.started


@pytest.mark.parametrize("script", ["soak.py", "fleet_fault.py", "field.py", "run.py"])
def test_bench_scripts_stop_with_words_not_a_traceback(tmp_path, script):
    python, env = bare_python(tmp_path)
    res = subprocess.run([python, os.path.join(ROOT, "bench", script)], cwd=str(tmp_path),
                         env=dict(env, PATH=MINIMAL_PATH, HOME=os.environ.get("HOME", "/root")),
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 1 and "ansible-playbook not found" in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
