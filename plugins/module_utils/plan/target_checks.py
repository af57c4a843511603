# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks on what the first read of the target returned, before anything on it changes (pure,
unit-tested).

``target_problems(variables, gpus, unit, unit_path)`` answers a list of ``Problem``: GPUs the host
lacks, a ``trainer_gpu_min_mib`` above a GPU's memory, a unit of that name that this collection did
not write, an nvidia-smi that failed. ``message`` words them as one refusal. Stdlib only, so a
module that runs on the target imports it without shipping the controller's checks
(``_validate``, which re-exports these names).
"""

from __future__ import annotations

import math
import re

UNIT_ACCEPTED = ("a unit name of letters, digits and _ . : - (no '/', '@', spaces or '..'), "
                 "without the .service suffix, not the name of a unit this collection did not write")
# the description line of the unit template: how a unit of ours is recognised on the target
UNIT_MARK = "managed by dflash.trainer"


class Problem(object):
    """One refused input, in words a user can act on."""

    def __init__(self, variable, why, accepted, value=None, secret=False, show_value=True):
        self.variable = variable
        self.why = why
        self.accepted = accepted
        self.value = value
        self.secret = secret
        self.show_value = show_value and not secret

    def __str__(self):
        got = ""
        if self.show_value:
            got = " (got %s)" % _show(self.value)
        elif self.secret:
            got = " (value not shown: it is a secret)"
        return "%s: %s%s; accepted: %s" % (self.variable, self.why, got, self.accepted)

    def __repr__(self):
        return "Problem(%s)" % self


def _show(value):
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


_DECIMAL_RE = re.compile(r"^-?[0-9]+(\.[0-9]+)?\Z")


def _number(value):
    """int/float, or a string that is a plain ASCII decimal (extra vars from -e are strings); else None.

    Python's int() and float() also read "1_0", "1e3", " 5 ", "inf" and non-ASCII digits ("\u0665");
    systemd reads none of these the same way, so none is a number here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str) and _DECIMAL_RE.match(value):
        return int(value) if "." not in value else float(value)
    return None


def gpu_indexes(gpus):
    """trainer_gpus as ints (after ``check`` accepted it)."""
    return [int(g) for g in gpus]


def target_problems(v, gpus=None, unit=None, unit_path=None):
    """Checks on what the first reads of the target returned, before anything changes.

    ``gpus``: trainer_status's ``gpus`` list (index, memory_total_mib); ``unit``: trainer_status's view of the
    unit (load_state, fragment_path, description).
    """
    problems = []
    if unit is not None and unit.get("gpu_error") and unit.get("gpu_node_fault"):
        problems.append(Problem("the node", "nvidia-smi in the container says the node is at fault, not the "
                                "trainer: %s" % unit["gpu_error"], "a node whose driver and GPUs answer (nothing "
                                "was stopped or changed; deploy again once the node is fixed)", show_value=False))
    elif unit is not None and unit.get("gpu_error"):
        problems.append(Problem("trainer_nvidia_smi", "nvidia-smi failed on the target: %s" % unit["gpu_error"],
                                "an nvidia-smi that lists the trainer's GPUs", v.get("trainer_nvidia_smi")))
    for problem in (unit or {}).get("device_problems") or []:
        problems.append(Problem("the node", problem, "the device nodes CUDA opens, as character devices in the "
                                "container (nothing was stopped or changed)", show_value=False))
    if gpus is not None and "trainer_gpus" in v:
        have = {g.get("index"): g for g in gpus}
        wanted = gpu_indexes(v["trainer_gpus"])
        missing = [g for g in wanted if g not in have]
        if missing:
            problems.append(Problem("trainer_gpus", "asks for GPU %s, which nvidia-smi does not list (it lists %s)"
                                    % (", ".join(str(g) for g in missing), ", ".join(str(i) for i in sorted(have)) or "none"),
                                    "indexes nvidia-smi lists", v["trainer_gpus"]))
        min_mib = _number(v.get("trainer_gpu_min_mib"))
        if min_mib is not None:
            small = [(g, have[g].get("memory_total_mib")) for g in wanted
                     if g in have and _is_int(have[g].get("memory_total_mib")) and have[g]["memory_total_mib"] < min_mib]
            if small:
                problems.append(Problem("trainer_gpu_min_mib", "is above the memory of %s" % ", ".join(
                    "GPU %d (%d MiB)" % s for s in small), "at most the smallest trainer GPU's memory.total",
                    v["trainer_gpu_min_mib"]))
    if unit is not None and unit.get("load_state") == "loaded":
        fragment = unit.get("fragment_path") or ""
        ours = UNIT_MARK in (unit.get("description") or "") and (unit_path is None or fragment == unit_path)
        if not ours:
            problems.append(Problem("trainer_unit_name", "names a unit this collection did not write (%s, %s)"
                                    % (fragment or "no unit file", unit.get("description") or "no description"),
                                    UNIT_ACCEPTED, v.get("trainer_unit_name")))
    return problems


def message(problems, entry="main"):
    """One message for all problems: the deploy is refused, nothing on the target changed."""
    lines = ["refused before any change on the target (%d problem%s):" % (len(problems), "" if len(problems) == 1 else "s")]
    lines.extend("- %s" % p for p in problems)
    return "\n".join(lines)
