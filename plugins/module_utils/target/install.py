# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Installing the trainer's files - launcher, environment file, unit - in one module run.

Three copy/template tasks cost five remote calls each over pct (echo ~, mkdtemp, stat, file, rm);
on a real node every pct call loads Proxmox's Perl stack. ``install_file`` compares and writes one
file atomically (tmp in the same directory, fsync, rename), creating its directory with the
given mode; ``install_all`` runs it for all three and reloads/enables the unit only on a change -
for ``trainer_install`` and for the modules that install, or compare, in the same remote call as their
own work (``trainer_restart`` before it starts the job; ``trainer_status``, whose first read of a deploy
says what the install would change): ``INSTALL_OPTIONS`` is their shared argument spec.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import tempfile

from ansible_collections.dflash.trainer.plugins.module_utils.target.ownership import ENV_MARK, judge, observe
from ansible_collections.dflash.trainer.plugins.module_utils.target.private_file import replace_private
from ansible_collections.dflash.trainer.plugins.module_utils.target.command import CommandTimeout
from ansible_collections.dflash.trainer.plugins.module_utils.target.secrets import parse_env_file, secret_values

# the options of trainer_install; the `install` option of trainer_restart and trainer_status takes
# them as suboptions (INSTALL_SUBOPTIONS) but the secret, a top-level option of theirs (env_content,
# no_log): Ansible logs a module's invocation in the target's journal with a dict option's repr, where
# a no_log suboption's value with a newline or a backslash no longer matches what it masks
INSTALL_OPTIONS = dict(
    unit=dict(type="str", required=True),
    unit_path=dict(type="path", required=True),
    unit_content=dict(type="str", required=True),
    enabled=dict(type="bool", default=True),
    launcher_path=dict(type="path", required=True),
    launcher_content=dict(type="str", required=True),
    env_path=dict(type="path", required=True),
    env_content=dict(type="str", required=True, no_log=True),
)
INSTALL_SUBOPTIONS = dict((k, v) for k, v in INSTALL_OPTIONS.items() if k != "env_content")
ENV_CONTENT_OPTION = dict(type="str", no_log=True)
# the role variable that names each file (a refusal names what to set)
VARIABLES = dict(launcher="trainer_launcher_path", env="trainer_env_file", unit="trainer_unit_name")
ENABLED_STATES = ("enabled", "enabled-runtime", "alias", "static", "indirect", "generated")
# what a changed file means for the trainer, in the words of the restart's reasons
CHANGE_WORDS = (("unit_changed", "unit file changed"), ("env_changed", "environment changed"),
                ("launcher_changed", "launcher changed"))


class InstallError(Exception):
    """The install refused or failed: ``msg`` and the result so far (``result``)."""

    def __init__(self, msg, result):
        super(InstallError, self).__init__(msg)
        self.msg = msg
        self.result = result


def change_reasons(result):
    """The restart's reasons in ``install_all``'s result (which files changed), in words."""
    return [words for key, words in CHANGE_WORDS if (result or {}).get(key)]


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


def _text(data):
    return "" if data is None else data.decode("utf-8", "replace")


def install_all(p, run, systemctl, check_mode=False, diff=False):
    """Install the launcher, the environment file and the unit of ``p`` (INSTALL_OPTIONS' values),
    reload systemd when the unit changed, enable or disable it as asked -> the result
    (``changed``, ``<name>_changed``, ``enabled_changed``, ``diff`` in diff mode). ``run(argv)``
    -> (rc, out, err). Raises InstallError before any write when a path holds a file this
    collection did not write, and when a write or systemctl fails."""
    files = (
        ("launcher", p["launcher_path"], p["launcher_content"], 0o755, 0o755),
        ("env", p["env_path"], ENV_MARK + "\n" + p["env_content"], 0o600, 0o700),
        ("unit", p["unit_path"], p["unit_content"], 0o644, 0o755),
    )
    result = dict(changed=False)
    # never over a file this collection did not write (trainer_status judged it too; this is the
    # last look before the write)
    refused = [why for why in (judge(VARIABLES[name], name, observe(path, name)) for name, path, _c, _m, _d in files)
               if why]
    if refused:
        raise InstallError("refused before any change on the target: %s" % "; ".join(refused), result)
    diffs = []
    for name, path, content, mode, dir_mode in files:
        data = content.encode("utf-8")
        before, _mode = current(path) if diff else (None, None)
        try:
            changes = install_file(path, data, mode, dir_mode, check_mode=check_mode)
        except (IOError, OSError) as exc:
            raise InstallError("Unable to write %s: %s" % (path, exc), result) from None
        result["%s_changed" % name] = bool(changes)
        result["changed"] = result["changed"] or bool(changes)
        if diff and changes:
            old, new = _text(before), content
            if name == "env":
                old, new = masked_env(old), masked_env(new)
            diffs.append(dict(before_header=path, after_header=path, before=old, after=new))

    def systemd(*args):
        argv = [systemctl] + list(args)
        try:
            return run(argv)
        except CommandTimeout as exc:
            raise InstallError(str(exc), result) from None

    if result["unit_changed"] and not check_mode:
        rc, out, err = systemd("daemon-reload")
        if rc != 0:
            raise InstallError("systemctl daemon-reload failed: %s" % (err or out).strip(), result)
    _rc, out, _err = systemd("is-enabled", p["unit"])
    state = out.strip()
    want = p["enabled"]
    result["enabled_changed"] = want != (state in ENABLED_STATES) and not (not want and state in ("static", "generated"))
    if result["enabled_changed"]:
        result["changed"] = True
        if not check_mode:
            verb = "enable" if want else "disable"
            rc, out, err = systemd(verb, p["unit"])
            if rc != 0:
                raise InstallError("systemctl %s %s failed: %s" % (verb, p["unit"], (err or out).strip()), result)
    if diffs:
        result["diff"] = diffs
    return result


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


# -- the proved configuration ----------------------------------------------------------------------
# The unit, the environment file and the launcher are part of what a proof proved: a rollback that put
# the last good release back under a new environment file (or a new unit) would run an unproved
# configuration, and a same-release restart that failed would have nothing to go back to. So when a
# release is marked good the job keeps a copy of the three files beside last_good (root-only, one
# JSON file written atomically, mode 0600: the environment's values are secrets, never printed), and
# a rollback puts them back with the release.
PROVED_CONFIG = "last_good.config"
CONFIG_VERSION = 1
CONFIG_NAMES = ("launcher", "env", "unit")
# what each file is, in the words of an outcome
CONFIG_WORDS = dict(launcher="launcher", env="environment file", unit="unit file")


def config_files(p, unit_path=None, launcher_path=None, env_path=None):
    """[(name, path)] of the trainer's configuration: the install's paths when the job installed
    them (``p["install"]``), else the ones given."""
    inst = (p or {}).get("install") or {}
    files = (("launcher", inst.get("launcher_path") or launcher_path), ("env", inst.get("env_path") or env_path),
             ("unit", inst.get("unit_path") or unit_path))
    return [(name, path) for name, path in files if path]


def _b64(data):
    return base64.b64encode(data).decode("ascii")


def _unb64(text):
    return base64.b64decode(text.encode("ascii"))


def config_record(release, files, read=current):
    """The record of the configuration at ``files`` ([(name, path)]) proved with ``release``
    (a dict, JSON-ready; file contents base64) - None when a file cannot be read."""
    out = dict(version=CONFIG_VERSION, release=release, files={})
    for name, path in files:
        data, mode = read(path)
        if data is None:
            return None
        out["files"][name] = dict(path=path, mode=mode, content=_b64(data))
    return out


def config_changes(record, read=current):
    """The names of the files of ``record`` whose content or mode on disk differ from it ([] when
    the configuration in place is the proved one)."""
    changed = []
    for name in CONFIG_NAMES:
        f = (record or {}).get("files", {}).get(name)
        if not f:
            continue
        data, mode = read(f["path"])
        if data != _unb64(f["content"]) or mode != f["mode"]:
            changed.append(name)
    return changed


class ProvedConfig(object):
    """The copy of the configuration proved with the last good release (``<root>/last_good.config``)
    and the only code that writes or restores it. ``files``: [(name, path)] (``config_files``);
    ``run(argv)`` -> (rc, out, err) for ``systemctl daemon-reload`` after a restored unit."""

    def __init__(self, root, files, run=None, systemctl="systemctl"):
        self.path = os.path.join(root, PROVED_CONFIG)
        self.files, self.run, self.systemctl = list(files), run, systemctl

    def read(self):
        """The record, or None (absent, unreadable, a symlink: never followed, another version)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as fh:
                data = json.load(fh)
        except (IOError, OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("version") != CONFIG_VERSION:
            return None
        if not isinstance(data.get("files"), dict):
            return None
        return data

    def kept_for(self, release):
        """Whether a copy proved with ``release`` is kept."""
        record = self.read()
        return bool(record and release and record.get("release") == release)

    def keep(self, release):
        """Copy the configuration in place as the one proved with ``release`` (after its proof)."""
        record = config_record(release, self.files)
        if record is None:
            raise OSError("a file of the configuration cannot be read (%s)" % ", ".join(p for _n, p in self.files))
        replace_private(self.path, json.dumps(record, sort_keys=True), sync=True)

    def changes(self, release):
        """The files in place that differ from the copy proved with ``release`` ([] when none, or when
        no copy was kept for it)."""
        return config_changes(self.read()) if self.kept_for(release) else []

    def secrets(self):
        """The secret values of the kept environment file (masked like the one in place)."""
        f = ((self.read() or {}).get("files") or {}).get("env")
        if not f:
            return []
        try:
            return secret_values(parse_env_file(_unb64(f["content"]).decode("utf-8", "replace")))
        except (TypeError, ValueError):
            return []

    def restore(self, release):
        """Put back the files of the copy proved with ``release`` that differ (each judged ours first,
        written atomically) and reload systemd when the unit was one -> the names restored. Raises
        InstallError (no copy for ``release``, a file not ours, a failed write or reload)."""
        record = self.read()
        if not record or record.get("release") != release:
            raise InstallError("no configuration proved with release %s is kept in %s" % (release, self.path), {})
        names = config_changes(record)
        targets = [(n, record["files"][n]) for n in names]
        refused = [why for why in (judge(VARIABLES[n], n, observe(f["path"], n)) for n, f in targets) if why]
        if refused:
            raise InstallError("refused to restore the proved configuration: %s" % "; ".join(refused), {})
        for name, f in targets:
            try:
                install_file(f["path"], _unb64(f["content"]), f["mode"], 0o700 if name == "env" else 0o755)
            except (IOError, OSError) as exc:
                raise InstallError("Unable to restore %s: %s" % (f["path"], exc), dict(restored=names)) from None
        if "unit" in names and self.run is not None:
            try:
                rc, out, err = self.run([self.systemctl, "daemon-reload"])
            except CommandTimeout as exc:
                raise InstallError(str(exc), dict(restored=names)) from None
            if rc != 0:
                raise InstallError("systemctl daemon-reload failed: %s" % (err or out).strip(), dict(restored=names))
        return names


def config_words(names):
    """The restored files, in words ("" for none)."""
    return " and ".join(CONFIG_WORDS[n] for n in names if n in CONFIG_WORDS)
