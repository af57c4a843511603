"""Pre-flight decisions (module_utils/_preflight.py) on real files in a tmp dir."""
import os

from ansible_collections.dflash.trainer.plugins.module_utils._preflight import command_problem, gpu_problem, output_tail


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
