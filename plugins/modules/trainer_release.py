#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: trainer_release
short_description: Immutable, content-addressed code releases uploaded beside the running one
description:
  - Keeps releases of a code tree under C(<root>/releases/<id>), where C(<id>) is the first 16 hex
    characters of a content hash of the tree (paths, types, modes, file contents, symlink targets;
    not mtimes). C(<root>/current) is a relative symlink to C(releases/<id>), switched atomically
    (new symlink, then rename over the old one). C(<root>/last_good) holds the id of the last
    release that passed the readiness proof.
  - With O(src), the action plugin computes the id on the controller and asks the target whether
    that release already exists. Only when it does not, the tree goes over as B(one) deterministic
    archive (one file transfer), extracted into C(releases/.tmp-<id>-*), checked against the id,
    completed by a marker file C(.dflash-release) written last, then renamed into place. A
    deploy that changes nothing is one module run with C(changed=false) (no remote temporary
    directory either).
  - The archive is a B(plain tar) - weights and checkpoints do not compress, and gzip would send
    them at about 20 MB/s. It is written while it is sent and, when the connection can stream
    (P(dflash.trainer.pct#connection) can), it goes through a fifo in the remote temporary
    directory straight into the module, which unpacks it as it arrives - no archive file on the
    controller or in the container. Other connections put it as one file. A small one (at most
    4 MiB of tar) is gzip-compressed and, when it then fits 1 MiB, rides inline in the module's
    arguments. The target reads either kind.
  - The controller caches each file's sha256 under its absolute path with its size, mtime, ctime,
    inode and device (C($XDG_CACHE_HOME/dflash-trainer/release-hashes/), C(~/.cache) by default) -
    a file whose stat is unchanged is not read again, so a deploy that changes nothing costs the
    same with a 1 GiB checkpoint in the tree as without it. Files changed less than 3 s before
    they are hashed are not cached (a same-tick rewrite would keep their stat); the target
    checks every file it receives against the release id whatever the cache said.
  - Each release records its manifest (path, type, mode, sha256 or link target of every entry) in
    its marker. When the release C(current) points at has one, the archive is a B(delta) - the
    manifest of the new tree, directories, symlinks and only the files whose content the current
    release lacks; the target takes the other files from the current release, each verified
    against its sha256 first, then checks the whole tree against the id as for a full archive. If
    that base cannot supply a file, the action sends the full archive.
  - A file taken from the base release is B(hard-linked) when the base file already has the mode
    and owner extraction would give it (and lies on the same filesystem), else copied - the
    C(rsync --link-dest) pattern. Releases are immutable (only this module writes below
    C(releases/)), so identical content with an identical mode can share one inode, and pruning a
    release leaves the others complete. The limit - an in-place edit of a file below C(releases/)
    shows in every release sharing it; O(state=query) with O(verify=true) re-hashes the current
    release against its manifest to find such edits.
  - A partial release (interrupted extraction) is never eligible for C(current); stale
    C(.tmp-*) directories are removed by the next run that writes.
  - Extraction follows the rules of Python's C(tarfile) C(data) filter, implemented in the
    collection because Debian bookworm's Python 3.11.2 predates it - only directories, regular
    files and relative symlinks that stay inside the release; no absolute paths, no C(..), no
    devices or hard links; setuid/setgid/sticky and group/other write bits dropped.
version_added: 0.1.0
author:
  - dflash.trainer maintainers (@dflash)
options:
  root:
    description:
      - Directory that holds C(releases/), C(current) and C(last_good). Created with O(state=present)
        when missing.
    type: path
    required: true
  state:
    description:
      - V(present) makes O(release) (or the release built from O(src)) exist, then prunes old releases. It never
        moves C(current) - the restart job (P(dflash.trainer.trainer_restart#module) O(dflash.trainer.trainer_restart#module:release))
        switches it, after the pre-flight, and back when the proof fails.
      - V(mark_good) records the release C(current) points at (or O(release)) in C(last_good).
      - V(query) only reads and returns C(current), C(last_good) and the releases.
    type: str
    choices: [present, mark_good, query]
    default: present
  src:
    description:
      - B(Action plugin option, read on the controller.) Directory whose contents become the release.
        A relative path is searched like the M(ansible.builtin.copy) module's O(ansible.builtin.copy#module:src)
        (role C(files/), playbook directory).
      - The task fails before touching the target if it is missing or not a directory, if it holds a
        device, fifo or socket, or a symlink that is absolute or leads outside the tree.
      - Only with O(state=present); mutually exclusive with O(release) and O(archive).
    type: path
  excludes:
    description:
      - B(Action plugin option.) fnmatch patterns matched against every path component and against
        the path relative to O(src); a match leaves out the entry (and everything below it).
      - Only with O(src).
    type: list
    elements: str
    default: ['.git', '__pycache__', '*.pyc', 'checkpoints']
  release:
    description:
      - Release id. Required with O(state=present) when O(src) is not given.
      - With O(state=mark_good), the release to record instead of the one C(current) points at.
    type: str
  archive_b64:
    description:
      - A small archive (a delta) inline, base64; the action plugin uses it instead of O(archive)
        when the archive is at most 1 MiB, saving the remote temp dir and the transfer. Internal.
    type: str
  archive:
    description:
      - Path B(on the target) of a tar (plain or gzip-compressed) of the release, as built by the action plugin, or
        of a fifo the action plugin streams it into while the module reads it. Used only
        when the release does not exist yet; its content hash must match O(release).
    type: path
  base:
    description:
      - Id of a complete release on the target that O(archive), a B(delta) archive, builds on (set by
        the action plugin from the C(base) the module answered). Only with O(archive).
    type: str
  keep:
    description:
      - Number of newest releases to keep with O(state=present); the release C(current) points at
        and C(last_good) are never removed on top of that.
    type: int
    default: 5
  verify:
    description:
      - Only with O(state=query). Re-hash the release C(current) points at and compare every entry
        (type, mode, sha256, link target; nothing missing, nothing extra) with the manifest its
        marker records; returns RV(verified) and RV(mismatches). Reads every file of the release.
      - The action plugin does not pass this option through yet (it is not in its accepted
        arguments); the module itself takes it.
    type: bool
    default: false
extends_documentation_fragment:
  - dflash.trainer.group_hold
  - action_common_attributes
  - action_common_attributes.flow
  - dflash.trainer.play_lock
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Reports what would be transferred and pruned without transferring or writing.
  diff_mode:
    support: full
    details:
      - Lists the files the release adds (C(+ path (size))), removes (C(- path)) and modifies
        (C(M path (old size → new size))) against the release C(current) points at, as Ansible's
        prepared diff - with O(state=present) (also in check mode).
      - The action plugin compares the tree of O(src) with the manifest of the current release, which
        the module returns (only in diff mode) with its answer that it needs an archive.
  platform:
    platforms: posix
notes:
  - Run as a user that owns O(root). Files in a release belong to that user; owners from the
    archive are ignored.
  - Concurrent runs against the same O(root) are serialised with a lock file C(<root>/.lock).
seealso:
  - module: ansible.builtin.copy
"""

EXAMPLES = r"""
- name: Deploy the trainer code (one archive transfer only when the content changed)
  dflash.trainer.trainer_release:
    root: /opt/dflash-trainer
    src: "{{ playbook_dir }}/../examples/trainer/"
    excludes: ['.git', '__pycache__', '*.pyc', 'checkpoints', '*.log']
    keep: 5
  register: trainer_release

- name: Record the running release as good once the readiness proof passed
  dflash.trainer.trainer_release:
    root: /opt/dflash-trainer
    state: mark_good

- name: Which release is live?
  dflash.trainer.trainer_release:
    root: /opt/dflash-trainer
    state: query
  register: trainer_release_state
"""

RETURN = r"""
release:
  description: Release id the task worked on (for V(query), the one C(current) points at).
  returned: always
  type: str
  sample: 3f2a9c0d41b7e8a5
previous:
  description:
    - Release C(current) points at (V(present) - unchanged by it), or the previous
      C(last_good) (V(mark_good)). V(null) when there was none.
  returned: when state is present or mark_good
  type: str
  sample: 91c04d7e22aa0b13
transferred:
  description: Whether the release was (or would be) unpacked from an archive in this run.
  returned: when state is present
  type: bool
  sample: true
needs_archive:
  description:
    - The release does not exist on the target and no O(archive) was given. Nothing was touched.
      The action plugin answers by uploading the archive; it never shows up in its result.
  returned: when state is present and the module is called without the action plugin
  type: bool
  sample: false
base:
  description:
    - Release a delta was (or would be) built on. With C(needs_archive), the release the module
      offers as base (V(null) when there is none with a manifest).
  returned: when state is present and a delta was installed, or with needs_archive
  type: str
  sample: 91c04d7e22aa0b13
have:
  description: Distinct sha256 of the regular files of RV(base) (only with needs_archive).
  returned: with needs_archive
  type: list
  elements: str
base_manifest:
  description:
    - The manifest of the release C(current) points at (V(null) when there is none or it records none),
      for the action plugin's diff. It never shows up in the action plugin's result.
  returned: with needs_archive, in diff mode
  type: list
  elements: list
delta:
  description: Whether the release was (or would be) installed from a delta archive.
  returned: when a release was (or would be) installed
  type: bool
  sample: true
sent_files:
  description: Regular files that went over in the archive (directories and symlinks always do).
  returned: when a release was (or would be) installed
  type: int
  sample: 1
reused_files:
  description:
    - Regular files taken from the base release instead of being sent (RV(linked_files) +
      RV(copied_files)).
  returned: when a release was (or would be) installed
  type: int
  sample: 1999
linked_files:
  description: Of RV(reused_files), the files hard-linked to the base release's file.
  returned: when a release was installed
  type: int
  sample: 1998
copied_files:
  description:
    - Of RV(reused_files), the files copied (the base file's mode or owner differs from what the
      new release needs, or the link failed).
  returned: when a release was installed
  type: int
  sample: 1
verified:
  description:
    - Whether the current release matches its manifest (O(verify=true)); V(null) when there is no
      current release.
  returned: when state is query and verify is true
  type: bool
  sample: true
mismatches:
  description: Entries of the current release that differ from its manifest, one line each.
  returned: when state is query and verify is true
  type: list
  elements: str
  sample: ["pkg/model.py: content differs from its recorded sha256"]
releases:
  description: Complete releases under C(<root>/releases), newest first, after the task.
  returned: always
  type: list
  elements: str
  sample: [3f2a9c0d41b7e8a5, 91c04d7e22aa0b13]
pruned:
  description: Releases removed (or that would be removed) by O(keep).
  returned: when state is present
  type: list
  elements: str
  sample: [0a1b2c3d4e5f6071]
cleaned:
  description: Leftovers of interrupted runs (C(.tmp-*) directories, temporary links) removed.
  returned: when state is present
  type: list
  elements: str
  sample: [releases/.tmp-3f2a9c0d41b7e8a5-x1y2z3]
current:
  description: Release C(current) points at after the task.
  returned: always
  type: str
  sample: 3f2a9c0d41b7e8a5
last_good:
  description: Release recorded in C(<root>/last_good), V(null) if none.
  returned: always
  type: str
  sample: 91c04d7e22aa0b13
file_count:
  description: Regular files in the O(src) tree (action plugin).
  returned: when O(src) is given
  type: int
  sample: 42
bytes:
  description: Total size of the regular files in the O(src) tree (action plugin).
  returned: when O(src) is given
  type: int
  sample: 183340
hashed_files:
  description:
    - Files of the O(src) tree whose sha256 was computed in this run (action plugin); the others
      came from the controller's hash cache.
  returned: when O(src) is given
  type: int
  sample: 1
archive_bytes:
  description: Size of the archive that was (or would be) transferred (action plugin).
  returned: when O(src) is given and a transfer happened
  type: int
  sample: 51234
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dflash.trainer.plugins.module_utils.job.lock import PLAY_LOCK_SPEC, play_lease
from ansible_collections.dflash.trainer.plugins.module_utils.release.scan import DEFAULT_EXCLUDES
from ansible_collections.dflash.trainer.plugins.module_utils.release.root import ReleaseModuleError
# the module's behaviour, callable without Ansible (run); the unit tests import run and
# ReleaseModuleError from this module
from ansible_collections.dflash.trainer.plugins.module_utils.release.states import STATES, run


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", required=True),
            state=dict(type="str", default="present", choices=sorted(STATES)),
            src=dict(type="path"),
            excludes=dict(type="list", elements="str", default=list(DEFAULT_EXCLUDES)),
            release=dict(type="str"),
            archive=dict(type="path"),
            archive_b64=dict(type="str", no_log=True),
            base=dict(type="str"),
            keep=dict(type="int", default=5),
            verify=dict(type="bool", default=False),
            lock=PLAY_LOCK_SPEC,
            group_hold=dict(type="dict"),
        ),
        required_if=[("state", "present", ("release", "src"), True)],
        mutually_exclusive=[("src", "release"), ("src", "archive"), ("src", "base"), ("archive", "archive_b64")],
        supports_check_mode=True,
    )
    try:
        # the play's lease is renewed while a release of any size arrives and is unpacked
        with play_lease(module.params["lock"]):
            result = run(module.params, module.check_mode, module._diff)
    except ReleaseModuleError as e:
        module.fail_json(msg=e.msg, **e.result)
    except OSError as e:
        module.fail_json(msg="Unable to manage releases under %s: %s" % (module.params["root"], e))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
