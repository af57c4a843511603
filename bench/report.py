# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/README.md's result tables, rendered from the runs' own files under bench/results/.

    python bench/report.py            # rewrite the tables between their markers
    python bench/report.py --check    # exit 1 when a table differs from its results file

Each table sits between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``; NAME is a results
file (``field.json``, ``group-<date>.json``: the newest of a glob) rendered by the bench that wrote it
(bench/field.py's ``table``, bench/group.py's ``table``, bench/refusal.py's ``table``). tests/unit/test_bench_report.py keeps the
README equal to the files, so a figure in it is always the one a run measured.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import field  # noqa: E402  (bench/field.py)
import group  # noqa: E402  (bench/group.py)
import refusal  # noqa: E402  (bench/refusal.py)

README = os.path.join(HERE, "README.md")
RESULTS = os.path.join(HERE, "results")
BLOCK = re.compile(r"(<!-- results:(?P<name>[\w.*-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


def _field(doc):
    return "%s\n\nOne run, %d repetitions, %s; the trainer's own start-up and hold: %.2f s.\n" % (
        field.table(doc["rows"], doc["trainer_own_s"]), doc["reps"], doc["when"], doc["trainer_own_s"])


def _group(doc):
    m = doc["machine"]
    return "%s\n\nOne run, %d repetitions, -f %d, %s; %d CPUs, ansible-core %s, load %.1f before / %.1f after.\n" % (
        group.table(doc["cases"]), doc["settings"]["reps"], doc["settings"]["forks"], doc["when"], m["nproc"],
        m["ansible_core"], m["load_before"][0], m["load_after"][0])


def _refusal(doc):
    return "%s\nMade by two runs at the same time, so that both saw the same load: `%s` in a checkout of the\n" \
           "commit before the change (its --results pointing at this checkout's file) and `%s` here.\n" % (
               refusal.table(doc), "python bench/refusal.py --label before --ct 521 --results .../refusal.json",
               "python bench/refusal.py --label after")


RENDER = {"field.json": _field, "group-*.json": _group, "refusal.json": _refusal}


def results_file(name, results=RESULTS):
    """The newest results file that ``name`` (a file name or a glob) names; LookupError without one."""
    found = sorted(glob.glob(os.path.join(results, name)))
    if not found:
        raise LookupError("bench/results/%s: no such results file (run the bench that writes it)" % name)
    return found[-1]


def render(text, results=RESULTS):
    """``text`` with every results block rendered again from its file."""
    def block(m):
        name = m.group("name")
        if name not in RENDER:
            raise LookupError("bench/README.md: no renderer for results:%s" % name)
        with open(results_file(name, results)) as fh:
            doc = json.load(fh)
        return m.group(1) + RENDER[name](doc) + m.group(4)
    return BLOCK.sub(block, text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    with open(README) as fh:
        text = fh.read()
    new = render(text)
    if args.check:
        if new != text:
            sys.stderr.write("bench/README.md's tables differ from bench/results/: run python bench/report.py\n")
            return 1
        return 0
    with open(README, "w") as fh:
        fh.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
