# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An entry point's input check, run on the controller by the actions that begin an entry point: trainer_validate
(the deploy's entries) and trainer_status with ``check`` (status, logs, history: the check and the read in one task).

The play's ``trainer_*`` variables are templated once; the role's argument spec for the entry point is checked first
when asked (``spec``: plugin_utils/_role_spec.py, Ansible's message), then the collection's own checks
(plugin_utils/_validate.py ``check``). No remote call: a refused input costs nothing on the target.
"""
from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_native

from ansible_collections.dflash.trainer.plugins.plugin_utils._validate import check
from ansible_collections.dflash.trainer.plugins.plugin_utils._role_spec import entry_options, spec_failure

# inventory variables the checks read besides trainer_*
HOST_VARS = ("proxmox_vmid", "ansible_connection", "inventory_hostname", "groups")


def play_variables(templar, task_vars):
    """The play's ``trainer_*`` variables and HOST_VARS, templated (AnsibleError naming the one that cannot be)."""
    names = [k for k in task_vars if k.startswith("trainer_")] + [k for k in HOST_VARS if k in task_vars]
    out = {}
    for name in names:
        try:
            out[name] = templar.template(task_vars[name])
        except AnsibleError as exc:
            raise AnsibleError("%s cannot be templated: %s" % (name, to_native(exc)))
    return out


def spec_refusal(task, entry, variables):
    """The role's argument spec for ``entry`` over ``variables`` (every option of the spec is a trainer_* variable)
    -> None, or the failed result Ansible's validate_argument_spec gives. ``task`` must be a task of the role (its
    meta/argument_specs.yml)."""
    role = getattr(task, "_role", None)
    if role is None:
        raise AnsibleError("spec: true needs a task of the role (its meta/argument_specs.yml)")
    options = entry_options(role._role_path, entry)
    return spec_failure(options, {k: variables[k] for k in options if k in variables})


def entry_check(task, templar, task_vars, entry, spec=False, variables=None, more=None):
    """The input check of entry point ``entry`` -> (variables, problems, refused).

    ``variables``: the values to check, else the play's (``play_variables``). With ``spec``, the role's argument
    spec for ``entry`` first. Then ``check(variables, entry)`` and ``more(variables)`` (further problems the caller
    adds). ``refused`` is the failed result to answer with at once - the spec's refusal, or ``input check failed:
    ...`` when a variable cannot be templated or a check cannot run - else None; ``problems`` the Problems found
    (the caller fails with them: plan.target_checks.message)."""
    try:
        if variables is None:
            variables = play_variables(templar, task_vars)
        refused = spec_refusal(task, entry, variables) if spec else None
        if refused:
            return variables, [], refused
        problems = check(variables, entry)
        if more is not None:
            problems.extend(more(variables))
    except (AnsibleError, ValueError) as exc:
        return variables, [], dict(failed=True, msg="input check failed: %s" % to_native(exc))
    return variables, problems, None
