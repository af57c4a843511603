"""module_utils/target/install.py: the three files installed in one call (install_all) - written, then
unchanged, then the changed one named; nothing written in check mode; a foreign file refused before
any write."""
import os
import pathlib
import shutil
import tempfile

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.target.install import (
    InstallError,
    change_reasons,
    install_all,
)
from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import LAUNCHER_MARK, UNIT_MARK


class FakeSystemctl(object):
    """systemctl as the install sees it: is-enabled answers ``state``; every call recorded."""

    def __init__(self, state="enabled"):
        self.state, self.calls = state, []

    def __call__(self, argv):
        self.calls.append(argv[1:])
        if argv[1] == "is-enabled":
            return 0, self.state + "\n", ""
        return 0, "", ""


@pytest.fixture
def tmp_path():
    """A private directory outside /tmp: the install refuses paths every user can write (a planted
    symlink), as it must on the target."""
    base = tempfile.mkdtemp(prefix="dflash-install-test-", dir=os.path.expanduser("~"))
    os.chmod(base, 0o700)
    try:
        yield pathlib.Path(base)
    finally:
        shutil.rmtree(base)


def params(tmp_path, env="A=\"1\"\n", unit_extra=""):
    return dict(unit="dflash-trainer", unit_path=str(tmp_path / "unit" / "dflash-trainer.service"),
                unit_content="[Unit]\nDescription=DFlash trainer, %s\n%s" % (UNIT_MARK, unit_extra), enabled=True,
                launcher_path=str(tmp_path / "lib" / "launch"), launcher_content="#!/bin/sh\n%s\n" % LAUNCHER_MARK,
                env_path=str(tmp_path / "etc" / "trainer.env"), env_content=env)


def test_install_all_writes_then_changes_nothing_then_names_the_changed_file(tmp_path):
    run = FakeSystemctl(state="disabled")
    first = install_all(params(tmp_path), run, "systemctl")
    assert first["changed"] and first["unit_changed"] and first["env_changed"] and first["launcher_changed"]
    assert ["daemon-reload"] in run.calls and ["enable", "dflash-trainer"] in run.calls
    run = FakeSystemctl()
    again = install_all(params(tmp_path), run, "systemctl")
    assert not again["changed"] and change_reasons(again) == []
    assert run.calls == [["is-enabled", "dflash-trainer"]]  # no daemon-reload, no enable
    env = install_all(params(tmp_path, env="A=\"2\"\n"), FakeSystemctl(), "systemctl")
    assert change_reasons(env) == ["environment changed"]
    assert oct(os.stat(str(tmp_path / "etc" / "trainer.env")).st_mode & 0o777) == "0o600"


def test_install_all_in_check_mode_writes_nothing(tmp_path):
    out = install_all(params(tmp_path), FakeSystemctl(), "systemctl", check_mode=True)
    assert out["unit_changed"] and not os.path.exists(str(tmp_path / "unit"))


def test_a_foreign_file_is_refused_before_any_write(tmp_path):
    p = params(tmp_path)
    os.makedirs(os.path.dirname(p["unit_path"]))
    with open(p["unit_path"], "w") as fh:
        fh.write("[Unit]\nDescription=someone else's\n")
    with pytest.raises(InstallError) as err:
        install_all(p, FakeSystemctl(), "systemctl")
    assert "refused before any change" in err.value.msg and "not written by dflash.trainer" in err.value.msg
    assert not os.path.exists(p["launcher_path"]) and not os.path.exists(p["env_path"])
