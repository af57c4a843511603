# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_node_gpus (documented in the module): Ansible's own run of the
module, its payload kept between runs (plugins/plugin_utils/_payload_cache.py).

The controller's own options, never sent to the target:

- ``python`` (the node's Python the module runs in): described first by a raw shell script over the task's
  connection (no Python runs: plugin_utils/_node_program.py ``script``) and judged (``problem``) - a Python
  another user may change is refused here, before the module runs in it;
- ``view``: the role's node-view options, whole, spread under the task's own (the role reads the view twice);
- ``must`` (default true): false - an unreadable node view does not fail the task (the role reads it after a
  failed restart only to name who holds the GPUs).

The result always carries V(lines) (who holds the trainer's GPUs, in words) and V(has_lines); lines to show are
its V(msg) too, shown as ansible.builtin.debug's message is (plugins/callback/concise.py)."""
from __future__ import annotations

from collections.abc import Mapping

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.dflash.trainer.plugins.plugin_utils._node_program import problem, script
from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload


class ActionModule(KeptPayload, NormalAction):
    """dflash.trainer.trainer_node_gpus, run as ansible.builtin.normal runs a module - once its Python is judged."""

    def run(self, tmp=None, task_vars=None):
        args = dict(self._task.args)
        view = args.pop("view", None) or {}
        if not isinstance(view, Mapping):
            return dict(failed=True, changed=False, lines=[], has_lines=False,
                        msg="view must be a dictionary of the node view's options, got %s" % type(view).__name__)
        args = dict(view, **args)
        python, must = args.pop("python", None), args.pop("must", True)
        self._task.args = args
        if python:
            described = self._low_level_execute_command(script(str(python)))
            why = problem(described.get("stdout", ""), str(python))
            if why:
                return dict(failed=True, changed=False, lines=[], has_lines=False,
                            msg="refused before the node's view ran: %s" % why)
        result = super().run(tmp, task_vars)
        if result.get("failed") and not boolean(must, strict=False):
            result["failed"] = False
        lines = result.get("lines") if isinstance(result.get("lines"), list) else []
        result.update(lines=lines, has_lines=bool(lines))
        if lines and not result.get("failed") and not result.get("msg"):  # shown as ansible.builtin.debug's msg is
            result.update(msg=lines, _ansible_verbose_always=True)
        return result
