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
from ansible.module_utils.common.text.converters import to_native, to_text
from ansible.plugins.action import ActionBase

from ansible_collections.dflash.trainer.plugins.module_utils.target.config_id import unit_path_of
from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import managed
from ansible_collections.dflash.trainer.plugins.module_utils.plan.target_checks import message, target_problems
from ansible_collections.dflash.trainer.plugins.plugin_utils._group import barrier_first
from ansible_collections.dflash.trainer.plugins.plugin_utils._input_check import entry_check
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import DEFAULT_EXCLUDES, ReleaseError
from ansible_collections.dflash.trainer.plugins.plugin_utils._release_cache import resolve_src, scan_cached
from ansible_collections.dflash.trainer.plugins.plugin_utils._validate import RUNS, run_intent, src_problems


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


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("entry", "run", "variables", "gpus", "unit", "spec", "lock_token", "group_barrier"))

    def _release_id(self, variables):
        """The id of the release trainer_src would become: the release's own scan (the same search path and per-file
        hash cache as the upload, plugin_utils/_release_cache.py)."""
        excludes = variables.get("trainer_release_excludes")
        excludes = list(DEFAULT_EXCLUDES) if excludes is None else [to_text(x) for x in excludes]
        return scan_cached(resolve_src(to_text(variables.get("trainer_src")), self._find_needle), excludes)[0].release_id

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self._task.args
        run = args.get("run")
        if run is not None and run not in RUNS:
            result.update(failed=True, msg="input check failed: run must be one of %s, not %r" % (", ".join(RUNS), run))
            return result
        # a run of the role (main.yml): its entry point names the input check's entry, and main's takes the
        # argument spec too (playbooks/deploy.yml imports the role without Ansible's own check task)
        entry = RUNS[run][0] if run else args.get("entry") or "main"

        def more(variables):
            """What the deploy's entries check besides check(): the source tree, what the target's reads returned."""
            found = []
            if entry == "main" and "trainer_src" in variables:
                found.extend(src_problems(variables.get("trainer_src"), variables.get("trainer_release_excludes") or ()))
            if args.get("gpus") is not None or args.get("unit") is not None:
                unit_path = unit_path_of(variables.get("trainer_unit_name"))
                found.extend(target_problems(variables, args.get("gpus"), args.get("unit"), unit_path))
            return found

        variables, problems, refused = entry_check(self._task, self._templar, task_vars, entry, spec=args.get("spec") or run == "main",
                                                   variables=args.get("variables"), more=more)
        if refused:
            result.update(refused)
            return result
        if entry == "main" and not problems:
            result["source"] = describe_source(variables.get("trainer_src"))
        if run and not problems:  # what the run's first read plans for
            try:
                release = self._release_id(variables) if RUNS[run][1] == "deploy" else None
            except (AnsibleError, ReleaseError, OSError) as exc:
                result.update(failed=True, msg="input check failed: %s" % to_native(exc))
                return result
            result.update(run_intent(run, variables, release))
        if entry != "status" and not problems:
            # what a run writes or deletes on the target: judged there by the first read (trainer_status)
            unit_path = unit_path_of(variables.get("trainer_unit_name"))
            result["owned"] = [dict(variable=var, kind=kind, path=path) for var, kind, path in managed(variables, unit_path)]
        if entry != "status":
            # the play's lock: the token the first read takes it with, and who holds it (vars/main.yml)
            result["lock_token"], result["lock_owner"] = play_lock(args.get("lock_token"), os.environ,
                                                                   os.uname().nodename)
        result["problems"] = [str(p) for p in problems]
        # a member of a trainer group (trainer_group): its group's play deploys it (tasks/group.yml)
        result["in_group"] = bool(variables.get("trainer_group"))
        result["leave_to_group"] = entry == "main" and result["in_group"]
        result["changed"] = False
        if problems:
            result["failed"] = True
            result["msg"] = message(problems, entry)
            return result
        # a trainer group's member, its inputs accepted: the group whole in this run (plugin_utils/_group.py)
        return dict(result, **(barrier_first(self, task_vars) or {}))
