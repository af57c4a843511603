# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_release (documented in the module).

state=present with src: hash the tree here, ask the target whether that release exists (one
module run). Only if it answers needs_archive: build one deterministic tar.gz locally, put it
into the remote tmp dir (one transfer), run the module again with archive=, clean up.
Every other call goes to the module unchanged.
"""
from __future__ import annotations

import os
import tempfile

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_native, to_text
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.dflash.trainer.plugins.module_utils._release import (
    DEFAULT_EXCLUDES,
    ReleaseError,
    build_archive,
    scan_tree,
)

display = Display()

MODULE = "dflash.trainer.trainer_release"


class ActionModule(ActionBase):

    TRANSFERS_FILES = True
    _VALID_ARGS = frozenset(("root", "state", "src", "excludes", "release", "archive", "keep"))

    def run(self, tmp=None, task_vars=None):
        if task_vars is None:
            task_vars = dict()
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # tmp no longer has any effect

        args = dict(self._task.args)
        src = args.pop("src", None)
        excludes = args.pop("excludes", None)
        state = args.get("state") or "present"

        if src is None:
            if excludes is not None:
                return self._fail(result, "excludes is only valid together with src")
            result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
            return result

        if state != "present":
            return self._fail(result, "src is only valid with state=present, not state=%s" % state)
        for other in ("release", "archive"):
            if args.get(other) is not None:
                return self._fail(result, "src and %s are mutually exclusive: the release id is "
                                          "computed from src" % other)
        if excludes is None:
            excludes = list(DEFAULT_EXCLUDES)
        elif isinstance(excludes, str):
            excludes = [excludes]
        excludes = [to_text(x) for x in excludes]

        # Everything that can fail on the controller fails here, before the target is touched.
        try:
            src_path = self._resolve_src(to_text(src))
            scan = scan_tree(src_path, excludes)
        except (AnsibleError, ReleaseError, OSError) as e:
            return self._fail(result, to_native(e))

        display.vvv("trainer_release: %s -> release %s (%d files, %d bytes)"
                    % (src_path, scan.release_id, scan.file_count, scan.bytes))
        module_args = dict(args, state="present", release=scan.release_id)
        tree = dict(src=src_path, file_count=scan.file_count, bytes=scan.bytes)

        try:
            first = self._execute_module(module_name=MODULE, module_args=module_args, task_vars=task_vars)
            if first.get("failed") or not first.get("needs_archive"):
                result.update(first)
                result.update(tree)
                result.pop("needs_archive", None)
                return result

            local_fd, local_archive = tempfile.mkstemp(prefix="dflash-release-%s-" % scan.release_id,
                                                       suffix=".tar.gz")
            os.close(local_fd)
            try:
                written = build_archive(scan, local_archive)
                if written != scan.digest:
                    return self._fail(result, "src %s changed while the release archive was built "
                                              "(%s, now %s); deploy again"
                                      % (src_path, scan.release_id, written[:len(scan.release_id)]),
                                      **tree)
                tree["archive_bytes"] = os.path.getsize(local_archive)

                if self._task.check_mode:
                    previous = first.get("previous")
                    result.update(first)
                    result.pop("needs_archive", None)
                    result.update(tree)
                    result.update(changed=True, transferred=True, switched=previous != scan.release_id,
                                  current=scan.release_id)
                    return result

                if self._connection._shell.tmpdir is None:
                    self._make_tmp_path()
                remote_archive = self._connection._shell.join_path(
                    self._connection._shell.tmpdir, "release-%s.tar.gz" % scan.release_id)
                self._transfer_file(local_archive, remote_archive)
                self._fixup_perms2((self._connection._shell.tmpdir, remote_archive))
            finally:
                try:
                    os.unlink(local_archive)
                except OSError:
                    pass

            second = self._execute_module(module_name=MODULE,
                                          module_args=dict(module_args, archive=remote_archive),
                                          task_vars=task_vars)
            result.update(second)
            result.pop("needs_archive", None)
            result.update(tree)
            return result
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)

    def _resolve_src(self, src):
        src = os.path.expanduser(src)
        if os.path.isabs(src):
            path = src
        else:
            try:
                path = self._find_needle("files", src)
            except AnsibleError:
                raise AnsibleError("src %s does not exist on the controller (searched the role's "
                                   "files/ and the playbook directory)" % src)
        path = os.path.abspath(path)
        if not os.path.exists(path):
            raise AnsibleError("src %s does not exist on the controller" % path)
        if not os.path.isdir(path):
            raise AnsibleError("src %s is not a directory; a release is built from a directory" % path)
        return path

    @staticmethod
    def _fail(result, msg, **extra):
        result.update(extra)
        result.update(failed=True, changed=False, msg=msg)
        return result
