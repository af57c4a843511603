"""Pre-flight decisions (module_utils/proof/preflight.py) on real files in a tmp dir."""
import os

from ansible_collections.dflash.trainer.plugins.module_utils.proof.preflight import command_problem, gpu_problem, output_tail


def release(tmp_path):
    d = tmp_path / "releases" / "abc123"
    d.mkdir(parents=True)
    run = d / "run.sh"
    run.write_text("#!/bin/sh\nexec python3 train.py\n")
    run.chmod(0o755)
    (d / "train.py").write_text("print('hi')\n")
    return str(d)


def test_executable_script_passes(tmp_path):
    assert command_problem(["./run.sh"], release(tmp_path)) is None


def test_no_exec_bit_names_mode_and_the_interpreter_way(tmp_path):
    d = release(tmp_path)
    os.chmod(os.path.join(d, "run.sh"), 0o644)
    got = command_problem(["./run.sh"], d)
    assert "./run.sh in release abc123 is not executable (mode 0644)" in got and "['bash', './run.sh']" in got


def test_missing_file_and_directory(tmp_path):
    d = release(tmp_path)
    assert "does not exist in release abc123" in command_problem(["./nope.sh"], d)
    os.mkdir(os.path.join(d, "bin"))
    assert "not a regular file" in command_problem(["./bin"], d)


def test_missing_shebang_interpreter(tmp_path):
    d = release(tmp_path)
    with open(os.path.join(d, "run.sh"), "w") as fh:
        fh.write("#!/usr/bin/python9\n")
    assert "interpreter /usr/bin/python9" in command_problem(["./run.sh"], d)
    with open(os.path.join(d, "run.sh"), "w") as fh:
        fh.write("#!/usr/bin/env no-such-interp\n")
    assert "runs no-such-interp" in command_problem(["./run.sh"], d)


def test_path_lookup_and_interpreter_scripts(tmp_path):
    d = release(tmp_path)
    assert command_problem(["sh", "train.py"], d) is None
    assert "not on PATH" in command_problem(["no-such-program-xyz"], d)
    assert "sh missing.py, which does not exist" in command_problem(["sh", "missing.py"], d)
    assert command_problem(["sh", "-c", "exit 0"], d) is None
    assert command_problem(["sh", "-c", "missing.py"], d) is None


def gpus(used, procs=()):
    return [{"index": i, "memory_used_mib": used.get(i, 0),
             "processes": [p for p in procs if p["gpu"] == i]} for i in range(8)]


def test_gpu_held_while_stopped_is_refused():
    got = gpu_problem(gpus({5: 30000}), list(range(8)), 1024, running=False, trainer_pids=set())
    assert "GPU 5 30000 MiB held while the trainer is stopped" in got


def test_gpu_held_by_trainer_is_fine_and_by_stranger_refused():
    procs = [{"gpu": 5, "pid": 10, "process_name": "python3", "used_memory_mib": 30000},
             {"gpu": 6, "pid": 99, "process_name": "other", "used_memory_mib": 5000}]
    visible = {10, 99}.__contains__
    assert gpu_problem(gpus({5: 30000}, procs[:1]), list(range(8)), 1024, True, {10}, visible) is None
    got = gpu_problem(gpus({5: 30000, 6: 5000}, procs), list(range(8)), 1024, True, {10}, visible)
    assert "pid 99 other (5000 MiB on GPU 6)" in got and "pid 10" not in got


def test_invisible_pids_cannot_be_attributed_while_running():
    procs = [{"gpu": 5, "pid": 123456, "process_name": "[Not Found]", "used_memory_mib": 30000}]
    assert gpu_problem(gpus({5: 30000}, procs), [5], 1024, True, {1}, lambda pid: False) is None


def test_gpus_not_in_the_trainer_set_are_ignored():
    assert gpu_problem(gpus({2: 30000}), [5, 6, 7], 1024, False, set()) is None


def test_output_tail():
    assert output_tail("a\n\nb\n", "c\n", lines=2) == ["b", "c"]


def test_another_tenants_memory_from_the_node_view_is_allowed():
    gpus = [{"index": 7, "memory_used_mib": 20500, "processes": []}]
    assert gpu_problem(gpus, [7], 1024, False, set()) is not None
    assert gpu_problem(gpus, [7], 1024, False, set(), allowance={7: 20000}) is None
    assert gpu_problem(gpus, [7], 1024, False, set(), allowance={6: 20000}) is not None


# -- the unit's environment (the default pre-flight) ------------------------------------------------
import json  # noqa: E402

import pytest  # noqa: E402

from ansible_collections.dflash.trainer.plugins.module_utils.proof.preflight import (  # noqa: E402
    DEFAULT_PROPERTIES,
    PYTHON,
    Refused,
    environment_problem,
    interpreter_check,
    launcher_check,
    preflight_properties,
    reason_line,
    run_preflight,
    transient_argv,
    unit_exec_properties,
)


@pytest.mark.parametrize("env, words", [
    ({"PATH": "/opt/conda/bin:$PATH"}, "trainer_env PATH holds a '$': systemd does not expand variables"),
    ({"LD_LIBRARY_PATH": "${CUDA_HOME}/lib64"}, "trainer_env LD_LIBRARY_PATH holds a '$'"),
    ({"PYTHONPATH": "~/lib"}, "trainer_env PYTHONPATH holds a '~'"),
    ({"PATH": "bin:/usr/bin"}, "trainer_env PATH holds a relative directory"),
    ({"PATH": ""}, "trainer_env PATH is empty"),
])
def test_directory_lists_systemd_cannot_expand_are_refused_without_their_value(env, words):
    problem = environment_problem(env)
    assert problem.startswith(words)
    assert "/opt/conda/bin:$PATH" not in problem and "${CUDA_HOME}" not in problem and "~/lib" not in problem


def test_ordinary_environments_pass():
    assert environment_problem({"PATH": "/opt/conda/bin:/usr/bin:/bin", "HF_TOKEN": "a$b", "X": "~"}) is None
    assert environment_problem({}) is None


UNIT = """# managed
[Unit]
Description=DFlash trainer (t), managed by dflash.trainer
Environment=NOT_SERVICE=1

[Service]
Type=exec
ExecStart="/usr/local/lib/dflash-trainer/launch" "--" "./run.sh"
WorkingDirectory=/opt/dflash-trainer
# a comment
User=root
EnvironmentFile=-/etc/default/locale
EnvironmentFile=-/etc/locale.conf
EnvironmentFile=/etc/dflash-trainer/trainer.env
KillMode=control-group

[Install]
WantedBy=multi-user.target
"""


def test_the_unit_s_exec_settings_are_replayed_with_the_new_environment_file_and_the_release():
    props = unit_exec_properties(UNIT)
    assert props == [("WorkingDirectory", "/opt/dflash-trainer"), ("User", "root"),
                     ("EnvironmentFile", "-/etc/default/locale"), ("EnvironmentFile", "-/etc/locale.conf"),
                     ("EnvironmentFile", "/etc/dflash-trainer/trainer.env")]
    out = preflight_properties(props, "/etc/dflash-trainer/trainer.env", "/tmp/x/trainer.env", "/opt/r/releases/abc")
    assert out == [("User", "root"), ("EnvironmentFile", "-/etc/default/locale"),
                   ("EnvironmentFile", "-/etc/locale.conf"), ("EnvironmentFile", "/tmp/x/trainer.env"),
                   ("WorkingDirectory", "/opt/r/releases/abc")]
    # without the unit's text: the role's own settings, the staged file last (it wins)
    assert preflight_properties(list(DEFAULT_PROPERTIES), "/e", "/s", "/r")[-2:] == [
        ("EnvironmentFile", "/s"), ("WorkingDirectory", "/r")]


def test_transient_argv_is_one_argv_with_the_properties_and_the_launcher_variables():
    argv = transient_argv("/usr/bin/systemd-run", "dflash-preflight-1.service", [("User", "root")],
                          ["./run.sh", "a b"], 59.2, setenv=["DFLASH_RELEASE=abc"])
    assert argv == ["/usr/bin/systemd-run", "--wait", "--pipe", "--collect", "--quiet", "--service-type=exec",
                    "--unit", "dflash-preflight-1.service", "-p", "RuntimeMaxSec=60", "-p", "User=root", "--",
                    "/usr/bin/env", "DFLASH_RELEASE=abc", "./run.sh", "a b"]


def test_the_interpreter_is_started_harmlessly(tmp_path):
    d = release(tmp_path)
    assert interpreter_check(["./run.sh"], d, "/usr/bin:/bin") == (["/bin/sh", "-n", "./run.sh"],
                                                                   "/bin/sh reads ./run.sh")
    py = os.path.realpath("/usr/bin/python3")
    argv, words = interpreter_check(["python3", "train.py"], d, os.path.dirname(py) + ":/usr/bin")
    assert argv[1:] == ["-c", "pass"] and os.path.basename(argv[0]).startswith("python") and "starts" in words
    env_script = tmp_path / "releases" / "abc123" / "t.py"
    env_script.write_text("#!/usr/bin/env python3\n")
    env_script.chmod(0o755)
    assert interpreter_check(["./t.py"], d, "/usr/bin")[0] == ["/usr/bin/python3", "-c", "pass"]
    assert interpreter_check(["true"], d, "/usr/bin:/bin") == (None, None)  # not an interpreter we know


def test_a_shell_command_string_is_read_as_a_command_not_as_a_file(tmp_path):
    """sh -c 'COMMAND' (and bash -lc): the check reads the command string (-n -c), it never takes the
    command for a script file's name (which refused a healthy trainer: 'cannot open echo …')."""
    d = release(tmp_path)
    sh = os.path.realpath("/bin/sh")
    argv, words = interpreter_check(["sh", "-c", "echo step $STEP; exit 1"], d, os.path.dirname(sh) + ":/bin")
    assert argv[1:] == ["-n", "-c", "echo step $STEP; exit 1"] and "-c command" in words
    argv, _words = interpreter_check(["bash", "-lc", "python3 train.py"], d, "/usr/bin:/bin")
    assert argv is None or argv[1:] == ["-n", "-c", "python3 train.py"]
    assert interpreter_check(["sh", "-c"], d, "/usr/bin:/bin") == (None, None)
    # and what the shell does with it: -n reads, runs nothing, accepts good syntax, refuses bad
    import subprocess
    good = subprocess.run([sh, "-n", "-c", "echo hi > /nonexistent/x; exit 1"], capture_output=True, check=False)
    bad = subprocess.run([sh, "-n", "-c", "if then fi (("], capture_output=True, check=False)
    assert good.returncode == 0 and bad.returncode != 0


class FakeShell(object):
    """The unit's environment as the pre-flight sees it: each run recorded, answers scripted."""

    def __init__(self, env, answers=None):
        self.env, self.answers, self.calls, self.closed = env, dict(answers or {}), [], False
        self.where = "a fake unit"

    def run(self, argv, timeout_s, setenv=()):
        self.calls.append((list(argv), list(setenv)))
        if argv[0] == PYTHON and argv[1:3] == ["-I", "-S"]:
            return 0, json.dumps(dict(env=self.env, cwd="/r", uid=0)), ""
        return self.answers.get(argv[-1], (0, "", ""))

    def close(self):
        self.closed = True


def preflight(tmp_path, shell, env_content, command=("./run.sh",), preflight_command=()):
    d = release(tmp_path)
    p = dict(release_dir=d, command=list(command), environment_json="{}", preflight_command=list(preflight_command),
             timeout_s=5, unit="t", gpus=[], max_mib=1024, gpu_foreign_mib={}, nvidia_smi="nvidia-smi",
             unit_files=dict(env_content=env_content, unit_content=UNIT, env_path="/etc/dflash-trainer/trainer.env"))
    seen = {}

    def make_shell(_get, props, env_text, env_path, release_dir):
        seen.update(props=props, env_text=env_text, env_path=env_path, release_dir=release_dir)
        return shell

    return run_preflight(p, lambda name: None, make_shell=make_shell), seen


def test_the_default_preflight_runs_the_probe_and_the_interpreter_in_the_new_environment(tmp_path):
    shell = FakeShell({"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"})
    res, seen = preflight(tmp_path, shell, 'HF_TOKEN="hf_abcdefgh"\n')
    assert seen["env_text"].endswith('HF_TOKEN="hf_abcdefgh"\n')
    assert seen["env_path"] == "/etc/dflash-trainer/trainer.env"
    assert ("User", "root") in seen["props"]
    assert [c[0] for c in shell.calls][1] == ["/bin/sh", "-n", "./run.sh"]
    assert all("DFLASH_RELEASE=abc123" in c[1] for c in shell.calls) and shell.closed
    assert any("HOME /root" in c for c in res["checks"])
    assert "in the new environment /bin/sh reads ./run.sh" in res["checks"]


def test_a_path_with_a_dollar_is_refused_before_anything_runs(tmp_path):
    shell = FakeShell({"PATH": "/usr/bin"})
    with pytest.raises(Refused) as err:
        preflight(tmp_path, shell, 'PATH="/opt/conda/bin:\\$PATH"\n')
    assert "trainer_env PATH holds a '$'" in err.value.result["msg"] and shell.calls == []


def test_a_command_not_on_the_unit_s_path_is_refused(tmp_path):
    shell = FakeShell({"PATH": "/opt/conda/bin"})  # what the unit's process really gets
    with pytest.raises(Refused) as err:
        preflight(tmp_path, shell, "", command=("python3", "train.py"))
    assert "python3 is not on PATH (/opt/conda/bin)" in err.value.result["msg"] and shell.closed


def test_an_interpreter_that_cannot_start_is_refused_with_its_output_masked(tmp_path):
    py = os.path.realpath("/usr/bin/python3")
    shell = FakeShell({"PATH": os.path.dirname(py)},
                      answers={"pass": (1, "", "Fatal Python error: init_fs_encoding hf_abcdefgh\n")})
    with pytest.raises(Refused) as err:
        preflight(tmp_path, shell, 'PYTHONHOME="/nonexistent"\nHF_TOKEN="hf_abcdefgh"\n',
                  command=("python3", "train.py"))
    msg = err.value.result["msg"]
    assert "does not start in the new environment" in msg and "exited with status 1: Fatal Python error" in msg
    assert "hf_abcdefgh" not in json.dumps(err.value.result)


def test_the_user_s_preflight_command_runs_in_the_unit_without_gpus(tmp_path):
    shell = FakeShell({"PATH": "/usr/bin:/bin"}, answers={"import trainer": (0, "ok\n", "")})
    res, _seen = preflight(tmp_path, shell, "", preflight_command=("python3", "-c", "import trainer"))
    argv, setenv = shell.calls[-1]
    assert argv == ["python3", "-c", "import trainer"] and "CUDA_VISIBLE_DEVICES=" in setenv
    assert res["output"] == ["ok"]


def test_the_launcher_s_interpreter_is_started_in_the_new_environment_first(tmp_path):
    launcher = "#!/usr/bin/python3\n# dflash.trainer: the trainer unit's launcher\n"
    assert launcher_check(launcher, "/usr/bin") == (["/usr/bin/python3", "-c", "pass"],
                                                    "the launcher's /usr/bin/python3 starts")
    assert launcher_check("#!/bin/sh\n", "/usr/bin") == (None, None) and launcher_check(None, "/bin") == (None, None)
    shell = FakeShell({"PATH": "/usr/bin:/bin"},
                      answers={"pass": (1, "", "Fatal Python error: init_fs_encoding: failed to get the "
                                               "Python codec\n")})
    d = release(tmp_path)
    p = dict(release_dir=d, command=["./run.sh"], environment_json="{}", preflight_command=[], timeout_s=5, unit="t",
             gpus=[], max_mib=1024, gpu_foreign_mib={}, nvidia_smi="nvidia-smi",
             unit_files=dict(env_content='PYTHONHOME="/nonexistent"\n', unit_content=UNIT, launcher_content=launcher))
    with pytest.raises(Refused) as err:
        run_preflight(p, lambda name: None, make_shell=lambda *a: shell)
    assert err.value.result["msg"].endswith(
        "the unit's launcher does not start in the new environment: /usr/bin/python3 -c pass exited with status 1: "
        "Fatal Python error: init_fs_encoding: failed to get the Python codec")


def test_the_reason_is_the_line_that_names_the_error():
    tail = ["Python path configuration:", "  PYTHONHOME = '***'",
            "Fatal Python error: init_fs_encoding: failed to get the Python codec of the filesystem encoding",
            "Python runtime state: core initialized", "ModuleNotFoundError: No module named 'encodings'",
            "", "Current thread 0x00007f84ef61e040 (most recent call first):", "  <no Python frame>"]
    assert reason_line(tail) == "ModuleNotFoundError: No module named 'encodings'"
    assert reason_line(["just this"]) == "just this" and reason_line([]) == "no output"
