# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Deploy lock decisions, pure: who may take the lock, given what the lock file says.

A deploy is many tasks; nothing in Ansible holds a lock across them. The lock is a directory
created with mkdir (atomic) holding an owner record; these functions decide what to do with an
existing record so the module stays a thin shell around mkdir/rmdir.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

TAKE, KEEP, REFUSE, STALE = "take", "keep", "refuse", "stale"


def owner_record(token, owner, now):
    return json.dumps({"token": token, "owner": owner, "since": now}, sort_keys=True)


def parse_record(text):
    """The owner record, or None when it is unreadable (a crash between mkdir and write)."""
    try:
        rec = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("since"), (int, float)):
        return None
    return rec


def decide(record, token, now, stale_s):
    """What to do when the lock directory already exists.

    KEEP: it is ours (same token: the role ran again in the same play);
    STALE: older than stale_s, or unreadable and older than a few seconds: take it over;
    REFUSE: someone else's, recent.
    """
    if record is None:
        return STALE
    if record.get("token") == token:
        return KEEP
    if now - record["since"] > stale_s:
        return STALE
    return REFUSE


def refusal_message(path, record, now):
    return ("another deploy holds %s: %s since %d s ago; wait for it, or remove the lock if that "
            "deploy is dead (it is taken over by itself after trainer_lock_stale_s)"
            % (path, record.get("owner", "unknown"), int(now - record["since"])))
