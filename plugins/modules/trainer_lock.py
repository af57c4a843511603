#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: trainer_lock
short_description: Hold a deploy lock in the container for the length of a play
description:
  - Two deploys to one container (two people, a CI job and a person) would interleave their
    stop, start and proof tasks. This lock is a directory put in place by one rename with its owner
    record already inside; the role takes it before changing anything and releases it at the end,
    also on failure.
  - >-
    A lock older than O(stale_s) is taken over, so a killed play does not block the next one forever.
    Every decision (take, take over, release) is made holding C(flock) on C(<path>.guard), and a
    lock is taken over or released by renaming it aside only if it still holds the record that was
    read; of many contenders for one stale lock exactly one wins, the others are refused with its owner.
  - >-
    The owner record holds the token, the owner, when it was taken (C(since), C(taken_at)) and,
    optionally, C(heartbeat) and C(expires) (epoch seconds), honoured when present.
  - >-
    A release that does not happen fails the task, when the lock is someone else's (ours was taken
    over as stale, so this play was not alone) or cannot be removed. A lock already gone is a warning.
author:
  - dflash.trainer maintainers (@dflash)
version_added: 0.1.0
extends_documentation_fragment:
  - dflash.trainer.group_hold
options:
  path:
    description: Lock directory in the container.
    type: path
    default: /run/dflash-trainer.deploy.lock
  state:
    description:
      - V(present) takes the lock, V(absent) releases it (only when the token matches; fails otherwise).
      - V(renew) only renews this play's lease (O(lease_s)); it fails when the lock is not this play's (taken over,
        released, removed) - it never takes a lock.
    type: str
    choices: [present, absent, renew]
    default: present
  token:
    description: This play's token; the same token re-takes its own lock.
    type: str
    required: true
  owner:
    description: Who holds the lock, in words (shown to a deploy that is refused).
    type: str
    default: unknown
  stale_s:
    description: Seconds after which someone else's lock counts as abandoned.
    type: int
    default: 3600
  lease_s:
    description:
      - Seconds the lock stays ours without renewal; taking it again with the same token renews
        it. A holder that stops renewing (a killed play, a lost connection) is taken over after
        its lease, not after O(stale_s). The restart job renews it while it runs.
      - Unset - no lease, only O(stale_s).
    type: int
  wait_s:
    description: While someone else holds the lock, wait up to this many seconds for it (to be
      released or to expire) before refusing.
    type: float
    default: 0
  missing_ok:
    description: With O(state=absent), a lock that is already gone (released by the restart job) is no warning.
    type: bool
    default: false
  holder:
    description:
      - With O(state=absent), who holds the lock after the run's calls that could hand it over - V(play), V(job),
        V(nobody) or V(unknown) (the role's C(__trainer_lock_holder)). The lock is released only when the play holds
        it, and not in check mode; the task is skipped otherwise.
      - Handled by the action plugin; the target never sees it.
    type: str
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Takes or releases nothing in check mode; reports what it would do.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
"""

EXAMPLES = r"""
- name: Take the deploy lock
  dflash.trainer.trainer_lock:
    token: "{{ play_token }}"
    owner: "{{ lookup('env', 'USER') }} on the controller"

- name: Release it
  dflash.trainer.trainer_lock:
    token: "{{ play_token }}"
    state: absent
"""

RETURN = r"""
action:
  description: >-
    What was done: V(take), V(keep) (already ours; renewed), V(stale) (taken over), V(release), V(none) (nothing
    to release); on failure V(refuse) (held by another deploy), V(not_ours) (the lock to release is
    someone else's) or V(error).
  returned: always
  type: str
  sample: take
owner:
  description: Owner of the lock that refused us, or of the lock that is not ours to release.
  returned: when RV(action) is V(refuse) or V(not_ours)
  type: str
  sample: alice on laptop
lock_holder:
  description: Who holds the lock for this play now - V(play) (taken) or V(nobody) (released, or not taken).
  returned: outside check mode
  type: str
previous_owner:
  description: Owner of a lock that was taken over.
  returned: when RV(action) is V(stale)
  type: str
  sample: alice on laptop
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dflash.trainer.plugins.module_utils.job.lock import (
    NONE, NOT_OURS, REFUSE, RELEASE, STALE, acquire_waiting, heartbeat, peek, read_lock, release)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/run/dflash-trainer.deploy.lock"),
            state=dict(type="str", choices=["present", "absent", "renew"], default="present"),
            token=dict(type="str", required=True, no_log=False),
            owner=dict(type="str", default="unknown"),
            stale_s=dict(type="int", default=3600),
            lease_s=dict(type="int"),
            wait_s=dict(type="float", default=0),
            missing_ok=dict(type="bool", default=False),
            group_hold=dict(type="dict"),
            holder=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params

    if p["state"] == "renew":
        if module.check_mode:
            module.exit_json(changed=False, action="keep", msg="check mode: nothing renewed")
        out = heartbeat(p["path"], p["token"], p["lease_s"] or 30)
        if not out.ok:
            module.fail_json(msg=out.msg, action=out.action, lock_holder="nobody")
        module.exit_json(changed=False, action=out.action, msg=out.msg, lock_holder="play")
    if p["state"] == "absent":
        if module.check_mode:
            record, _text, exists, _mtime = read_lock(p["path"])
            ours = exists and record is not None and record.get("token") == p["token"]
            module.exit_json(changed=ours, action=RELEASE if ours else (NOT_OURS if exists else NONE))
        out = release(p["path"], p["token"])
    elif module.check_mode:
        out = peek(p["path"], p["token"], p["stale_s"])
        if not out.ok:
            module.warn(out.msg)
        module.exit_json(changed=out.changed, action=out.action, msg="check mode: " + out.msg)
    else:
        out = acquire_waiting(p["path"], p["token"], p["owner"], p["stale_s"], lease_s=p["lease_s"], wait_s=p["wait_s"])

    # who holds the lock now, as far as this play goes: its own (taken) or nobody's it could free
    holder = "play" if p["state"] == "present" and out.ok else "nobody"
    if not out.ok:
        extra = dict(owner=out.owner()) if out.action in (REFUSE, NOT_OURS) else {}
        module.fail_json(msg=out.msg, action=out.action, lock_holder=holder, **extra)
    if out.action == NONE and not p["missing_ok"]:
        module.warn(out.msg)
    extra = dict(previous_owner=out.owner()) if out.action == STALE else {}
    module.exit_json(changed=out.changed, action=out.action, msg=out.msg, lock_holder=holder, **extra)


if __name__ == "__main__":
    main()
