"""What the collection may write or delete (module_utils/target/ownership.py): every file it writes is
absent or carries its mark, resolved paths included; the purge deletes only a torchinductor cache."""
import json
import os
import pathlib
import shutil
import stat
import tempfile

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.target import ownership as o
from ansible_collections.dflash.trainer.plugins.module_utils.target.inductor_cache import CacheRefused, purge
from ansible_collections.dflash.trainer.plugins.module_utils.target.marks import ROOT_MARK
from ansible_collections.dflash.trainer.plugins.module_utils.proof.trainer_log import marker_line

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "roles", "trainer", "files", "dflash-trainer-launch")
UNIT = "[Unit]\nDescription=DFlash trainer (dflash-trainer), managed by dflash.trainer\n"


@pytest.fixture
def tmp_path():
    """A private directory outside /tmp (pytest's tmp_path lies in /tmp, a sticky directory every
    user can write, which the check refuses for most files of ours, as it must on the target): in
    root's home, root-owned from / down."""
    base = tempfile.mkdtemp(prefix="dflash-ownership-test-", dir=os.path.expanduser("~"))
    os.chmod(base, 0o700)
    try:
        yield pathlib.Path(base)
    finally:
        shutil.rmtree(base)


@pytest.fixture(autouse=True)
def root_is_who_runs_the_tests(monkeypatch):
    """Root's files are the ones the check trusts; a developer running the tests as another user
    owns tmp_path: that uid stands in for root then."""
    monkeypatch.setattr(o, "_ROOT_UID", os.geteuid())


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
    ("env", o.ENV_MARK + '\nHF_TOKEN="x"\n'),
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


def test_shadow_like_lines_are_not_an_env_file(tmp_path):
    assert judge_at(tmp_path, "shadow", "root:$y$j9T$abc:19000:0:99999:7:::\n", "env")


@pytest.mark.parametrize("kind,content", [
    # the collection's own words without its mark line: the mark is what makes a file ours
    ("launcher", "#!/usr/bin/python3\n\"\"\"ExecStart of the dflash trainer unit: pin the release\n"),
    ("env", 'HF_TOKEN="x"\nPYTHONUNBUFFERED="1"\nTORCHINDUCTOR_CACHE_DIR="/tmp/torchinductor_root"\n'),
    ("env", 'HF_TOKEN="x"\n' + o.ENV_MARK + "\n"),  # the mark, but not as the first line
])
def test_a_file_without_the_mark_is_refused(tmp_path, kind, content):
    why = judge_at(tmp_path, "f", content, kind)
    assert why and "exists and was not written by dflash.trainer" in why


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
    ("cache", "/var/cache/dflash-trainer/inductor"),
    ("cache", "/root/.cache/torch/inductor"),
    ("unit", "/etc/systemd/system/dflash-trainer.service"),
])
def test_defaults_and_usual_places_are_accepted(kind, path):
    assert o.placement_problem(kind, path) is None


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
    with pytest.raises(CacheRefused) as exc:
        purge(path)
    assert "checkpoint.pt" in exc.value.msg and "nothing was deleted" in exc.value.msg
    assert os.path.exists(os.path.join(path, "checkpoint.pt"))


def test_purge_empties_a_mount_point_instead_of_removing_it(tmp_path, monkeypatch):
    path = cache_tree(tmp_path / "mnt", ["ab/", "locks/", "memoizer_cache.json"])
    (tmp_path / "mnt" / "ab" / "cabm7qpgiyjpkp7if2jwvf7dvibbkcxzvaxvrwcbwndsspltizml.so").write_text("x")
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
         "trainer_inductor_cache_dir": "/var/cache/dflash-trainer/inductor", "trainer_purge_inductor_cache": True}
    got = o.managed(v, "/etc/systemd/system/t.service")
    paths = [p for _v, _k, p in got]
    assert paths == ["/opt/r", "/usr/local/lib/dflash-trainer/launch", "/etc/dflash-trainer/trainer.env",
                     "/etc/systemd/system/t.service", "/workspace/t.log", "/workspace/t.log.start",
                     "/workspace/t.log.1", "/workspace/t.log.2", "/run/l", "/run/l.guard",
                     "/run/dflash-trainer/s.json", "/var/cache/dflash-trainer/inductor", "nvidia-smi"]
    # purge or not, the trainer writes compiled code there and loads it as root: judged either way
    assert ("trainer_inductor_cache_dir", "cache", "/var/cache/dflash-trainer/inductor") in o.managed(
        dict(v, trainer_purge_inductor_cache=False))


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


# ---------------------------------------------------------------------------------------------
# every directory above a file of ours is root's and writable by root alone (sshd's StrictModes)

def as_user(path, uid=1000, mode=None):
    os.chown(str(path), uid, uid)
    if mode is not None:
        os.chmod(str(path), mode)
    return path


@pytest.mark.parametrize("kind", ["log", "log_rotation", "log_start", "env", "launcher", "metrics", "state", "lock",
                                  "lock_guard", "root"])
def test_a_directory_another_user_owns_is_refused_naming_it(tmp_path, kind):
    (tmp_path / "u").mkdir()
    d = as_user(tmp_path / "u", mode=0o755)
    why = o.judge("trainer_x", kind, o.observe(str(d / "f"), kind))
    assert why == "%s is in %s, owned by uid 1000 (mode 0755): every directory above it must be root's, or that " \
                  "user can replace the file before root %s it" % (d / "f", d, o._USE.get(kind, "writes"))


def test_a_deeper_directory_of_another_user_is_refused_too(tmp_path):
    (tmp_path / "u" / "deep").mkdir(parents=True)
    as_user(tmp_path / "u", mode=0o700)
    why = o.judge("trainer_env_file", "env", o.observe(str(tmp_path / "u" / "deep" / "missing" / "t.env"), "env"))
    assert "is in %s, owned by uid 1000" % (tmp_path / "u") in why


def test_a_group_writable_directory_is_refused(tmp_path):
    (tmp_path / "g").mkdir()
    os.chmod(str(tmp_path / "g"), 0o775)
    why = o.judge("trainer_launcher_path", "launcher", o.observe(str(tmp_path / "g" / "launch"), "launcher"))
    assert "is in %s (uid 0, mode 0775), which its group or others can write" % (tmp_path / "g") in why


def test_a_sticky_shared_directory_holds_only_files_root_creates_anew(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(str(shared), 0o1777)
    for kind in ("log", "log_start", "env", "launcher", "lock", "lock_guard", "root", "metrics"):
        why = o.judge("trainer_x", kind, o.observe(str(shared / "f"), kind))
        assert "is in %s (mode 1777), a directory every user can write" % shared in why, kind
        assert "only the restart job's state" in why
    # the job state: created with O_EXCL and renamed into place
    assert o.judge("trainer_job_state_path", "state", o.observe(str(shared / "s.json"), "state")) is None
    # ... but only right there: a directory below that is missing yet could be made by anyone first
    why = o.judge("trainer_job_state_path", "state", o.observe(str(shared / "d" / "s.json"), "state"))
    assert "a directory every user can write: another user can put a file or directory of theirs at that name " \
           "first" in why
    # ... and never one another user planted
    (shared / "s.json").write_text(json.dumps({"job_id": "x"}))
    as_user(shared / "s.json")
    why = o.judge("trainer_job_state_path", "state", o.observe(str(shared / "s.json"), "state"))
    assert why == "%s exists and belongs to uid 1000: root adopts only its own files" % (shared / "s.json")


@pytest.mark.parametrize("kind,content", [
    ("log", marker_line("a" * 32, "r1", 7, "t") + "\n"),
    ("env", o.ENV_MARK + "\nLD_PRELOAD=\"/home/u/x.so\"\n"),
    ("metrics", o.METRICS_MARK + " x\n"),
])
def test_a_file_of_another_user_is_not_adopted_even_with_our_mark(tmp_path, kind, content):
    path = tmp_path / "f"
    path.write_text(content)
    as_user(path)
    assert o.judge("trainer_x", kind, o.observe(str(path), kind)) == \
        "%s exists and belongs to uid 1000: root adopts only its own files" % path
    os.chown(str(path), 0, 0)
    os.chmod(str(path), 0o666)
    assert o.judge("trainer_x", kind, o.observe(str(path), kind)) == \
        "%s exists with mode 0666: its group or others can change it" % path
    os.chmod(str(path), 0o644)
    assert o.judge("trainer_x", kind, o.observe(str(path), kind)) is None


def test_the_chain_is_judged_from_slash_down():
    f = {"path": "/data/x.log", "real": "/data/x.log", "exists": False,
         "chain": [("/", 0, 0o755), ("/data", 0, 0o1777)]}
    assert "is in /data (mode 1777)" in o.judge("trainer_log_path", "log", f)
    f["chain"] = [("/", 1000, 0o755), ("/data", 0, 0o755)]
    assert "is in /, owned by uid 1000" in o.judge("trainer_log_path", "log", f)
    f["chain"] = [("/", 0, 0o755), ("/data", 0, 0o755)]
    assert o.judge("trainer_log_path", "log", f) is None


def test_an_owner_of_uid_65534_is_explained_as_the_id_map():
    """In an unprivileged container a bind mount that is not id-mapped shows its files as uid 65534 (nobody): the
    refusal says what that means and what to do on the node, once."""
    f = {"path": "/data/x.log", "real": "/data/x.log", "exists": False,
         "chain": [("/", 0, 0o755), ("/data", 65534, 0o755)]}
    why = o.judge("trainer_log_path", "log", f)
    assert why.startswith("/data/x.log is in /data, owned by uid 65534 (mode 0755)")
    assert why.count("uid 65534 is nobody") == 1 and "id map does not cover" in why and "uid 100000" in why
    f["chain"] = [("/", 0, 0o755), ("/data", 1000, 0o755)]
    assert "nobody" not in o.judge("trainer_log_path", "log", f)
    assert o.idmap_words(None) is None and o.idmap_words("owned by uid 655340") == "owned by uid 655340"


# -- the environment file and the launcher outlive a reboot -----------------------------------------

MOUNTINFO = (
    "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "23 22 0:22 / /run rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,size=1024k,mode=755\n"
    "24 23 0:23 / /run/lock rw,nosuid,nodev,noexec - tmpfs tmpfs rw,size=5120k\n"
    "25 22 0:24 / /data/my\\040disk rw - xfs /dev/sdb1 rw\n"
    "26 22 0:25 / /tmp rw - tmpfs tmpfs rw\n"
    "27 22 0:26 / /tmp rw - ext4 /dev/sdc1 rw\n"  # mounted over the tmpfs: the later line wins
    "garbage\n"
)


@pytest.mark.parametrize("path,want", [
    ("/etc/dflash-trainer/trainer.env", ("/", "ext4")),
    ("/run/dflash-trainer/trainer.env", ("/run", "tmpfs")),
    ("/run/lock/x", ("/run/lock", "tmpfs")),
    ("/runner/x", ("/", "ext4")),
    ("/data/my disk/t.env", ("/data/my disk", "xfs")),
    ("/tmp/x", ("/tmp", "ext4")),
])
def test_mount_of_reads_mountinfo(path, want):
    assert o.mount_of(path, MOUNTINFO) == want


def test_mount_of_without_mountinfo():
    assert o.mount_of("/x", None) is None and o.mount_of("/x", "nonsense\n") is None


@pytest.mark.parametrize("kind", ["env", "launcher"])
def test_the_environment_file_and_the_launcher_are_refused_on_a_tmpfs(kind):
    f = {"path": "/run/dflash-trainer/f", "real": "/run/dflash-trainer/f", "exists": False,
         "chain": [("/", 0, 0o755), ("/run", 0, 0o755)], "mount_point": "/run", "fstype": "tmpfs"}
    why = o.judge("trainer_x", kind, f)
    assert why.startswith("/run/dflash-trainer/f lies on a tmpfs (/run): it is lost at reboot, and the enabled unit "
                          "then fails to start")
    assert o.judge("trainer_x", "log", f) is None  # a log there is only lost
    assert o.judge("trainer_x", kind, dict(f, fstype="ext4")) is None


def test_observe_reads_this_machines_mounts(tmp_path):
    f = o.observe(str(tmp_path / "t.env"), "env")
    with open("/proc/self/mountinfo") as fh:
        assert (f["mount_point"], f["fstype"]) == o.mount_of(str(tmp_path), fh.read())


# -- the release root: ours by its marker ------------------------------------------------------------

def release(root, rid, marked=True):
    (root / "releases" / rid).mkdir(parents=True)
    if marked:
        (root / "releases" / rid / o.RELEASE_MARK_NAME).write_text("{}")


def test_a_root_with_our_marker_is_ours(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / o.ROOT_MARK_NAME).write_text(ROOT_MARK + "\n")
    (root / "notes.txt").write_text("x")  # an operator's file beside ours: the marker says the root is ours
    assert o.judge("trainer_root", "root", o.observe(str(root), "root")) is None


def test_a_root_an_older_version_made_is_adopted_when_everything_in_it_is_ours(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    release(root, "0123456789abcdef")
    (root / "releases" / ".tmp-delete-x").mkdir()
    (root / "current").symlink_to("releases/0123456789abcdef")
    (root / "last_good").write_text("0123456789abcdef\n")
    (root / "ledger.json").write_text(json.dumps({"version": 1, "entries": []}, sort_keys=True, indent=1))
    (root / ".lock").write_text("")
    f = o.observe(str(root), "root")
    assert o.root_kind(f) == "legacy" and o.judge("trainer_root", "root", f) is None
    # a ledger that is not ours, or a foreign name: not adopted
    (root / "ledger.json").write_text('{"accounts": []}')
    assert o.root_kind(o.observe(str(root), "root")) is None
    (root / "ledger.json").write_text(json.dumps({"entries": []}))
    (root / "id_rsa").write_text("x")
    why = o.judge("trainer_root", "root", o.observe(str(root), "root"))
    assert "is not a release root of dflash.trainer (no %s)" % o.ROOT_MARK_NAME in why and "id_rsa" in why


def test_another_applications_deploy_root_is_refused(tmp_path):
    """releases/ + current, the Capistrano layout: its releases carry no marker of ours."""
    root = tmp_path / "app"
    root.mkdir()
    release(root, "20260101120000", marked=False)
    (root / "current").symlink_to("releases/20260101120000")
    why = o.judge("trainer_root", "root", o.observe(str(root), "root"))
    assert "is not a release root of dflash.trainer" in why
    assert "releases/ holds 20260101120000, which has no .dflash-release" in why


def test_an_empty_root_is_ours_only_when_root_made_it(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "lost+found").mkdir()  # a fresh volume's mount point
    assert o.judge("trainer_root", "root", o.observe(str(root), "root")) is None
    as_user(root, mode=0o755)
    assert o.judge("trainer_root", "root", o.observe(str(root), "root")) == \
        "%s exists and belongs to uid 1000: root adopts only its own files" % root


def test_what_a_root_holds_is_roots(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / o.ROOT_MARK_NAME).write_text(ROOT_MARK + "\n")
    release(root, "r1")
    (root / "ledger.json").write_text(json.dumps({"entries": []}))
    as_user(root / "releases", mode=0o755)
    assert "holds releases, which belongs to uid 1000" in o.judge("trainer_root", "root", o.observe(str(root), "root"))
    os.chown(str(root / "releases"), 0, 0)
    os.chmod(str(root / "ledger.json"), 0o666)
    assert "holds ledger.json (mode 0666)" in o.judge("trainer_root", "root", o.observe(str(root), "root"))


def test_the_first_lock_of_a_root_marks_it(tmp_path):
    from ansible_collections.dflash.trainer.plugins.module_utils.release import root as rr
    root = tmp_path / "root"
    release(root, "r1")
    with rr._Lock(str(root)):
        pass
    assert (root / o.ROOT_MARK_NAME).read_text() == ROOT_MARK + "\n"
    assert stat.S_IMODE(os.lstat(str(root / o.ROOT_MARK_NAME)).st_mode) == 0o644
    assert rr.mark_root(str(root)) is False  # there already: left as it is
    f = o.observe(str(root), "root")
    assert o.root_kind(f) == "marked" and o.judge("trainer_root", "root", f) is None


# -- programs run as root ----------------------------------------------------------------------------

def program(tmp_path, rel="bin/nvidia-smi", mode=0o755):
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(str(path), mode)
    return path


def test_a_root_program_in_root_directories_is_accepted(tmp_path):
    smi = program(tmp_path)
    for item in (str(smi), o.program_item("nvidia-smi", str(tmp_path / "nowhere") + ":" + str(smi.parent))):
        f = o.observe(item, o.PROGRAM)
        assert f["found"] == str(smi) and o.judge("trainer_nvidia_smi", o.PROGRAM, f) is None


def test_a_program_that_is_not_there_is_left_to_its_caller(tmp_path):
    assert o.judge("trainer_nvidia_smi", o.PROGRAM, o.observe(str(tmp_path / "none"), o.PROGRAM)) is None
    f = o.observe(o.program_item("nvidia-smi", str(tmp_path)), o.PROGRAM)
    assert not f.get("found") and o.judge("trainer_nvidia_smi", o.PROGRAM, f) is None


def test_another_users_program_or_directory_is_refused(tmp_path):
    smi = program(tmp_path)
    as_user(smi)
    why = o.judge("trainer_nvidia_smi", o.PROGRAM, o.observe(str(smi), o.PROGRAM))
    assert why == "%s, which belongs to uid 1000: a program run as root must be a file root owns and only root may " \
                  "write, in directories only root may write (as sudo's secure_path)" % smi
    os.chown(str(smi), 0, 0)
    os.chmod(str(smi), 0o775)
    why = o.judge("v", o.PROGRAM, o.observe(str(smi), o.PROGRAM))
    assert "(mode 0775), which its group or others can change" in why
    os.chmod(str(smi), 0o755)
    os.chmod(str(smi.parent), 0o1777)
    why = o.judge("v", o.PROGRAM, o.observe(o.program_item("nvidia-smi", str(smi.parent)), o.PROGRAM))
    assert why.startswith("nvidia-smi resolves to %s, in %s (mode 1777), which every user can write"
                          % (smi, smi.parent))
    os.chmod(str(smi.parent), 0o755)
    as_user(smi.parent)
    assert "in %s, owned by uid 1000 (mode 0755)" % smi.parent in o.judge("v", o.PROGRAM,
                                                                          o.observe(str(smi), o.PROGRAM))


def test_a_symlinked_program_is_judged_where_it_leads(tmp_path):
    real = program(tmp_path, "u/nvidia-smi")
    as_user(tmp_path / "u", mode=0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").symlink_to(real)
    why = o.judge("v", o.PROGRAM, o.observe(str(tmp_path / "bin" / "nvidia-smi"), o.PROGRAM))
    assert why.startswith("%s resolves to %s, in %s, owned by uid 1000" % (tmp_path / "bin" / "nvidia-smi", real,
                                                                           tmp_path / "u"))


def test_search_dirs_is_get_bin_paths():
    assert o.search_dirs(environ={"PATH": "/usr/bin:/sbin"}) == ["/usr/bin", "/sbin", "/usr/sbin", "/usr/local/sbin"]
    assert o.search_dirs("/opt/conda/bin::/usr/bin") == ["/opt/conda/bin", "/usr/bin"]
    assert o.program_lookup(o.program_item("python3", "/a:/b")) == ("python3", "/a:/b")
    assert o.program_lookup(o.program_item("/usr/bin/python3", "/a")) == ("/usr/bin/python3", None)
    assert o.program_lookup("nvidia-smi") == ("nvidia-smi", None)


def test_managed_lists_the_programs_root_runs():
    v = {"trainer_nvidia_smi": "/opt/nv/nvidia-smi", "trainer_preflight_command": ["python3", "-c", "import x"],
         "trainer_command": ["./run.sh"], "trainer_env": {"PATH": "/opt/conda/bin:/usr/bin"}}
    assert [(var, p) for var, k, p in o.managed(v) if k == o.PROGRAM] == [
        ("trainer_nvidia_smi", "/opt/nv/nvidia-smi"),
        ("trainer_preflight_command", o.program_item("python3", "/opt/conda/bin:/usr/bin"))]
    v = {"trainer_command": ["/opt/venv/bin/python", "train.py"], "trainer_preflight_command": []}
    assert [(var, p) for var, k, p in o.managed(v) if k == o.PROGRAM] == [
        ("trainer_nvidia_smi", "nvidia-smi"), ("trainer_command", "/opt/venv/bin/python")]
    v = {"trainer_command": ["python3"]}
    assert o.program_lookup([p for _v, k, p in o.managed(v) if k == o.PROGRAM][-1]) == ("python3", o.SYSTEMD_PATH)


# -- the environment's search paths (trainer_env PATH, PYTHONPATH, LD_PRELOAD, ...) --------------------

def test_managed_lists_every_absolute_search_entry_of_the_environment():
    v = {"trainer_env": {"PATH": "/opt/conda/bin::/usr/bin:bin", "PYTHONPATH": "/srv/lib:/srv/lib",
                         "LD_PRELOAD": "/opt/a.so /opt/b.so:libc.so", "HF_TOKEN": "/not/a/search/path",
                         "BASH_ENV": "/etc/dflash.bashrc"}}
    assert [(var, p) for var, k, p in o.managed(v) if k == o.SEARCH] == [
        ("trainer_env.PATH", "/opt/conda/bin"), ("trainer_env.PATH", "/usr/bin"),
        ("trainer_env.PYTHONPATH", "/srv/lib"), ("trainer_env.LD_PRELOAD", "/opt/a.so"),
        ("trainer_env.LD_PRELOAD", "/opt/b.so"), ("trainer_env.BASH_ENV", "/etc/dflash.bashrc")]
    assert [k for _v, k, _p in o.managed({"trainer_env": {"PATH": 7}})].count(o.SEARCH) == 0


def test_a_root_search_directory_is_accepted_and_an_absent_one_under_root_too(tmp_path):
    (tmp_path / "lib").mkdir(mode=0o755)
    for path in (tmp_path / "lib", tmp_path / "none", tmp_path / "lib" / "none"):
        assert o.judge("trainer_env.PYTHONPATH", o.SEARCH, o.observe(str(path), o.SEARCH)) is None
    assert o.judge("trainer_env.PATH", o.SEARCH, o.observe("/usr/bin", o.SEARCH)) is None


def test_a_search_directory_another_user_owns_or_may_write_is_refused_naming_it(tmp_path):
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    as_user(home / "bin", mode=0o755)
    why = o.judge("trainer_env.PATH", o.SEARCH, o.observe(str(home / "bin"), o.SEARCH))
    assert why.startswith("%s belongs to uid 1000: root's processes (the pre-flight, the launcher, the trainer) "
                          "would run or import what that user puts there" % (home / "bin"))
    # a directory of root's inside one the user owns: the user can rename it away and put their own there
    as_user(home, mode=0o755)
    os.chown(str(home / "bin"), os.geteuid(), 0)
    why = o.judge("trainer_env.PYTHONPATH", o.SEARCH, o.observe(str(home / "bin"), o.SEARCH))
    assert why.startswith("%s is in %s, owned by uid 1000" % (home / "bin", home))
    # absent, under a directory every user may write (as /tmp): another user can create it first
    os.chown(str(home), os.geteuid(), 0)
    os.chmod(str(home), 0o1777)
    why = o.judge("trainer_env.PYTHONPATH", o.SEARCH, o.observe(str(home / "site"), o.SEARCH))
    assert why.startswith("%s is in %s (mode 1777), which every user can write" % (home / "site", home))
    os.chmod(str(home), 0o755)
    os.chmod(str(home / "bin"), 0o775)
    assert "has mode 0775: its group can write it" in o.judge("v", o.SEARCH, o.observe(str(home / "bin"), o.SEARCH))


def test_a_search_entry_through_another_users_link_is_refused(tmp_path):
    """The link's owner could point it elsewhere after the check: judged as written, not only resolved."""
    (tmp_path / "real").mkdir(mode=0o755)
    link = tmp_path / "lib"
    link.symlink_to(tmp_path / "real")
    assert o.judge("trainer_env.PYTHONPATH", o.SEARCH, o.observe(str(link), o.SEARCH)) is None  # root's link
    os.lchown(str(link), 1000, 1000)
    why = o.judge("trainer_env.PYTHONPATH", o.SEARCH, o.observe(str(link / "sub"), o.SEARCH))
    assert why.startswith("%s (it resolves to %s) is in %s, owned by uid 1000" % (
        link / "sub", tmp_path / "real" / "sub", link))


@pytest.mark.parametrize("kind", ["log", "env", "launcher", "lock", "state", "metrics", "cache", "root"])
def test_a_path_through_another_users_link_is_refused_for_every_kind(tmp_path, kind):
    """Judged as written, not only resolved: the link's owner could point it elsewhere after the check
    (a log written, a cache deleted, a root run from, in a directory of that user's choice)."""
    (tmp_path / "real").mkdir(mode=0o755)
    link = tmp_path / "ln"
    link.symlink_to(tmp_path / "real")
    assert o.judge("trainer_x", kind, o.observe(str(link / "x"), kind)) is None  # root's link: as before
    os.lchown(str(link), 1000, 1000)
    why = o.judge("trainer_x", kind, o.observe(str(link / "x"), kind))
    assert why is not None and "is reached through %s, a symlink owned by uid 1000" % link in why, why


def test_a_link_inside_a_links_target_and_a_users_directory_on_the_way_are_judged(tmp_path):
    (tmp_path / "real").mkdir(mode=0o755)
    (tmp_path / "mid").mkdir(mode=0o755)
    inner = tmp_path / "mid" / "inner"
    inner.symlink_to(tmp_path / "real")
    (tmp_path / "outer").symlink_to(tmp_path / "mid")
    path = str(tmp_path / "outer" / "inner" / "trainer.log")
    assert o.judge("trainer_log_path", "log", o.observe(path, "log")) is None
    os.lchown(str(inner), 1000, 1000)
    assert "is reached through %s, a symlink owned by uid 1000" % inner in o.judge(
        "trainer_log_path", "log", o.observe(path, "log"))
    os.lchown(str(inner), 0, 0)
    # a root-owned link in a directory another user owns: the user can replace the link
    os.chown(str(tmp_path / "mid"), 1000, 1000)
    why = o.judge("trainer_log_path", "log", o.observe(path, "log"))
    assert "is in %s, owned by uid 1000" % (tmp_path / "mid") in why, why


def test_a_progress_file_whose_directory_is_another_users_link_is_refused(tmp_path):
    from ansible_collections.dflash.trainer.plugins.module_utils.proof import progress_file as pf
    (tmp_path / "real").mkdir(mode=0o755)
    (tmp_path / "real" / "progress.jsonl").write_text('{"step": 1}\n')
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "real")
    path = str(link / "progress.jsonl")
    assert pf.trust_problem(path, os.stat(path), os.stat(str(link))) is None  # root's link: read
    os.lchown(str(link), 1000, 1000)
    # the resolved file and directory are root's alone: only the way as written shows the user's link
    why = pf.trust_problem(path, os.stat(path), os.stat(str(link)))
    assert why.startswith("the progress file %s is reached through %s, a symlink owned by uid 1000" % (path, link))
    p = {"progress_path": path}
    assert pf.collision(p) == why


def test_a_cache_of_another_users_or_in_a_directory_of_theirs_is_refused(tmp_path):
    """Whoever owns the cache, or a directory above it, can put compiled code there that root loads."""
    home = tmp_path / "home"
    (home / "cache").mkdir(parents=True, mode=0o755)
    assert o.judge("trainer_inductor_cache_dir", "cache", o.observe(str(home / "cache"), "cache")) is None
    os.chown(str(home / "cache"), 1000, 1000)
    why = o.judge("trainer_inductor_cache_dir", "cache", o.observe(str(home / "cache"), "cache"))
    assert why == ("%s belongs to uid 1000 (mode 0755): that user could plant compiled code there that the trainer "
                   "would load as root; remove it (root makes it anew)" % (home / "cache"))
    os.chown(str(home / "cache"), 0, 0)
    os.chown(str(home), 1000, 1000)
    why = o.judge("trainer_inductor_cache_dir", "cache", o.observe(str(home / "cache"), "cache"))
    assert why.startswith("%s is in %s, owned by uid 1000" % (home / "cache", home)), why


def test_a_cache_anyone_could_make_first_is_refused_purge_or_not(tmp_path):
    """A cache in a sticky shared directory (/tmp after a boot): another user can make the directory
    before the trainer starts and plant compiled code there that root loads - refused whether it exists
    or not; and a root-owned cache others may write."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(str(shared), 0o1777)
    why = o.judge("trainer_inductor_cache_dir", "cache", o.observe(str(shared / "torchinductor_root"), "cache"))
    assert why.startswith("%s is in %s (mode 1777), a directory every user can write: another user can put a file "
                          "or directory of theirs at that name first" % (shared / "torchinductor_root", shared)), why
    (shared / "torchinductor_root").mkdir(mode=0o700)
    why = o.judge("trainer_inductor_cache_dir", "cache", o.observe(str(shared / "torchinductor_root"), "cache"))
    assert "(mode 1777), a directory every user can write" in why, why
    own = tmp_path / "cache"
    own.mkdir(mode=0o755)
    assert o.judge("trainer_inductor_cache_dir", "cache", o.observe(str(own), "cache")) is None
    os.chmod(str(own), 0o777)
    why = o.judge("trainer_inductor_cache_dir", "cache", o.observe(str(own), "cache"))
    assert why == "%s has mode 0777: every user can plant compiled code there that the trainer would load as root; " \
                  "make it writable by root alone (chmod 0700) or remove it" % own
    os.chmod(str(own), 0o700)
    os.chmod(str(tmp_path), 0o775)
    why = o.judge("trainer_inductor_cache_dir", "cache", o.observe(str(own), "cache"))
    assert "which its group or others can write" in why, why
    os.chmod(str(tmp_path), 0o700)
