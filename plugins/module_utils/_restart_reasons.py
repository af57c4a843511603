"""Why a deploy must restart the trainer: one pure function over what the run read and changed.

The deploy restarts when anything it owns changed, when asked to, and whenever the trainer that
runs is not the one a proof is on record for - a deploy that exits 0 leaves a trainer that
``status`` calls healthy. The role calls it through the ``restart_reasons`` filter.
"""

from ansible_collections.dflash.trainer.plugins.module_utils._install import change_reasons


def restart_reasons(before, release, switched=False, install=None, force=False):
    """-> [reason, ...] in words; empty: leave the trainer running untouched.

    ``before``: trainer_status's result (running, running_release, last_good, last_job, health),
    read before any change; ``release``: the release current now; ``switched``: current moved to it;
    ``install``: trainer_install's result (unit_changed, env_changed, launcher_changed)."""
    before = before or {}
    install = install or {}
    reasons = []
    if force:
        reasons.append("forced (trainer_force_restart)")
    if switched:
        reasons.append("release switched to %s" % release)
    reasons.extend(change_reasons(install))
    running = bool(before.get("running"))
    if not running:
        reasons.append("trainer not running")
        return reasons
    running_release = before.get("running_release")
    if running_release != release:
        reasons.append("running release %s is not current %s" % (running_release, release))
        return reasons
    # "proved" is a recorded fact (last_good), not "running == current": a release switched to by a
    # restart job that a reboot or a kill interrupted runs unproven until a deploy proves it
    last_good = before.get("last_good") or None
    if last_good != release:
        job = (before.get("last_job") or {}).get("words") or "no restart job on record"
        reasons.append("release %s runs without a proof on record (last proved: %s; %s)"
                       % (release, last_good or "none", job))
        return reasons
    # the release was proved, but maybe not this start of it: systemd's Restart= after a death, a
    # reboot of the container - the same words status fails with
    health = before.get("health")
    if isinstance(health, dict) and not health.get("ok"):
        reasons.append("the running trainer is not the one proved: %s" % (health.get("words") or "no health read"))
    return reasons
