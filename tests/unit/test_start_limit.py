"""The unit's start limit scales with the trainer's start-up (plugins/filter/start_limit.py)."""
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.trainer.plugins.filter.start_limit import FilterModule, start_limit_interval

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.parametrize("floor,burst,restart,start_up,interval", [
    (300, 3, 5, 900, 2715),        # the defaults: 3 starts of a trainer that may take 900 s
    (300, 3, 5, 30, 300),          # a fast trainer: the floor
    (600, 4, 7, 30, 600),
    (10, 2, 0.5, 0.2, 10),
    (1, 3, 0, 10.1, 31),           # rounded up
    (0, 3, 5, 900, 0),             # 0: no start limit, as systemd reads it
    ("300", "3", "5", "900.0", 2715),
])
def test_the_interval_covers_a_burst_of_slow_starts(floor, burst, restart, start_up, interval):
    assert start_limit_interval(floor, burst, restart, start_up) == interval


def test_a_crash_loop_of_a_slow_trainer_is_stopped_with_the_role_defaults():
    """Simulate systemd's rate limit: starts at 0, c, 2c, ... (c = RestartSec + the time the trainer
    lives); the (burst+1)-th start within the interval is refused."""
    with open(os.path.join(ROOT, "roles/trainer/defaults/main.yml")) as f:
        d = yaml.safe_load(f)
    burst, restart = d["trainer_start_limit_burst"], d["trainer_restart_sec"]
    interval = start_limit_interval(d["trainer_start_limit_interval_s"], burst, restart, d["trainer_ready_timeout_s"])
    for lives_s in (1, 60, 240, d["trainer_ready_timeout_s"]):
        cycle = restart + lives_s
        starts = [k * cycle for k in range(burst + 1)]
        assert starts[-1] - starts[0] <= interval, (lives_s, interval)   # refused: the loop stops


@pytest.mark.parametrize("args", [(300, 0, 5, 900), (-1, 3, 5, 900), (300, 3, -5, 900), ("x", 3, 5, 900),
                                  (300, 3, 5, float("nan")), (300, 3, None, 900)])
def test_nonsense_fails_the_task(args):
    with pytest.raises(AnsibleFilterError):
        start_limit_interval(*args)


def test_the_filter_is_registered_and_the_role_uses_it():
    assert FilterModule().filters()["start_limit_interval"] is start_limit_interval
    with open(os.path.join(ROOT, "roles/trainer/vars/main.yml")) as f:
        role_vars = yaml.safe_load(f)
    assert " ".join(role_vars["__trainer_start_limit_interval_s"].split()) == (
        "{{ trainer_start_limit_interval_s | dflash.trainer.start_limit_interval(trainer_start_limit_burst, "
        "trainer_restart_sec, trainer_ready_timeout_s) }}")
    with open(os.path.join(ROOT, "roles/trainer/templates/trainer.service.j2")) as f:
        unit = f.read()
    assert ("StartLimitIntervalSec={{ __trainer_start_limit_interval_s"
            " | default(trainer_start_limit_interval_s) }}") in unit


def test_the_role_renders_the_stretched_interval_into_the_unit():
    """The role's expression, then the unit template, with the collection's filter: 2715 with the defaults."""
    import jinja2
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["dflash.trainer.start_limit_interval"] = start_limit_interval
    with open(os.path.join(ROOT, "roles/trainer/defaults/main.yml")) as f:
        values = yaml.safe_load(f)
    with open(os.path.join(ROOT, "roles/trainer/vars/main.yml")) as f:
        expr = yaml.safe_load(f)["__trainer_start_limit_interval_s"]
    values["__trainer_start_limit_interval_s"] = env.from_string(expr).render(**values)
    with open(os.path.join(ROOT, "roles/trainer/templates/trainer.service.j2")) as f:
        line = [x for x in f.read().splitlines() if x.startswith("StartLimitIntervalSec=")][0]
    assert env.from_string(line).render(**values) == "StartLimitIntervalSec=%d" % (3 * (5 + 900))
