# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's judgement (dflash.trainer.trainer_doctor, documented in the module), made on the controller from what
the node answered the role's raw task - after asking the container itself when that answer says to, over the task's
own connection (the play host's: pct exec into it), as ansible.builtin.raw would. The decisions are
plugin_utils/_doctor.py's (pure and tested): whether the container is asked (``enter``), what its answer is
(``answered``, or ``unreachable`` when the connection fails - judged as the raw task's unreachable result was), the
report - shown as its lines (the stdout callback shows the words alone, plugins/callback/concise.py) - and the record
written on the controller when asked; the task fails, with the report's summary, when an assumption does not
hold."""
from __future__ import annotations

import os
import time

from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure
from ansible.module_utils.common.text.converters import to_bytes, to_native
from ansible.plugins.action import ActionBase
from ansible.plugins.filter.core import to_nice_json

from ansible_collections.dflash.trainer.plugins.module_utils.target.private_file import replace_private
from ansible_collections.dflash.trainer.plugins.module_utils.target.secrets import secret_values
from ansible_collections.dflash.trainer.plugins.plugin_utils import _doctor

try:  # ansible-core 2.19+: the error an unreachable task's result is said in
    from ansible.errors import AnsibleTaskError
except ImportError:  # pragma: no cover - 2.18 says the connection's words alone
    AnsibleTaskError = None

# the report, as the CLI (dflash_trainer/doctor.py) reads it from the task's event
FACT = "__trainer_doctor"
RECORD_MODE = 0o600  # what replace_private writes


def record_path(record_dir, host):
    """Where a host's record is written: RECORD_DIR/HOST.json."""
    return os.path.join(record_dir, "%s.json" % host)


def write_record(path, content):
    """CONTENT (text) at PATH, mode 0600, replaced whole (the collection's private-file writer: a temporary file
    beside it renamed over it) -> whether the file changed (it was missing, or its content or mode differed)."""
    try:
        with open(path, "rb") as fh:
            same = fh.read() == to_bytes(content) and os.stat(path).st_mode & 0o7777 == RECORD_MODE
    except FileNotFoundError:
        same = False
    if same:
        return False
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        replace_private(path, content, tmp=tmp)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return True


def task_failed(exc):
    """EXC's words as an unreachable task's result says them (ansible-core's TaskExecutor: from 2.19 "Task failed: "
    and the words of EXC and its causes, before it EXC's alone)."""
    if AnsibleTaskError is None:
        return to_native(exc)
    err = AnsibleTaskError()
    err.__cause__ = exc
    return err.message


def judge(node, container, before, after, env=None, record=False, **params):
    """The report (``_doctor.report``'s {checks, lines, failed, exit_code, summary}) of the two answers, the values
    of ENV (trainer_env) masked, and with RECORD the answers kept for `doctor --record` -> (report, record or
    None)."""
    params["sudo"] = bool(params.get("sudo"))
    out, kept = _doctor.judged(node, container, before, after, secrets=secret_values(env or {}), **params)
    return out, (kept if record else None)


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("node", "vmid", "host", "user", "pct_path", "sudo", "python", "nvidia_smi",
                             "trainer_root", "node_nvidia_smi", "env", "record_dir"))
    _supports_check_mode = True  # read-only: the container is asked in check mode too

    def ask(self, script):
        """The container's answer to SCRIPT, run as ansible.builtin.raw runs its command (its connection failing:
        the unreachable answer, in the words Ansible gives an unreachable task)."""
        try:
            return _doctor.answered(self._low_level_execute_command(script, executable=False))
        except AnsibleConnectionFailure as exc:
            return _doctor.unreachable(task_failed(exc))

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        result["changed"] = False
        args = self._task.args
        node = dict(args.get("node") or {})
        params = dict((k, args.get(k)) for k in _doctor.JUDGE_PARAMS if args.get(k) is not None)
        before = time.time()  # the controller's clock around the container's answer: the clock check's window
        container = _doctor.container_answer(node, lambda: self.ask(_doctor.script("container", **params)))
        after = time.time()
        record_dir = args.get("record_dir") or ""
        report, kept = judge(node, container, before, after, env=args.get("env"), record=bool(record_dir), **params)
        if kept is not None:
            path = record_path(record_dir, task_vars.get("inventory_hostname"))
            try:
                result["changed"] = write_record(path, to_nice_json(kept))
            except OSError as exc:
                raise AnsibleActionFail("doctor: cannot write the record %s: %s" % (path, to_native(exc)))
            result["record"] = path
        result.update(ansible_facts={FACT: report}, _ansible_verbose_always=True)
        if report["failed"]:  # the lines, and the summary as the failure's message
            result.update(failed=True, lines=report["lines"], msg="doctor: %s" % report["summary"])
        else:
            result["msg"] = report["lines"]
        return result
