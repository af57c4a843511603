# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A module's AnsiballZ payload, built once and kept between runs (controller side).

Before a task runs one of this collection's modules, Ansible builds its payload: it parses the
module and every module_util it imports, file by file, to find what to ship, and zips them. It keeps
the result in ``ansiballz_cache`` under its local tmp of *this* run, which it removes when
ansible-playbook exits: every run builds every module again. For the first read of a deploy
(trainer_plan, about 36 files) that build is about a third of the task, and it is the same bytes in
every run until the collection, ansible-core or Python changes. No well-kept library keeps it for a
collection (Mitogen keeps modules between tasks, but replaces Ansible's execution model): this file
does, in the fewest moves.

- :func:`payload_key` - the key of a payload: ansible-core's version and location, Python's version,
  the module's compression, the module file and every file under the collection's module_utils.
  Anything the build reads from this collection changes it; a stale payload is never used.
- :func:`store_dir` - the store: ``dflash-trainer-payloads/<module>/<key>`` beside the run's local tmp
  (``~/.ansible/tmp`` by default), used only when every directory of it belongs to this user and
  no one else may write it (the payload is a pickle that Ansible loads).
- :func:`restore` / :func:`keep` - before the build, the stored payload is copied where Ansible looks
  first (its run's cache: it then uses it as its own); after it, the built one is stored (older keys of
  the module removed). Any error leaves Ansible to build as usual: the cache only ever saves time.
- :func:`with_bytecode` / :func:`add_bytecode` - a payload this run built gets, before it is stored, the
  compiled code of each of its Python files beside the file (``x.pyc`` beside ``x.py``). The target
  imports the payload from the zip, where Python keeps no bytecode cache: without it, every call compiles
  every module_util again (ansible-core's own ones included), ≈ 0.1 s of a first read's ≈ 0.3 s on the
  target. Each ``.pyc`` is a checked-hash one (PEP 552): the target's Python uses it only when it is its
  own version (the magic number) and the source beside it has the hash it was compiled from; else it
  compiles the source, as without it. Nothing in Ansible adds bytecode to a payload.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.util
import io
import marshal
import os
import pickle
import shutil
import stat
import sys
import tempfile
import zipfile

import ansible
from ansible import constants as C
from ansible.release import __version__ as ANSIBLE_VERSION

STORE_NAME = "dflash-trainer-payloads"
_TEMP = ".part-"


def payload_key(module_path, utils_dir, runtime):
    """sha256 (hex) of what a module's payload is built from: ``runtime`` (strings: ansible-core's
    version and path, Python's version, the compression), the module file and every file under
    ``utils_dir`` (its relative name and bytes, in name order)."""
    h = hashlib.sha256()
    for part in runtime:
        h.update(b"r\0" + str(part).encode() + b"\0")
    with open(module_path, "rb") as fh:
        h.update(b"m\0" + fh.read() + b"\0")
    names = []
    for top, dirs, files in os.walk(utils_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        names.extend(os.path.join(top, f) for f in files if f.endswith(".py"))
    for path in sorted(names):
        with open(path, "rb") as fh:
            h.update(b"u\0" + os.path.relpath(path, utils_dir).encode() + b"\0" + fh.read() + b"\0")
    return h.hexdigest()


# the stored payload's form: a payload stored in an earlier form is never used (its key differs)
PAYLOAD_FORM = "with-bytecode-1"


def runtime_of(compression):
    """The runtime part of a payload's key: ansible-core's version and location, Python's version, the
    compression and the stored payload's form."""
    return (ANSIBLE_VERSION, os.path.dirname(ansible.__file__), sys.version, compression, PAYLOAD_FORM)


def _private(path, uid):
    """``path`` is a real directory (no link) owned by ``uid`` that no one else may write."""
    st = os.lstat(path)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022


def store_dir(local_tmp_parent, module, key, uid=None):
    """The store's directory of ``module``'s payload ``key``, made (mode 0700) when missing; None when a
    directory of it is not this user's alone (then nothing is read from it or written to it)."""
    uid = os.geteuid() if uid is None else uid
    path = local_tmp_parent
    for name in (STORE_NAME, module, key):
        path = os.path.join(path, name)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        if not _private(path, uid):
            return None
    return path if _private(local_tmp_parent, uid) else None


def _is_payload(name, prefix):
    return name.startswith(prefix) and not name.endswith(".lock") and not name.endswith("-part") and _TEMP not in name


def _copy(src, dest_dir, name, uid):
    """Copy the regular file ``src`` owned by ``uid`` to ``dest_dir/name`` atomically; False when it is
    not such a file or ``name`` is there already."""
    dest = os.path.join(dest_dir, name)
    st = os.lstat(src)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or os.path.lexists(dest):
        return False
    with open(src, "rb") as fh:
        _write_atomically(dest, lambda out: shutil.copyfileobj(fh, out))
    return True


def _write_atomically(dest, write):
    """``write(file)`` into a temp file of its own beside ``dest`` (never a payload's name), then one rename
    onto ``dest``: a reader sees the old file or the whole new one, and writers at once never mix."""
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(dest) + _TEMP, dir=os.path.dirname(dest))
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise


def restore(store, run_cache, prefix, uid=None):
    """Copy the stored payloads whose name starts with ``prefix`` into ``run_cache`` (made when
    missing) -> their names."""
    uid = os.geteuid() if uid is None else uid
    os.makedirs(run_cache, mode=0o700, exist_ok=True)
    return [n for n in sorted(os.listdir(store))
            if _is_payload(n, prefix) and _copy(os.path.join(store, n), run_cache, n, uid)]


def keep(store, run_cache, prefix, uid=None, prepare=None):
    """Store the payloads ``run_cache`` holds whose name starts with ``prefix`` and ``store`` lacks (built by
    this run), each given to ``prepare(path)`` first when given (KeptPayload: ``add_bytecode``), and remove
    the module's other keys beside ``store`` -> the names stored."""
    uid = os.geteuid() if uid is None else uid
    kept = []
    for name in sorted(os.listdir(run_cache)):
        if not _is_payload(name, prefix) or os.path.lexists(os.path.join(store, name)):
            continue
        if prepare is not None:
            prepare(os.path.join(run_cache, name))
        if _copy(os.path.join(run_cache, name), store, name, uid):
            kept.append(name)
    if kept:
        module_dir, key = os.path.split(store)
        for other in os.listdir(module_dir):
            if other != key:
                shutil.rmtree(os.path.join(module_dir, other), ignore_errors=True)
    return kept


def _pyc(source, filename):
    """A checked-hash .pyc (PEP 552: magic, flags 0b11, the source's hash, the code) of ``source``."""
    code = compile(source, filename, "exec", dont_inherit=True, optimize=0)
    return importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little") + importlib.util.source_hash(source) \
        + marshal.dumps(code)


def with_bytecode(zip_bytes):
    """The payload zip ``zip_bytes`` with a checked-hash ``.pyc`` beside each ``.py`` that has none (as this
    Python compiles it; a file that does not compile is left to the target, as it would be without) -> bytes."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(zip_bytes)) as src, zipfile.ZipFile(out, "w") as dst:
        names = set(src.namelist())
        for info in src.infolist():
            body = src.read(info)
            dst.writestr(info, body)
            if not info.filename.endswith(".py") or info.filename + "c" in names:
                continue
            try:
                pyc = _pyc(body, info.filename)
            except (SyntaxError, ValueError):
                continue
            compiled = zipfile.ZipInfo(info.filename + "c", info.date_time)
            compiled.compress_type = info.compress_type
            dst.writestr(compiled, pyc)
    return out.getvalue()


def add_bytecode(path):
    """Give the payload Ansible cached at ``path`` (its pickled module: base64 zip data, metadata) the bytecode
    of its Python files (``with_bytecode``), replacing the file atomically; False when it has it already."""
    from ansible.executor.module_common import _CachedModule  # the payload's own class: its pickle needs it

    cached = _CachedModule.load(path)
    zip_bytes = base64.b64decode(cached.zip_data)
    with zipfile.ZipFile(io.BytesIO(zip_bytes)) as zf:
        if any(name.endswith(".pyc") for name in zf.namelist()):
            return False
    new = dataclasses.replace(cached, zip_data=base64.b64encode(with_bytecode(zip_bytes)))
    _write_atomically(path, lambda out: pickle.dump(new, out))  # workers of one run may do this at once
    return True


class KeptPayload:  # pylint: disable=too-few-public-methods
    """Mixin for an action plugin (before ActionBase in its bases): the payload of this collection's
    modules is restored from the store before Ansible's build and stored after it."""

    def _configure_module(self, module_name, module_args, task_vars):
        where = None
        try:
            found = self._shared_loader_obj.module_loader.find_plugin_with_context(
                module_name, ".py", collection_list=self._task.collections)
            if found.resolved and found.plugin_resolved_collection == "dflash.trainer":
                leaf = found.resolved_fqcn.rsplit(".", 1)[-1]
                compression = C.config.get_config_value("DEFAULT_MODULE_COMPRESSION", variables=task_vars)
                path = found.plugin_resolved_path
                key = payload_key(path, os.path.join(os.path.dirname(os.path.dirname(path)), "module_utils"),
                                  runtime_of(compression))
                store = store_dir(os.path.dirname(C.DEFAULT_LOCAL_TMP), leaf, key)
                if store:
                    where = (store, os.path.join(C.DEFAULT_LOCAL_TMP, "ansiballz_cache"),
                             "ansible_collections.dflash.trainer.plugins.modules.%s-%s-" % (leaf, compression))
                    restore(*where)
        except OSError:
            where = None
        built = super()._configure_module(module_name=module_name, module_args=module_args, task_vars=task_vars)
        if where:
            try:
                keep(*where, prepare=add_bytecode)  # a payload this run built is stored with its bytecode
            # the cache only ever saves time: on any error Ansible's own build stands
            except Exception:  # pylint: disable=broad-except
                pass
        return built
