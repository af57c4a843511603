"""job.steps.before_start: what the restart job's start call does before the job - the pre-flight
first (a refusal installs nothing), then the install, whose changed files join the job's reasons."""
import json

import pytest

from ansible_collections.dflash.trainer.plugins.module_utils.job import steps as _restart_steps
from ansible_collections.dflash.trainer.plugins.module_utils.target.install import InstallError
from ansible_collections.dflash.trainer.plugins.module_utils.proof.preflight import Refused


def params(**kw):
    p = dict(lock_path="", lock_token="", lock_lease_s=15, reasons=["forced (trainer_force_restart)"],
             preflight=None, install=None, environment_json="{}", env_content="")
    p.update(kw)
    return p


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def preflight(p, _get_bin_path):
        seen.append(("preflight", json.loads(p["environment_json"])))
        if p.get("refuse"):
            raise Refused(dict(msg="pre-flight refused the release: no"))
        return dict(checks=["command ./run.sh can be executed"])

    def install(p, _run, _systemctl):
        seen.append(("install", p["env_content"]))
        return dict(changed=True, unit_changed=True, env_changed=False, launcher_changed=False)

    monkeypatch.setattr(_restart_steps, "run_preflight", preflight)
    monkeypatch.setattr(_restart_steps, "install_all", install)
    return seen


def test_preflight_then_install_and_the_changed_files_join_the_reasons(calls):
    p = params(preflight=dict(release_dir="/r"), install=dict(unit="u"), environment_json='{"K": "v"}',
               env_content="K=\"v\"\n")
    fields = _restart_steps.before_start(p, lambda _n: None, None, "systemctl")
    assert [c[0] for c in calls] == ["preflight", "install"]
    assert calls[0][1] == {"K": "v"} and calls[1][1] == "K=\"v\"\n"  # the secrets came as top-level options
    assert fields["preflight"]["checks"] and fields["install"]["unit_changed"]
    assert p["reasons"] == ["forced (trainer_force_restart)", "unit file changed"]


def test_a_refused_preflight_installs_nothing(calls):
    p = params(preflight=dict(release_dir="/r", refuse=True), install=dict(unit="u"))
    with pytest.raises(Refused):
        _restart_steps.before_start(p, lambda _n: None, None, "systemctl")
    assert [c[0] for c in calls] == ["preflight"]
    assert p["reasons"] == ["forced (trainer_force_restart)"]


def test_nothing_asked_nothing_done(calls):
    p = params()
    assert _restart_steps.before_start(p, lambda _n: None, None, "systemctl") == {}
    assert calls == [] and p["reasons"] == ["forced (trainer_force_restart)"]


def test_an_install_error_propagates(monkeypatch):
    def install(_p, _run, _systemctl):
        raise InstallError("Unable to write /etc/x: EROFS", {})
    monkeypatch.setattr(_restart_steps, "install_all", install)
    with pytest.raises(InstallError):
        _restart_steps.before_start(params(install=dict(unit="u")), lambda _n: None, None, "systemctl")
