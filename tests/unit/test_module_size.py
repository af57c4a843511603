"""Every module is thin: at most 150 lines of code, counting imports and statements only (not
DOCUMENTATION/EXAMPLES/RETURN, docstrings, comments or blank lines). The work lives in
module_utils, as pure functions with their own tests."""
import ast
import glob
import io
import os
import tokenize

import pytest

MODULES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "modules", "*.py")))
LIMIT = 150
_DOC_NAMES = {"DOCUMENTATION", "EXAMPLES", "RETURN"}
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def code_lines(source):
    """The number of lines of ``source`` that carry code, documentation strings left out."""
    tree = ast.parse(source)
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in _DOC_NAMES for t in node.targets):
            skip.update(range(node.lineno, node.end_lineno + 1))
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                skip.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in skip)
    return len(lines)


def test_the_counter_counts_code_only():
    source = ('"""doc"""\nimport os\n\nDOCUMENTATION = r"""\na: 1\n"""\n# a comment\n\n'
              'def f(x):\n    """doc\n    more"""\n    return (x +\n            1)\n')
    assert code_lines(source) == 4  # import, def, and the two lines of the return


def test_there_are_modules():
    assert len(MODULES) >= 5


@pytest.mark.parametrize("path", MODULES, ids=os.path.basename)
def test_module_is_thin(path):
    with open(path, encoding="utf-8") as fh:
        n = code_lines(fh.read())
    assert n <= LIMIT, "%s has %d lines of code (at most %d): move the work into module_utils" % (
        os.path.basename(path), n, LIMIT)
