# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is this directory a torchinductor cache? Judged entry by entry, at every depth, before the
purge (``purge``, here beside its judge) deletes it (``rm -rf``): a directory of anything else - a corpus of ``en/ de/ fr/``, a
checkpoint, a project with ``model.py`` - is refused, naming what it holds.

The layout is inductor's own (torch/_inductor: ``codecache.get_path``, ``write_atomic``,
``get_lock_dir``, ``FxGraphCache``, ``AOTAutogradCache``, ``triton_cache_dir``, ...), and
tests/unit/fixtures/inductor_cache_torch_2.13_cpu.txt is a tree real torch wrote:

* ``XY/`` - a two-character directory holding files named ``<key>.<ext>`` whose key (a letter and
  a long hash: ``c`` + 51 base32 characters) carries ``XY`` as its 2nd and 3rd characters
  (``get_path``: ``subdir = basename[1:3]``): ``3b/c3bm7q….main.cpp``, ``….so``, ``….py``;
* ``locks/<name>.lock``; ``precompiled_headers/`` (``*.h``, ``*.h.gch``, ``locks/``);
* ``fxgraph/XY/<key>/<hash>``, ``aotautograd/<key>/<hash>``, ``cache/<hash>``,
  ``triton/<device>/<hash>/<kernel>.{json,ttir,ttgir,llir,ptx,cubin,…}``;
* other directories inductor names (``dynamo``, ``gcc``, ``aoti_eager``, ...): files named by a
  hash or carrying a compiler's extension (``.so``, ``.o``, ``.cubin``, ...);
* at the top: ``memoizer_cache.json``/``.lock``, ``configs_*.json`` (CUTLASS), ``tmp*`` temporary
  files and ``tmp*/`` nested caches (``fresh_cache``); anywhere: ``write_atomic``'s
  ``.<pid>.<thread>.tmp``.

A symlink, device, socket or FIFO, and a directory on another file system (a mount below the
cache), are never inductor's: refused. There is no cut-off: every entry is judged (the problem
names the first few that are not inductor's and how many there are).

``observe`` walks the tree (lstat only, never following a link); ``tree_problem`` and
``entry_problem`` are pure; ``purge`` deletes the cache once ``cache_problem`` finds nothing (the
restart job's step, while the unit is stopped) and raises ``CacheRefused`` when it refuses. Stdlib
only: the lab runs this file's source by itself in a container, on the cache real torch wrote.
"""

from __future__ import annotations

import os
import re
import shutil
import stat

# a key: a letter and a long hash (base32 lowercase today; older torch: urlsafe base64 with _ for -)
_KEY = r"[A-Za-z0-9_]{32,}"
_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{31,}$")
_HASH2_RE = re.compile(r"^[A-Za-z0-9_]{2}$")
# a file named by a bare hash: FxGraphCache's and AOTAutogradCache's entries (sha256 in lowercase base32,
# which may begin with a digit: 5nyninwi2ib6eg3h…), hex digests; with its .lock
_HASH_NAME_RE = re.compile(r"^[a-z0-9]{32,}(\.lock)?$")
# a file named by a key: <key>.<ext>[.<ext>...] (c3bm….main.cpp, c24….so, c24….so.load_ok)
_KEY_FILE_RE = re.compile(r"^(%s)((?:\.[A-Za-z0-9_]{1,16}){0,4})$" % _KEY)
# a file whose name carries a hash somewhere (code_state_<hash>.pkl, <name>_<hash>.so)
_HASHED_RE = re.compile(r"[A-Za-z0-9]{32,}")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+:-]{1,255}$")
# temporary files: write_atomic's .<pid>.<thread>.tmp; tempfile's tmp<random>[suffix]
_ATOMIC_TMP_RE = re.compile(r"^\.\d+\.\d+\.tmp$")
_TEMP_RE = re.compile(r"^tmp[A-Za-z0-9_]{6,}(\.[A-Za-z0-9_]{1,16})?$")
_TEMP_DIR_RE = re.compile(r"^tmp[A-Za-z0-9_]{6,}$")
# what a compiler or inductor writes (a file of another name must carry one of these)
ARTIFACT_EXTS = frozenset(("so", "o", "a", "gch", "pch", "lock", "load_ok", "best_config", "cubin", "ptx", "hsaco",
                           "spv", "fatbin", "ttir", "ttgir", "llir", "amdgcn", "source", "zebin", "ll", "mlir",
                           "cpp", "h", "hpp", "cu", "cuh", "hip"))
_TRITON_FILE_RE = re.compile(r"^(__grp__)?[A-Za-z0-9_.+-]{1,200}\.(json|ttir|ttgir|llir|ptx|cubin|hsaco|amdgcn|source|"
                             r"spv|so|o|zebin|ttsharedir|ll|mlir|lock)$")
# directories inductor creates directly in the cache directory
NAMED_DIRS = frozenset(("locks", "precompiled_headers", "fxgraph", "aotautograd", "triton", "cache", "dynamo", "gcc",
                        "torch_cutlass", "unhashed_kernel_inputs", "aoti_eager", "autoheuristic", "bisect",
                        "cutedsl_compile_cache", "kernel", "subgraphs", "cudagraphs", "halide"))
ROOT_FILES = frozenset(("memoizer_cache.json", "memoizer_cache.lock"))
_CUTLASS_CONFIG_RE = re.compile(r"^configs_[A-Za-z0-9_.-]{1,200}\.json$")
SHOWN = 5


def _exts(name):
    return name.split(".")[1:]


def _key_file(name, hash2=None):
    """``name`` is <key>.<ext>...; with ``hash2``: the key's 2nd and 3rd characters are it."""
    m = _KEY_FILE_RE.match(name)
    if not m or not _KEY_RE.match(m.group(1)):
        return False
    return hash2 is None or m.group(1)[1:3] == hash2


def _artifact(name):
    """A file of a compiler or of inductor, named by a hash or by a compiler's extension."""
    if _key_file(name) or _ATOMIC_TMP_RE.match(name) or _TEMP_RE.match(name):
        return True
    if not _NAME_RE.match(name):
        return False
    exts = _exts(name)
    if exts and exts[-1] in ARTIFACT_EXTS:
        return True
    return bool(_HASHED_RE.search(name.split(".")[0]))


def entry_problem(parts, kind):
    """Why the entry at relative path ``parts`` (a tuple of names, from the cache directory down)
    of ``kind`` ("file", "dir", "symlink", "other", "mount") is not inductor's, or None."""
    name = parts[-1]
    if kind == "symlink":
        return "a symlink"
    if kind == "mount":
        return "a mount point (another file system below the cache)"
    if kind not in ("file", "dir"):
        return "a special file (device, socket or FIFO)"
    # a nested cache (fresh_cache: tmpXXXXXXXX/ with the same layout): judged as the top
    while len(parts) > 1 and _TEMP_DIR_RE.match(parts[0]):
        parts = parts[1:]
    if kind == "file" and _ATOMIC_TMP_RE.match(name):
        return None
    top, depth = parts[0], len(parts)
    if depth == 1:
        if kind == "dir":
            ok = bool(_HASH2_RE.match(name)) or name in NAMED_DIRS or bool(_TEMP_DIR_RE.match(name))
        else:
            ok = name in ROOT_FILES or bool(_TEMP_RE.match(name)) or bool(_CUTLASS_CONFIG_RE.match(name))
        return None if ok else _not_inductor(kind)
    if _HASH2_RE.match(top) and top not in NAMED_DIRS:
        # XY/<key>.<ext>; an AOT build's XY/<key>/ directory holds a compiler's files
        if depth == 2:
            if kind == "file":
                return None if _key_file(name, top) else "a file not named by a hash of its directory %s/" % top
            return None if (_KEY_RE.match(name) and name[1:3] == top) or name == "__pycache__" else _not_inductor(kind)
        return None if kind == "dir" or _artifact(name) else _not_inductor(kind)
    if top == "locks":
        if kind == "file":
            return None if _NAME_RE.match(name) and name.endswith(".lock") else "not a .lock file"
        return _not_inductor(kind)
    if top == "precompiled_headers":
        if kind == "dir":
            return None if depth == 2 and name == "locks" else _not_inductor(kind)
        if depth == 3:
            return None if _NAME_RE.match(name) and name.endswith(".lock") else "not a .lock file"
        exts = _exts(name)
        return None if _NAME_RE.match(name) and exts and exts[-1] in ("h", "gch", "pch", "lock") \
            or _TEMP_RE.match(name) else "not a header or a precompiled header"
    if top in ("fxgraph", "aotautograd", "cache"):
        # fxgraph/XY/<key>/<hash>, aotautograd/<key>/<hash>, cache/<hash> (and cache/<name>/<hash>)
        if kind == "dir":
            if top == "fxgraph" and depth == 2:
                return None if _HASH2_RE.match(name) else _not_inductor(kind)
            if top == "fxgraph" and depth == 3:
                return None if _KEY_RE.match(name) and name[1:3] == parts[1] else _not_inductor(kind)
            if top == "aotautograd" and depth == 2:
                return None if _KEY_RE.match(name) else _not_inductor(kind)
            if top == "cache" and depth == 2:
                return None if _NAME_RE.match(name) else _not_inductor(kind)
            return _not_inductor(kind)
        return None if _key_file(name) or _TEMP_RE.match(name) or _HASH_NAME_RE.match(name) \
            else "a file not named by a hash"
    if top == "triton":
        if kind == "dir":
            return None if depth <= 3 and _NAME_RE.match(name) else _not_inductor(kind)
        return None if _TRITON_FILE_RE.match(name) or _key_file(name) or _TEMP_RE.match(name) \
            else "not a file Triton's cache holds"
    if top in NAMED_DIRS:
        if kind == "dir":
            return None if _NAME_RE.match(name) else _not_inductor(kind)
        return None if _artifact(name) else "a file neither named by a hash nor a compiler's output"
    return _not_inductor(kind)


def _not_inductor(kind):
    return "a %s inductor does not write there" % ("directory" if kind == "dir" else "file")


def tree_problem(tree):
    """``tree``: [(relative path, kind)] of every entry below the cache directory (``observe``)
    -> why it is not a torchinductor cache, or None."""
    strange = []
    for rel, kind in tree:
        why = entry_problem(tuple(rel.split("/")), kind)
        if why:
            strange.append((rel, kind, why))
    if not strange:
        return None
    shown = ", ".join(rel + ("/" if kind == "dir" else "") for rel, kind, _why in strange[:SHOWN])
    more = len(strange) - SHOWN
    first = strange[0]
    return ("does not look like a torchinductor cache: it holds %s%s, which inductor does not write (%s%s: %s; a "
            "cache holds two-character hash directories of files named by that hash, locks/, precompiled_headers/, "
            "fxgraph/, aotautograd/, triton/, ...)" % (shown, " and %d more entries like them" % more if more > 0 else "",
                                                       first[0], "/" if first[1] == "dir" else "", first[2]))


def cache_problem(facts):
    """Why the directory described by ``facts`` is not a torchinductor cache, or None.

    ``facts`` from ``observe`` below carry the whole ``tree``; facts of ``target.ownership.observe``
    carry only the top level (``entries``), which is judged by the same rules (what is below is
    judged again, entry by entry, at the purge)."""
    if not facts.get("exists"):
        return None
    if facts.get("type") != "dir":
        t = facts.get("type")
        what = ("a file of %d bytes" % facts.get("size", 0) if t == "file" else
                "something unreadable (%s)" % facts.get("error", "?") if t == "unreadable" else
                "a special file (device, socket or FIFO)" if t == "other" else "a %s" % t)
        return "is %s, not a torchinductor cache directory" % what
    if facts.get("error"):
        return "cannot be read entirely (%s): what it holds cannot be judged" % facts["error"]
    if "tree" in facts:
        return tree_problem(facts["tree"])
    return tree_problem(list(facts.get("entries") or []))


def observe(path):
    """What is at ``path`` (not followed when it is a symlink): exists, type, uid, mode, mount and,
    for a directory, ``tree``: [(relative path, kind)] of every entry below it, none followed, a
    directory on another file system given as kind "mount" and not entered."""
    facts = {"path": path, "real": path, "exists": False}
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return facts
    except OSError as exc:
        facts.update(exists=True, type="unreadable", error=exc.strerror or str(exc))
        return facts
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else \
        "symlink" if stat.S_ISLNK(st.st_mode) else "other"
    facts.update(exists=True, type=kind, size=st.st_size, uid=st.st_uid, mode=stat.S_IMODE(st.st_mode))
    if kind != "dir":
        return facts
    facts["mount"] = os.path.ismount(path)
    tree = []
    stack = [("", path)]
    while stack:
        rel, absdir = stack.pop()
        try:
            with os.scandir(absdir) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            facts["error"] = "%s: %s" % (rel or ".", exc.strerror or exc)
            break
        for child in children:
            crel = rel + "/" + child.name if rel else child.name
            try:
                cst = child.stat(follow_symlinks=False)
            except OSError:
                tree.append((crel, "other"))
                continue
            if stat.S_ISDIR(cst.st_mode):
                if cst.st_dev != st.st_dev:
                    tree.append((crel, "mount"))
                    continue
                tree.append((crel, "dir"))
                stack.append((crel, child.path))
            elif stat.S_ISREG(cst.st_mode):
                tree.append((crel, "file"))
            elif stat.S_ISLNK(cst.st_mode):
                tree.append((crel, "symlink"))
            else:
                tree.append((crel, "other"))
    facts["tree"] = tree
    return facts


# ---------------------------------------------------------------------------------------------
# the purge (the restart job's step, job.steps.Steps.purge)

class CacheRefused(Exception):
    """The purge refused to delete (or to make again) the cache directory: ``msg`` in words. The
    restart job's step raises it as ``job.cycle.StepFailed``, with the same words."""

    def __init__(self, msg):
        super(CacheRefused, self).__init__(msg)
        self.msg = msg


def purge(path, observe_dir=None):
    """Delete the torchinductor cache directory (only ever called while the unit is stopped) and
    make it again, empty, root's and mode 0700 (inductor loads the .so files it finds there: no
    other user may plant one before the trainer starts).

    Judged again here, at the moment of deleting, entry by entry at every depth
    (``cache_problem``): it must be absent or hold only what inductor writes, else the purge is
    refused with CacheRefused naming what is there (the job then brings the trainer back) and
    nothing is deleted. A symlink is removed, never followed; a cache that is a mount point is
    emptied, not removed (removing it fails with EBUSY)."""
    if not path:
        return False
    if os.path.islink(path):
        os.unlink(path)
        _make_cache_dir(path)
        return True
    facts = (observe_dir or observe)(path)
    why = cache_problem(facts)
    if why:
        raise CacheRefused("refused to purge %s: it %s; nothing was deleted" % (path, why))
    if not facts.get("exists"):
        _make_cache_dir(path)
        return False
    if facts.get("mount"):
        for name in os.listdir(path):
            child = os.path.join(path, name)
            if os.path.isdir(child) and not os.path.islink(child):
                shutil.rmtree(child)
            else:
                os.unlink(child)
        os.chown(path, os.geteuid(), os.getegid(), follow_symlinks=False)
        os.chmod(path, 0o700)
        return True
    shutil.rmtree(path)
    _make_cache_dir(path)
    return True


def _make_cache_dir(path):
    """The cache directory, new and empty, owned by us, mode 0700; refused when something else
    took its place in the meantime (another user's directory in /tmp)."""
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        os.makedirs(parent, 0o755, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not os.listdir(path)):
            raise CacheRefused("refused to start with the torchinductor cache %s: after the purge something else took "
                               "its place (%s owned by uid %d); remove it" % (
                                   path, "a directory" if stat.S_ISDIR(st.st_mode) else "a file or link", st.st_uid))
    os.chmod(path, 0o700)
