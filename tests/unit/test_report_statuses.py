"""Every verdict is shown one way: a mark, a style and words for each Status, from one table."""

from rich.console import Console

from theinference.grading.judge.results import Status
from theinference.report.statuses import presentation
from theinference.report.terminal import render_stage
from .builders import case, stage


def test_every_status_has_a_mark_a_style_and_words_of_its_own():
    words = [presentation(status).words for status in Status]
    assert all(presentation(s).mark and presentation(s).style for s in Status)
    assert len(set(words)) == len(words)  # no two verdicts read alike


def test_the_stage_line_and_the_case_line_say_the_status_in_the_tables_words():
    console = Console(width=100, record=True, color_system=None)
    render_stage(
        console, stage(status=Status.TIMEOUT, cases=[case("a", Status.TIMEOUT, message="over its budget")]), 50257
    )
    text = console.export_text()
    assert f"{presentation(Status.TIMEOUT).mark} " in text and "timed out — over its budget" in text
