"""The configuration proved with the last good release (module_utils/target/install.py ProvedConfig) and
what the restart job does with it (job.restart.RestartJob): kept after a proof, put back - the
files that differ, each judged ours first - by a rollback, the same release's included; a first
deploy that fails says nothing was rolled back."""
import json
import os
import pathlib
import shutil
import tempfile

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.target.install import (
    PROVED_CONFIG,
    InstallError,
    ProvedConfig,
    config_files,
)
from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import ENV_MARK, LAUNCHER_MARK, UNIT_MARK
from ansible_collections.dflash.trainer.plugins.module_utils.job.restart import RestartJob

from test_restart_job import FakeLayout, FakeSteps


@pytest.fixture
def tmp_path():
    """A private directory outside /tmp (the ownership checks refuse world-writable places)."""
    base = tempfile.mkdtemp(prefix="dflash-config-test-", dir=os.path.expanduser("~"))
    os.chmod(base, 0o700)
    try:
        yield pathlib.Path(base)
    finally:
        shutil.rmtree(base)


class Systemctl(object):
    def __init__(self):
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv[1:])
        return 0, "", ""


def write(path, text, mode):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)


def installed(tmp_path, env='HF_TOKEN="hf_secret_value"\n', unit_extra=""):
    files = dict(launcher=str(tmp_path / "lib" / "launch"), env=str(tmp_path / "etc" / "trainer.env"),
                 unit=str(tmp_path / "unit" / "dflash-trainer.service"))
    write(files["launcher"], "#!/bin/sh\n%s\n" % LAUNCHER_MARK, 0o755)
    write(files["env"], ENV_MARK + "\n" + env, 0o600)
    write(files["unit"], "[Unit]\nDescription=DFlash trainer, %s\n%s" % (UNIT_MARK, unit_extra), 0o644)
    return files


def config(tmp_path, files, run=None):
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return ProvedConfig(str(root), config_files({}, unit_path=files["unit"], launcher_path=files["launcher"],
                                                env_path=files["env"]), run or Systemctl(), "systemctl")


def read(path):
    with open(path) as fh:
        return fh.read()


def test_config_files_prefer_the_install_paths():
    p = dict(install=dict(unit_path="/u", launcher_path="/l", env_path="/e"))
    assert config_files(p, unit_path="/x", launcher_path="/y", env_path="/z") == [
        ("launcher", "/l"), ("env", "/e"), ("unit", "/u")]
    assert config_files({}, unit_path="/x", env_path="/z") == [("env", "/z"), ("unit", "/x")]


def test_kept_root_only_and_restored_file_by_file(tmp_path):
    files = installed(tmp_path)
    run = Systemctl()
    cfg = config(tmp_path, files, run)
    assert not cfg.kept_for("r1") and cfg.changes("r1") == []
    cfg.keep("r1")
    kept = os.path.join(str(tmp_path / "root"), PROVED_CONFIG)
    assert oct(os.stat(kept).st_mode & 0o777) == "0o600"
    assert "hf_secret_value" not in read(kept)  # contents are base64: never plain text in a grep either
    assert cfg.kept_for("r1") and not cfg.kept_for("r2") and cfg.changes("r1") == []
    assert cfg.secrets() == ["hf_secret_value"]
    # an environment-only change, then a rollback to the proved configuration
    good_env = read(files["env"])
    write(files["env"], ENV_MARK + '\nPYTHONHOME="/nonexistent"\n', 0o644)
    assert cfg.changes("r1") == ["env"]
    assert cfg.restore("r1") == ["env"]
    assert read(files["env"]) == good_env and oct(os.stat(files["env"]).st_mode & 0o777) == "0o600"
    assert run.calls == []  # no unit restored: no daemon-reload
    # a changed unit is put back and systemd reloaded
    good_unit = read(files["unit"])
    write(files["unit"], good_unit + "Environment=X=1\n", 0o644)
    assert cfg.restore("r1") == ["unit"] and read(files["unit"]) == good_unit
    assert run.calls == [["daemon-reload"]]
    assert cfg.restore("r1") == []  # nothing differs


def test_restore_refuses_another_release_and_a_file_not_ours(tmp_path):
    files = installed(tmp_path)
    cfg = config(tmp_path, files)
    cfg.keep("r1")
    with pytest.raises(InstallError) as err:
        cfg.restore("r2")
    assert "no configuration proved with release r2" in err.value.msg
    write(files["env"], "SOMEONE=else\n", 0o600)  # no mark: not the collection's file
    with pytest.raises(InstallError) as err:
        cfg.restore("r1")
    assert "refused to restore" in err.value.msg and read(files["env"]) == "SOMEONE=else\n"


def test_a_symlinked_or_foreign_record_is_not_read(tmp_path):
    files = installed(tmp_path)
    cfg = config(tmp_path, files)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"version": 1, "release": "r1", "files": {}}))
    os.symlink(str(elsewhere), cfg.path)
    assert cfg.read() is None and not cfg.kept_for("r1")
    os.unlink(cfg.path)
    pathlib.Path(cfg.path).write_text(json.dumps({"version": 99, "release": "r1", "files": {}}))
    assert not cfg.kept_for("r1")


class FakeConfig(object):
    """The proved configuration as the job sees it."""

    def __init__(self, kept=None, differs=("env",), fail_restore=False):
        self.kept, self.differs, self.fail_restore, self.events = kept, list(differs), fail_restore, []

    def kept_for(self, rid):
        return rid is not None and rid == self.kept

    def keep(self, rid):
        self.events.append(("keep", rid))
        self.kept = rid

    def restore(self, rid):
        if self.fail_restore:
            raise InstallError("Unable to restore /etc/dflash-trainer/trainer.env: No space left on device", {})
        self.events.append(("restore", rid))
        return list(self.differs)


def test_a_proved_release_keeps_its_configuration():
    cfg = FakeConfig()
    res = RestartJob(FakeSteps(), FakeLayout(), config=cfg).run()
    assert res["ok"] and cfg.events == [("keep", "new")]


def test_an_environment_only_restart_that_fails_puts_the_proved_configuration_back_and_proves_it():
    steps, layout = FakeSteps(fail=[("prove", 1, "trainer exited with status 1")]), FakeLayout("cur", "cur")
    cfg = FakeConfig(kept="cur")
    res = RestartJob(steps, layout, config=cfg, log_path="/w/t.log").run()
    assert not res["ok"] and res["rolled_back"] and res["rollback_release"] == "cur"
    assert layout.events == []  # the same release: current is not switched
    assert cfg.events[0] == ("restore", "cur") and steps.calls == ["stop", "drain", "purge", "start", "prove"] * 2
    assert res["outcome"].startswith("Rolled back: release cur runs again with the configuration it was proved "
                                     "with (environment file restored) and is proved ready (pid 42")
    assert [e["verdict"] for e in layout.entries] == ["failed", "proved"]


def test_a_forced_restart_of_the_same_configuration_that_fails_is_restarted_not_stopped():
    steps, layout = FakeSteps(fail=[("prove", 1, "no progress")]), FakeLayout("cur", "cur")
    res = RestartJob(steps, layout, config=FakeConfig(kept="cur", differs=())).run()
    assert res["rolled_back"] and steps.calls[-1] == "prove"
    assert "runs again with the configuration it was proved with (unchanged)" in res["outcome"]


def test_a_rollback_to_another_release_brings_its_configuration_with_it():
    steps, layout = FakeSteps(fail=[("prove", 1, "boom")]), FakeLayout("new", "old")
    cfg = FakeConfig(kept="old", differs=("env", "unit"))
    res = RestartJob(steps, layout, config=cfg).run()
    assert layout.events == [("switch", "old")] and ("restore", "old") in cfg.events
    assert ("Rolled back: the last good release old runs again with the configuration it was proved with "
            "(environment file and unit file restored)") in res["outcome"]


def test_a_failed_start_of_the_proved_release_restores_its_configuration_too():
    steps, layout = FakeSteps(fail=[("start", 1, "unit failed to start")]), FakeLayout("cur", "cur")
    cfg = FakeConfig(kept="cur")
    res = RestartJob(steps, layout, config=cfg).run()
    assert res["restored"] and cfg.events[0] == ("restore", "cur")
    assert "runs again with the configuration it was proved with (environment file restored)" in res["outcome"]


def test_a_restore_that_cannot_write_says_so_and_what_runs():
    steps, layout = FakeSteps(fail=[("prove", 1, "boom")]), FakeLayout("cur", "cur")
    res = RestartJob(steps, layout, config=FakeConfig(kept="cur", fail_restore=True)).run()
    assert not res["ok"] and "restoring the proved configuration failed" in res["rollback_failure"]
    assert "FAILED as well" in res["outcome"] and "is stopped" in res["outcome"]


def test_a_first_deploy_that_fails_says_nothing_was_rolled_back():
    steps, layout = FakeSteps(fail=[("prove", 1, "boom")]), FakeLayout("first", None)
    res = RestartJob(steps, layout, config=FakeConfig(), log_path="/w/t.log").run()
    assert not res["rolled_back"] and steps.calls[-1] == "stop"
    assert ("nothing was rolled back: no earlier release was proved here; dflash-trainer is stopped"
            in res["outcome"]) and "/w/t.log" in res["outcome"]


def test_the_same_release_without_a_kept_configuration_is_stopped_and_says_why():
    steps, layout = FakeSteps(fail=[("prove", 1, "boom")]), FakeLayout("cur", "cur")
    res = RestartJob(steps, layout, config=FakeConfig(kept=None)).run()
    assert steps.calls[-1] == "stop" and "no configuration proved with release cur is kept" in res["outcome"]
