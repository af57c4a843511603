"""Where Ansible's programs are: on PATH, else beside the Python that runs us (a venv's bin/).

`.venv/bin/python` run without the venv on PATH (a cron job, a systemd unit, an IDE) cannot see
`.venv/bin/ansible-playbook`; ansible-runner then ends with rc 127 and no word of why. The API,
the CLI and the bench scripts ask `find_program` instead, and `ProgramNotFound` says where it
looked. Pure but for the file system checks; environ and executable are injectable for tests.
"""
from __future__ import annotations

import os
import shutil
import sys
from typing import Mapping, Optional

__all__ = ["ProgramNotFound", "find_program", "require_program", "program_env"]


class ProgramNotFound(FileNotFoundError):
    """A program (ansible-playbook) is neither on PATH nor beside the interpreter."""


def _beside(executable: Optional[str]) -> Optional[str]:
    """The directory of the interpreter as it was called (a venv's bin/: symlinks not resolved)."""
    executable = sys.executable if executable is None else executable
    return os.path.dirname(os.path.abspath(executable)) if executable else None


def find_program(name: str, environ: Optional[Mapping[str, str]] = None,
                 executable: Optional[str] = None) -> Optional[str]:
    """The absolute path of NAME: the first on environ's PATH, else the executable file NAME beside
    EXECUTABLE (default sys.executable); None when neither has it."""
    environ = os.environ if environ is None else environ
    found = shutil.which(name, path=environ.get("PATH", os.defpath))
    if found:
        return os.path.abspath(found)
    directory = _beside(executable)
    if directory:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def require_program(name: str, environ: Optional[Mapping[str, str]] = None,
                    executable: Optional[str] = None) -> str:
    """find_program, or ProgramNotFound naming the program and every place searched."""
    found = find_program(name, environ, executable)
    if found:
        return found
    environ = os.environ if environ is None else environ
    raise ProgramNotFound(
        "%s not found: not on PATH (%s) nor beside the Python running this (%s); install ansible-core into "
        "that environment (pip install -e . or make setup) or put the directory that holds %s on PATH"
        % (name, environ.get("PATH", os.defpath) or "empty", _beside(executable) or "unknown", name))


def program_env(program: str, environ: Optional[Mapping[str, str]] = None) -> dict:
    """ENVIRON (default os.environ) with PROGRAM's directory first on PATH, so that what it starts
    (ansible-galaxy, ansible-connection, a venv's python) comes from the same place."""
    env = dict(os.environ if environ is None else environ)
    directory = os.path.dirname(program)
    parts = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    if directory not in parts:
        env["PATH"] = os.pathsep.join([directory] + parts)
    return env
