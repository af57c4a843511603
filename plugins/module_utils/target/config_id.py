# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The configuration id: which command and environment a release ran with (pure, but for the key).

An experiment is a release *and* a configuration: the same code run with another ``trainer_env``
value or another ``trainer_command`` is another entry in the ledger, compared with the one before
it. The configuration id names that pair without telling it: HMAC-SHA256, keyed with a random key
kept on the target (``<trainer_root>/config.key``, 0600, made by the first restart job), over the
trainer's argv and the sorted items (names and values) of its environment file, cut to
``ID_LEN`` hex characters.

Why keyed: the values are secrets, and many are short or guessable (a 4-digit id, ``0``/``1``, a
token whose format is known). An unkeyed hash of them can be reversed by trying every candidate
value; without the key the id says nothing about any value, and the key sits beside the
environment file it protects (whoever can read it can read the values anyway). The same target
gives the same configuration the same id in every deploy; two targets give it different ids.

What counts, read from what systemd will run (the installed unit and environment file, so a
restart or a rollback gets the id of what it really starts): the words after the first ``--`` of
the unit's ``ExecStart=`` (the launcher's own options before it - log size, metrics - are not the
experiment), and every item of the environment file, the role's own ``PYTHONUNBUFFERED`` and
``TORCHINDUCTOR_CACHE_DIR`` included (changing the cache directory is a new configuration).

Standard library only: this file is shipped in the modules' payload.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import json
import os

from ansible_collections.dflash.trainer.plugins.module_utils.target.private_file import write_private
from ansible_collections.dflash.trainer.plugins.module_utils.target.secrets import parse_env_file

ID_LEN = 8
KEY_NAME = "config.key"
KEY_BYTES = 32
_DOMAIN = b"dflash.trainer configuration v1\0"
_MAX_READ = 4 * 1024 * 1024


def config_id(argv, env, key):
    """The id of the trainer's ``argv`` (a list of words) with the environment ``env`` (a mapping),
    keyed by ``key`` (bytes): ``ID_LEN`` hex characters. The same inputs give the same id; the id
    tells nothing of the values without the key."""
    if not key:
        raise ValueError("a configuration id needs a key")
    message = json.dumps({"argv": [str(w) for w in argv],
                          "env": sorted([str(k), "" if v is None else str(v)] for k, v in (env or {}).items())},
                         ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hmac.new(key, _DOMAIN + message.encode("utf-8"), hashlib.sha256).hexdigest()[:ID_LEN]


# --- the key -------------------------------------------------------------------------------------

def key_path(root):
    return os.path.join(root, KEY_NAME)


def _parse_key(raw):
    try:
        key = binascii.unhexlify(raw.strip())
    except (binascii.Error, ValueError):
        return None
    return key if len(key) == KEY_BYTES else None


def read_key(root):
    """The target's key (bytes), or None: absent, unreadable, malformed, or a symlink (never followed)."""
    try:
        fd = os.open(key_path(root), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            return _parse_key(fh.read(256))
    except (IOError, OSError):
        return None


def ensure_key(root, urandom=os.urandom):
    """The target's key, made when there is none (random, mode 0600, never through a symlink, published
    whole by a hard link, so two jobs racing agree on one key) -> bytes, or None when it cannot be made."""
    key = read_key(root)
    if key is not None or not os.path.isdir(root):
        return key
    path = key_path(root)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        write_private(tmp, binascii.hexlify(urandom(KEY_BYTES)).decode("ascii") + "\n", sync=True)
        try:
            os.link(tmp, path)  # fails when another job made it first: theirs stands
        except FileExistsError:
            pass
    except OSError:
        return None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return read_key(root)


# --- what systemd runs -----------------------------------------------------------------------------

def unit_path_of(unit):
    """Where the role installs the unit (its place is fixed)."""
    return "/etc/systemd/system/%s.service" % unit


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "s": " "}


def split_exec(value):
    """The words of an ``ExecStart=`` value as systemd reads them: double- or single-quoted or bare
    words, C escapes, ``%%`` and ``$$`` (what ``systemd_exec_argv`` writes, read back); a leading
    ``-``/``@``/``+``/``!``/``:`` prefix of the program is dropped. ValueError for an unclosed quote."""
    words, i, n = [], 0, len(value)
    while True:
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            break
        quote = value[i] if value[i] in "\"'" else None
        if quote:
            i += 1
        word = []
        while i < n:
            c = value[i]
            if quote and c == quote:
                i += 1
                break
            if not quote and c in " \t":
                break
            if c == "\\" and i + 1 < n:
                nxt = value[i + 1]
                word.append(_ESCAPES.get(nxt, nxt))
                i += 2
                continue
            word.append(c)
            i += 1
        else:
            if quote:
                raise ValueError("unclosed quote in ExecStart=")
        words.append("".join(word).replace("%%", "%").replace("$$", "$"))
    if words and not (value.lstrip()[:1] in "\"'"):
        words[0] = words[0].lstrip("-@+!:")
    return words


def exec_start(unit_text):
    """The words of the unit's last non-empty ``ExecStart=`` (continuation lines joined), or None."""
    lines, found, held = (unit_text or "").split("\n"), None, ""
    for line in lines:
        line = held + line.strip() if held else line.strip()
        held = ""
        if line.endswith("\\"):
            held = line[:-1] + " "
            continue
        if line.startswith("ExecStart="):
            value = line[len("ExecStart="):].strip()
            found = value or found
    if found is None:
        return None
    return split_exec(found)


def trainer_argv(words):
    """The trainer's own command: the words after the launcher's first ``--`` (all of them when there is none)."""
    if "--" in words:
        return words[words.index("--") + 1:]
    return list(words)


def _read_text(path):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(_MAX_READ).decode("utf-8", "replace")


def installed_config(root, unit_path, env_file, create=False):
    """The id of the installed unit's trainer command and environment file -> (id, None), or (None,
    why) when it cannot be known: the unit or its environment file unreadable, no ``ExecStart=``,
    no key (``create``: make one - the restart job; a read-only reader never does). Never raises."""
    if not root:
        return None, "no trainer_root"
    try:
        words = exec_start(_read_text(unit_path))
    except (IOError, OSError, ValueError) as exc:
        return None, "unit %s unreadable (%s)" % (unit_path, getattr(exc, "strerror", None) or exc)
    if words is None:
        return None, "unit %s has no ExecStart=" % unit_path
    env = {}
    if env_file:
        try:
            env = parse_env_file(_read_text(env_file))
        except (IOError, OSError) as exc:
            return None, "environment file %s unreadable (%s)" % (env_file, exc.strerror or exc)
    key = ensure_key(root) if create else read_key(root)
    if key is None:
        return None, "no configuration key in %s" % root
    return config_id(trainer_argv(words), env, key), None


def job_config_id(p):
    """The restart job's reading (``trainer_restart``'s parameters ``p``): the id of the unit and the
    environment file installed for the start it makes, the key made when there is none; None when
    unknown (bookkeeping: never raises)."""
    unit_path = (p.get("install") or {}).get("unit_path") or p.get("unit_path") or unit_path_of(p["unit"])
    env_file = (p.get("install") or {}).get("env_path") or p.get("env_file")
    return installed_config(p.get("root"), unit_path, env_file, create=True)[0]
