# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: release_id
author:
  - dflash.trainer maintainers (@dflash)
version_added: "0.1.0"
short_description: The release id of a directory on the controller, as dflash.trainer.trainer_release computes it
description:
  - Hashes the tree (paths, types, modes, file contents, symlink targets; not mtimes) with the same code and the
    same per-file hash cache as M(dflash.trainer.trainer_release)'s action plugin, and returns the release id it
    would deploy - without contacting any host.
  - The role passes it to the first read of a deploy (M(dflash.trainer.trainer_status) with
    O(dflash.trainer.trainer_status#module:no_op)), so a deploy that changes nothing is one remote call.
options:
  _terms:
    description:
      - The directory, one - searched like O(dflash.trainer.trainer_release#module:src) (the role's C(files/), the
        playbook directory).
    required: true
    type: path
  excludes:
    description: fnmatch patterns left out, as O(dflash.trainer.trainer_release#module:excludes).
    type: list
    elements: str
    default: ['.git', '__pycache__', '*.pyc', 'checkpoints']
"""

EXAMPLES = r"""
- name: Which release would this tree be?
  ansible.builtin.debug:
    msg: "{{ lookup('dflash.trainer.release_id', 'examples/trainer') }}"
"""

RETURN = r"""
_raw:
  description: The release id (16 hex characters).
  type: list
  elements: str
"""

import os

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_native, to_text
from ansible.plugins.lookup import LookupBase

from ansible_collections.dflash.trainer.plugins.plugin_utils._release_cache import scan_cached
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import DEFAULT_EXCLUDES, ReleaseError


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if len(terms) != 1:
            raise AnsibleError("release_id takes one directory, got %d" % len(terms))
        src = os.path.expanduser(to_text(terms[0]))
        path = src if os.path.isabs(src) else self.find_file_in_search_path(variables, "files", src, ignore_missing=True)
        if not path or not os.path.isdir(path):
            raise AnsibleError("src %s is not a directory on the controller (searched the role's files/ and the "
                               "playbook directory); a release is built from a directory" % src)
        excludes = self.get_option("excludes")
        excludes = list(DEFAULT_EXCLUDES) if excludes is None else [to_text(x) for x in excludes]
        path = os.path.abspath(path)
        try:
            scan, _cache = scan_cached(path, excludes)
        except (ReleaseError, OSError) as e:
            raise AnsibleError(to_native(e)) from None
        return [scan.release_id]
