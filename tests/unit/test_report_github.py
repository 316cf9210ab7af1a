"""report/github.py: the `::error` annotations GitHub Actions reads, and the Markdown job summary.

The annotations are parsed here as GitHub parses workflow commands (one command a line, properties split at
commas, %-escapes decoded), so a test fails where GitHub would show something else than the grader meant.
"""

import os
import re

import pytest

from theinference.grading.judge.results import Status
from theinference.report.github import render_annotations, render_summary

from .builders import HOSTILE, case, check_snapshot, error_case, failing_case, mixed_run, run, stage

COMMAND = re.compile(r"^::(?P<name>[a-z]+)(?: (?P<props>[^:]*))?::(?P<data>.*)$")


def _unescape(text: str) -> str:
    return text.replace("%0A", "\n").replace("%0D", "\r").replace("%3A", ":").replace("%2C", ",").replace("%25", "%")


def commands(output: str) -> list[dict]:
    """Each line of output as GitHub reads a workflow command: its name, properties and message, decoded."""
    parsed = []
    for line in output.splitlines():
        m = COMMAND.match(line)
        assert m, f"not a workflow command: {line!r}"
        props = dict(p.split("=", 1) for p in m["props"].split(",")) if m["props"] else {}
        parsed.append(
            {"name": m["name"], **{k: _unescape(v) for k, v in props.items()}, "message": _unescape(m["data"])}
        )
    return parsed


@pytest.fixture(autouse=True)
def workspace(monkeypatch):
    """The course is the checkout GitHub Actions runs in: annotation paths are relative to it."""
    monkeypatch.setenv("GITHUB_WORKSPACE", "/course")


def test_annotations_snapshot():
    # the snapshot's paths are POSIX ones; on Windows the same annotations name them with its separator
    check_snapshot("github_annotations.txt", render_annotations(mixed_run()).replace(os.sep, "/"))


def test_summary_snapshot():
    check_snapshot("github_summary.md", render_summary(mixed_run(), "0.1.0"))


def test_one_error_per_stage_that_did_not_pass_and_a_notice_with_the_total():
    found = commands(render_annotations(mixed_run()))
    errors = [c for c in found if c["name"] == "error"]
    assert [c["title"] for c in errors] == [
        "theinference per-step-identity: fail",
        "theinference single-step: error",
        "theinference greedy: fail",
    ]
    assert found[-1]["name"] == "notice"
    assert found[-1]["message"] == "2 of 5 stages passed, 20/50 points; isolation: sandbox"


def test_a_passing_run_has_only_the_notice():
    found = commands(render_annotations(run()))
    assert [c["name"] for c in found] == ["notice"]
    assert "1 of 1 stages passed, 10/10 points" in found[0]["message"]


def test_a_passed_cost_proof_names_its_cpu_meter_and_a_self_check_says_it_is_not_a_grade_of_record():
    from .builders import scaling

    self_check = scaling(accounting="process tree (psutil)", guarantee="self-check")
    cost = case("generation", Status.PASS, rows=[], scaling=self_check)
    found = commands(render_annotations(run([stage("cache-scaling", Status.PASS, [cost])])))
    assert [(c["name"], c["title"]) for c in found[:-1]] == [("notice", "theinference cache-scaling")]
    assert "counted by the grader (process tree (psutil))" in found[0]["message"]
    assert "a self-check, not a grade of record" in found[0]["message"]


def test_the_error_points_at_the_line_the_traceback_left_the_course():
    broken = stage("single-step", Status.ERROR, [error_case(at=("src/kvcache.py", 41))], adapter_line=12)
    (error,) = [c for c in commands(render_annotations(run([broken]))) if c["name"] == "error"]
    assert (error["file"], error["line"]) == (os.path.join("src", "kvcache.py"), "41")


def test_without_a_traceback_the_error_points_at_the_adapter_definition():
    failing = stage(
        "per-step-identity",
        Status.FAIL,
        [failing_case()],
        adapter_source="/course/src/adapters_impl.py",
        adapter_line=12,
    )
    (error,) = [c for c in commands(render_annotations(run([failing]))) if c["name"] == "error"]
    assert (error["file"], error["line"]) == (os.path.join("src", "adapters_impl.py"), "12")


def test_no_line_property_when_the_adapter_line_is_unknown():
    failing = stage("per-step-identity", Status.FAIL, [failing_case()])
    (error,) = [c for c in commands(render_annotations(run([failing]))) if c["name"] == "error"]
    assert error["file"] == "tests/adapters.py" and "line" not in error


def test_hostile_text_stays_inside_its_annotation():
    """A student's message with newlines, `::error::`, `%0A`, commas, escapes cannot add a command, forge a
    property, or reach the log reader's terminal: one error line, its message the text shown escaped."""
    hostile = error_case(message=HOSTILE, traceback="", at=(HOSTILE + ".py", 3))
    output = render_annotations(run([stage("single-step", Status.ERROR, [hostile])]))
    found = commands(output)
    assert [c["name"] for c in found] == ["error", "notice"]
    assert "\x1b" not in output and "\r" not in output and "\u202e" not in output
    error = found[0]
    assert "::error::pwned %0A, done\n```\nafter the fence" in error["message"]  # decoded: the student's own text
    assert "\\x1b[2J" in error["message"] and "\\u202e" in error["message"]  # shown, not obeyed
    assert error["file"].startswith("boom\\x1b[2J\\x0d\\u202e::error::pwned %0A, done")
    assert set(error) == {"name", "file", "line", "title", "message"}  # the path's comma made no property


def test_repeated_failures_are_told_once_with_how_many_more():
    same = [error_case(f"case-{i}") for i in range(3)]
    (error,) = [c for c in commands(render_annotations(run([stage("x", Status.ERROR, same)]))) if c["name"] == "error"]
    assert error["message"].count("Traceback (most recent call last)") == 1
    assert error["message"].startswith("case-0: error")
    assert "same error in 2 more cases (case-1, case-2)" in error["message"]


def test_the_course_overriding_the_instructor_is_a_warning():
    found = commands(render_annotations(run(course_supplied=["the course's theinference.toml set timeout = 99"])))
    (warning,) = [c for c in found if c["name"] == "warning"]
    assert warning["title"] == "theinference: not the instructor"
    assert warning["message"] == "the course's theinference.toml set timeout = 99"


def test_summary_table_has_a_row_per_stage_with_status_cases_and_points():
    text = render_summary(mixed_run(), "9.9.9")
    assert text.startswith("## theinference: 20/50 points\n")
    assert "| `per-step-identity` | ❌ fail | 1/2 | 0/10 |" in text
    assert "| `cache-scaling` | ✅ pass | 1/1 | 10/10 |" in text
    assert "theinference 9.9.9 · weights `/w/model.safetensors` · seed 7 · isolation: sandbox" in text


def test_summary_cannot_be_broken_out_of_by_a_fence_in_the_students_output():
    hostile = error_case(message="x", traceback="```\n# injected heading\n````")
    text = render_summary(run([stage("single-step", Status.ERROR, [hostile])]), "0")
    block = text[text.index("### `single-step` · broken") :]
    fence = re.search(r"^(`{3,})text$", block, re.M)
    assert fence and len(fence[1]) > 4  # longer than the longest backtick run in the traceback
    closing = block.index("\n" + fence[1] + "\n", fence.end())
    assert "# injected heading" in block[fence.end() : closing]


def test_summary_shows_a_stage_read_across_its_cases():
    from theinference.grading.judge.results import Diagnosis

    across = Diagnosis("first-decode-row-off", "only the first decode row is off", "Append k and v first.")
    text = render_summary(
        run([stage("single-step", Status.FAIL, [case("a"), failing_case("b")], cross_case=across)]), "0"
    )
    assert "### `single-step` · across its cases" in text
    assert "shape: first-decode-row-off — only the first decode row is off" in text


def test_summary_quotes_what_the_course_chose_instead_of_the_instructor():
    text = render_summary(run(course_supplied=["timeout = 99 \x1b[2J"]), "0")
    assert "> **not the instructor's:** timeout = 99 \\x1b[2J  " in text


def test_a_path_that_cannot_be_made_relative_is_given_whole(monkeypatch):
    """On Windows a path on another drive has no relative form: the annotation names it as it is."""

    def other_drive(path, start):
        raise ValueError("path is on mount 'D:', start on mount 'C:'")

    monkeypatch.setattr("theinference.report.github.os.path.relpath", other_drive)
    broken = stage("single-step", Status.ERROR, [error_case()])
    (error,) = [c for c in commands(render_annotations(run([broken]))) if c["name"] == "error"]
    assert error["file"] == os.path.join("/course", "tests/adapters.py")
