# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Keeping ``trainer_env`` values out of everything the collection prints or keeps (pure).

Every value of ``trainer_env`` is treated as a secret (tokens, keys). A trainer, a pre-flight
command or a traceback may print one; so every text that leaves the target - the pre-flight's
output, failure messages, log tails, the restart job's state file and the release ledger - goes
through ``mask`` first, which replaces each value by ``***``.

On the target the values are read back from the environment file the role wrote
(``parse_env_file``), so no module needs the secrets as a parameter; the role's own entries
(``PYTHONUNBUFFERED``, ``TORCHINDUCTOR_CACHE_DIR``) are not secrets. Values shorter than
``MIN_SECRET_LEN`` characters are not masked: masking ``1`` would rewrite every number in a log
and hide nothing a guess would not find.
"""

from __future__ import annotations

import re

MASK = "***"
MIN_SECRET_LEN = 3
# the role's own entries of the environment file: never secrets
NOT_SECRET = frozenset(("PYTHONUNBUFFERED", "TORCHINDUCTOR_CACHE_DIR"))
_LINE_RE = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*$')
_UNESCAPE_RE = re.compile(r"\\(.)")


def parse_env_file(text):
    """The mapping an EnvironmentFile written by ``systemd_env_file`` holds (comments skipped)."""
    env = {}
    for line in (text or "").split("\n"):  # not splitlines(): a value may hold U+0085 or U+2028
        m = _LINE_RE.match(line)
        if m:
            env[m.group(1)] = _UNESCAPE_RE.sub(r"\1", m.group(2))
    return env


def secret_values(env, exclude=NOT_SECRET):
    """The values of ``env`` to mask, longest first (a value inside another is masked after it)."""
    values = set()
    for key, value in (env or {}).items():
        if key in exclude or value is None:
            continue
        text = str(value)
        if len(text) >= MIN_SECRET_LEN:
            values.add(text)
    return sorted(values, key=lambda s: (-len(s), s))


def mask(obj, secrets):
    """``obj`` (str, list, tuple, dict, nested) with every secret value replaced by ``***``."""
    if not secrets:
        return obj
    if isinstance(obj, str):
        for value in secrets:
            if value in obj:
                obj = obj.replace(value, MASK)
        return obj
    if isinstance(obj, dict):
        return dict((mask(k, secrets), mask(v, secrets)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(mask(v, secrets) for v in obj)
    return obj


def read_secrets(path):
    """The secret values of the environment file at ``path`` ([] when it cannot be read)."""
    if not path:
        return []
    try:
        with open(path, "rb") as fh:
            text = fh.read(4 * 1024 * 1024).decode("utf-8", "replace")
    except (IOError, OSError):
        return []
    return secret_values(parse_env_file(text))
