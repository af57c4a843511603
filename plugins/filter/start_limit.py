"""The unit's start limit, scaled to the trainer's start-up, so the template stays dumb.

systemd refuses a start when more than StartLimitBurst= starts fall within
StartLimitIntervalSec=. A crash loop of a trainer that takes minutes to load before it dies
restarts every RestartSec= + start-up seconds: with a fixed interval shorter than the burst's
worth of such cycles the limit is never reached and the loop never stops.
"""
import math

from ansible.errors import AnsibleFilterError


def start_limit_interval(floor_s, burst, restart_sec, start_up_s):
    """StartLimitIntervalSec= (whole seconds): at least ``floor_s`` and at least ``burst`` x
    (``restart_sec`` + ``start_up_s``), the time ``burst`` crash-loop cycles of a trainer that dies
    after ``start_up_s`` take. ``floor_s`` 0 keeps systemd's meaning: no start limit."""
    try:
        floor_s, burst = int(floor_s), int(burst)
        restart_sec, start_up_s = float(restart_sec), float(start_up_s)
    except (TypeError, ValueError):
        raise AnsibleFilterError("start_limit_interval expects numbers, got %r, %r, %r, %r" % (
            floor_s, burst, restart_sec, start_up_s))
    if floor_s < 0 or burst < 1 or restart_sec < 0 or start_up_s < 0 or math.isnan(restart_sec + start_up_s):
        raise AnsibleFilterError("start_limit_interval expects an interval >= 0, a burst >= 1 and times >= 0, got "
                                 "%r, %r, %r, %r" % (floor_s, burst, restart_sec, start_up_s))
    if floor_s == 0:
        return 0
    return max(floor_s, int(math.ceil(burst * (restart_sec + start_up_s))))


class FilterModule:
    def filters(self):
        return {"start_limit_interval": start_limit_interval}
