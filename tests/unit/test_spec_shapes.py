"""spec/shapes.py: the failure shapes a stage file's [hints] may name, each one a diagnosis can give."""

import re
from pathlib import Path


from theinference.grading.judge import diagnose
from theinference.grading.spec.shapes import SHAPES

AUTHORING = Path(__file__).parents[2] / "docs" / "authoring.md"


def test_shapes_are_unique_names():
    assert len(set(SHAPES)) == len(SHAPES)
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", s) for s in SHAPES)


def test_every_shape_the_rows_diagnosis_names_may_get_a_hint():
    assert set(diagnose._SUMMARIES) <= set(SHAPES)


def test_every_shape_a_hint_may_name_is_documented_for_instructors():
    text = AUTHORING.read_text()
    paragraph = text[text.index("**Shapes** a `[hints]` key may name") :].split("\n\n")[0]
    assert [s for s in SHAPES if f"`{s}`" not in paragraph] == []
