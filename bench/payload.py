# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What each module ships to the target: python3 bench/payload.py [--reps N] [--json FILE] [module ...]

For each module in plugins/modules (or the ones named), builds the AnsiballZ payload with Ansible's own
builder (ansible.executor.module_common.modify_module, the call a task makes before it runs a module)
with the compression a task uses (ZIP_DEFLATED, ansible's default) and prints: the collection's
module_utils files shipped in the zip, their lines, the payload's bytes, and the median build time of
N builds (default 5). Each build gets an empty ansiballz cache (Ansible keeps built zips under its local
tmp and reuses them), so each one finds the imports and packs the zip again: the cost of the first call
of a module in a run.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import statistics
import shutil
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
UTILS_IN_ZIP = "/dflash/trainer/plugins/module_utils/"


def modules_here():
    folder = os.path.join(ROOT, "plugins", "modules")
    return sorted(n[:-3] for n in os.listdir(folder) if n.endswith(".py") and not n.startswith("_"))


def build(name):
    """The payload Ansible sends for ``dflash.trainer.<name>`` (bytes) and the time that took."""
    from ansible.executor import module_common  # pylint: disable=import-outside-toplevel
    from ansible.template import Templar  # pylint: disable=import-outside-toplevel
    cache = tempfile.mkdtemp(prefix="payload-")
    module_common.C.DEFAULT_LOCAL_TMP = cache  # an empty ansiballz cache: this build packs the zip
    try:
        start = time.perf_counter()
        built = module_common.modify_module(
            module_name="dflash.trainer." + name,
            module_path=os.path.join(ROOT, "plugins", "modules", name + ".py"),
            module_args={}, templar=Templar(loader=None), module_compression="ZIP_DEFLATED",
            task_vars={"ansible_python_interpreter": "/usr/bin/python3"})
        took = time.perf_counter() - start
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return built.b_module_data, took


def shipped(data):
    """The collection's module_utils files (name -> source) inside a payload."""
    match = re.search(rb"zip_data='([A-Za-z0-9+/=]+)'", data)
    zipped = zipfile.ZipFile(io.BytesIO(base64.b64decode(match.group(1))))
    return {n.split(UTILS_IN_ZIP, 1)[1][:-3].replace("/", "."): zipped.read(n) for n in zipped.namelist()
            if UTILS_IN_ZIP in n and not n.endswith("/__init__.py")}


def measure(name, reps):
    times = []
    data = None
    while len(times) < reps:
        data, took = build(name)
        times.append(took)
    files = shipped(data)
    return {"module": name, "files": sorted(files), "n_files": len(files),
            "lines": sum(src.count(b"\n") for src in files.values()),
            "bytes": len(data), "build_ms": round(statistics.median(times) * 1000, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", help="also write the rows (with each module's file list) here")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder  # pylint: disable=import-outside-toplevel
    _AnsibleCollectionFinder(paths=[os.path.join(ROOT, "collections")])._install()  # pylint: disable=protected-access
    rows = [measure(m, args.reps) for m in (args.modules or modules_here())]
    print("| module | module_utils files | their lines | payload bytes | build ms (median of %d) |" % args.reps)
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        print("| %(module)s | %(n_files)d | %(lines)d | %(bytes)d | %(build_ms).1f |" % row)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
