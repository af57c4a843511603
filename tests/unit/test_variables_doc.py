"""docs/variables.md is the rendering of the role's argument spec (docs/render_variables.py): a variable
added, removed or changed in the spec without rendering the page again fails here."""
import importlib.util
import os

import yaml

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _renderer():
    spec = importlib.util.spec_from_file_location("render_variables", os.path.join(ROOT, "docs", "render_variables.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _spec():
    with open(os.path.join(ROOT, "roles", "trainer", "meta", "argument_specs.yml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)["argument_specs"]


def test_the_variables_page_is_the_rendering_of_the_argument_spec():
    with open(os.path.join(ROOT, "docs", "variables.md"), encoding="utf-8") as fh:
        page = fh.read()
    assert page == _renderer().render(_spec()), "run: python3 docs/render_variables.py"


def test_every_variable_of_the_spec_has_one_row_and_a_changed_spec_changes_the_page():
    render, spec = _renderer().render, _spec()
    names = set(n for entry in spec.values() for n in (entry.get("options") or {}))
    page = render(spec)
    assert sorted(n for n in names if page.count("| `%s` |" % n) != 1) == []
    first = next(iter(spec))
    name = next(iter(spec[first]["options"]))
    spec[first]["options"][name] = dict(spec[first]["options"][name], default="changed-default")
    assert "changed-default" in render(spec) and render(spec) != page


def test_a_row_says_its_type_default_and_entry_points():
    row = [line for line in _renderer().render({
        "main": {"options": {"trainer_x": {"type": "list", "elements": "int", "default": [0, 1],
                                           "description": ["Two", "lines | with a bar."]}}},
        "status": {"options": {}}}).splitlines() if line.startswith("| `trainer_x`")]
    assert row == ["| `trainer_x` | list of int | `[0, 1]` | main | Two lines \\| with a bar. |"]
