"""reach.py's statement sources, split once per file, are exactly what ast.get_source_segment gives."""

import ast

import pytest

from theinference.bundled import data_dir
from theinference.grading.tools.reach import _ast_lines, _segment

TRICKY = [
    "x = 1\r\ny = 'é\x0c'\rz = (1,\n 2)\n\x0c\nclass A: pass\n",  # \r\n, a lone \r, a form feed, non-ASCII
    "a = '\u2028'; b = 2\nc = 3",  # a line separator str.splitlines would split at, inside a string
    "import os\r\n\r\nv = [\r\n 1]\r\n",
]


@pytest.mark.parametrize(
    "text", TRICKY + [p.read_text() for p in sorted((data_dir("course") / "solution").rglob("*.py"))]
)
def test_each_statements_source_is_ast_own(text):
    lines = _ast_lines(text)
    for node in ast.parse(text).body:
        assert _segment(lines, node) == ast.get_source_segment(text, node)
