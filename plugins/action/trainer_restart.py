# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_restart (documented in the module): Ansible's own run of the
module, its payload kept between runs (plugins/plugin_utils/_payload_cache.py).

With ``job`` (the controller's own option, never sent to the target): the role's restart-job settings, whole,
spread under the task's own options (plugin_utils/_job_spec.py).

With O(operation=wait) and ``watch_calls`` (the controller's own option, never sent to the target): the
task watches the job to its end, in up to that many calls of O(wait_s) each, and says each phase as
it begins and what it waits for (plugin_utils/_watch.py) - one task instead of an until loop, whose
retries Ansible shows as "FAILED - RETRYING".

With ``group_hold`` (the controller's own option, never sent to the target): a trainer group's member whose
own task ended renews its deploy lock until every member's task ended (plugin_utils/_group_hold.py) - the
lease never runs out while the play waits for the slowest member.

With O(operation=start) or O(operation=stop) and no O(job_id): the job is named here - the play's lock token, C(-stop) for
a stop, and 8 random digits.

With O(operation=wait) and ``begun`` (the controller's own option, never sent to the target): the result of the call
that started the job (the role's ``trainer_restart`` O(operation=start) or O(operation=stop), or the first read's
``job_start``). Its O(job_id) and the phases it said are the watch's; a call that did not start the job fails
the task here with its reason (nothing was watched); a job that ended within that call is not watched again. The
result then says what the role shows of the job's end (plugin_utils/_watch.py ``outcome``): V(ok), V(words) (the
proof, or what a stop stopped: ``kind``, restart or stop) and V(fail_msg) - the task does not fail on the job's
verdict (the role fails after it has read the node's view of the GPUs)."""
from __future__ import annotations

import secrets
import string
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action.normal import ActionModule as NormalAction
from ansible.utils.display import Display

from ansible_collections.dflash.trainer.plugins.plugin_utils._group import run_judged
from ansible_collections.dflash.trainer.plugins.plugin_utils._group_hold import run_held
from ansible_collections.dflash.trainer.plugins.plugin_utils._job_spec import with_job
from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload
from ansible_collections.dflash.trainer.plugins.plugin_utils._watch import lines, not_started_msg, outcome, say_start

display = Display()


class ActionModule(KeptPayload, NormalAction):
    """dflash.trainer.trainer_restart, run as ansible.builtin.normal runs a module; a watch to the end."""

    def run(self, tmp=None, task_vars=None):
        # a trainer group's barrier or verdict first (plugin_utils/_group.py), then its hold
        return run_judged(self, lambda tmp, task_vars: run_held(self, self._run, tmp, task_vars, display), tmp,
                          task_vars, display)

    def _run(self, tmp=None, task_vars=None):
        try:
            self._task.args = with_job(self._task.args)
        except ValueError as exc:
            raise AnsibleActionFail(str(exc), result=dict(not_started=True, lock_holder="play")) from None
        args = dict(self._task.args)
        calls = args.pop("watch_calls", None)
        begun, kind = args.pop("begun", None), args.pop("kind", None) or "restart"
        if kind == "start":  # the operation that started the job (the plan's job_operation): a restart
            kind = "restart"
        host = (task_vars or {}).get("inventory_hostname", "?")
        if args.get("operation") in ("start", "stop") and not args.get("job_id"):
            args["job_id"] = job_name(args)
        self._task.args = dict(args, watch_calls=calls) if calls is not None else dict(args)
        if begun is not None:
            return self._outcome(begun, kind, calls, tmp, task_vars)
        if calls is None or args.get("operation") != "wait":
            result = super().run(tmp, task_vars)
            if args.get("operation") in ("start", "stop"):  # the first watch rides with the start: its phases
                say_start(display, host, result)
            return result
        return self._watch(args, calls, host, task_vars)

    def _outcome(self, begun, kind, calls, tmp, task_vars):
        """The watch of the job ``begun`` started, to its end -> its result and what the role shows of it."""
        if not isinstance(begun, dict) or not begun.get("started"):
            begun = begun if isinstance(begun, dict) else {}
            return dict(failed=True, changed=False, msg=not_started_msg(begun), not_started=bool(begun.get("not_started")),
                        lock_holder=begun.get("lock_holder", "unknown"))
        if begun.get("finished"):  # it ended within the call that started it: nothing to watch
            result = dict((k, v) for k, v in begun.items() if k not in ("failed", "changed"))
        else:
            self._task.args = dict(self._task.args, job_id=begun.get("job_id"),
                                   seen=len(begun.get("timeline") or []))
            args = dict(self._task.args)
            args.pop("watch_calls", None)
            host = (task_vars or {}).get("inventory_hostname", "?")
            result = self._watch(args, calls, host, task_vars) if calls is not None else super().run(tmp, task_vars)
        unit = (self._task.args.get("unit") or "")
        result.update(outcome(result, unit, begun.get("reasons"), kind))
        result["failed"] = False  # the job's verdict: the role reports it (fail_msg) after the node's view
        return result

    def _watch(self, args, calls, host, task_vars):
        try:
            calls = int(calls)
        except (TypeError, ValueError):
            raise AnsibleActionFail("watch_calls must be a number of calls, got %r" % (calls,)) from None
        # O(seen): the phases the call that started the job has said already
        seen, said, said_at, result, waited, attempts = int(args.get("seen") or 0), "", None, {}, 0, 0
        # a call that came back with a new phase did not wait out O(wait_s): only full waits count
        while waited < max(calls, 1):
            result = self._execute_module(module_name="dflash.trainer.trainer_restart",
                                          module_args=dict(args, seen=seen), task_vars=task_vars)
            attempts += 1
            before = seen
            said_lines, seen, said, said_at = lines(result, seen, said, time.monotonic(), said_at)
            for line in said_lines:
                display.display("[%s] restart job: %s" % (host, line))
            if result.get("finished") or result.get("failed") or result.get("unreachable"):
                break
            if seen == before:
                waited += 1
        result["attempts"] = attempts
        return result


def job_name(args):
    """A job's id: the play's lock token, C(-stop) for a stop, and 8 random digits."""
    return "%s-%s%s" % (args.get("lock_token") or "job", "stop-" if args.get("operation") == "stop" else "",
                        "".join(secrets.choice(string.digits) for _i in range(8)))
