"""The unit template (roles/trainer/templates/trainer.service.j2): the trainer runs as a root login
would - User=root (systemd then sets HOME, USER, LOGNAME, SHELL), the container's locale files, then
the trainer's own environment file, which wins - and the pre-flight replays exactly these settings."""
import os

import jinja2
import pytest
import yaml

from ansible_collections.dflash.trainer.plugins.filter.systemd_quote import FilterModule
from ansible_collections.dflash.trainer.plugins.module_utils.target.systemd import cache_directory

from ansible_collections.dflash.trainer.plugins.module_utils.proof.preflight import DEFAULT_PROPERTIES, unit_exec_properties

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE = os.path.join(ROOT, "roles", "trainer", "templates", "trainer.service.j2")


def render(**over):
    values = dict(ansible_managed="managed", trainer_unit_name="dflash-trainer", trainer_start_limit_interval_s=300,
                  trainer_start_limit_burst=3,
                  __trainer_exec_start='"/usr/local/lib/dflash-trainer/launch" "--" "./run.sh"',
                  trainer_root="/opt/dflash-trainer", trainer_env_file="/etc/dflash-trainer/trainer.env",
                  trainer_stop_timeout_s=30, trainer_restart_policy="on-failure", trainer_restart_sec=5,
                  __trainer_cache_directory="dflash-trainer/inductor")
    values.update(over)
    with open(TEMPLATE) as fh:
        return jinja2.Template(fh.read(), undefined=jinja2.StrictUndefined).render(**values)


def test_the_unit_runs_as_a_root_login_with_the_locale_and_then_the_trainer_s_environment():
    props = unit_exec_properties(render())
    assert props == [("WorkingDirectory", "/opt/dflash-trainer"), ("User", "root"),
                     ("EnvironmentFile", "-/etc/default/locale"), ("EnvironmentFile", "-/etc/locale.conf"),
                     ("EnvironmentFile", "/etc/dflash-trainer/trainer.env")]


def test_the_preflight_s_defaults_are_the_template_s_settings():
    props = [p for p in unit_exec_properties(render())
             if p[0] != "WorkingDirectory" and p[1] != "/etc/dflash-trainer/trainer.env"]
    assert props == list(DEFAULT_PROPERTIES)


def test_a_cache_below_var_cache_is_made_by_systemd_root_s_and_0700_at_every_start():
    lines = render().splitlines()
    assert "CacheDirectory=dflash-trainer/inductor" in lines and "CacheDirectoryMode=0700" in lines
    assert not [line for line in render(__trainer_cache_directory="").splitlines() if line.startswith("CacheDirectory")]


@pytest.mark.parametrize("path,value", [
    ("/var/cache/dflash-trainer/inductor", "dflash-trainer/inductor"),
    ("/var/cache/inductor/", "inductor"),
    ("/var/cache", ""), ("/var/cache/", ""), ("/var/cachex/a", ""), ("/tmp/torchinductor_root", ""),
    ("/root/.cache/torch/inductor", ""), ("/var/cache/a b", ""), ("/var/cache/%n", ""), ("/var/cache/a/../b", ""),
    ("/var/cache//a", ""), (None, ""),
])
def test_cache_directory_is_derived_from_the_path(path, value):
    assert cache_directory(path) == value
    assert FilterModule().filters()["systemd_cache_directory"](path) == value


def test_the_role_s_default_cache_gets_cache_directory():
    with open(os.path.join(ROOT, "roles", "trainer", "defaults", "main.yml")) as fh:
        default = yaml.safe_load(fh)["trainer_inductor_cache_dir"]
    assert cache_directory(default) == "dflash-trainer/inductor"
