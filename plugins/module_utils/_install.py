# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Installing the trainer's files - launcher, environment file, unit - in one module run.

Three copy/template tasks cost five remote calls each over pct (echo ~, mkdtemp, stat, file, rm);
on a real node every pct call loads Proxmox's Perl stack. ``install_file`` compares and writes one
file atomically (tmp in the same directory, fsync, rename), creating its directory with the
given mode; the module runs it for all three and reloads/enables the unit only on a change.
"""

from __future__ import annotations

import os
import stat
import tempfile

from ansible_collections.dflash.trainer.plugins.module_utils._ownership import ENV_MARK


def current(path):
    """(content bytes, mode) of a regular file, or (None, None)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None, None
    if not stat.S_ISREG(st.st_mode):
        return None, None
    with open(path, "rb") as fh:
        return fh.read(), stat.S_IMODE(st.st_mode)


def plan(path, content, mode):
    """What installing ``content`` at ``path`` with ``mode`` would change: [] or some of
    "content", "mode", "new"."""
    have, have_mode = current(path)
    if have is None:
        return ["new"]
    changes = []
    if have != content:
        changes.append("content")
    if have_mode != mode:
        changes.append("mode")
    return changes


def ensure_dir(path, mode):
    if not os.path.isdir(path):
        os.makedirs(path, mode)
        os.chmod(path, mode)


def install_file(path, content, mode, dir_mode=0o755, check_mode=False):
    """Write ``content`` (bytes) at ``path`` with ``mode`` when it differs -> the list of changes."""
    changes = plan(path, content, mode)
    if not changes or check_mode:
        return changes
    directory = os.path.dirname(path)
    ensure_dir(directory, dir_mode)
    if changes == ["mode"]:
        os.chmod(path, mode)
        return changes
    fd, tmp = tempfile.mkstemp(prefix=".%s.tmp-" % os.path.basename(path), dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return changes


def masked_env(text):
    """An EnvironmentFile with every value replaced by ******** (for diffs: values are secrets).
    Every line is masked - a line without ``=`` too - except the collection's own mark line."""
    out = []
    for line in (text or "").splitlines():
        if line == ENV_MARK or not line.strip():
            out.append(line)
        elif "=" in line:
            out.append("%s=********" % line.split("=", 1)[0])
        else:
            out.append("********")
    return "\n".join(out) + ("\n" if out else "")
