"""The CLI is there after the Quick start (issue 16 item 1): on a fresh clone the Makefile's setup
(`$(VENV)/.installed`, which `make lab` runs first) installs the project itself, editable, so
`.venv/bin/dflash-trainer --help` works - run with a PATH that lacks the venv - and runs the
clone's code; the setup is redone when pyproject.toml changes.

Fast and offline but for the local package index: the clone's venv sees the packages already
installed beside this interpreter (a .pth line), so the setup's `pip install -r
requirements-dev.txt -e .` finds every requirement satisfied and only builds the project."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = next((p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "ansible_runner"))),
            None)

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("make") is None or SITE is None,
                                reason="needs git, make and ansible-runner installed beside this python")


def sh(argv, cwd, env=None, timeout=600, ok=True):
    res = subprocess.run(argv, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if ok:
        assert res.returncode == 0, "%s: rc %s\n%s\n%s" % (" ".join(map(str, argv)), res.returncode,
                                                           res.stdout[-3000:], res.stderr[-3000:])
    return res


def fresh_clone(dest):
    """git clone of this checkout, plus its uncommitted changes (what the next commit holds)."""
    sh(["git", "clone", "--quiet", "--no-hardlinks", ROOT, str(dest)], ROOT)
    changed = sh(["git", "ls-files", "-z", "--modified", "--others", "--exclude-standard"], ROOT).stdout
    for rel in sorted({p for p in changed.split("\0") if p}):
        src, dst = os.path.join(ROOT, rel), os.path.join(str(dest), rel)
        if os.path.lexists(dst) and not os.path.isdir(dst):
            os.unlink(dst)
        if os.path.lexists(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    dest = tmp_path_factory.mktemp("quickstart") / "dflash"
    fresh_clone(dest)
    assert not (dest / ".venv").exists() and not (dest / "dflash_trainer.egg-info").exists()
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    sh([base, "-m", "venv", str(dest / ".venv")], dest)
    site = dest / ".venv" / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages"
    (site / "reuse-installed.pth").write_text(SITE + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL")}
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    sh(["make", "--no-print-directory", ".venv/.installed"], dest, env)
    return dest


def test_dflash_trainer_runs_from_the_venv_without_it_on_path(clone):
    cli = clone / ".venv" / "bin" / "dflash-trainer"
    assert cli.is_file() and os.access(str(cli), os.X_OK)
    res = sh([str(cli), "--help"], clone, env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")})
    assert res.stdout.startswith("usage: dflash-trainer")
    for action in ("deploy", "status", "history", "logs"):
        assert action in res.stdout


def test_the_install_is_the_clones_code_editable(clone):
    probe = "import dflash_trainer.api as a; print(a.__file__); print(a.REPO_ROOT)"
    where, repo_root = sh([str(clone / ".venv" / "bin" / "python"), "-c", probe], "/").stdout.split()
    assert where == str(clone / "dflash_trainer" / "api.py")
    assert repo_root == str(clone)  # the API runs the clone's playbooks, from anywhere


def test_the_setup_is_redone_when_pyproject_changes(clone):
    env = dict(os.environ, PATH="/usr/bin:/bin")
    assert sh(["make", "-q", ".venv/.installed"], clone, env, ok=False).returncode == 0
    stamp = os.stat(str(clone / ".venv" / ".installed")).st_mtime
    os.utime(str(clone / "pyproject.toml"), (stamp + 10, stamp + 10))
    assert sh(["make", "-q", ".venv/.installed"], clone, env, ok=False).returncode == 1
