"""The role's run decisions, made in Python (pure, tested) so that its tasks stay a `when:` on a field:

- ``proof_options``: the proof's settings from the role's variables (the judge's one table,
  module_utils/proof/readiness.PROOF_SETTINGS), as trainer_restart's ``proof`` takes them;
- ``last_ran``: of a run's registered results, the latest call's that ran (a job's outcome);
- ``trainer_lock_holder``: who holds the deploy lock after the run's last call that could hand it over
  (module_utils/plan/decide.last_lock_holder);
- ``launcher_metrics_args``: the launcher's metrics arguments, none without trainer_metrics_path.
"""
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.trainer.plugins.module_utils.plan.decide import last_lock_holder, last_ran
from ansible_collections.dflash.trainer.plugins.module_utils.proof.readiness import role_proof


def proof_options(variables, progress=True):
    """{setting: value} of every proof setting, read from ``variables`` (the play's ``vars``) by the
    role variable of each; ``progress`` false: a trainer group's member whose log does not show the
    job's progress (trainer_group_progress)."""
    if not isinstance(variables, Mapping):
        raise AnsibleFilterError("proof_options expects the play's vars (a mapping), got %r" % type(variables).__name__)
    try:
        return role_proof(variables, progress=bool(progress))
    except KeyError as exc:
        raise AnsibleFilterError("proof_options: the role variable %s is not defined" % exc.args[0])


def _results(results):
    if not isinstance(results, (list, tuple)):
        raise AnsibleFilterError("expects a list of registered results, latest first, got %r" % type(results).__name__)
    return [dict(r) if isinstance(r, Mapping) else r for r in results]


def trainer_last_ran(results):
    return last_ran(_results(results))


def trainer_lock_holder(results):
    return last_lock_holder(_results(results))


def launcher_metrics_args(path, interval_s, window_s, tokps_regex, step_regex):
    """The launcher's arguments for its metrics file: none when ``path`` is empty (the unit is then
    unchanged), else where it writes, how often, over which window and with which regexes."""
    if not path:
        return []
    return ["--metrics", path, "--metrics-interval-s", interval_s, "--metrics-window-s", window_s,
            "--tokps-regex", tokps_regex, "--step-regex", step_regex]


class FilterModule:
    def filters(self):
        return {"proof_options": proof_options, "trainer_last_ran": trainer_last_ran,
                "trainer_lock_holder": trainer_lock_holder,
                "launcher_metrics_args": launcher_metrics_args}
