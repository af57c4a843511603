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

A value that is a number (``0.3``, ``1800``) is masked where it stands as a number of its own, never as a
piece of another (``40.3K tok/s`` holds ``0.3``): masking every occurrence would rewrite the figures
the proof reports, and a number inside another number tells nothing of the value.

Mask first, cut after: ``cut(text, n, secrets)`` masks, then shortens (the ledger's reason, a log
line in a message). A text that was cut before it reached ``mask`` may end (or begin) inside a
secret; so ``mask`` also masks every piece of at least ``PARTIAL_MIN`` characters that begins or
ends a secret (``hf_abcdefgh…`` cut after 9 characters): what a cut elsewhere can leak is bounded
to fewer than ``PARTIAL_MIN`` characters of a value.
"""

from __future__ import annotations

import re

MASK = "***"
MIN_SECRET_LEN = 3
# a piece of a secret this long, at its start or its end, is masked too (a cut text)
PARTIAL_MIN = 8
# the role's own entries of the environment file: never secrets
NOT_SECRET = frozenset(("PYTHONUNBUFFERED", "TORCHINDUCTOR_CACHE_DIR"))
_LINE_RE = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*$')
_UNESCAPE_RE = re.compile(r"\\(.)")
_NUMBER_RE = re.compile(r"^[+-]?\d+(?:\.\d+)?$")


def _replace(text, value):
    """``text`` with ``value`` replaced by MASK: everywhere, or where a number stands alone (see above)."""
    if _NUMBER_RE.match(value):
        return re.sub(r"(?<![\d.])%s(?!\d|\.\d)" % re.escape(value), MASK, text)
    return text.replace(value, MASK)


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
                obj = _replace(obj, value)
        for value in secrets:
            if len(value) > PARTIAL_MIN and not _NUMBER_RE.match(value):
                obj = _mask_pieces(obj, value)
        return obj
    if isinstance(obj, dict):
        return dict((mask(k, secrets), mask(v, secrets)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(mask(v, secrets) for v in obj)
    return obj


def _mask_pieces(text, value):
    """Mask each run of ``text`` that is the first (or last) ``PARTIAL_MIN`` or more characters of
    ``value``: what is left of a secret where a text was cut inside it."""
    head, tail = value[:PARTIAL_MIN], value[-PARTIAL_MIN:]
    spans = []
    at = text.find(head)
    while at >= 0:
        end = at + PARTIAL_MIN
        while end < len(text) and end - at < len(value) and text[end] == value[end - at]:
            end += 1
        spans.append((at, end))
        at = text.find(head, at + 1)
    at = text.find(tail)
    while at >= 0:
        start, end = at, at + PARTIAL_MIN
        k = len(value) - PARTIAL_MIN  # value[k:] == tail
        while start > 0 and k > 0 and text[start - 1] == value[k - 1]:
            start, k = start - 1, k - 1
        spans.append((start, end))
        at = text.find(tail, at + 1)
    if not spans:
        return text
    spans.sort()
    out, pos = [], 0
    for start, end in spans:
        if end <= pos:
            continue
        start = max(start, pos)
        out.append(text[pos:start])
        out.append(MASK)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def cut(text, limit, secrets=(), more=""):
    """``text`` masked, then cut to ``limit`` characters (``more`` appended when it was cut)."""
    text = mask(text, secrets) if secrets else text
    return text if len(text) <= limit else text[:limit] + more


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
