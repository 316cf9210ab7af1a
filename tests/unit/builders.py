"""Small builders of finished results (RunResult, StageResult, CaseResult, ...) for renderer and judge tests.

Each builder gives a plausible default for every field and takes keyword overrides, so a test names only what it
is about. The defaults are deliberately unremarkable (a passing rows stage on the tiny synthetic weights); a test
that needs a failure, a hostile message or a cache-scaling case says so.
"""

import dataclasses
import os
from pathlib import Path

from theinference.grading.judge.results import (
    CaseResult,
    Diagnosis,
    RowStats,
    RunResult,
    ScalingResult,
    StageResult,
    Status,
    TimedCall,
    TokenStep,
)
from theinference.grading.spec.checks import RowsCheck, ScalingCheck, ScalingSpec, TokensCheck
from theinference.grading.spec.stages import CaseSpec, StageSpec
from theinference.model.weights import Synthetic
from theinference.proc.runner import StepTime

ROWS = RowsCheck(atol=1e-4, rtol=1e-3)
TOKENS = TokensCheck(tie_rtol=1e-4)
SCALING = ScalingCheck(tie_rtol=1e-4, params=ScalingSpec(lengths=(8, 480), repeats=3, max_ratio=2.0))
TINY_CONFIG = {"n_vocab": 50257, "n_ctx": 256, "n_embd": 128, "n_head": 2, "n_layer": 2}

# Text a student's code controls, holding what breaks each output: a terminal escape (clears a TA's screen), a
# carriage return, a bidirectional override, GitHub workflow-command syntax (`::`, `%`, `,`, newlines) and a
# Markdown fence.
HOSTILE = "boom\x1b[2J\r\u202e::error::pwned %0A, done\n```\nafter the fence"

SNAPSHOTS = Path(__file__).parent / "snapshots"


def row(i: int = 0, err: float = 0.0, *, atol: float = 1e-4, n: int = 128) -> RowStats:
    """Row i of an output compared with the oracle: within tolerance when err <= atol."""
    ok = err <= atol
    return RowStats(
        row=i,
        position=3 + i,
        token=[464, 3797, 3332, 319][i % 4],
        max_abs=err,
        max_rel=err * 10,
        n_bad=0 if ok else n // 2 + i,
        n=n,
        n_nonfinite=0,
        worst_index=7,
        expected=1.5,
        got=1.5 + err,
        ok=ok,
    )


def case(name: str = "one", status: str = Status.PASS, **fields) -> CaseResult:
    """A case's verdict; rows default to two passing ones for a pass, none otherwise."""
    fields.setdefault("rows", [row(0), row(1)] if status == Status.PASS else [])
    fields.setdefault("inputs", {"seq": [464, 3797]})
    return CaseResult(name=name, status=status, **fields)


def failing_case(name: str = "long", **fields) -> CaseResult:
    """A rows case whose error grows from its second row on, diagnosed as such."""
    rows = [row(0), row(1, 0.5), row(2, 1.0), row(3, 2.0)]
    fields.setdefault("message", "3 of 4 rows outside atol=0.0001 rtol=0.001")
    fields.setdefault(
        "diagnosis",
        Diagnosis("error-grows", "the error grows with the position", "Your position counter isn't advancing."),
    )
    return case(name, Status.FAIL, rows=rows, **fields)


def error_case(name: str = "broken", message: str = "ValueError: bad shape", **fields) -> CaseResult:
    """A case whose adapter raised: a traceback from the student's own file."""
    fields.setdefault(
        "traceback",
        f'Traceback (most recent call last):\n  File "tests/adapters.py", line 3, in run\n{message}\n',
    )
    fields.setdefault("at", ("tests/adapters.py", 3))
    return case(name, Status.ERROR, message=message, **fields)


def token_steps(mismatch_at: int | None = 2) -> list[TokenStep]:
    """A greedy walk: matches, one near-tie, and a mismatch at mismatch_at (None: none)."""
    steps = [TokenStep(0, 1, 15496, 15496, 0.0, "match"), TokenStep(1, 2, 995, 11, 0.004, "near-tie", 0.005)]
    if mismatch_at is not None:
        steps.append(TokenStep(mismatch_at, 1 + mismatch_at, 0, 13, 2.5, "mismatch"))
    return steps


def scaling(**fields) -> ScalingResult:
    """Cache-scaling's figures for a cached run: flat per-token cost, a fraction of the oracle's recompute."""
    values = dict(
        lengths=(8, 480),
        seconds=(0.08, 4.8),
        max_ratio=2.0,
        max_fraction=0.35,
        accounting="cgroup",
        oracle_seconds=24.0,
        step_ms=9.0,
        calls=(TimedCall(8, 0.08, 0.09, prompt_tokens=4), TimedCall(480, 4.8, 5.0, prompt_tokens=4)),
    )
    values.update(fields)
    return ScalingResult(**values)


def step_time(charged: float = 1.5, timeout: float = 30.0) -> StepTime:
    return StepTime(charged=charged, timeout=timeout, cpu=1.2, waited=0.25, wall=1.75)


def stage(stage_id: str = "prove-one-layer", status: str = Status.PASS, cases=None, **fields) -> StageResult:
    """A stage's verdict: full points when it passes, none otherwise."""
    cases = [case()] if cases is None else list(cases)
    values = dict(
        title=stage_id.replace("-", " ").capitalize(),
        points=10 if status == Status.PASS else 0,
        max_points=10,
        adapter="run_" + stage_id.replace("-", "_"),
        adapters_file="tests/adapters.py",
        lesson="lessons/x.md",
        check=ROWS,
        seconds=0.5,
    )
    values.update(fields)
    return StageResult(id=stage_id, status=status, cases=cases, **values)


def run(stages=None, **fields) -> RunResult:
    """A run on the tiny synthetic weights; one passing stage unless stages are given."""
    values = dict(
        course="/course",
        weights_path="/w/model.safetensors",
        weights_source="--weights",
        weights_why="given with --weights",
        synthetic=Synthetic("tiny", "0"),
        config=dict(TINY_CONFIG),
        isolation="sandbox",
        isolation_summary="bubblewrap: no network, the course read-only",
    )
    values.update(fields)
    return RunResult(stages=[stage()] if stages is None else list(stages), **values)


def mixed_run(**fields) -> RunResult:
    """A run of every kind of outcome: a pass, a rows failure, an error, a greedy mismatch, and cache-scaling."""
    greedy = case(
        "sentence",
        Status.FAIL,
        rows=[],
        inputs={"prompt": [464], "n_new": 4},
        message="token 2 of 4 differs from the oracle's greedy choice",
        steps=token_steps(),
        got_tokens=[15496, 995, 0, 13],
        expected_tokens=[15496, 995, 13, 198],
        diagnosis=Diagnosis("token-mismatch", "a token differs from the oracle's", "Check the decode loop."),
    )
    cost = case("cost", Status.PASS, rows=[], inputs={"n_new": 480}, scaling=scaling())
    stages = [
        stage("prove-one-layer"),
        stage("per-step-identity", Status.FAIL, [case("short"), failing_case()]),
        stage("single-step", Status.ERROR, [error_case()]),
        stage("greedy", Status.FAIL, [greedy], check=TOKENS),
        stage("cache-scaling", Status.PASS, [cost], check=SCALING),
    ]
    return run(stages, seed=7, **fields)


def stage_spec(stage_id: str = "prove-one-layer", inputs=("seq",), cases=None, **fields) -> StageSpec:
    """A stage as the loader would give it (its file is not read: tests of what uses a spec need none)."""
    cases = (CaseSpec("one", {"seq": [464, 3797]}),) if cases is None else tuple(cases)
    values = dict(
        title=stage_id.replace("-", " ").capitalize(),
        order=1,
        lesson=Path("lessons") / f"{stage_id}.md",
        adapter="run_" + stage_id.replace("-", "_"),
        aliases=(),
        oracle="layer0-attn-sublayer",
        check=ROWS,
        timeout=30.0,
        points=10.0,
        credit="all-or-nothing",
        hints={},
        source=Path("stages") / f"{stage_id}.toml",
    )
    values.update(fields)
    return StageSpec(id=stage_id, inputs=tuple(inputs), cases=cases, **values)


def replace(obj, **fields):
    return dataclasses.replace(obj, **fields)


def check_snapshot(name: str, text: str) -> None:
    """text equals the snapshot; UPDATE_SNAPSHOTS=1 (re)writes it instead (then read the diff before committing).

    A missing snapshot fails rather than being written silently: a renamed test must not pass vacuously."""
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOTS"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path.name}: run with UPDATE_SNAPSHOTS=1 to write it, then read it"
    assert text == path.read_text(), f"{path.name} differs: if the change is intended, rerun with UPDATE_SNAPSHOTS=1"
