# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of dflash.trainer.trainer_release (documented in the module).

state=present with src: hash the tree here (file hashes cached by stat, _release_cache), ask the
target whether that release exists (one module run, pipelined: no remote temporary directory).
Only if it answers needs_archive: build one deterministic archive - a delta holding only the
files whose sha256 the target's base release (the one it answered in base / have) lacks, or the
full tree when there is no base. A small one (at most SMALL_ARCHIVE_MAX of tar) is gzip'd in
memory and rides inline in the module's arguments when it fits INLINE_ARCHIVE_MAX; a bigger one
is a plain tar (weights and checkpoints do not compress: gzip would cost ~20 s per GiB), streamed
straight into the remote tmp dir by a connection that can (dflash.trainer.pct's put_stream: no
local copy), else written to a local temp file and put (one transfer). Then the module runs again
with archive= (and base=), and the tmp dir is removed. Should the base fail the target's checks
(vanished, a file not matching its sha256), send the full archive once more (delta: false).
In diff mode the first answer also carries the current release's manifest (base_manifest): the
result's diff lists the files of src that the switch adds, removes and modifies (release_diff).
Every other call goes to the module unchanged.
"""
from __future__ import annotations

import base64
import io
import os
import shlex
import tempfile
import threading
import time

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_native, to_text
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.dflash.trainer.plugins.module_utils.release.archive import (
    DEFAULT_COMPRESSLEVEL,
    archive_estimate,
    delta_counts,
    parse_manifest,
    write_archive,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.diff import release_diff
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import (
    DEFAULT_EXCLUDES,
    ReleaseError,
)
from ansible_collections.dflash.trainer.plugins.plugin_utils._release_cache import resolve_src, scan_cached
from ansible_collections.dflash.trainer.plugins.plugin_utils._group_hold import run_held
from ansible_collections.dflash.trainer.plugins.plugin_utils._payload_cache import KeptPayload

display = Display()

MODULE = "dflash.trainer.trainer_release"
# archives up to this size travel inside the module arguments (base64)
INLINE_ARCHIVE_MAX = 1024 * 1024
# archives whose plain tar would be at most this are gzip'd in memory (they may then fit inline);
# bigger ones travel as a plain tar, streamed
SMALL_ARCHIVE_MAX = 4 * INLINE_ARCHIVE_MAX
# in the container: let whoever waits in open() on the fifo go, and make any later open fail
UNBLOCK_SCRIPT = 'if [ -p "$1" ]; then exec 3<>"$1"; rm -f "$1"; mkdir "$1"; exec 3<&-; fi'
# the pipe between the archive writer and the transfer (Linux F_SETPIPE_SZ; 64 KiB otherwise)
PIPE_SIZE = 1024 * 1024

# keys of the module's needs_archive answer that never reach the task result
_PROTOCOL_KEYS = ("needs_archive", "have", "base_manifest")


class ActionModule(KeptPayload, ActionBase):

    # The remote tmp dir is only needed to upload an archive; it is made lazily (_make_tmp_path)
    # then, so that a no-op release is a single pipelined module run.
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("root", "state", "src", "excludes", "release", "archive", "base", "keep", "verify", "lock"))

    def run(self, tmp=None, task_vars=None):
        # a trainer group's member: held until every member's upload ended (plugin_utils/_group_hold.py)
        return run_held(self, self._run, tmp, task_vars, display)

    def _run(self, tmp=None, task_vars=None):
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
        started = time.monotonic()
        try:
            src_path = resolve_src(to_text(src), self._find_needle)
            scan, cache = scan_cached(src_path, excludes)
        except (AnsibleError, ReleaseError, OSError) as e:
            return self._fail(result, to_native(e))
        if cache.error:
            display.vvv("trainer_release: hash cache: %s" % cache.error)

        display.vvv("trainer_release: %s -> release %s (%d files, %d bytes; %d files hashed, %d bytes, %d from the "
                    "hash cache %s; %.2f s)" % (src_path, scan.release_id, scan.file_count, scan.bytes, cache.hashed,
                                                cache.hashed_bytes, cache.hits, cache.path, time.monotonic() - started))
        module_args = dict(args, state="present", release=scan.release_id)
        tree = dict(src=src_path, file_count=scan.file_count, bytes=scan.bytes, hashed_files=cache.hashed)

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
                # the archive's size, measured by writing it nowhere (files checked by stat, not hashed again)
                level = _compresslevel(scan, have)
                written, tree["archive_bytes"] = write_archive(scan, _NullWriter(), have=have, compresslevel=level,
                                                               check="stat")
                if written != scan.digest:
                    self._changed_during_build(result, src_path, scan, written, tree)
                    return result
                sent = delta_counts(scan, have)
                previous = first.get("previous")
                self._finish(result, first, tree)
                result.update(changed=True, transferred=True,
                              current=previous, delta=base is not None, base=base,
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

    def _send(self, scan, src_path, module_args, task_vars, base, have, tree, result):
        """Build, upload and install; the module's result, or None after failing result."""
        counts = delta_counts(scan, have)
        kind = "a delta" if base else "the full"
        level = _compresslevel(scan, have)
        try:
            if level is not None:
                buf = io.BytesIO()
                written, size = write_archive(scan, buf, have=have, compresslevel=level)
                data = buf.getvalue()
                del buf

                def produce(out):
                    out.write(data)
                    return written, size
            else:
                written, size, data = None, None, None

                def produce(out):
                    # the module hashes every file it receives against the release id: here a stat
                    # check is enough to name a file that changed since the scan (no 2nd sha256 pass)
                    return write_archive(scan, out, have=have, check="stat")
            if data is not None and written != scan.digest:
                return self._changed_during_build(result, src_path, scan, written, tree)
            if data is not None and size <= INLINE_ARCHIVE_MAX:
                # a small delta rides in the module's arguments: no temp dir, no put, no chmod
                tree["archive_bytes"] = size
                display.vvv("trainer_release: sending %s archive of %d files inline, %d bytes (gzip)"
                            % (kind, counts[0], size))
                args = dict(module_args, archive_b64=base64.b64encode(data).decode("ascii"))
                if base is not None:
                    args["base"] = base
                return self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
            name = "release-%s.tar%s" % (scan.release_id, ".gz" if level is not None else "")
            args = dict(module_args)
            if base is not None:
                args["base"] = base
            if callable(getattr(self._connection, "put_stream", None)):
                return self._stream_into_module(produce, name, args, task_vars, scan, src_path, tree, result,
                                                "%s archive of %d files (%d reused from %s), %s"
                                                % (kind, counts[0], counts[1], base,
                                                   "gzip" if level is not None else "plain tar"))
            remote_archive, written, size = self._upload(produce, name)
        except (ReleaseError, OSError) as e:
            self._fail(result, "Unable to send release %s from %s: %s" % (scan.release_id, src_path, to_native(e)),
                       **tree)
            return None
        tree["archive_bytes"] = size
        if written != scan.digest:
            return self._changed_during_build(result, src_path, scan, written, tree)
        display.vvv("trainer_release: sent %s archive of %d files (%d reused from %s), %d bytes (%s, one put "
                    "of a local temp file)" % (kind, counts[0], counts[1], base, size,
                                               "gzip" if level is not None else "plain tar"))
        return self._execute_module(module_name=MODULE, module_args=dict(args, archive=remote_archive),
                                    task_vars=task_vars)

    def _remote_tmp(self):
        if self._connection._shell.tmpdir is None:
            self._make_tmp_path()
        return self._connection._shell.tmpdir

    def _upload(self, produce, name):
        """Put what produce(out) writes (it returns (digest, bytes)) into the remote tmp dir as
        name, through a local temp file and the connection's put_file. -> (remote path, digest,
        bytes)."""
        tmpdir = self._remote_tmp()
        remote = self._connection._shell.join_path(tmpdir, name)
        fd, local = tempfile.mkstemp(prefix="dflash-release-", suffix="-" + name)
        try:
            with os.fdopen(fd, "wb") as fh:
                written, size = produce(fh)
            self._transfer_file(local, remote)
        finally:
            _unlink(local)
        self._fixup_perms2((tmpdir, remote))
        return remote, written, size

    def _stream_into_module(self, produce, name, args, task_vars, scan, src_path, tree, result, what):
        """The archive straight from the tree into the new release, no copy on either side: a fifo
        in the remote tmp dir, the connection's put_stream writing produce's output into it (a
        thread) while the module unpacks it (archive=<fifo>).

        Either side may fail first; neither is left waiting for the other: the module reads the
        fifo to its end on success, and after any failure UNBLOCK_SCRIPT replaces the fifo by a
        directory (whoever opens it next fails at once) after opening it once (whoever waits in
        open gets its peer, then EOF or EPIPE). The module's result, or None after failing result."""
        tmpdir = self._remote_tmp()
        fifo = self._connection._shell.join_path(tmpdir, name + ".fifo")
        made = self._low_level_execute_command("mkfifo -m 600 %s" % shlex.quote(fifo), sudoable=False)
        if made.get("rc") != 0:
            self._fail(result, "Unable to create the fifo %s for release %s: %s"
                       % (fifo, scan.release_id, (made.get("stderr") or made.get("stdout") or "").strip()), **tree)
            return None
        self._fixup_perms2((tmpdir, fifo))
        put_stream = self._connection.put_stream
        box = {}

        def sender():
            try:
                box["result"] = _stream(produce, lambda src: put_stream(src, fifo))
            except BaseException as e:  # pylint: disable=broad-except  # reported below
                box["error"] = e
                self._unblock(fifo)

        thread = threading.Thread(target=sender, name="trainer_release-put", daemon=True)
        started = time.monotonic()
        thread.start()
        answer = None
        try:
            answer = self._execute_module(module_name=MODULE, module_args=dict(args, archive=fifo),
                                          task_vars=task_vars)
        finally:
            if (answer is None or answer.get("failed")) and thread.is_alive():
                self._unblock(fifo)
            thread.join()
        error = box.get("error")
        if error is not None:
            why = "%s: %s" % (type(error).__name__, to_native(error)) if isinstance(error, OSError) else to_native(error)
            msg = "Unable to send release %s from %s: %s" % (scan.release_id, src_path, why)
            if answer.get("failed") and answer.get("msg"):
                msg += " (the target: %s)" % answer["msg"]
            self._fail(result, msg, **tree)
            return None
        written, tree["archive_bytes"] = box["result"]
        if written != scan.digest:
            # the module hashed what it received: its verdict stands; the stat check explains it
            if answer.get("failed"):
                return self._changed_during_build(result, src_path, scan, written, tree,
                                                  " (the target: %s)" % answer.get("msg"))
            display.warning("trainer_release: a file of %s changed while release %s was sent; the target "
                            "received the content the release id names (checked) and installed it"
                            % (src_path, scan.release_id))
        display.vvv("trainer_release: streamed %s, %d bytes, into the module through %s (%.2f s)"
                    % (what, tree["archive_bytes"], fifo, time.monotonic() - started))
        return answer

    def _unblock(self, fifo):
        """Release whoever waits on the fifo (see _stream_into_module); never raises."""
        cmd = "/bin/sh -c %s sh %s" % (shlex.quote(UNBLOCK_SCRIPT), shlex.quote(fifo))
        try:
            self._connection.exec_command(cmd, sudoable=False)
        except Exception as e:  # pylint: disable=broad-except  # best effort: the call timeout bounds the rest
            display.vvv("trainer_release: could not release the fifo %s: %s" % (fifo, e))

    def _changed_during_build(self, result, src_path, scan, written, tree, more=""):
        self._fail(result, "src %s changed while the release archive was built (%s, now %s); deploy again%s"
                   % (src_path, scan.release_id, written[:len(scan.release_id)], more), **tree)
        return None

    @staticmethod
    def _finish(result, module_result, tree):
        result.update(module_result)
        for key in _PROTOCOL_KEYS:
            result.pop(key, None)
        if not result.get("delta"):
            result.pop("base", None)
        result.update(tree)
        return result

    @staticmethod
    def _fail(result, msg, **extra):
        result.update(extra)
        result.update(failed=True, changed=False, msg=msg)
        return result


def _compresslevel(scan, have):
    """gzip level for the archive of scan (against have), or None for a plain tar."""
    return DEFAULT_COMPRESSLEVEL if archive_estimate(scan, have) <= SMALL_ARCHIVE_MAX else None


class _NullWriter(object):
    def write(self, data):
        return len(data)

    def flush(self):
        pass


def _stream(produce, put):
    """Run produce(out) in a thread writing into a pipe while put(src) reads the other end.

    Returns what produce returned, after checking that put (the container's byte count) got every
    byte. A failure of produce (a file that cannot be read) wins over the transfer's: it is the
    cause, the transfer only saw the stream end early."""
    rfd, wfd = os.pipe()
    try:
        import fcntl
        fcntl.fcntl(wfd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except (ImportError, OSError):
        pass  # the default pipe size works, a little slower
    box = {}

    def writer():
        try:
            with os.fdopen(wfd, "wb") as out:
                box["result"] = produce(out)
        except BaseException as e:  # pylint: disable=broad-except  # reported by the caller
            box["error"] = e

    thread = threading.Thread(target=writer, name="trainer_release-archive", daemon=True)
    thread.start()
    try:
        with os.fdopen(rfd, "rb", buffering=0) as src:
            got = put(src)
    except BaseException:
        thread.join()  # src is closed: a blocked writer gets EPIPE and ends
        error = box.get("error")
        if error is not None and not isinstance(error, BrokenPipeError):
            raise error
        raise
    thread.join()
    if "error" in box:
        raise box["error"]
    written, size = box["result"]
    if got is not None and got != size:  # None: a fifo, whose reader checks what it got
        raise AnsibleError("the container received %s of the %d bytes of the release archive" % (got, size))
    return written, size


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass
