"""module_utils/_install.py: the three files installed in one call (install_all), and the install that
rides with a deploy's release call (install_unless_switched): never after an upload or a switch, the
lock released only when nothing changed, a foreign file refused before any write."""
import os
import pathlib
import shutil
import tempfile

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils._install import (
    InstallError,
    change_reasons,
    install_all,
    install_unless_switched,
)
from ansible_collections.dflash.trainer.plugins.module_utils._lock import Outcome
from ansible_collections.dflash.trainer.plugins.module_utils._ownership import LAUNCHER_MARK, UNIT_MARK


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


@pytest.mark.parametrize("release", [dict(needs_archive=True), dict(switched=True), dict(transferred=True)])
def test_no_install_rides_with_a_new_or_switched_release(tmp_path, release):
    unlocked = []
    assert install_unless_switched(release, params(tmp_path), FakeSystemctl(), "systemctl",
                                   unlock=lambda: unlocked.append(1)) == {}
    assert unlocked == [] and not os.path.exists(str(tmp_path / "unit"))


def test_the_lock_is_released_only_when_no_file_changed(tmp_path):
    unlocked = []

    def unlock():
        unlocked.append(1)
        return Outcome("release", True)

    changed = install_unless_switched(dict(changed=False), params(tmp_path), FakeSystemctl(), "systemctl", unlock=unlock)
    assert changed["changed"] and change_reasons(changed["install"]) and "lock_released" not in changed
    assert unlocked == []
    quiet = install_unless_switched(dict(changed=False), params(tmp_path), FakeSystemctl(), "systemctl", unlock=unlock)
    assert quiet["lock_released"] is True and not quiet["changed"] and unlocked == [1]


def test_a_lock_that_is_not_ours_is_reported_not_claimed_released(tmp_path):
    install_all(params(tmp_path), FakeSystemctl(), "systemctl")
    out = install_unless_switched({}, params(tmp_path), FakeSystemctl(), "systemctl",
                                  unlock=lambda: Outcome("not_ours", False, "held by someone else"))
    assert out["lock_released"] is False and out["lock_msg"] == "held by someone else"


def test_check_mode_says_what_would_change_even_for_a_switched_release(tmp_path):
    out = install_unless_switched(dict(switched=True), params(tmp_path), FakeSystemctl(), "systemctl", check_mode=True)
    assert out["install"]["unit_changed"] and not os.path.exists(str(tmp_path / "unit"))
