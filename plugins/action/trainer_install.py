# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_install (documented in the module): Ansible's own run of the
module, its payload kept between runs (plugins/plugin_utils/_payload_cache.py)."""
from __future__ import annotations

from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.dflash.trainer.plugins.plugin_utils._group import barrier_first
from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload


class ActionModule(KeptPayload, NormalAction):
    """dflash.trainer.trainer_install, run as ansible.builtin.normal runs a module; a trainer group's barrier
    (``group_barrier``) judged first."""

    def run(self, tmp=None, task_vars=None):
        judged = barrier_first(self, task_vars)  # a trainer group's barrier, before anything (plugin_utils/_group.py)
        return judged if judged is not None else super().run(tmp, task_vars)
