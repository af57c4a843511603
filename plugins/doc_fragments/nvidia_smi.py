# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The O(nvidia_smi) option of every module that reads GPUs with nvidia-smi."""

from __future__ import annotations


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  nvidia_smi:
    description: Name (looked up in E(PATH)) or absolute path of the nvidia-smi executable on the host the module runs on.
    type: str
    default: nvidia-smi
"""
