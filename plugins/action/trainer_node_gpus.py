# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_node_gpus (documented in the module): Ansible's own run of the
module, its payload kept between runs (plugins/plugin_utils/_payload_cache.py).

The controller's own options, never sent to the target:

- ``program`` (the raw task's result that described the node's Python, plugin_utils/_node_program.py) and
  ``python`` (that interpreter's path): a Python another user may change is refused here, before the module
  runs in it;
- ``must`` (default true): false - an unreadable node view does not fail the task (the role reads it after a
  failed restart only to name who holds the GPUs).

The result always carries V(lines) (who holds the trainer's GPUs, in words) and V(has_lines)."""
from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.dflash.trainer.plugins.plugin_utils._node_program import problem
from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload


class ActionModule(KeptPayload, NormalAction):
    """dflash.trainer.trainer_node_gpus, run as ansible.builtin.normal runs a module - once its Python is judged."""

    def run(self, tmp=None, task_vars=None):
        args = dict(self._task.args)
        program, python, must = args.pop("program", None), args.pop("python", None), args.pop("must", True)
        self._task.args = args
        if program is not None:
            text = program.get("stdout", "") if isinstance(program, dict) else str(program or "")
            why = problem(text, str(python))
            if why:
                return dict(failed=True, changed=False, lines=[], has_lines=False,
                            msg="refused before the node's view ran: %s" % why)
        result = super().run(tmp, task_vars)
        if result.get("failed") and not boolean(must, strict=False):
            result["failed"] = False
        lines = result.get("lines") if isinstance(result.get("lines"), list) else []
        result.update(lines=lines, has_lines=bool(lines))
        return result
