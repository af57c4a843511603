"""The node's Python judged before anything runs it: plugin_utils/_node_program's raw script, run here by a
real /bin/sh (this machine stands in for the node), and its judgement."""
import os
import shutil
import subprocess
import tempfile

import pytest

from ansible_collections.dflash.trainer.plugins.plugin_utils import _node_program as np


def ask(path):
    return subprocess.run(["/bin/sh", "-c", np.script(path)], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def home_dir():
    """A directory of root's alone, outside /tmp (sticky, world-writable)."""
    base = tempfile.mkdtemp(prefix="dflash-node-program-", dir=os.path.expanduser("~"))
    os.chmod(base, 0o700)
    yield base
    shutil.rmtree(base)


def python_at(directory, name="python3", mode=0o755):
    path = os.path.join(directory, name)
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\ntouch \"$0.ran\"\n")
    os.chmod(path, mode)
    return path


def test_the_systems_python_is_accepted():
    assert np.problem(ask("/usr/bin/python3"), "/usr/bin/python3") == ""


def test_a_python_of_roots_in_roots_directories_is_accepted_even_through_a_link(home_dir):
    real = python_at(home_dir)
    os.symlink(real, os.path.join(home_dir, "py"))
    assert np.problem(ask(os.path.join(home_dir, "py")), os.path.join(home_dir, "py")) == ""


def test_a_python_in_a_directory_every_user_may_write_is_refused_and_never_run():
    shared = tempfile.mkdtemp(prefix="dflash-node-program-")  # under /tmp: sticky, every user may write
    try:
        os.chmod(shared, 0o1777)
        path = python_at(shared)
        why = np.problem(ask(path), path)
        assert why.startswith("trainer_node_python: %s, in " % path) and "which every user can write" in why, why
        assert not os.path.exists(path + ".ran")  # asked about, never run
    finally:
        shutil.rmtree(shared)


def test_another_users_python_is_refused(home_dir):
    path = python_at(home_dir)
    os.chown(path, 1000, 1000)
    why = np.problem(ask(path), path)
    assert why.startswith("trainer_node_python: %s, which belongs to uid 1000" % path), why
    os.chown(path, 0, 0)
    os.chmod(path, 0o775)
    assert "(mode 0775), which its group or others can change" in np.problem(ask(path), path)


def test_a_python_that_is_not_there_is_named():
    assert np.problem(ask("/nonexistent/python3"), "/nonexistent/python3") == (
        "trainer_node_python: /nonexistent/python3 is not on the node (or cannot be read): set trainer_node_python "
        "to the node's Python 3")


def test_the_path_reaches_the_shell_quoted():
    path = "/opt/a b/py'; touch /tmp/dflash-pwned; '"
    assert "touch /tmp/dflash-pwned" not in ask(path) and not os.path.exists("/tmp/dflash-pwned")
    assert np.problem(ask(path), path).startswith("trainer_node_python: ")


def test_the_login_users_own_python_is_trusted_as_root_is():
    answer = "uid 1000\nreal /home/op/py/bin/python3\nfile 1000 755 regular file\ndir 0 755 /\ndir 0 755 /home\n" \
             "dir 1000 755 /home/op\ndir 1000 755 /home/op/py\ndir 1000 755 /home/op/py/bin\n"
    assert np.problem(answer, "/home/op/py/bin/python3") == ""
    assert "belongs to uid 1000" in np.problem(answer.replace("uid 1000", "uid 0"), "/home/op/py/bin/python3")
