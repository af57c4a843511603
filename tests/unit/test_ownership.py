"""What the collection may write or delete (module_utils/_ownership.py): every file it writes is
absent or carries its mark, resolved paths included; the purge deletes only a torchinductor cache."""
import json
import os

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils import _ownership as o
from ansible_collections.dflash.trainer.plugins.module_utils._cycle import StepFailed, purge
from ansible_collections.dflash.trainer.plugins.module_utils._trainer_log import marker_line

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "roles", "trainer", "files", "dflash-trainer-launch")
UNIT = "[Unit]\nDescription=DFlash trainer (dflash-trainer), managed by dflash.trainer\n"


@pytest.fixture(autouse=True)
def tmp_is_not_world_writable_here(request, monkeypatch):
    """pytest's tmp_path lies in /tmp, which the placement rule refuses for every file of ours: the
    tests of real files judge everything but that rule (test_placements_refused checks it)."""
    if "placement" not in request.node.name:
        monkeypatch.setattr(o, "_WORLD_WRITABLE", ())


def facts(tmp_path, name, content, kind):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return o.observe(str(path), kind)


def judge_at(tmp_path, name, content, kind):
    return o.judge("trainer_x", kind, facts(tmp_path, name, content, kind))


@pytest.mark.parametrize("kind,content", [
    ("launcher", None),
    ("launcher", "#!/usr/bin/python3\n\"\"\"ExecStart of the dflash trainer unit: pin the release\n"),  # before the mark
    ("env", o.ENV_MARK + '\nHF_TOKEN="x"\n'),
    ("env", 'HF_TOKEN="x"\nPYTHONUNBUFFERED="1"\nTORCHINDUCTOR_CACHE_DIR="/tmp/torchinductor_root"\n'),  # legacy
    ("unit", UNIT),
    ("log", marker_line("a" * 32, "r1", 7, "2026-01-01T00:00:00+00:00") + "\nstep=1 tok/s=5\n"),
    ("log", ""),
    ("log_rotation", marker_line("a" * 32, "r1", 7, "t").replace(" <==", " continued=rotated <==") + "\n"),
    ("log_start", json.dumps({"invocation": "a" * 32, "offset": 0})),
    ("state", json.dumps({"job_id": "x", "phase": "done"})),
    ("lock_guard", ""),
])
def test_files_of_ours_are_accepted(tmp_path, kind, content):
    if content is None:
        with open(LAUNCHER) as fh:
            content = fh.read()
    assert judge_at(tmp_path, "f", content, kind) is None


@pytest.mark.parametrize("kind", ["launcher", "env", "unit", "log", "log_rotation", "log_start", "state", "lock_guard"])
def test_a_file_we_did_not_write_is_refused(tmp_path, kind):
    why = judge_at(tmp_path, "python3", b"\x7fELF\x02\x01\x01" + b"\0" * 100, kind)
    assert why and "exists and was not written by dflash.trainer" in why and "a file of 107 bytes" in why


def test_the_unit_file_is_not_an_environment_file(tmp_path):
    why = judge_at(tmp_path, "dflash-trainer.service", UNIT, "env")
    assert "not written by dflash.trainer" in why and "the environment file" in why


def test_shadow_like_lines_are_not_a_legacy_env_file(tmp_path):
    assert judge_at(tmp_path, "shadow", "root:$y$j9T$abc:19000:0:99999:7:::\n", "env")


def test_a_directory_where_a_file_goes_is_refused(tmp_path):
    (tmp_path / "d" / "x").mkdir(parents=True)
    why = o.judge("trainer_log_path", "log", o.observe(str(tmp_path / "d"), "log"))
    assert "a directory holding x/" in why


def test_a_symlinked_parent_is_resolved_before_judging(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "link").symlink_to(real)
    f = o.observe(str(tmp_path / "link" / "passwd"), "log")
    assert f["real"] == str(real / "passwd")
    why = o.judge("trainer_log_path", "log", f)
    assert "resolves to %s" % (real / "passwd") in why and "not written by dflash.trainer" in why


def test_absent_files_are_fine_but_where_they_go_still_counts(tmp_path):
    assert o.judge("trainer_log_path", "log", o.observe(str(tmp_path / "new.log"), "log")) is None
    f = {"path": "/etc/cron.d/x", "real": "/etc/cron.d/x", "exists": False}
    assert "lies in /etc" in o.judge("trainer_log_path", "log", f)


@pytest.mark.parametrize("kind,path,words", [
    ("log", "/etc/passwd", "lies in /etc"),
    ("env", "/etc/shadow", "lies in /etc"),
    ("env", "/etc/systemd/system/dflash-trainer.service", "lies in /etc"),
    ("launcher", "/usr/bin/python3", "lies in /usr"),
    ("launcher", "/usr/local/lib/python3.11/dist-packages/sitecustomize.py", "lies in /usr"),
    ("log", "/root/.ssh/authorized_keys", "dot-directory"),
    ("log", "/root/.bashrc", "dot-directory"),
    ("log", "/home/alice/.profile", "dot-directory"),
    ("state", "/tmp/restart.json", "every user of the container can write"),
    ("lock", "/dev/shm/x.lock", "lies in /dev"),
    ("lock", "/var/tmp/x.lock", "lies in /var"),
    ("log", "/var/spool/cron/crontabs/root", "lies in /var"),
    ("log", "/run/systemd/x", "lies in /run"),
    ("log", "/boot/grub/grub.cfg", "lies in /boot"),
    ("cache", "/root/.ssh", "dot-directory"),
    ("cache", "/var/lib/dpkg", "system files"),
    ("cache", "/etc/ssh", "system files"),
])
def test_placements_refused(kind, path, words):
    why = o.placement_problem(kind, path)
    assert why and words in why


@pytest.mark.parametrize("kind,path", [
    ("launcher", "/usr/local/lib/dflash-trainer/launch"),
    ("env", "/etc/dflash-trainer/trainer.env"),
    ("log", "/workspace/trainer.log"),
    ("log", "/var/log/dflash/trainer.log"),
    ("lock", "/run/dflash-trainer.deploy.lock"),
    ("lock_guard", "/run/dflash-trainer.deploy.lock.guard"),
    ("state", "/run/dflash-trainer/restart.json"),
    ("cache", "/tmp/torchinductor_root"),
    ("cache", "/root/.cache/torch/inductor"),
    ("unit", "/etc/systemd/system/dflash-trainer.service"),
])
def test_defaults_and_usual_places_are_accepted(kind, path):
    assert o.placement_problem(kind, path) is None


def test_state_files_need_a_root_owned_directory_nobody_else_writes():
    base = {"path": "/data/x.json", "real": "/data/x.json", "exists": False, "parent": "/data"}
    assert "owned by uid 1000" in o.judge("trainer_job_state_path", "state", dict(base, parent_uid=1000, parent_mode=0o755))
    assert "others can write" in o.judge("trainer_job_state_path", "state", dict(base, parent_uid=0, parent_mode=0o1777))
    assert o.judge("trainer_job_state_path", "state", dict(base, parent_uid=0, parent_mode=0o755)) is None
    # a log may live in a directory its user owns (it is appended to, never a state file)
    assert o.judge("trainer_log_path", "log", dict(base, parent_uid=1000, parent_mode=0o755)) is None


def test_the_lock_is_a_directory_with_an_owner_record(tmp_path):
    lock = tmp_path / "x.lock"
    lock.mkdir()
    (lock / "owner.json").write_text(json.dumps({"token": "t", "owner": "me"}))
    assert o.judge("trainer_lock_path", "lock", o.observe(str(lock), "lock")) is None
    (lock / "id_rsa").write_text("-----BEGIN")
    assert "not written by dflash.trainer" in o.judge("trainer_lock_path", "lock", o.observe(str(lock), "lock"))


def test_the_release_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    assert o.judge("trainer_root", "root", o.observe(str(root), "root")) is None
    (root / "releases").mkdir()
    (root / "current").symlink_to("releases/x")
    assert o.judge("trainer_root", "root", o.observe(str(root), "root")) is None
    other = tmp_path / "home"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    why = o.judge("trainer_root", "root", o.observe(str(other), "root"))
    assert "not a release root" in why and "notes.txt" in why


def cache_tree(base, names):
    base.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name.endswith("/"):
            (base / name.rstrip("/")).mkdir()
        else:
            (base / name).write_text("x")
    return str(base)


def test_a_real_inductor_cache_layout_is_accepted(tmp_path):
    # the layout of a real /tmp/torchinductor_root after a tiny torch.compile model (FIELD-NOTES)
    names = ["3e/", "au/", "yx/", "locks/", "precompiled_headers/", "fxgraph/", "aotautograd/", "triton/", "cache/",
             "memoizer_cache.json", "tmpa1b2c3.py"]
    path = cache_tree(tmp_path / "torchinductor_root", names)
    assert o.judge("trainer_inductor_cache_dir", "cache", o.observe(path, "cache")) is None


@pytest.mark.parametrize("names,shown", [
    (["checkpoint.pt", "ab/"], "checkpoint.pt"),
    (["authorized_keys", "known_hosts"], "authorized_keys, known_hosts"),
    (["step_1000/", "step_2000/"], "step_1000/, step_2000/"),
])
def test_anything_else_is_refused_naming_what_it_holds(tmp_path, names, shown):
    path = cache_tree(tmp_path / "c", names)
    why = o.judge("trainer_inductor_cache_dir", "cache", o.observe(path, "cache"))
    assert "does not look like a torchinductor cache" in why and shown in why


def test_a_file_at_the_cache_path_is_refused(tmp_path):
    (tmp_path / "c").write_text("x")
    assert "not a torchinductor cache directory" in o.cache_problem(o.observe(str(tmp_path / "c"), "cache"))


def test_purge_refuses_what_is_not_a_cache_and_deletes_nothing(tmp_path):
    path = cache_tree(tmp_path / "ckpt", ["checkpoint.pt", "ab/"])
    with pytest.raises(StepFailed) as exc:
        purge(path)
    assert "checkpoint.pt" in exc.value.msg and "nothing was deleted" in exc.value.msg
    assert os.path.exists(os.path.join(path, "checkpoint.pt"))


def test_purge_empties_a_mount_point_instead_of_removing_it(tmp_path, monkeypatch):
    path = cache_tree(tmp_path / "mnt", ["ab/", "locks/", "memoizer_cache.json"])
    (tmp_path / "mnt" / "ab" / "k.so").write_text("x")
    real_ismount = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: p == path or real_ismount(p))
    assert purge(path)
    assert os.path.isdir(path) and os.listdir(path) == []


def test_collisions_after_resolution(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").symlink_to(tmp_path / "a")
    targets = [("trainer_log_path", "log", o.observe(str(tmp_path / "a" / "x"), "log")),
               ("trainer_env_file", "env", o.observe(str(tmp_path / "b" / "x"), "env"))]
    got = o.problems(targets)
    assert got == [("trainer_env_file", "%s resolves to %s, the same file as trainer_log_path"
                    % (tmp_path / "b" / "x", tmp_path / "a" / "x"))]
    cache = [("trainer_inductor_cache_dir", "cache", o.observe(str(tmp_path / "b"), "cache"))]
    got = o.problems(targets[:1] + cache)
    assert got and got[0][0] == "trainer_inductor_cache_dir" and "the purge would delete it" in got[0][1]


def test_managed_lists_every_file_a_deploy_writes():
    v = {"trainer_root": "/opt/r", "trainer_launcher_path": "/usr/local/lib/dflash-trainer/launch",
         "trainer_env_file": "/etc/dflash-trainer/trainer.env", "trainer_log_path": "/workspace/t.log",
         "trainer_log_keep": 2, "trainer_lock_path": "/run/l", "trainer_job_state_path": "/run/dflash-trainer/s.json",
         "trainer_inductor_cache_dir": "/tmp/torchinductor_root", "trainer_purge_inductor_cache": True}
    got = o.managed(v, "/etc/systemd/system/t.service")
    paths = [p for _v, _k, p in got]
    assert paths == ["/opt/r", "/usr/local/lib/dflash-trainer/launch", "/etc/dflash-trainer/trainer.env",
                     "/etc/systemd/system/t.service", "/workspace/t.log", "/workspace/t.log.start",
                     "/workspace/t.log.1", "/workspace/t.log.2", "/run/l", "/run/l.guard",
                     "/run/dflash-trainer/s.json", "/tmp/torchinductor_root"]
    assert "/tmp/torchinductor_root" not in [p for _v, _k, p in o.managed(dict(v, trainer_purge_inductor_cache=False))]


def test_a_cache_under_a_parent_linked_to_the_release_root_is_refused(tmp_path):
    root = tmp_path / "opt" / "dflash-trainer"
    (root / "releases").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rl").symlink_to(root)
    targets = [("trainer_root", "root", o.observe(str(root), "root")),
               ("trainer_inductor_cache_dir", "cache", o.observe(str(tmp_path / "data" / "rl" / "cache"), "cache")),
               ("trainer_log_path", "log", o.observe(str(tmp_path / "data" / "rl" / "t.log"), "log"))]
    got = dict(o.problems(targets))
    assert "inside the release root" in got["trainer_inductor_cache_dir"]
    assert "the purge would delete releases" in got["trainer_inductor_cache_dir"]
    assert "inside the release root" in got["trainer_log_path"]


def test_a_job_state_longer_than_the_head_is_still_ours(tmp_path):
    """The job state keeps log tails: far more than the 4 KiB a mark is looked for in."""
    state = {"job_id": "x", "done": True, "result": {"log_tail": ["line %d " % i + "x" * 200 for i in range(100)]}}
    assert judge_at(tmp_path, "restart.json", json.dumps(state, sort_keys=True), "state") is None
