"""The action plugin end to end: ansible-playbook against localhost over the local connection."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.release.root import switch_current

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: deploy
      dflash.trainer.trainer_release:
        root: "{{ root }}"
        src: "{{ src }}"
        keep: 3
      register: r
    - name: report
      ansible.builtin.copy:
        content: "{{ r | to_json }}"
        dest: "{{ out }}"
      delegate_to: localhost
      check_mode: false
"""

pytestmark = pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="needs ansible-playbook")


def make_src(path):
    os.makedirs(os.path.join(path, "pkg", "__pycache__"))
    with open(os.path.join(path, "run.sh"), "w") as f:
        f.write("#!/bin/sh\nexec python3 trainer.py\n")
    os.chmod(os.path.join(path, "run.sh"), 0o755)
    with open(os.path.join(path, "trainer.py"), "w") as f:
        f.write("print('step=1')\n")
    with open(os.path.join(path, "pkg", "__pycache__", "x.pyc"), "wb") as f:
        f.write(b"\0")
    for i in range(20):
        with open(os.path.join(path, "pkg", "m%02d.py" % i), "w") as f:
            f.write("X = %d\n" % i)


def tree_of(path):
    """relpath -> (mode, bytes or link target) of everything below path, but the release marker
    and the default excludes."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(str(path)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, str(path))
            if rel == ".dflash-release":
                continue
            st = os.lstat(full)
            if os.path.islink(full):
                out[rel] = ("link", os.readlink(full))
            elif os.path.isdir(full):
                out[rel] = (st.st_mode & 0o7777, None)
            else:
                with open(full, "rb") as f:
                    out[rel] = (st.st_mode & 0o7777, f.read())
    return out


def switch(root, rid):
    """Point <root>/current at rid, as the restart job does (trainer_release never moves it)."""
    switch_current(str(root), rid)


def deploy_task_output(stdout):
    """-vvv output of the deploy task alone (the report task makes its own tmp dirs)."""
    return stdout.split("TASK [deploy]", 1)[1].split("TASK [report]", 1)[0]


def module_runs(stdout):
    return sum(1 for line in stdout.splitlines()
               if line.startswith("Using module file") and line.rstrip().endswith("trainer_release.py"))


def archive_puts(stdout):
    return sum(1 for line in stdout.splitlines() if "PUT " in line and "release-" in line and ".tar" in line)


def play(tmp_path, src, root, check=False, extra=None, pipelining=False):
    book = tmp_path / "play.yml"
    book.write_text(PLAYBOOK)
    out = tmp_path / "result.json"
    if out.exists():
        out.unlink()
    ev = {"root": str(root), "src": str(src), "out": str(out),
          "ansible_python_interpreter": "/usr/bin/python3"}
    ev.update(extra or {})
    cmd = ["ansible-playbook", "-vvv", "-i", "localhost,", "-c", "local", "-e", json.dumps(ev), str(book)]
    if check:
        cmd.append("--check")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
               ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-remote"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_PIPELINING="1" if pipelining else "0",
               XDG_CACHE_HOME=str(tmp_path / "cache"))  # the controller's hash cache: ours
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)
    result = json.loads(out.read_text()) if out.exists() else None
    return proc, result


@pytest.fixture(scope="module")
def python_ok():
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs /usr/bin/python3")


def test_deploy_twice_then_change(tmp_path, python_ok):
    src, root = tmp_path / "src", tmp_path / "opt" / "dflash-trainer"
    make_src(str(src))

    proc, r = play(tmp_path, src, root, check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r["changed"] is True and r["transferred"] is True and not root.exists()
    assert module_runs(proc.stdout) == 1 and archive_puts(proc.stdout) == 0

    proc, r1 = play(tmp_path, src, root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r1["changed"] is True and r1["transferred"] is True and "switched" not in r1
    assert r1["current"] is None and not os.path.lexists(str(root / "current"))  # the restart job's
    assert r1["file_count"] == 22 and r1["bytes"] > 0 and r1["archive_bytes"] > 0
    assert "needs_archive" not in r1
    # a small archive (< 1 MiB) rides inside the module arguments: no transfer round trips
    assert module_runs(proc.stdout) == 2 and archive_puts(proc.stdout) == 0
    switch(root, r1["release"])
    current = root / "current"
    assert os.readlink(current) == "releases/" + r1["release"]
    assert os.access(current / "run.sh", os.X_OK)
    assert (current / "pkg" / "m07.py").read_text() == "X = 7\n"
    assert not (current / "pkg" / "__pycache__").exists()  # default excludes

    assert r1["delta"] is False and r1["sent_files"] == 22 and r1["reused_files"] == 0

    proc, r2 = play(tmp_path, src, root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r2["changed"] is False and r2["transferred"] is False and r2["release"] == r1["release"]
    assert module_runs(proc.stdout) == 1 and archive_puts(proc.stdout) == 0
    # pipelined (as over dflash.trainer.pct), a no-op is one module run and makes no remote tmp dir
    proc, r2p = play(tmp_path, src, root, pipelining=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r2p["changed"] is False and r2p["release"] == r1["release"]
    assert "Pipelining is enabled" in deploy_task_output(proc.stdout)
    assert module_runs(proc.stdout) == 1 and "ansible-tmp-" not in deploy_task_output(proc.stdout)

    # one file changed: a delta carrying that file alone, the rest linked from the current release
    (src / "trainer.py").write_text("print('step=2')\n")
    proc, r3 = play(tmp_path, src, root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r3["release"] != r1["release"] and r3["previous"] == r1["release"]
    assert "switched" not in r3 and set(r3["releases"]) == {r1["release"], r3["release"]}
    assert r3["current"] == r1["release"] and os.readlink(root / "current") == "releases/" + r1["release"]
    assert r3["delta"] is True and r3["base"] == r1["release"]
    assert r3["sent_files"] == 1 and r3["reused_files"] == 21
    # same mode and owner: every reused file is a hard link to the previous release's
    assert r3["linked_files"] == 21 and r3["copied_files"] == 0
    old_release = root / "releases" / r1["release"]
    new_release = root / "releases" / r3["release"]
    assert os.stat(new_release / "pkg" / "m07.py").st_ino == os.stat(old_release / "pkg" / "m07.py").st_ino
    assert r3["archive_bytes"] > 0 and "have" not in r3 and "needs_archive" not in r3
    assert module_runs(proc.stdout) == 2 and archive_puts(proc.stdout) == 0
    assert (new_release / "trainer.py").read_text() == "print('step=2')\n"
    assert (old_release / "trainer.py").read_text() == "print('step=1')\n"
    assert os.access(new_release / "run.sh", os.X_OK)
    assert tree_of(new_release) == tree_of(src)
    switch(root, r3["release"])
    # the remote tmp dir holding the archive is gone
    remote_tmp = tmp_path / "ansible-remote"
    assert not remote_tmp.exists() or not any(remote_tmp.iterdir())

    proc, r4 = play(tmp_path, src, root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r4["changed"] is False and r4["release"] == r3["release"] and "delta" not in r4

    # a base file that fails its sha256 check: the action falls back to the full archive (the
    # in-place edit shows in both releases: they share m07.py's inode - the limit of linking)
    with open(root / "current" / "pkg" / "m07.py", "w") as f:
        f.write("X = 8\n")
    (src / "trainer.py").write_text("print('step=3')\n")
    proc, r5 = play(tmp_path, src, root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r5["changed"] is True and r5["delta"] is False and r5["sent_files"] == 22
    assert r5["linked_files"] == 0 and r5["copied_files"] == 0
    assert "does not match its recorded sha256" in r5["delta_fallback"]
    assert module_runs(proc.stdout) == 3 and archive_puts(proc.stdout) == 0
    assert tree_of(root / "releases" / r5["release"]) == tree_of(src)
    assert r5["current"] == r3["release"] and os.readlink(root / "current") == "releases/" + r3["release"]


def test_missing_src_fails_before_touching_target(tmp_path, python_ok):
    root = tmp_path / "opt" / "dflash-trainer"
    proc, _ignored = play(tmp_path, tmp_path / "nope", root)
    assert proc.returncode != 0
    assert "does not exist on the controller" in proc.stdout
    assert not root.exists()
    (tmp_path / "afile").write_text("x")
    proc, _ignored = play(tmp_path, tmp_path / "afile", root)
    assert proc.returncode != 0 and "is not a directory" in proc.stdout
    assert not root.exists()


def test_large_archive_goes_through_one_transfer(tmp_path, python_ok):
    """Over INLINE_ARCHIVE_MAX the archive is uploaded once into the remote tmp dir, then removed."""
    src, root = tmp_path / "src", tmp_path / "root"
    make_src(str(src))
    (src / "weights.bin").write_bytes(os.urandom(3 * 1024 * 1024))  # incompressible: > 1 MiB archive
    proc, r1 = play(tmp_path, src, root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert r1["transferred"] is True and r1["archive_bytes"] > 1024 * 1024
    assert module_runs(proc.stdout) == 2 and archive_puts(proc.stdout) == 1
    assert tree_of(root / "releases" / r1["release"]) == tree_of(src)
    assert r1["current"] is None and not os.path.lexists(str(root / "current"))
    remote_tmp = tmp_path / "ansible-remote"
    assert not remote_tmp.exists() or not any(remote_tmp.iterdir())


def test_big_archive_is_a_plain_tar_through_one_transfer(tmp_path, python_ok):
    """Over SMALL_ARCHIVE_MAX the archive is not compressed (a checkpoint does not compress); the local
    connection has no put_stream, so it goes through one put of a local temp file."""
    src, root = tmp_path / "src", tmp_path / "root"
    make_src(str(src))
    (src / "weights.bin").write_bytes(os.urandom(6 * 1024 * 1024))
    proc, r1 = play(tmp_path, src, root, extra={"ansible_pipelining": True})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = deploy_task_output(proc.stdout)
    puts = [line for line in out.splitlines() if "PUT " in line and "release-" in line]
    assert len(puts) == 1 and puts[0].rstrip().endswith(".tar"), puts
    assert "plain tar, one put of a local temp file" in out
    assert r1["transferred"] is True and 6 * 1024 * 1024 < r1["archive_bytes"] < 7 * 1024 * 1024
    assert r1["hashed_files"] == r1["file_count"] == 23
    assert tree_of(root / "releases" / r1["release"]) == tree_of(src)
    assert r1["current"] is None and not os.path.lexists(str(root / "current"))
    remote_tmp = tmp_path / "ansible-remote"
    assert not remote_tmp.exists() or not any(remote_tmp.iterdir())
