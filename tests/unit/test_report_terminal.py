"""report/terminal.py: the lines that say what in a run is not the instructor's, at 80 columns; a case's status and
message."""

import io

from rich.cells import cell_len
from rich.console import Console

from theinference.report.terminal import render_run

from theinference.grading.judge.results import RunResult, Status

from .builders import case, run, stage

WEIGHTS = "/home/student/.cache/theinference/synthetic-tiny-seed0-v2/model.safetensors"
SUPPLIED = f"weights from the course's theinference.toml: {WEIGHTS}"


def _rendered(width: int, result: RunResult | None = None) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=width, no_color=True, highlight=False, force_terminal=False)
    render_run(console, result or run(course_supplied=[SUPPLIED], weights_path=WEIGHTS), "0.1.0")
    return out.getvalue().splitlines()


def test_the_course_supplied_lines_fit_80_columns_with_the_path_whole():
    # A course made by `init` grades on weights its theinference.toml names: every report says so twice, and both
    # lines ran past 80 columns (125 and 133 wide) off a terminal with COLUMNS=80.
    lines = _rendered(80)
    said = [k for k, line in enumerate(lines) if line.startswith("not the instructor's")]
    assert [lines[k] for k in said] == [
        "not the instructor's: weights from the course's theinference.toml:",
        "not the instructor's grading: weights from the course's theinference.toml:",
    ]
    assert all(lines[k + 1] == "  " + WEIGHTS for k in said)  # the path whole, on a line of its own
    assert all(cell_len(lines[k + i]) <= 80 for k in said for i in (0, 1))


def test_on_a_wide_screen_each_is_one_line():
    lines = _rendered(200)
    assert f"not the instructor's: {SUPPLIED}" in lines
    assert lines[-1] == f"not the instructor's grading: {SUPPLIED}"


def test_a_timeout_message_says_timed_out_once():
    # Every timeout's message begins "timed out" (the process layer's words): the case line said it twice.
    message = "timed out: used 5.93 s of CPU without answering, on a case the reference computes in 0.018 s"
    timed_out = stage("forward", Status.TIMEOUT, cases=[case("one-token", Status.TIMEOUT, message=message)])
    text = "\n".join(_rendered(200, run(stages=[timed_out])))
    assert f"case one-token: {message}" in text and "timed out — timed out" not in text


def test_another_message_follows_its_status_after_a_dash():
    failed = stage("forward", Status.ERROR, cases=[case("one-token", Status.ERROR, message="ValueError: bad shape")])
    assert "case one-token: error — ValueError: bad shape" in "\n".join(_rendered(200, run(stages=[failed])))
