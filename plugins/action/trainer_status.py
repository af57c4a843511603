# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_status (documented in the module): Ansible's own run of the
module, its payload kept between runs (plugins/plugin_utils/_payload_cache.py)."""
from __future__ import annotations

from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.dflash.trainer.plugins.plugin_utils._freezer import frozen_checked
from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload


class ActionModule(KeptPayload, NormalAction):
    """dflash.trainer.trainer_status, run as ansible.builtin.normal runs a module. A read (status, logs, history:
    the run's first contact) fails at once, naming the freeze, when the container is frozen (the pct connection's
    frozen_check); a watch after a proof (watch_s) waits a freeze out, as the proof does."""

    def run(self, tmp=None, task_vars=None):
        with frozen_checked(self._connection, on=not self._task.args.get("watch_s")):
            return super().run(tmp, task_vars)
