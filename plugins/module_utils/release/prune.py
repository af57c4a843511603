# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Immutable code releases: which releases to delete (plan_prune) and their order, newest first.

Pure Python standard library, usable on the controller and on the target (module, through
AnsiballZ). Nothing here talks to Ansible.
"""
from __future__ import annotations


def plan_prune(releases, current, last_good, keep, also=()):
    """Which releases to delete.

    releases: mapping id -> mtime (or iterable of (id, mtime) pairs). Keeps `keep` releases in
    all: `current`, `last_good` and ``also`` (the release current pointed at before - the one
    the trainer runs, and the one a refused pre-flight switches back to) always, then the newest
    others (mtime, ties broken by id) while room is left - so a run of failed releases never
    grows the directory past `keep` (or past those protected ones). Returns ids to delete,
    oldest first.
    """
    if keep < 0:
        raise ValueError("keep must be >= 0, got %r" % (keep,))
    pairs = list(releases.items()) if isinstance(releases, dict) else list(releases)
    newest_first = sorted(pairs, key=lambda p: (p[1], p[0]), reverse=True)
    protected = set(x for x in (current, last_good) + tuple(also or ()) if x)
    room = max(keep - len([p for p in newest_first if p[0] in protected]), 0)
    doomed = [pair[0] for pair in newest_first if pair[0] not in protected][room:]
    doomed.reverse()
    return doomed


def order_newest_first(releases):
    pairs = list(releases.items()) if isinstance(releases, dict) else list(releases)
    return [pair[0] for pair in sorted(pairs, key=lambda p: (p[1], p[0]), reverse=True)]
