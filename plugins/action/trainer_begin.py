# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_begin (documented in the module): Ansible's own run of the
module, its payload kept between runs (plugins/plugin_utils/_payload_cache.py)."""
from __future__ import annotations

from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload


class ActionModule(KeptPayload, NormalAction):
    """dflash.trainer.trainer_begin, run as ansible.builtin.normal runs a module."""
