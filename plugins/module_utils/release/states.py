# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The states of trainer_release (present, mark_good, query) as functions of the
module's parameters: ``run(params, check_mode, diff)`` is all of the module's behaviour, callable
without Ansible. Each returns the module's result or raises ReleaseModuleError.
"""
from __future__ import annotations

import base64
import os
import tempfile
import time

from ansible_collections.dflash.trainer.plugins.module_utils.release.archive import manifest_items
from ansible_collections.dflash.trainer.plugins.module_utils.release.diff import release_diff
from ansible_collections.dflash.trainer.plugins.module_utils.release.prune import (
    order_newest_first,
    plan_prune,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.install import (
    _is_fifo,
    delta_base,
    install_release,
    read_manifest,
    verify_release,
)
from ansible_collections.dflash.trainer.plugins.module_utils.release.root import (
    delete_release,
    is_complete,
    list_releases,
    _Lock,
    read_current,
    read_last_good,
    ReleaseModuleError,
    releases_dir,
    remove_path,
    stale_entries,
    validate_id,
    write_last_good,
)


def switch_diff(root, previous, rid):
    """Ansible's diff of switching current from previous to rid (both complete releases)."""
    before = read_manifest(root, previous) if previous else None
    return release_diff(before, read_manifest(root, rid) or [], previous, rid)


def _present(params, check_mode):
    root = params["root"]
    rid = validate_id(params.get("release"))
    archive = params.get("archive")
    base = params.get("base")
    if base is not None:
        validate_id(base, "base release")
        if not archive:
            raise ReleaseModuleError("base is only valid together with archive (a delta archive)")
    keep = params["keep"]
    if keep < 0:
        raise ReleaseModuleError("keep must be 0 or more, got %d" % keep)

    previous = read_current(root)
    complete = is_complete(root, rid)
    result = dict(changed=False, release=rid, previous=previous,
                  transferred=False, needs_archive=False, pruned=[], cleaned=[],
                  last_good=read_last_good(root))

    if not complete and not archive:
        # Decide before touching anything: the action plugin uploads and calls again, with a
        # delta against base (the current release) when there is one with a manifest.
        delta_from, have = delta_base(root, previous)
        result.update(needs_archive=True, current=previous, base=delta_from, have=have,
                      releases=order_newest_first(list_releases(root)))
        if params.get("_diff"):  # the action plugin diffs the new tree against it
            manifest = read_manifest(root, previous) if previous else None
            result["base_manifest"] = None if manifest is None else manifest_items(manifest)
        return result
    if not complete and not (os.path.isfile(archive) or _is_fifo(archive)):
        raise ReleaseModuleError("Unable to install release %s: archive %s does not exist on the target"
                                 % (rid, archive))

    if params.get("_diff") and complete and previous != rid:
        result["diff"] = switch_diff(root, previous, rid)

    if check_mode:
        releases = list_releases(root)
        if not complete:
            releases[rid] = time.time()
        result["transferred"] = not complete
        result["cleaned"] = stale_entries(root)
        result["pruned"] = plan_prune(releases, rid, result["last_good"], keep, also=(previous,))
        result["releases"] = [r for r in order_newest_first(releases) if r not in result["pruned"]]
        result["current"] = previous
        result["changed"] = bool(result["transferred"] or result["pruned"]
                                 or result["cleaned"])
        return result

    os.makedirs(releases_dir(root), mode=0o755, exist_ok=True)
    with _Lock(root):
        # re-read under the lock: another run may have installed or switched meanwhile
        previous = read_current(root)
        result["previous"] = previous
        for rel in stale_entries(root):
            remove_path(os.path.join(root, rel))
            result["cleaned"].append(rel)
        if not is_complete(root, rid):
            result.update(install_release(root, rid, archive, base))
            if base is not None:
                result["base"] = base
            result["transferred"] = True
        last_good = read_last_good(root)
        for old in plan_prune(list_releases(root), rid, last_good, keep, also=(previous,)):
            delete_release(root, old)
            result["pruned"].append(old)
        result["last_good"] = last_good
        result["current"] = read_current(root)
        result["releases"] = order_newest_first(list_releases(root))
    result["changed"] = bool(result["transferred"] or result["pruned"] or result["cleaned"])
    return result


def _mark_good(params, check_mode):
    root = params["root"]
    if params.get("release"):
        rid = validate_id(params["release"])
    else:
        rid = read_current(root)
        if rid is None:
            raise ReleaseModuleError("no current release under %s; nothing to mark good" % root)
    if not is_complete(root, rid):
        raise ReleaseModuleError("Unable to mark release %s good: it is not a complete release under %s"
                                 % (rid, releases_dir(root)))
    previous = read_last_good(root)
    changed = previous != rid
    if changed and not check_mode:
        with _Lock(root):
            write_last_good(root, rid)
    return dict(changed=changed, release=rid, previous=previous, last_good=rid,
                current=read_current(root), releases=order_newest_first(list_releases(root)))


def _query(params, check_mode):
    root = params["root"]
    current = read_current(root)
    result = dict(changed=False, release=current, current=current, last_good=read_last_good(root),
                  releases=order_newest_first(list_releases(root)))
    if params.get("verify"):
        if current is None or not is_complete(root, current):
            result.update(verified=None, mismatches=[])
        else:
            ok, mismatches = verify_release(root, current)
            result.update(verified=ok, mismatches=mismatches)
    return result


STATES = {"present": _present, "mark_good": _mark_good, "query": _query}


def _with_inline_archive(params, check_mode):
    """archive_b64: a small archive that came inside the module's arguments (the action plugin
    sends a delta of up to INLINE_ARCHIVE_MAX this way: no remote temp dir, no transfer round
    trips). Written next to the releases, used as archive=, removed afterwards."""
    if params.get("archive"):
        raise ReleaseModuleError("archive and archive_b64 are mutually exclusive")
    if check_mode:
        return STATES["present"](dict(params, archive_b64=None, archive="(inline)"), check_mode)
    try:
        data = base64.b64decode(params["archive_b64"], validate=True)
    except (TypeError, ValueError) as e:
        raise ReleaseModuleError("archive_b64 is not valid base64: %s" % e)
    os.makedirs(params["root"], mode=0o755, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=".upload-", suffix=".tar.gz", dir=params["root"])
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return STATES["present"](dict(params, archive_b64=None, archive=path), check_mode)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def run(params, check_mode=False, diff=False):
    """All of the module's behaviour, callable without Ansible. Raises ReleaseModuleError.
    diff: Ansible's diff mode (a ``diff`` of the files a switch changes)."""
    if params.get("src"):
        raise ReleaseModuleError(
            "src is read on the controller by the dflash.trainer.trainer_release action plugin; "
            "the module on the target takes release= (and archive=)")
    root = os.path.abspath(params["root"])
    params = dict(params, root=root, _diff=bool(diff))
    if params.get("verify") and (params.get("state") or "present") != "query":
        raise ReleaseModuleError("verify is only valid with state=query")
    if params.get("archive_b64"):
        return _with_inline_archive(params, check_mode)
    return STATES[params.get("state") or "present"](params, check_mode)
