# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_validate (documented in the module).

Runs the pure checks of plugin_utils/_validate.py here, on the play's templated ``trainer_*``
variables: no remote call, so a refused input costs nothing on the target and changes nothing.
"""
from __future__ import annotations

import os
import secrets
import string
import subprocess

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.action import ActionBase

from ansible_collections.dflash.trainer.plugins.module_utils.target.config_id import unit_path_of
from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import managed
from ansible_collections.dflash.trainer.plugins.module_utils.plan.target_checks import message, target_problems
from ansible_collections.dflash.trainer.plugins.plugin_utils._group import barrier_first
from ansible_collections.dflash.trainer.plugins.plugin_utils._validate import check, src_problems
from ansible_collections.dflash.trainer.plugins.plugin_utils._role_spec import entry_options, spec_failure


def describe_source(src):
    """"git 4f1c2d9" (+ " dirty") when trainer_src is a git checkout, else "" (the job then records
    the release id, which is the tree's content hash). Read here, on the controller, where the
    checkout is, by one ``git status`` (its porcelain v2 header names the commit; its entries are the
    changes under trainer_src); git's absence, a checkout with no commit or any git error just gives ""."""
    try:
        res = subprocess.run(["git", "-C", src, "status", "--porcelain=v2", "--branch", "--", "."],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = res.stdout.splitlines() if res.returncode == 0 else []
    oid = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), "")
    if not oid or oid == "(initial)":
        return ""
    return "git %s%s" % (oid[:7], " dirty" if any(not line.startswith("#") for line in lines) else "")


_TOKEN_CHARS = string.ascii_lowercase + string.digits


def play_lock(token, environ, nodename):
    """(token, owner) of this play's deploy lock: ``token`` kept when given (the role may run several
    times in one play: its runs share one token), else 20 random characters of [a-z0-9]; the owner
    names who runs the play and where ("$USER on <node>", root when USER is unset or empty)."""
    token = token or "".join(secrets.choice(_TOKEN_CHARS) for _i in range(20))
    return token, "%s on %s" % (environ.get("USER") or "root", nodename)


# inventory variables the checks read besides trainer_*
_HOST_VARS = ("proxmox_vmid", "ansible_connection", "inventory_hostname", "groups")


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("entry", "variables", "gpus", "unit", "spec", "lock_token", "group_barrier"))

    def _play_variables(self, task_vars):
        names = [k for k in task_vars if k.startswith("trainer_")] + [k for k in _HOST_VARS if k in task_vars]
        out = {}
        for name in names:
            try:
                out[name] = self._templar.template(task_vars[name])
            except AnsibleError as exc:
                out[name] = None
                raise AnsibleError("%s cannot be templated: %s" % (name, to_native(exc)))
        return out

    def _spec_failure(self, entry, variables):
        """The role's argument spec for ``entry`` over ``variables`` (the play's, templated once by
        ``_play_variables``: every option of the spec is a trainer_* variable; plugin_utils/_role_spec.py)."""
        role = getattr(self._task, "_role", None)
        if role is None:
            raise AnsibleError("spec: true needs a task of the role (its meta/argument_specs.yml)")
        options = entry_options(role._role_path, entry)
        return spec_failure(options, {k: variables[k] for k in options if k in variables})

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self._task.args
        entry = args.get("entry") or "main"
        try:
            variables = args.get("variables")
            if variables is None:
                variables = self._play_variables(task_vars)
            refused = self._spec_failure(entry, variables) if args.get("spec") else None
            if refused:
                result.update(refused)
                return result
            problems = check(variables, entry)
            if entry == "main" and "trainer_src" in variables:
                problems.extend(src_problems(variables.get("trainer_src"),
                                             variables.get("trainer_release_excludes") or ()))
            if args.get("gpus") is not None or args.get("unit") is not None:
                unit_path = unit_path_of(variables.get("trainer_unit_name"))
                problems.extend(target_problems(variables, args.get("gpus"), args.get("unit"), unit_path))
        except (AnsibleError, ValueError) as exc:
            result.update(failed=True, msg="input check failed: %s" % to_native(exc))
            return result
        if entry == "main" and not problems:
            result["source"] = describe_source(variables.get("trainer_src"))
        if entry != "status" and not problems:
            # what a run writes or deletes on the target: judged there by the first read (trainer_status)
            unit_path = unit_path_of(variables.get("trainer_unit_name"))
            result["owned"] = [dict(variable=var, kind=kind, path=path) for var, kind, path in managed(variables, unit_path)]
        if entry != "status":
            # the play's lock: the token the first read takes it with, and who holds it (vars/main.yml)
            result["lock_token"], result["lock_owner"] = play_lock(args.get("lock_token"), os.environ,
                                                                   os.uname().nodename)
        result["problems"] = [str(p) for p in problems]
        # a member of a trainer group (trainer_group): its group's play deploys it (tasks/group.yml), status
        # judges its group as a whole
        result["in_group"] = bool(variables.get("trainer_group"))
        result["leave_to_group"] = entry == "main" and result["in_group"]
        result["changed"] = False
        if problems:
            result["failed"] = True
            result["msg"] = message(problems, entry)
            return result
        # a trainer group's member, its inputs accepted: the group whole in this run (plugin_utils/_group.py)
        return dict(result, **(barrier_first(self, task_vars) or {}))
