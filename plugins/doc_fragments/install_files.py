# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The trainer's files in one place: the O(install) option of the modules that install (trainer_restart)
or compare (trainer_status) them in the same remote call as their own work (DOCUMENTATION), and the
same options at the top level for trainer_install (FILES). Two literal copies - ansible-test reads a
doc fragment's attributes as string literals, so one text cannot be indented into both - that
tests/unit/test_docs.py holds equal."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  install:
    description:
      - The launcher, environment file and unit, with the options of M(dflash.trainer.trainer_install)
        and its guarantees (atomic writes, a path holding a file the collection did not write refused
        before any write, daemon-reload and enable only on a change). RV(install) says what changed
        (or would change).
    type: dict
    suboptions:
      unit:
        description: The unit's name (without .service).
        type: str
        required: true
      unit_path:
        description: Where the unit file goes.
        type: path
        required: true
      unit_content:
        description: The unit file.
        type: str
        required: true
      enabled:
        description: Enable the unit at boot (V(false) - disable it).
        type: bool
        default: true
      launcher_path:
        description: Where the launcher goes (mode 0755).
        type: path
        required: true
      launcher_content:
        description: The launcher.
        type: str
        required: true
      env_path:
        description: Where the EnvironmentFile goes (mode 0600, its directory 0700).
        type: path
        required: true
  env_content:
    description:
      - The EnvironmentFile O(install) writes at C(env_path) - a secret, never logged, so a top-level option
        and not one of O(install)'s (Ansible logs a dict option's repr in the target's journal, where a
        masked suboption's value with a newline no longer matches).
    type: str
"""

    # trainer_install: the same file options at the top level (its env_content is its own)
    FILES = r"""
options:
  unit:
    description: The unit's name (without .service).
    type: str
    required: true
  unit_path:
    description: Where the unit file goes.
    type: path
    required: true
  unit_content:
    description: The unit file.
    type: str
    required: true
  enabled:
    description: Enable the unit at boot (V(false) - disable it).
    type: bool
    default: true
  launcher_path:
    description: Where the launcher goes (mode 0755).
    type: path
    required: true
  launcher_content:
    description: The launcher.
    type: str
    required: true
  env_path:
    description: Where the EnvironmentFile goes (mode 0600, its directory 0700).
    type: path
    required: true
"""
