# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A refusal's suggested fix: a line of its own that can be pasted as is.

``extra_vars`` writes the settings to add as ``-e`` words for the command that was refused (ansible-playbook
and dflash-trainer both take them), quoted for a POSIX shell: ``key=value`` where Ansible's key=value parser
keeps the value as it is, else a JSON object (that parser splits at spaces and decodes backslashes, so a path
with a space or a regex would not arrive whole). ``fix_line`` puts it on a line of its own under the words.
"""

from __future__ import annotations

import json
import re
import shlex

# values that Ansible's key=value parser keeps as they are (no space, quote, backslash, '=' or '{')
_PLAIN = re.compile(r"\A[A-Za-z0-9_./:,@+%^-]+\Z")


def extra_vars(*pairs):
    """``-e`` words for ``pairs`` ((variable, value), ...), each quoted for a shell -> one string."""
    words = []
    for name, value in pairs:
        text = value if isinstance(value, str) else json.dumps(value)
        if _PLAIN.match(text) and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            words.append("-e %s" % shlex.quote("%s=%s" % (name, text)))
        else:
            words.append("-e %s" % shlex.quote(json.dumps({name: value})))
    return " ".join(words)


def fix_line(fix, indent="    "):
    """The fix (a command or ``-e`` words) on a line of its own, to go after the words that say why."""
    return "\n%s%s" % (indent, fix)
