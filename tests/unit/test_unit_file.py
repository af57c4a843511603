"""The unit template (roles/trainer/templates/trainer.service.j2): the trainer runs as a root login
would - User=root (systemd then sets HOME, USER, LOGNAME, SHELL), the container's locale files, then
the trainer's own environment file, which wins - and the pre-flight replays exactly these settings."""
import os

import jinja2

from ansible_collections.dflash.trainer.plugins.module_utils._preflight import DEFAULT_PROPERTIES, unit_exec_properties

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE = os.path.join(ROOT, "roles", "trainer", "templates", "trainer.service.j2")


def render(**over):
    values = dict(ansible_managed="managed", trainer_unit_name="dflash-trainer", trainer_start_limit_interval_s=300,
                  trainer_start_limit_burst=3,
                  __trainer_exec_start='"/usr/local/lib/dflash-trainer/launch" "--" "./run.sh"',
                  trainer_root="/opt/dflash-trainer", trainer_env_file="/etc/dflash-trainer/trainer.env",
                  trainer_stop_timeout_s=30, trainer_restart_policy="on-failure", trainer_restart_sec=5)
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
