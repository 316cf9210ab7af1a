"""Report rendering, snapshot-tested at a fixed width, plain and in colour.

Run with UPDATE_SNAPSHOTS=1 to rewrite the snapshots after an intended change, then read the diff.
"""

import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from theinference.grading.diagnose import diagnose_rows, diagnose_tokens
from theinference.report.terminal import render_run, sparkline
from theinference.grading.results import CaseResult, RowStats, RunResult, StageResult, TokenStep

SNAPSHOTS = Path(__file__).parent / "snapshots"
HINTS = {"error-grows": "Your position counter isn't advancing.", "token-mismatch": "Check the decode loop."}


def _row(i: int, err: float) -> RowStats:
    ok = err <= 1e-3
    return RowStats(row=i, position=4 + i, token=[464, 3797, 3332, 319][i % 4], max_abs=err, max_rel=err * 10,
                    n_bad=0 if ok else 40000 + i, n=50257, n_nonfinite=0, worst_index=995,
                    expected=1.5, got=1.5 + (0 if ok else err), ok=ok)


def sample_run() -> RunResult:
    growing = [1e-6] + [0.05 * k for k in range(1, 24)]
    rows_case = CaseResult(name="long-generation", status="fail", message="23 of 24 rows outside atol=0.001 rtol=0.01",
                           rows=[_row(i, e) for i, e in enumerate(growing)], seconds=1.0)
    rows_case.diagnosis = diagnose_rows(rows_case.rows, HINTS)
    steps = [TokenStep(0, 1, 15496, 15496, 0.0, "match"), TokenStep(1, 2, 995, 11, 0.004, "near-tie", 0.005),
             TokenStep(2, 3, 0, 13, 2.5, "mismatch")]
    greedy_case = CaseResult(name="sentence", status="fail", message="token 2 of 4 differs from the oracle's greedy choice",
                             steps=steps, got_tokens=[15496, 995, 0, 13], expected_tokens=[15496, 995, 13, 198],
                             inputs={"prompt": [464], "n_new": 4}, texts={"prompt": "The"})
    greedy_case.diagnosis = diagnose_tokens(steps, HINTS, lambda t: str(t))
    error_case = CaseResult(name="one-step", status="error", message="ValueError: bad shape",
                            traceback='Traceback (most recent call last):\n  File "tests/adapters.py", line 3, in run\nValueError: bad shape\n',
                            stdout="debug print\n")
    common = dict(adapters_file="tests/adapters.py", lesson="lessons/x.md", atol=1e-3, rtol=1e-2, seconds=1.25)
    stages = [
        StageResult(id="per-step-identity", title="Per-step identity", status="fail", cases=[rows_case, error_case],
                    points=0, max_points=20, adapter="run_per_step_logits", compare="rows", **common),
        StageResult(id="greedy", title="Greedy", status="fail", cases=[greedy_case], points=0, max_points=10,
                    adapter="run_greedy", compare="tokens", **common),
        StageResult(id="prove-one-layer", title="Prove one layer", status="not-started",
                    cases=[CaseResult(name="one", status="not-started", message="NotImplementedError: embed")],
                    points=0, max_points=10, adapter="run_layer_equiv", compare="rows", **common),
    ]
    config = {"n_vocab": 50257, "n_ctx": 256, "n_embd": 128, "n_head": 2, "n_layer": 2}
    return RunResult(course="/course", weights_path="/w/model.safetensors", weights_source="--weights",
                     weights_why="given with --weights", synthetic="tiny preset, seed 0", config=config, stages=stages)


def render(colour: bool) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=100, force_terminal=colour, color_system="standard" if colour else None,
                      no_color=not colour, highlight=False, legacy_windows=False)
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
