"""Report rendering, snapshot-tested at a fixed width, plain and in colour.

Run with UPDATE_SNAPSHOTS=1 to rewrite the snapshots after an intended change, then read the diff.
"""

import dataclasses
import io
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from theinference.grading.drive.advice import advise
from theinference.grading.judge.diagnose import diagnose_rows, diagnose_tokens
from theinference.grading.tools.mutants import build_mutant, load_mutants
from theinference.model.weights import Synthetic
from theinference.report.tables import sparkline
from theinference.report.terminal import render_run
from theinference.bundled import data_dir
from theinference.grading.judge.results import CaseResult, RowStats, RunResult, StageResult, TokenStep
from theinference.grading.drive.plan import plan_run
from theinference.grading.drive.session import open_session
from theinference.grading.spec.checks import RowsCheck, TokensCheck

SNAPSHOTS = Path(__file__).parent / "snapshots"
HINTS = {"error-grows": "Your position counter isn't advancing.", "token-mismatch": "Check the decode loop."}


def _row(i: int, err: float) -> RowStats:
    ok = err <= 1e-3
    return RowStats(
        row=i,
        position=4 + i,
        token=[464, 3797, 3332, 319][i % 4],
        max_abs=err,
        max_rel=err * 10,
        n_bad=0 if ok else 40000 + i,
        n=50257,
        n_nonfinite=0,
        worst_index=995,
        expected=1.5,
        got=1.5 + (0 if ok else err),
        ok=ok,
    )


ROWS = RowsCheck(atol=1e-3, rtol=1e-2)


def sample_run() -> RunResult:
    growing = [1e-6] + [0.05 * k for k in range(1, 24)]
    rows_case = CaseResult(
        name="long-generation",
        status="fail",
        message="23 of 24 rows outside atol=0.001 rtol=0.01",
        rows=[_row(i, e) for i, e in enumerate(growing)],
        seconds=1.0,
    )
    rows_case = dataclasses.replace(rows_case, diagnosis=diagnose_rows(rows_case.rows, HINTS))
    steps = [
        TokenStep(0, 1, 15496, 15496, 0.0, "match"),
        TokenStep(1, 2, 995, 11, 0.004, "near-tie", 0.005),
        TokenStep(2, 3, 0, 13, 2.5, "mismatch"),
    ]
    greedy_case = CaseResult(
        name="sentence",
        status="fail",
        message="token 3 of 4 differs from the oracle's greedy choice",
        steps=steps,
        got_tokens=[15496, 995, 0, 13],
        expected_tokens=[15496, 995, 13, 198],
        inputs={"prompt": [464], "n_new": 4},
        texts={"prompt": "The"},
    )
    greedy_case = dataclasses.replace(greedy_case, diagnosis=diagnose_tokens(steps, HINTS, lambda t: str(t)))
    error_case = CaseResult(
        name="one-step",
        status="error",
        message="ValueError: bad shape",
        traceback='Traceback (most recent call last):\n  File "tests/adapters.py", line 3, in run\nValueError: bad shape\n',
        stdout="debug print\n",
    )
    common = dict(adapters_file="tests/adapters.py", lesson="lessons/x.md", seconds=1.25)
    stages = [
        StageResult(
            id="per-step-identity",
            title="Per-step identity",
            status="fail",
            cases=[rows_case, error_case],
            points=0,
            max_points=20,
            adapter="run_per_step_logits",
            check=ROWS,
            **common,
        ),
        StageResult(
            id="greedy",
            title="Greedy",
            status="fail",
            cases=[greedy_case],
            points=0,
            max_points=10,
            adapter="run_greedy",
            check=TokensCheck(1e-4),
            **common,
        ),
        StageResult(
            id="prove-one-layer",
            title="Prove one layer",
            status="not-started",
            cases=[CaseResult(name="one", status="not-started", message="NotImplementedError: embed")],
            points=0,
            max_points=10,
            adapter="run_layer_equiv",
            check=ROWS,
            **common,
        ),
    ]
    config = {"n_vocab": 50257, "n_ctx": 256, "n_embd": 128, "n_head": 2, "n_layer": 2}
    return RunResult(
        course="/course",
        weights_path="/w/model.safetensors",
        weights_source="--weights",
        weights_why="given with --weights",
        synthetic=Synthetic("tiny", "0"),
        config=config,
        stages=stages,
    )


def render(colour: bool) -> str:
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=100,
        force_terminal=colour,
        color_system="standard" if colour else None,
        no_color=not colour,
        highlight=False,
        legacy_windows=False,
    )
    render_run(console, sample_run(), "0.1.0")
    return buffer.getvalue()


@pytest.mark.parametrize("name, colour", [("report_plain.txt", False), ("report_colour.txt", True)])
def test_report_snapshot(name, colour):
    text = render(colour)
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOTS") or not path.exists():
        path.write_text(text)
    assert text == path.read_text()


def test_plain_report_has_no_escape_codes_or_box_drawing():
    text = render(colour=False)
    assert "\x1b[" not in text
    assert not set("─│┃━┏┓└┘▁▂▃▄▅▆▇█") & set(text)


def test_colour_report_is_coloured():
    assert "\x1b[" in render(colour=True)


def test_long_case_is_folded_around_the_first_divergence():
    text = render(colour=False)
    assert "◀ first" in text
    assert "rows below" in text  # 24 rows: shown around row 1, the rest summarised
    assert "error by position: _" in text


def test_greedy_table_marks_mismatch_and_near_tie():
    text = render(colour=False)
    assert "◀ first mismatch (logit gap 2.5)" in text
    assert "near-tie accepted (gap 0.004 ≤ 0.005)" in text


def test_greedy_shows_prompt_and_both_continuations_as_text():
    text = render(colour=False)
    assert "prompt:   'The'" in text
    assert "expected: 'Hello world.\\n'" in text and "got:      'Hello world!.'" in text


def test_sparkline_scales_logarithmically_and_marks_nonfinite():
    assert sparkline([1e-6, 1e-3, 1.0]) == "▁▅█"
    assert sparkline([1.0, float("nan")], plain=True) == "_x"


# A failure as real GPT-2 logits give it: wide numbers, long token texts (<|endoftext|> among them).
_TOKENS = [464, 50256, 22837, 42492, 318, 6342, 11, 290, 262, 3139]


def _wide_row(i: int, err: float, position: int | None = None, n: int = 50257) -> RowStats:
    ok = err <= 1e-3
    position = 4 + i if position is None else position
    return RowStats(
        row=i,
        position=position,
        token=_TOKENS[position % len(_TOKENS)],
        max_abs=err,
        max_rel=err * 3.1e4,
        n_bad=0 if ok else n - n // 100 - i,
        n=n,
        n_nonfinite=0,
        worst_index=_TOKENS[(i + 2) % len(_TOKENS)],
        expected=-1.9543 * (i + 1),
        got=2.1537 * (i + 1),
        ok=ok,
    )


def failure_run() -> RunResult:
    """A rows stage with a long failing case, and a stage read across one-row cases."""
    errors = [2.62e-06, 5.2437, 5.1524, 3.6213, 5.6941, 5.1502, 4.5118, 4.1032, 3.8044, 1.6631]
    long_case = CaseResult(
        name="one-token-prompt",
        status="fail",
        message="9 of 10 rows outside atol=0.001 rtol=0.01",
        rows=[_wide_row(i, e) for i, e in enumerate(errors)],
    )
    long_case = dataclasses.replace(long_case, diagnosis=diagnose_rows(long_case.rows, HINTS))
    positions, across = [0, 1, 2, 4, 7, 11, 19, 44, 63], [0.0, 2.34, 0.954, 0.668, 0.428, 0.313, 0.0935, 0.0313, 0.0712]
    names = [
        "one-token",
        "two-tokens",
        "three-tokens",
        "5-tokens",
        "8-tokens",
        "12-tokens",
        "20-tokens",
        "45-tokens",
        "a-case-with-a-long-name",
    ]
    one_row = [
        CaseResult(
            name=name,
            status="pass" if err == 0 else "fail",
            rows=[_wide_row(0, err, pos, n=128)],
            message="" if err == 0 else "1 of 1 rows outside atol=0.0001 rtol=0.001",
        )
        for name, pos, err in zip(names, positions, across)
    ]
    ordered = [dataclasses.replace(c.rows[0], row=i) for i, c in enumerate(one_row)]
    common = dict(adapters_file="tests/adapters.py", lesson="lessons/x.md", seconds=0.4)
    stages = [
        StageResult(
            id="single-step-attention",
            title="Single step",
            status="fail",
            cases=one_row,
            points=0,
            max_points=5,
            adapter="run_single_step",
            check=ROWS,
            cross_case=diagnose_rows(ordered, {"first-decode-row-off": "Append k and v before attention."}),
            **common,
        ),
        StageResult(
            id="per-step-identity",
            title="Per-step identity",
            status="fail",
            cases=[long_case],
            points=0,
            max_points=20,
            adapter="run_per_step_logits",
            check=ROWS,
            **common,
        ),
    ]
    return dataclasses.replace(sample_run(), stages=stages)


def render_at(width: int, run: RunResult) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, highlight=False, legacy_windows=False)
    render_run(console, run, "0.1.0")
    return buffer.getvalue()


def assert_snapshot(text: str, name: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOTS") or not path.exists():
        path.write_text(text)
    assert text == path.read_text()


def _table_lines(text: str, header_start: str) -> list[str]:
    """The lines of the first table whose header starts with header_start, up to the next non-table line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    end = next((i for i in range(start, len(lines)) if "|" not in lines[i] and set(lines[i]) - set("-+")), len(lines))
    return lines[start:end]


@pytest.mark.parametrize("width", [80, 120])
def test_failure_tables_fit_the_width_and_keep_the_essential_columns_whole(width):
    run = failure_run()
    text = render_at(width, run)
    assert_snapshot(text, f"failure_tables_{width}.txt")
    table = _table_lines(text, "row")
    assert all(len(line) <= width for line in table)
    header = [cell.strip() for cell in table[0].split(" | ")]
    assert header[:4] == ["row", "pos", "token", "max |Δ|"]
    for line, row in zip(table[2:], run.stages[1].cases[0].rows):
        cells = [cell.strip() for cell in line.split(" | ")]
        assert cells[:2] == [str(row.row), str(row.position)] and cells[3] == f"{row.max_abs:.3g}"
        assert cells[-1] in ("ok", "off", "◀ first")
        assert cells[2].endswith("'")  # a shortened token keeps its closing quote
    assert "1 '<|endofte…'" not in text and "50256 '<|endofte…'" in text
    # Lower-priority columns show only where there is room: the count of elements off before the worst element.
    assert "out of tol" in header and ("worst: expected vs got" in header) == (width == 120)


def test_a_stage_read_across_one_row_cases_prints_one_table_by_position():
    run = failure_run()
    run = dataclasses.replace(run, stages=run.stages[:1])
    stage_text = render_at(80, run)
    assert_snapshot(stage_text, "one_row_stage_80.txt")
    assert stage_text.count("pos | case") == 1 and "error by position" not in stage_text
    table = _table_lines(stage_text, "pos | case")
    cases = sorted(run.stages[0].cases, key=lambda c: c.rows[0].position)
    assert [line.split(" | ")[1].strip() for line in table[2:]] == [c.name for c in cases]
    assert [line.split(" | ")[-1].strip() for line in table[2:4]] == ["ok", "◀ first"]
    assert "shape: first-decode-row-off — row 0 matches; row 1 is already off" in stage_text
    assert "hint: Append k and v before attention." in stage_text


@pytest.mark.slow
def test_a_real_failure_reads_whole_at_80_columns(tiny_path, tmp_path):
    mutant = next(m for m in load_mutants(data_dir("course") / "mutants") if m.name == "mask-off-by-one")
    course = build_mutant(mutant, data_dir("course") / "solution", tmp_path / mutant.name)
    session = open_session(plan_run(course, weights=str(tiny_path)))
    try:
        wanted = [s for s in session.stages if s.id in ("single-step-attention", "per-step-identity")]
        run = session.run(wanted, verdicts_first=False, follow_up=False)
    finally:
        session.close()
    text = render_at(80, run)
    across, rows = text.split("✘ per-step-identity")
    assert across.count("pos | case") == 1 and "error by position" not in across
    for case in run.stages[0].cases:  # every case's row in the one table, its max |Δ| in full
        assert re.search(
            rf"\n *{case.rows[0].position} \| {case.name} +\| .+ \| +{re.escape(f'{case.rows[0].max_abs:.3g}')} \|",
            across,
        )
    assert rows.count("row | pos | token") == len(run.stages[1].cases)
    assert "…" not in "".join(line for line in text.splitlines() if line.startswith(("row |", "pos |")))


GPT2_SHAPE = {"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12}


@pytest.mark.parametrize(
    "config, seconds, offered",
    [
        (GPT2_SHAPE, 3.0, True),  # 10 cases of 3 s of the student's compute on the 124M shape
        (GPT2_SHAPE, 0.2, False),  # a fast run needs no advice
        (sample_run().config, 3.0, False),  # already on tiny weights
    ],
)
def test_a_slow_run_on_large_weights_offers_the_tiny_weights_in_the_footer(config, seconds, offered):
    run = failure_run()
    stages = [
        dataclasses.replace(s, cases=[dataclasses.replace(c, seconds=seconds) for c in s.cases]) for s in run.stages
    ]
    run = dataclasses.replace(run, config=config, stages=stages)
    run = dataclasses.replace(run, advice=advise(run, [], None))
    footer = " ".join(render_at(80, run).split("stage(s) passed")[1].split())  # as read, whatever the wrapping
    assert ("`--weights tiny` gives the same verdicts in seconds" in footer) == offered
    assert footer.count("--weights tiny") == int(offered)
