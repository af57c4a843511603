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
    stop, start and proof tasks. This lock is a directory created atomically with an owner record;
    the role takes it before changing anything and releases it at the end, also on failure.
  - A lock older than O(stale_s) is taken over, so a killed play does not block the next one forever.
author:
  - dflash.trainer maintainers (@dflash)
version_added: 0.1.0
options:
  path:
    description: Lock directory in the container.
    type: path
    default: /run/dflash-trainer.deploy.lock
  state:
    description: V(present) takes the lock, V(absent) releases it (only when the token matches).
    type: str
    choices: [present, absent]
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
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Takes or releases nothing in check mode.
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
  description: What was done, V(take), V(keep) (already ours), V(stale) (taken over), V(release), V(none).
  returned: always
  type: str
  sample: take
previous_owner:
  description: Owner of a lock that was taken over.
  returned: when RV(action) is V(stale)
  type: str
  sample: alice on laptop
"""

import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.dflash.trainer.plugins.module_utils._lock import (
    KEEP, REFUSE, decide, owner_record, parse_record, refusal_message)


def read_record(path):
    try:
        with open(os.path.join(path, "owner.json")) as fh:
            return parse_record(fh.read())
    except (IOError, OSError):
        return None


def write_record(path, record):
    tmp = os.path.join(path, ".owner.json.tmp")
    with open(tmp, "w") as fh:
        fh.write(record)
    os.rename(tmp, os.path.join(path, "owner.json"))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/run/dflash-trainer.deploy.lock"),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            token=dict(type="str", required=True, no_log=False),
            owner=dict(type="str", default="unknown"),
            stale_s=dict(type="int", default=3600),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path, now = p["path"], time.time()
    record = read_record(path) if os.path.isdir(path) else None

    if p["state"] == "absent":
        if record is None or record.get("token") != p["token"]:
            module.exit_json(changed=False, action="none")
        if not module.check_mode:
            shutil.rmtree(path, ignore_errors=True)
        module.exit_json(changed=True, action="release")

    if module.check_mode:
        module.exit_json(changed=False, action="none", msg="check mode: the lock is neither taken nor checked")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if record is None and now - os.stat(path).st_mtime < 5:
            record = {"owner": "a deploy that is just starting", "since": now}  # mkdir done, record not yet
        verdict = decide(record, p["token"], now, p["stale_s"])
        if verdict == REFUSE:
            module.fail_json(msg=refusal_message(path, record, now), owner=record.get("owner"))
        if verdict == KEEP:
            module.exit_json(changed=False, action="keep")
        write_record(path, owner_record(p["token"], p["owner"], now))
        module.exit_json(changed=True, action="stale", previous_owner=(record or {}).get("owner", "unknown"))
    except OSError as exc:
        module.fail_json(msg="Unable to create lock %s: %s" % (path, exc))
    write_record(path, owner_record(p["token"], p["owner"], now))
    module.exit_json(changed=True, action="take")


if __name__ == "__main__":
    main()
