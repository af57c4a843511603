"""Filters that turn data into systemd syntax, so the unit template stays dumb.

systemd has its own quoting for ExecStart= (C-style escapes, `%` specifiers, `$` expansion) and
for EnvironmentFile= (shell-like double quotes): neither shlex nor Jinja's `quote` match them,
and no well-kept library ships these two functions, so they are written here, with tests.
"""
import re

from ansible.errors import AnsibleFilterError

from ansible_collections.dflash.trainer.plugins.module_utils.target.systemd import cache_directory

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _reject_controls(text, what):
    # the text itself is never echoed: environment values are secrets
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise AnsibleFilterError("%s contains a control character (newline, tab, ...)" % what)


def systemd_exec_argv(argv):
    """Render a list of words as the value of ExecStart= (each word double-quoted)."""
    if isinstance(argv, str) or not argv:
        raise AnsibleFilterError("systemd_exec_argv expects a non-empty list of words, got %r" % (argv,))
    words = []
    for word in argv:
        word = str(word)
        _reject_controls(word, "command word")
        escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
        words.append('"%s"' % escaped)
    return " ".join(words)


def systemd_env_file(env):
    """Render a mapping as an EnvironmentFile= (KEY="value" lines, sorted)."""
    if not isinstance(env, dict):
        raise AnsibleFilterError("systemd_env_file expects a mapping, got %s" % type(env).__name__)
    lines = []
    for key in sorted(env):
        if not _ENV_NAME.match(str(key)):
            raise AnsibleFilterError("invalid environment variable name %r (letters, digits, _; not starting with a digit)" % (key,))
        value = "" if env[key] is None else str(env[key])
        _reject_controls(value, "value of %s" % key)
        value = re.sub(r'(["\\`$])', r"\\\1", value)
        lines.append('%s="%s"' % (key, value))
    return "\n".join(lines) + ("\n" if lines else "")


def systemd_cache_directory(path):
    """The unit's CacheDirectory= value for the cache directory ``path`` (below /var/cache), else ""."""
    return cache_directory(path)


class FilterModule:
    def filters(self):
        return {"systemd_exec_argv": systemd_exec_argv, "systemd_env_file": systemd_env_file,
                "systemd_cache_directory": systemd_cache_directory}
