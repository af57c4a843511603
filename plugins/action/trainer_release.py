# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_release (documented in the module).

state=present with src: hash the tree here, ask the target whether that release exists (one
module run, pipelined: no remote temporary directory). Only if it answers needs_archive: build
one deterministic tar.gz locally - a delta holding only the files whose sha256 the target's base
release (the one it answered in base / have) lacks, or the full tree when there is no base -
create the remote tmp dir, put the archive there (one transfer), run the module again with
archive= (and base=), clean up. Should the base fail the target's checks (vanished, a file not
matching its sha256), send the full archive once more (delta: false).
In diff mode the first answer also carries the current release's manifest (base_manifest): the
result's diff lists the files of src that the switch adds, removes and modifies (release_diff).
Every other call goes to the module unchanged.
"""
from __future__ import annotations

import base64
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
    delta_counts,
    parse_manifest,
    release_diff,
    scan_tree,
)

display = Display()

MODULE = "dflash.trainer.trainer_release"
# archives up to this size travel inside the module arguments (base64)
INLINE_ARCHIVE_MAX = 1024 * 1024

# keys of the module's needs_archive answer that never reach the task result
_PROTOCOL_KEYS = ("needs_archive", "have", "base_manifest")


class ActionModule(ActionBase):

    # The remote tmp dir is only needed to upload an archive; it is made lazily (_make_tmp_path)
    # then, so that a no-op release is a single pipelined module run.
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("root", "state", "src", "excludes", "release", "archive", "base", "keep", "verify"))

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
        for other in ("release", "archive", "base"):
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
                return self._finish(result, first, tree)
            diff = self._diff(first, scan) if self._task.diff else None
            base = first.get("base")
            have = first.get("have") if base else None
            if base and not isinstance(have, list):
                base, have = None, None

            if self._task.check_mode:
                built = self._build(scan, src_path, have, tree, result)
                if built is None:
                    return result
                _unlink(built[0])
                sent = built[1]
                previous = first.get("previous")
                self._finish(result, first, tree)
                result.update(changed=True, transferred=True, switched=previous != scan.release_id,
                              current=scan.release_id, delta=base is not None, base=base,
                              sent_files=sent[0], reused_files=sent[1])
                if diff is not None:
                    result["diff"] = diff
                return result

            second = self._send(scan, src_path, module_args, task_vars, base, have, tree, result)
            if second is None:
                return result
            if base is not None and second.get("failed") and second.get("base_unusable"):
                display.warning("trainer_release: delta on base release %s refused by the target (%s); "
                                "sending the full archive" % (base, second.get("msg")))
                tree["delta_fallback"] = second.get("msg")
                second = self._send(scan, src_path, module_args, task_vars, None, None, tree, result)
                if second is None:
                    return result
            self._finish(result, second, tree)
            if diff is not None and not result.get("failed"):
                result["diff"] = diff
            return result
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)

    @staticmethod
    def _diff(answer, scan):
        """The diff of switching from the target's current release (its manifest in the module's
        answer) to the tree scanned here."""
        items = answer.get("base_manifest")
        try:
            before = parse_manifest(items, "manifest of release %s" % answer.get("current")) if items else None
        except ReleaseError as e:
            display.warning("trainer_release: no diff: %s" % to_native(e))
            return None
        return release_diff(before, scan.entries, answer.get("current"), scan.release_id)

    def _build(self, scan, src_path, have, tree, result):
        """Build the archive (a delta when have is not None) into a local temp file.

        Returns (local path, (sent_files, reused_files)) with tree['archive_bytes'] set, or None
        after failing result. The caller removes the file."""
        local_fd, local_archive = tempfile.mkstemp(prefix="dflash-release-%s-" % scan.release_id,
                                                   suffix=".tar.gz")
        os.close(local_fd)
        try:
            written = build_archive(scan, local_archive, have=have)
        except BaseException:
            _unlink(local_archive)
            raise
        if written != scan.digest:
            _unlink(local_archive)
            self._fail(result, "src %s changed while the release archive was built (%s, now %s); deploy again"
                       % (src_path, scan.release_id, written[:len(scan.release_id)]), **tree)
            return None
        tree["archive_bytes"] = os.path.getsize(local_archive)
        return local_archive, delta_counts(scan, have)

    def _send(self, scan, src_path, module_args, task_vars, base, have, tree, result):
        """Build, upload and install; the module's result, or None after failing result."""
        built = self._build(scan, src_path, have, tree, result)
        if built is None:
            return None
        local_archive, counts = built
        if tree["archive_bytes"] <= INLINE_ARCHIVE_MAX:
            # a small delta rides in the module's arguments: no temp dir, no put, no chmod
            try:
                with open(local_archive, "rb") as fh:
                    inline = base64.b64encode(fh.read()).decode("ascii")
            finally:
                _unlink(local_archive)
            display.vvv("trainer_release: sending %s archive of %d files inline, %d bytes"
                        % ("a delta" if base else "the full", counts[0], tree["archive_bytes"]))
            args = dict(module_args, archive_b64=inline)
            if base is not None:
                args["base"] = base
            return self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
        try:
            if self._connection._shell.tmpdir is None:
                self._make_tmp_path()
            remote_archive = self._connection._shell.join_path(
                self._connection._shell.tmpdir, "release-%s.tar.gz" % scan.release_id)
            self._transfer_file(local_archive, remote_archive)
            self._fixup_perms2((self._connection._shell.tmpdir, remote_archive))
        finally:
            _unlink(local_archive)
        display.vvv("trainer_release: sent %s archive of %d files (%d reused from %s), %d bytes"
                    % ("a delta" if base else "the full", counts[0], counts[1], base, tree["archive_bytes"]))
        args = dict(module_args, archive=remote_archive)
        if base is not None:
            args["base"] = base
        return self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)

    @staticmethod
    def _finish(result, module_result, tree):
        result.update(module_result)
        for key in _PROTOCOL_KEYS:
            result.pop(key, None)
        if not result.get("delta"):
            result.pop("base", None)
        result.update(tree)
        return result

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


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass
