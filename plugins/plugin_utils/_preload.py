# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's connection plugin, loaded once by ansible-playbook itself (controller side).

Every task runs in a worker that ansible-playbook forks, and a worker loads the host's connection plugin
when it is not loaded already: it imports dflash.trainer.pct and parses its DOCUMENTATION for its
options (≈ 0.03-0.05 s a task on the 2-core lab machine; a no-op deploy runs eight such tasks). Loaded
once in ansible-playbook's own process before the first task forks, every worker inherits it. The
guard play's hosts (playbooks/target_guard.yml, templated by ansible-playbook itself before any task of
every playbook that imports it) call :func:`preload_connection` through its filter.
"""
from __future__ import annotations

from ansible.plugins.loader import connection_loader

CONNECTION = "dflash.trainer.pct"


def preload_connection(loader=connection_loader, name=CONNECTION):
    """Load the connection plugin ``name`` (its module and its options' definitions) into this process
    -> whether it loaded. Never raises: a run that cannot preload it loads it in each worker, as Ansible does."""
    try:
        return loader.get(name, class_only=True) is not None
    except Exception:  # pylint: disable=broad-exception-caught
        return False
