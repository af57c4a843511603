"""The role's input checks (plugin_utils/_validate.py): each refusal names the variable, the value
(never a secret) and what is accepted; good defaults pass."""
import os
import socket

import pytest
import yaml

from ansible_collections.dflash.trainer.plugins.plugin_utils import _validate as v
from ansible_collections.dflash.trainer.plugins.module_utils.plan import target_checks as tc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def defaults():
    with open(os.path.join(ROOT, "roles", "trainer", "defaults", "main.yml")) as fh:
        d = yaml.safe_load(fh)
    d["trainer_src"] = os.path.join(ROOT, "examples", "trainer")
    d.update(ansible_connection="dflash.trainer.pct", proxmox_vmid=200)
    return d


def problems(entry="main", **changes):
    d = defaults()
    d.update(changes)
    return [str(p) for p in v.check(d, entry)]


def test_defaults_pass_every_entry_point():
    for entry in v.ENTRIES:
        assert problems(entry) == []
    assert v.src_problems(defaults()["trainer_src"], defaults()["trainer_release_excludes"]) == []


@pytest.mark.parametrize("var,value,words", [
    ("trainer_inductor_cache_dir", "/opt/dflash-trainer", "every release would be deleted"),
    ("trainer_inductor_cache_dir", "/opt/dflash-trainer/releases", "inside trainer_root"),
    ("trainer_inductor_cache_dir", "/workspace", "system directory"),
    ("trainer_inductor_cache_dir", "/workspace/logs", None),  # fine: not the log's directory
    ("trainer_inductor_cache_dir", "/", "system directory"),
    ("trainer_inductor_cache_dir", "/tmp", "system directory"),
    ("trainer_inductor_cache_dir", "/data", "top-level directory"),
    ("trainer_inductor_cache_dir", "/usr/lib", "system files"),
    ("trainer_inductor_cache_dir", "/home/alice", "home directory"),
    ("trainer_inductor_cache_dir", "/etc/dflash-trainer", "environment file"),
    ("trainer_inductor_cache_dir", "torchinductor", "relative path"),
    ("trainer_inductor_cache_dir", "/tmp/../opt", "'..'"),
    ("trainer_root", "/opt/dflash trainer", "' '"),
    ("trainer_root", "/opt/x'y", "\"'\""),
    ("trainer_root", "/opt/x;rm", "';'"),
    ("trainer_root", "/opt/$(reboot)", "'$'"),
    ("trainer_root", "/opt/x/", "trailing"),
    ("trainer_root", "/opt//x", "normalised"),
    ("trainer_log_path", "/workspace/a\nb.log", "'\\n'"),
    ("trainer_log_path", "/opt/dflash-trainer/x.log", "inside trainer_root"),
    ("trainer_log_path", "/proc/1/fd/1", "kernel file system"),
    ("trainer_env_file", "/etc/dflash-trainer/../x.env", "'..'"),
    ("trainer_env_file", "/workspace/trainer.log", "same file as trainer_log_path"),
])
def test_paths(var, value, words):
    got = problems(**{var: value})
    if words is None:
        assert got == []
        return
    assert got, "%s=%r accepted" % (var, value)
    assert got[0].startswith(var + ":"), got
    assert words in got[0], got
    assert "accepted:" in got[0]


@pytest.mark.parametrize("value,words", [
    ("a/b", "'/'"), ("../x", "'/' or '..'"), ("x@y", "'@'"), ("my trainer", "characters"),
    ("dflash-trainer.service", "without the suffix (dflash-trainer)"), ("", "non-empty"), (7, "non-empty"),
    (".hidden", "characters"),
])
def test_unit_names(value, words):
    got = problems(trainer_unit_name=value)
    assert len(got) == 1 and got[0].startswith("trainer_unit_name:") and words in got[0], got


@pytest.mark.parametrize("changes,var,words", [
    ({"trainer_gpus": []}, "trainer_gpus", "empty"),
    ({"trainer_gpus": [0, 1, 1]}, "trainer_gpus", "GPU 1 more than once"),
    ({"trainer_gpus": [-1]}, "trainer_gpus", "not a GPU index"),
    ({"trainer_gpus": [0, 64]}, "trainer_gpus", "not a GPU index"),
    ({"trainer_gpus": "0,1"}, "trainer_gpus", "not a list"),
    ({"trainer_release_keep": 0}, "trainer_release_keep", "out of range"),
    ({"trainer_drain_timeout_s": -5}, "trainer_drain_timeout_s", "out of range"),
    ({"trainer_ready_timeout_s": "soon"}, "trainer_ready_timeout_s", "not a number"),
    ({"trainer_ready_hold_s": 400, "trainer_ready_timeout_s": 300}, "trainer_ready_hold_s", "not shorter than"),
    ({"trainer_ready_hold_s": 10, "trainer_ready_stall_s": 20}, "trainer_ready_stall_s", "longer than trainer_ready_hold_s"),
    ({"trainer_ready_interval_s": 0}, "trainer_ready_interval_s", "out of range"),
    ({"trainer_ready_timeout_s": float("nan")}, "trainer_ready_timeout_s", "is not a number"),
    ({"trainer_ready_regex": "("}, "trainer_ready_regex", "does not compile"),
    ({"trainer_ready_regex": ""}, "trainer_ready_regex", "empty"),
    ({"trainer_ready_regex": "x*"}, "trainer_ready_regex", "matches every line"),
    ({"trainer_ready_regex": "dflash"}, "trainer_ready_regex", "start marker"),
    ({"trainer_step_regex": "step"}, "trainer_step_regex", "capture group"),
    ({"trainer_error_regexes": ["ok", ".*"]}, "trainer_error_regexes[1]", "every line"),
    ({"trainer_error_regexes": "Traceback"}, "trainer_error_regexes", "not a list"),
    ({"trainer_command": []}, "trainer_command", "empty"),
    ({"trainer_command": "python3 train.py"}, "trainer_command", "is a string, not a list"),
    ({"trainer_command": ["", "x"]}, "trainer_command[0]", "empty"),
    ({"trainer_command": ["./run.sh", "a\nb"]}, "trainer_command[1]", "control character"),
    ({"proxmox_vmid": None}, "proxmox_vmid", "not set"),
    ({"proxmox_vmid": "abc"}, "proxmox_vmid", "not a container id"),
    ({"proxmox_vmid": 12}, "proxmox_vmid", "not a container id"),
    ({"trainer_gpu_host_view": True, "ansible_connection": "community.proxmox.proxmox_pct_remote"},
     "trainer_gpu_host_view", "needs the dflash.trainer.pct connection"),
    ({"trainer_gpu_host_view": "yes please"}, "trainer_gpu_host_view", "not a boolean"),
    ({"trainer_gpu_host_view": True, "trainer_node_python": "python3"}, "trainer_node_python", "absolute"),
    ({"trainer_gpu_host_view": True, "trainer_node_nvidia_smi": "nvidia-smi; rm -rf /"}, "trainer_node_nvidia_smi",
     "not a program"),
])
def test_values(changes, var, words):
    got = problems(**changes)
    assert any(p.startswith(var + ":") and words in p for p in got), got


def test_env_values_are_never_shown():
    secret = "hunter2-" + "x" * (1024 * 1024)
    got = problems(trainer_env={"TOKEN": secret})
    assert len(got) == 1 and got[0].startswith("trainer_env['TOKEN']:") and "1048584 bytes" in got[0]
    assert "hunter2" not in got[0] and "not shown" in got[0]
    got = problems(trainer_env={"TOKEN": "hunter2\nx"})
    assert "control character" in got[0] and "hunter2" not in got[0]
    got = problems(trainer_env={"1BAD": "hunter2"})
    assert got[0].startswith("trainer_env['1BAD']:") and "hunter2" not in got[0]
    assert problems(trainer_env={"HF_TOKEN": "hunter2", "N": 3}) == []


def test_status_entry_checks_only_what_it_reads():
    assert problems("status", trainer_ready_stall_s=99) == []
    assert problems("status", trainer_unit_name="../x")


def test_rollback_release_id():
    assert problems("rollback", trainer_rollback_release="dda2287ea665b415") == []
    assert "trainer_rollback_release:" in problems("rollback", trainer_rollback_release="../../etc")[0]


def test_non_pct_connection_needs_no_vmid():
    assert problems(ansible_connection="local", proxmox_vmid=None) == []


def _tree(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "pkg" / "ok").symlink_to("../run.sh")
    return src


def test_src_checks(tmp_path):
    src = _tree(tmp_path)
    assert v.src_problems(str(src)) == []
    assert "does not exist" in str(v.src_problems(str(tmp_path / "nope"))[0])
    assert "is not a directory" in str(v.src_problems(str(src / "run.sh"))[0])
    (src / "pkg" / "loop1").symlink_to("loop2")
    (src / "pkg" / "loop2").symlink_to("loop1")
    assert "symlink loop at pkg/loop" in str(v.src_problems(str(src))[0])
    assert v.src_problems(str(src), excludes=["loop*"]) == []


def test_src_special_files(tmp_path):
    for kind in ("fifo", "socket", "outside"):
        src = _tree(tmp_path / kind)
        if kind == "fifo":
            os.mkfifo(str(src / "pipe"))
            words = "a FIFO at pipe"
        elif kind == "socket":
            s = socket.socket(socket.AF_UNIX)
            s.bind(str(src / "sock"))
            s.close()
            words = "a socket at sock"
        else:
            (src / "etc").symlink_to("../../../../../../../etc")
            words = "points outside the tree"
        got = [str(p) for p in v.src_problems(str(src))]
        assert len(got) == 1 and got[0].startswith("trainer_src:") and words in got[0], got


def test_target_checks():
    d = defaults()
    gpus = [{"index": i, "memory_total_mib": 143771} for i in range(8)]
    ours = {"load_state": "loaded", "fragment_path": "/etc/systemd/system/dflash-trainer.service",
            "description": "DFlash trainer (dflash-trainer), managed by dflash.trainer"}
    path = "/etc/systemd/system/dflash-trainer.service"
    assert tc.target_problems(d, gpus, ours, path) == []
    assert tc.target_problems(d, gpus, {"load_state": "not-found"}, path) == []
    foreign = {"load_state": "loaded", "fragment_path": "/lib/systemd/system/ssh.service",
               "description": "OpenBSD Secure Shell server"}
    got = [str(p) for p in tc.target_problems(dict(d, trainer_unit_name="ssh"), gpus, foreign, "/etc/systemd/system/ssh.service")]
    assert got[0].startswith("trainer_unit_name:") and "did not write" in got[0] and "ssh.service" in got[0]
    got = [str(p) for p in tc.target_problems(dict(d, trainer_gpus=[0, 8, 9]), gpus, ours, path)]
    assert got[0].startswith("trainer_gpus:") and "GPU 8, 9" in got[0] and "0, 1, 2" in got[0]
    got = [str(p) for p in tc.target_problems(dict(d, trainer_gpu_min_mib=200000), gpus, ours, path)]
    assert got[0].startswith("trainer_gpu_min_mib:") and "GPU 0 (143771 MiB)" in got[0]
    got = [str(p) for p in tc.target_problems(d, None, dict(ours, gpu_error="nvidia-smi hung"), path)]
    assert got[0].startswith("trainer_nvidia_smi:") and "hung" in got[0]


def test_message_lists_every_problem():
    d = defaults()
    d.update(trainer_unit_name="a/b", trainer_release_keep=0)
    msg = tc.message(v.check(d))
    assert msg.startswith("refused before any change on the target (2 problems):")
    assert "- trainer_unit_name:" in msg and "- trainer_release_keep:" in msg


def test_preflight_variables():
    assert problems(trainer_preflight_command=["python3", "-c", "import train"]) == []
    got = problems(trainer_preflight_command="python3 -c 'import train'")
    assert got[0].startswith("trainer_preflight_command:") and "not a list" in got[0]
    got = problems(trainer_preflight_timeout_s=0)
    assert got[0].startswith("trainer_preflight_timeout_s:") and "out of range" in got[0]


def test_measurement_variables():
    assert problems(trainer_measure_s=60, trainer_measure_regexes={"q_hs": r"q_hs=(\d+)"},
                    trainer_min_tokps_ratio=0.9) == []
    assert problems(trainer_measure_s=None) == []
    got = problems(trainer_measure_regexes={"q_hs": "q_hs"})
    assert got[0].startswith("trainer_measure_regexes['q_hs']:") and "capture group" in got[0]
    assert problems(trainer_min_tokps_ratio=-1)[0].startswith("trainer_min_tokps_ratio:")
    assert problems(trainer_measure_s=-3)[0].startswith("trainer_measure_s:")


def test_host_view_on_with_the_pct_connection_passes():
    assert problems(trainer_gpu_host_view=True) == []
    assert problems(trainer_gpu_host_view="true") == []  # -e trainer_gpu_host_view=true
    assert problems(trainer_gpu_host_view="no", ansible_connection="community.proxmox.proxmox_pct_remote") == []
    assert any("needs the dflash.trainer.pct connection" in p for p in problems(
        trainer_gpu_host_view="yes", ansible_connection="community.proxmox.proxmox_pct_remote"))
    assert problems(trainer_gpu_host_view=True, trainer_node_nvidia_smi="/usr/bin/nvidia-smi") == []


def test_default_places_in_messages_are_the_role_defaults():
    """The refusal messages name each path's default as an example (_DEFAULT_PLACES): every one of
    them is the role's default, so a default moved in defaults/main.yml cannot leave a message
    pointing at the old place."""
    with open(os.path.join(ROOT, "roles", "trainer", "defaults", "main.yml")) as fh:
        defaults = yaml.safe_load(fh)
    for name, place in v._DEFAULT_PLACES.items():
        assert defaults[name] == place, name


NO_JOB_FLAGS = dict(installs=False, enable=False, upload=None)
UPLOAD = dict(src="examples/trainer", excludes=[".git"], keep=5)


@pytest.mark.parametrize("run, variables, want", [
    ("main", dict(trainer_force_restart="yes", trainer_src="examples/trainer", trainer_release_excludes=[".git"],
                  trainer_release_keep=5),
     dict(intent=dict(entry="deploy", release="r9", force=True), installs=True, enable=False, upload=UPLOAD)),
    ("main", {}, dict(intent=dict(entry="deploy", release="r9", force=False), installs=True, enable=False,
                      upload=dict(src=None, excludes=None, keep=None))),
    ("group", dict(trainer_src="examples/trainer", trainer_release_excludes=[".git"], trainer_release_keep=5),
     dict(intent=dict(entry="deploy", release="r9", force=False, hold=True), installs=True, enable=False,
          upload=UPLOAD)),
    ("restart", {}, dict(NO_JOB_FLAGS, intent=dict(entry="restart"))),
    ("rollback", dict(trainer_rollback_release="r1"), dict(NO_JOB_FLAGS, intent=dict(entry="rollback", rollback_release="r1"))),
    ("rollback", dict(trainer_rollback_release=None), dict(NO_JOB_FLAGS, intent=dict(entry="rollback", rollback_release=""))),
    ("start", {}, dict(NO_JOB_FLAGS, intent=dict(entry="start"), enable=True)),
    ("start", dict(trainer_unit_enabled=False), dict(NO_JOB_FLAGS, intent=dict(entry="start"))),
    ("stop", dict(trainer_stop_disable="true"), dict(NO_JOB_FLAGS, intent=dict(entry="stop", disable=True))),
])
def test_each_entry_point_that_runs_says_what_its_first_read_plans_for(run, variables, want):
    assert v.run_intent(run, variables, release="r9") == want
    assert v.RUNS[run][0] in v.ENTRIES  # the input check it takes


class _Recording(dict):
    def __init__(self):
        super().__init__()
        self.read = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)


@pytest.mark.parametrize("run", sorted(v.RUNS))
def test_a_run_reads_only_its_listed_variables(run):
    """RUN_VARIABLES is what the argument spec test counts as the entry point's reads: it must be all of them."""
    seen = _Recording()
    v.run_intent(run, seen, release="r9")
    assert seen.read == set(v.RUN_VARIABLES[run])


def test_an_unknown_run_is_refused():
    with pytest.raises(ValueError, match="run must be one of"):
        v.run_intent("deploy", {})
