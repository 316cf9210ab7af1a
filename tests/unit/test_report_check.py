"""report/check.py: the `stages check` matrix (subjects × stages), its mismatches, problems and verdict."""

import io

from rich.console import Console

from theinference.grading.judge.results import CheckCell, CheckResult
from theinference.report.check import render_check

from .builders import check_snapshot

STAGES = ["forward", "greedy"]
SUBJECTS = ["solution", "starter", "wpe-off-by-one"]


def rendered(result: CheckResult, colour: bool = False) -> str:
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=100, force_terminal=colour, color_system="standard" if colour else None, no_color=not colour
    )
    render_check(console, result)
    return buffer.getvalue()


def all_good() -> CheckResult:
    cells = [
        CheckCell("solution", "forward", ("pass",), "pass"),
        CheckCell("solution", "greedy", ("pass",), "pass"),
        CheckCell("starter", "forward", ("not-started",), "not-started"),
        CheckCell("starter", "greedy", ("not-started",), "not-started"),
        CheckCell(
            "wpe-off-by-one",
            "forward",
            ("fail",),
            "shifted-by-one",
            expected_bugs=frozenset({"wpe-off-by-one"}),
            got_bugs=frozenset({"wpe-off-by-one"}),
        ),
        CheckCell("wpe-off-by-one", "greedy", ("token-mismatch",), "token-mismatch"),
    ]
    return CheckResult(STAGES, SUBJECTS, cells)


def with_mismatches() -> CheckResult:
    cells = [
        CheckCell("solution", "forward", ("pass",), "fail", message="1 of 3 cases failed [red]x[/red]"),
        CheckCell("solution", "greedy", ("pass",), "pass"),
        CheckCell(
            "wpe-off-by-one",
            "forward",
            ("shifted-by-one",),
            "shifted-by-one",
            expected_bugs=frozenset({"wpe-off-by-one"}),
            got_bugs=frozenset({"mask-diagonal"}),
        ),
    ]
    return CheckResult(
        STAGES,
        SUBJECTS,
        cells,
        problems=["lessons/greedy.md is missing"],
        broken=["mutants/x.toml: `expect` names no stage 'gredy'"],
    )


def test_snapshot_all_good():
    check_snapshot("check_ok_plain.txt", rendered(all_good()))


def test_snapshot_with_mismatches():
    check_snapshot("check_mismatches_plain.txt", rendered(with_mismatches()))


def test_a_clean_check_says_passed_with_its_counts():
    text = rendered(all_good())
    assert text.splitlines()[-1] == "stages check passed · 6 checks, 0 mismatches, 0 problems"
    assert "✔ shifted-by-one · wpe-off-by-one" in text  # the fingerprint it proved


def test_mismatches_problems_and_broken_manifests_are_each_named():
    text = rendered(with_mismatches())
    assert "mismatch: solution × forward: expected pass, got fail — 1 of 3 cases failed [red]x[/red]" in text
    assert "mismatch: wpe-off-by-one × forward: expected fingerprint wpe-off-by-one, got mask-diagonal" in text
    assert "problem: lessons/greedy.md is missing" in text
    assert "error: mutants/x.toml: `expect` names no stage 'gredy'" in text
    assert text.splitlines()[-1] == (
        "stages check failed · 3 checks, 2 mismatches, 1 problems, 1 broken manifest field(s)"
    )


def test_a_cell_says_what_was_wanted_when_it_differs():
    text = rendered(with_mismatches())
    assert "✘ fail (want pass)" in text
    assert "✘ shifted-by-one · mask-diagonal (want wpe-off-by-one)" in text


def test_a_subject_without_a_cell_for_a_stage_gets_an_empty_one():
    text = rendered(with_mismatches())
    (starter,) = [line for line in text.splitlines() if line.startswith(" starter") or line.startswith("starter")]
    assert "✔" not in starter and "✘" not in starter


def test_problems_alone_fail_the_check():
    result = CheckResult(STAGES, SUBJECTS, all_good().cells, problems=["an edit no longer applies"])
    assert rendered(result).splitlines()[-1].startswith("stages check failed")


def test_plain_output_has_no_escape_codes_and_colour_output_has():
    assert "\x1b[" not in rendered(with_mismatches())
    assert "\x1b[" in rendered(with_mismatches(), colour=True)
