# -*- coding: utf-8 -*-
# Copyright: dflash.trainer maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render docs/variables.md from the role's argument spec (roles/trainer/meta/argument_specs.yml), as
linux-system-roles render their README's variable tables: the spec is the one source, the page is its
rendering, and tests/unit/test_variables_doc.py fails when the two differ.

    python3 docs/render_variables.py            # rewrite docs/variables.md
    python3 docs/render_variables.py --check    # exit 1 when docs/variables.md is not the rendering
"""
import json
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(ROOT, "roles", "trainer", "meta", "argument_specs.yml")
PAGE = os.path.join(ROOT, "docs", "variables.md")

HEAD = """# Role variables

Every variable of the `dflash.trainer.trainer` role, rendered from its argument spec
(`roles/trainer/meta/argument_specs.yml`, checked on every run before anything changes) by
`python3 docs/render_variables.py`; do not edit this page by hand. "taken by" names the role's entry
points (`tasks_from`) that read the variable: %s. docs/real-host.md explains how the proof's settings
work together.

| variable | type | default | taken by | description |
|---|---|---|---|---|
"""


def _cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(option):
    if "default" not in option:
        return "required" if option.get("required") else "(none)"
    value = option["default"]
    shown = value if isinstance(value, str) else json.dumps(value)
    return "`%s`" % shown.replace("|", "\\|") if shown != "" else '`""`'


def _type(option):
    kind = option.get("type", "str")
    if option.get("elements"):
        kind = "%s of %s" % (kind, option["elements"])
    if option.get("choices"):
        kind += ": " + ", ".join("`%s`" % c for c in option["choices"])
    return kind


def render(spec):
    """The page for ``spec`` (the argument_specs mapping) -> text."""
    entries = list(spec)
    options, takers = {}, {}
    for entry in entries:
        for name, option in (spec[entry].get("options") or {}).items():
            options.setdefault(name, option)
            takers.setdefault(name, []).append(entry)
    lines = [HEAD % ", ".join("`%s`" % e for e in entries)]
    for name in sorted(options):
        option = options[name]
        description = option.get("description", "")
        if isinstance(description, list):
            description = " ".join(description)
        taken = "all" if len(takers[name]) == len(entries) else ", ".join(takers[name])
        row = (name, _type(option), _default(option), taken, _cell(description))
        lines.append("| `%s` | %s | %s | %s | %s |\n" % row)
    return "".join(lines)


def main(argv):
    with open(SPEC, encoding="utf-8") as fh:
        text = render(yaml.safe_load(fh)["argument_specs"])
    if "--check" in argv:
        with open(PAGE, encoding="utf-8") as fh:
            if fh.read() != text:
                sys.stderr.write("docs/variables.md is not the rendering of the role's argument spec: "
                                 "run python3 docs/render_variables.py\n")
                return 1
        return 0
    with open(PAGE, "w", encoding="utf-8") as fh:
        fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
