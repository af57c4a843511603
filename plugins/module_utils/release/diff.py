# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Immutable code releases: which files a release switch adds, removes and modifies (Ansible's
--diff of trainer_release).

Pure Python standard library, usable on the controller (action plugin) and on the target
(module, through AnsiballZ). Nothing here talks to Ansible.
"""
from __future__ import annotations

from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import (
    KIND_DIR,
    KIND_FILE,
    KIND_SYMLINK,
    _sort_key,
)


def human_size(n):
    """Bytes as people read them: 512 B, 1.5 KiB, 12.0 MiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return "%d B" % n if unit == "B" else "%.1f %s" % (size, unit)
        size /= 1024.0
    return "%d B" % n  # not reached


def _what(entry):
    if entry.kind == KIND_SYMLINK:
        return "-> %s" % entry.payload
    if entry.kind == KIND_DIR:
        return "directory"
    return human_size(entry.size)


def manifest_changes(before, after):
    """What going from the entries ``before`` (None: no release) to ``after`` changes, sorted by
    path: (sign, relpath, words) with sign ``+`` (added), ``-`` (removed) or ``M`` (content, mode,
    kind or link target changed). Directories added or removed are not listed (their files are);
    a path that turns from or into a directory is."""
    old = dict((e.relpath, e) for e in (before or ()))
    new = dict((e.relpath, e) for e in (after or ()))
    out = []
    for relpath in sorted(set(old) | set(new), key=_sort_key):
        a, b = old.get(relpath), new.get(relpath)
        if a is None:
            if b.kind != KIND_DIR:
                out.append(("+", relpath, "(%s)" % _what(b)))
        elif b is None:
            if a.kind != KIND_DIR:
                out.append(("-", relpath, ""))
        elif a.kind != b.kind:
            out.append(("M", relpath, "(%s, was %s)" % (_what(b), _what(a) if a.kind != KIND_DIR else "a directory")))
        elif a.kind == KIND_FILE and a.payload != b.payload:
            words = "(%s → %s)" % (human_size(a.size), human_size(b.size))
            if a.mode != b.mode:
                words += " mode %04o → %04o" % (a.mode, b.mode)
            out.append(("M", relpath, words))
        elif a.kind == KIND_SYMLINK and a.payload != b.payload:
            out.append(("M", relpath, "(-> %s, was -> %s)" % (b.payload, a.payload)))
        elif a.kind != KIND_SYMLINK and a.mode != b.mode:
            out.append(("M", relpath, "(mode %04o → %04o)" % (a.mode, b.mode)))
    return out


def release_diff(before, after, before_id, after_id):
    """Ansible's diff (``prepared`` text) of a release switch: a header, then ``+ path (size)``,
    ``- path``, ``M path (old → new size)`` per changed file or symlink."""
    changes = manifest_changes(before, after)
    counts = dict((sign, sum(1 for c in changes if c[0] == sign)) for sign in "+-M")
    header = "release %s → %s: %d added, %d removed, %d modified" % (
        before_id or "(none)", after_id, counts["+"], counts["-"], counts["M"])
    if before_id and before is None:
        header += " (release %s records no manifest: every file listed as added)" % before_id
    lines = [header] + [("%s %s %s" % c).rstrip() for c in changes]
    return dict(prepared="\n".join(lines) + "\n")
