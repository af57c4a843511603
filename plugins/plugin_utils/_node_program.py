# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's Python (``trainer_node_python``) judged before anything runs it.

The node's view of the GPUs (``trainer_node_gpus``) is a module, and a module runs in the interpreter
it names: the module's own check of that interpreter comes after the interpreter already ran. So a
raw shell script (``script``: no Python) asks the node first - the interpreter's resolved path, its
owner and mode, and every directory above it and above the directory it is named in (``stat``) - and
``problem`` judges the answer as every program root runs is judged on the target
(``target.ownership.program_problem``): a file the login user or root owns, that nobody else may write, in
directories only they may write. The play refuses before the module runs.
"""
from __future__ import annotations

import shlex

from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import program_problem

_KINDS = {"regular file": "file", "regular empty file": "file", "directory": "dir", "symbolic link": "symlink"}


def script(path):
    """The POSIX shell script that describes ``path`` and the directories above it, one line each:
    ``uid N`` (the login user), ``real PATH``, ``file UID MODE KIND``, ``dir UID MODE PATH``."""
    q = shlex.quote(path)
    return ("p=%s; echo \"uid $(id -u)\"; r=$(readlink -f -- \"$p\") || r=; echo \"real $r\"; "
            "[ -n \"$r\" ] && [ -e \"$r\" ] && stat -c 'file %%u %%a %%F' -- \"$r\"; "
            "for d in \"$(readlink -f -- \"$(dirname -- \"$p\")\")\" \"$(dirname -- \"$r\")\"; do "
            "case \"$d\" in /*) ;; *) continue ;; esac; "  # absolute only: dirname of "" is ".", forever
            "while :; do stat -c 'dir %%u %%a %%n' -- \"$d\" 2>/dev/null; "
            "[ \"$d\" = / ] && break; d=$(dirname -- \"$d\"); done; done; true" % q)


def facts(text, path):
    """``script``'s answer -> (facts as ``target.ownership.observe_program`` makes them, the login uid)."""
    out = {"path": path, "exists": False}
    chain, seen, uid = [], set(), None
    for line in (text or "").splitlines():
        word, _sep, rest = line.strip().partition(" ")
        try:
            if word == "uid":
                uid = int(rest)
            elif word == "real" and rest:
                out.update(real=rest, found=path)
            elif word == "file":
                owner, mode, kind = rest.split(" ", 2)
                out.update(exists=True, uid=int(owner), mode=int(mode, 8), type=_KINDS.get(kind, "other"))
            elif word == "dir":
                owner, mode, directory = rest.split(" ", 2)
                if directory not in seen:
                    seen.add(directory)
                    chain.append((directory, int(owner), int(mode, 8)))
        except ValueError:
            continue
    if not out.get("exists"):
        out.pop("found", None)
    # from / down, as target.ownership's chains are
    out["chain"] = sorted(chain, key=lambda c: (c[0].count("/") if c[0] != "/" else 0, c[0]))
    return out, uid


def problem(text, path):
    """Why the node may not run ``path`` as the node's Python (the variable named), or ""."""
    found, uid = facts(text, path)
    if not found.get("found"):
        return ("trainer_node_python: %s is not on the node (or cannot be read): set trainer_node_python to the "
                "node's Python 3" % path)
    why = program_problem(found, uids=(0,) if uid in (None, 0) else (0, uid))
    return "" if why is None else "trainer_node_python: %s" % why
