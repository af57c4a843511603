# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Installing and checking one release directory on the target, for trainer_release.

install_release unpacks an archive (full or delta) into releases/.tmp-<id>-*, checks it against
the id, writes the marker last and renames it into place; verify_release re-hashes a complete
release against the manifest its marker records (``read_manifest``); ``delta_base`` is what a delta
upload may build on.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import stat
import tarfile
import tempfile
import time

from ansible_collections.dflash.trainer.plugins.module_utils.target.marks import MARKER_NAME
from ansible_collections.dflash.trainer.plugins.module_utils.target.private_file import fsync_dir
from ansible_collections.dflash.trainer.plugins.module_utils.release.archive import manifest_items, parse_manifest
from ansible_collections.dflash.trainer.plugins.module_utils.release.extract import (
    extract_archive_entries,
    extract_delta,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.extract import _safe_mode as extracted_mode
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import (
    KIND_FILE,
    KIND_SYMLINK,
    RELEASE_ID_LEN,
    BaseReleaseError,
    ReleaseError,
    hash_entries,
    scan_tree,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.root import (
    is_complete,
    _rand,
    release_path,
    ReleaseModuleError,
    releases_dir,
    remove_path,
    TMP_PREFIX,
    valid_id,
)


# ---------------------------------------------------------------------------------------------
# a complete release's manifest (recorded in its marker)

def read_manifest(root, rid):
    """Entries of complete release rid as recorded in its marker, or None (no usable manifest)."""
    try:
        with open(os.path.join(release_path(root, rid), MARKER_NAME)) as f:
            marker = json.load(f)
        return parse_manifest(marker["manifest"], "manifest of release %s" % rid)
    except (OSError, ValueError, KeyError, TypeError, ReleaseError):
        return None


def delta_base(root, previous):
    """(base id, sorted distinct sha256 of its files) for a delta upload, or (None, [])."""
    if previous is None or not valid_id(previous) or not is_complete(root, previous):
        return None, []
    manifest = read_manifest(root, previous)
    if manifest is None:
        return None, []
    return previous, sorted(set(e.payload for e in manifest if e.kind == KIND_FILE))


def _is_fifo(path):
    """The action plugin streams a big archive through a fifo in its remote tmp dir."""
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def _base_unusable(rid, base, why):
    return ReleaseModuleError("Unable to install release %s as a delta on base release %s: %s; "
                              "send the full archive" % (rid, base, why), base_unusable=True, base=base)


def install_release(root, rid, archive, base=None):
    """Extract archive into releases/.tmp-<id>-*, verify, write the marker last, rename.

    With base, archive is a delta (see extract_delta): the files it lacks are copied from the
    complete release base, hard-linked where they can be (see extract_delta). Returns
    dict(delta=, sent_files=, reused_files=, linked_files=, copied_files=)."""
    rdir = releases_dir(root)
    final = release_path(root, rid)
    base_manifest = None
    if base is not None:
        if not is_complete(root, base):
            raise _base_unusable(rid, base, "it is not a complete release under %s" % rdir)
        base_manifest = read_manifest(root, base)
        if base_manifest is None:
            raise _base_unusable(rid, base, "it records no readable manifest")
    tmp = tempfile.mkdtemp(prefix="%s%s-" % (TMP_PREFIX, rid), dir=rdir)
    try:
        try:
            if base is None:
                digest, entries = extract_archive_entries(archive, tmp)
                stats = dict(delta=False, sent_files=sum(1 for e in entries if e.kind == KIND_FILE),
                             reused_files=0, linked_files=0, copied_files=0)
            else:
                done = extract_delta(archive, tmp, release_path(root, base), base_manifest)
                digest, entries = done.digest, done.entries
                stats = dict(delta=True, sent_files=done.sent, reused_files=done.reused,
                             linked_files=done.linked, copied_files=done.copied)
        except BaseReleaseError as e:
            raise _base_unusable(rid, base, str(e))
        except (ReleaseError, OSError, EOFError, ValueError, tarfile.TarError) as e:
            raise ReleaseModuleError("Unable to unpack release %s from %s: %s" % (rid, archive, e))
        if digest[:RELEASE_ID_LEN] != rid:
            raise ReleaseModuleError("Unable to install release %s: the archive %s holds release %s "
                                     "(content changed or wrong archive)"
                                     % (rid, archive, digest[:RELEASE_ID_LEN]))
        now = time.time()
        marker = {
            "id": rid,
            "digest": digest,
            "created": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(),
            "created_epoch": now,
            "manifest": manifest_items(entries),
        }
        with open(os.path.join(tmp, MARKER_NAME), "w") as f:
            json.dump(marker, f, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o755)
        fsync_dir(tmp)
        if os.path.lexists(final):  # an incomplete leftover with our id (no marker)
            aside = os.path.join(rdir, "%s%s-incomplete-%s" % (TMP_PREFIX, rid, _rand()))
            os.rename(final, aside)
            remove_path(aside)
        os.rename(tmp, final)
        fsync_dir(rdir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return stats


def verify_release(root, rid):
    """Re-hash complete release rid against the manifest its marker records: (ok, mismatches).

    Catches what hard links between releases would spread: a file edited in place, a chmod, a
    file added or removed below releases/<rid>."""
    manifest = read_manifest(root, rid)
    if manifest is None:
        return False, ["%s: the marker records no readable manifest" % MARKER_NAME]
    mismatches = []
    if hash_entries(manifest)[:RELEASE_ID_LEN] != rid:
        mismatches.append("%s: the recorded manifest is not that of release %s" % (MARKER_NAME, rid))
    try:
        scan = scan_tree(release_path(root, rid), ())
    except ReleaseError as e:
        return False, mismatches + [str(e)]
    on_disk = dict((e.relpath, e) for e in scan.entries if e.relpath != MARKER_NAME)
    for want in manifest:
        got = on_disk.pop(want.relpath, None)
        if got is None:
            mismatches.append("%s: missing" % want.relpath)
        elif got.kind != want.kind:
            mismatches.append("%s: a %s, recorded as a %s" % (want.relpath, got.kind, want.kind))
        elif want.kind == KIND_FILE and got.payload != want.payload:
            mismatches.append("%s: content differs from its recorded sha256" % want.relpath)
        elif want.kind == KIND_SYMLINK and got.payload != want.payload:
            mismatches.append("%s: points at %s, recorded %s" % (want.relpath, got.payload, want.payload))
        elif want.kind != KIND_SYMLINK and got.mode != extracted_mode(want.kind, want.mode):
            mismatches.append("%s: mode %04o, expected %04o"
                              % (want.relpath, got.mode, extracted_mode(want.kind, want.mode)))
    mismatches.extend("%s: not in the manifest" % relpath for relpath in sorted(on_disk))
    return not mismatches, mismatches
