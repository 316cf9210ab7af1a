"""The terminal report at 80 columns says each thing once: snapshots of real runs through the CLI.

Run with UPDATE_SNAPSHOTS=1 to rewrite the snapshots after an intended change, then read the diff.
Only what follows the header is kept (the header names this machine's paths), with the course's
path, the seconds and float-roundoff-sized numbers replaced by placeholders.
"""

import dataclasses
import io
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from rich.console import Console

from theinference.bundled import data_dir
from theinference.cli import consoles
from theinference.cli import stages as stages_cli
from theinference.cli import test as test_cli
from theinference.cli.live import RunProgress
from theinference.grading.judge.events import CallStarted, CaseEnded, CaseStarted
from theinference.grading.tools.mutants import build_mutant, load_mutants
from theinference.grading.judge.results import CaseResult, StageResult, TokenStep
from theinference.report.terminal import render_stage
from theinference.grading.spec.checks import TokensCheck

from conftest import write_adapters
from test_report import SNAPSHOTS, assert_snapshot


@pytest.fixture
def narrow(monkeypatch):
    """`test` and `stages list` print at 80 columns, as on a narrow terminal."""

    def console(stream):
        return consoles.console_for(stream, width=80)  # off a terminal: plain, as at 80 columns without colour

    monkeypatch.setattr(test_cli, "console_for", console)
    monkeypatch.setattr(stages_cli, "console_for", console)


@pytest.fixture
def short_dir():
    """A course directory whose path has the same length on every machine (tracebacks name it)."""
    path = Path(tempfile.mkdtemp(prefix="ti", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[+-]\d+)?")


def _mask_row(line: str) -> str:
    """A table row with the numbers after its first three cells (row, position, token; step and tokens) masked."""
    cells = line.split(" | ")
    return " | ".join(cells[:3] + [_NUMBER.sub("#", c) for c in cells[3:]])


def _body(text: str, course: Path) -> str:
    """The report after its header, with what differs between machines and runs replaced: paths, seconds,
    and the numbers in tables, findings and error-by-position lines (their last digits depend on the BLAS; unit
    snapshots pin them)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line[:1] in "✘✔⏱·")
    masked = [_mask_row(line) if " | " in line else line for line in lines[start:]]
    body = "\n".join(masked) + "\n"
    body = body.replace(str(course), "<course>")
    body = re.sub(r"\d+\.\d s\b", "N s", body)
    body = re.sub(r"logit gap [\d.e+-]+", "logit gap #", body)
    body = re.sub(r"(error by position: )\S+", r"\1#", body)  # a position's band flips with the roundoff
    return re.sub(r"\b\d(\.\d+)?e-(0[5-9]|[1-9]\d)\b", "~0", body)


def assert_same_words(text: str, name: str) -> None:
    """Compare with the snapshot word for word: where a masked number's width moved a line break, it still matches
    (the width itself is asserted separately)."""
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOTS") or not path.exists():
        path.write_text(text)
    assert text.split() == path.read_text().split()


def _mutant(name: str, dest: Path) -> Path:
    mutant = next(m for m in load_mutants(data_dir("course") / "mutants") if m.name == name)
    return build_mutant(mutant, data_dir("course") / "solution", dest)


@pytest.mark.slow
def test_a_failing_per_step_identity_says_its_finding_once(cli, narrow, short_dir, tiny_path):
    course = _mutant("decode-wpe-off-by-one", short_dir / "bug")
    result = cli("test", "--course", course, "--weights", tiny_path, "--stage", "per-step-identity")
    assert result.exit_code == 1
    body = _body(result.stdout, course)
    assert_same_words(body, "short_per_step_identity_80.txt")
    assert body.count("finding: wpe-off-by-one") == 1 and body.count("hint: Position i uses wpe[i]") == 1
    assert body.count("shape: first-decode-row-off") == 3  # each failing case keeps its shape
    # The verdict came first; the finding was added once every verdict was out.
    assert body.index("✘ per-step-identity") < body.index("finding: wpe-off-by-one") < body.index("stage(s) passed")
    assert all(len(line) <= 80 for line in body.splitlines())
    # Tables and wrapped text end where their text does: no line is padded out to the width.
    assert all(line == line.rstrip() for line in result.stdout.splitlines())


@pytest.mark.slow
def test_an_error_in_every_stage_shows_one_traceback(cli, narrow, short_dir, tiny_path):
    course = short_dir / "broken"
    write_adapters(course, "import src.does_not_exist\n")
    result = cli("test", "--course", course, "--weights", tiny_path, "--all")
    assert result.exit_code == 1
    body = _body(result.stdout, course)
    assert_same_words(body, "short_error_every_stage_80.txt")
    assert body.count("Traceback (most recent call last)") == 1
    assert body.count("same error as forward (shown above)") == 6  # one line for each later stage
    assert len(body.splitlines()) < 40


@pytest.mark.slow
def test_wrong_tokens_in_cache_scaling_are_a_few_lines(cli, narrow, short_dir, tiny_path, proof_cache, monkeypatch):
    monkeypatch.setenv("THEINFERENCE_CACHE", str(proof_cache))
    events = []
    real = RunProgress.__call__
    monkeypatch.setattr(
        RunProgress,
        "__call__",
        lambda self, event: (isinstance(event, CASE_EVENTS) and events.append(_told(event))) or real(self, event),
    )
    course = _mutant("causal-mask-on-decode", short_dir / "bug")
    result = cli("test", "--course", course, "--weights", tiny_path, "--stage", "cache-scaling")
    assert result.exit_code == 1
    body = _body(result.stdout, course)
    assert_same_words(body, "wrong_tokens_cache_scaling_80.txt")
    assert "token-mismatch" in body and "the timing was not judged" in body and "pass the greedy stage first" in body
    assert "step | expected" not in body and len(body.splitlines()) < 20  # no token table, no 480-token texts
    assert all(len(line) <= 80 for line in body.splitlines())
    # The live line named the case, then the call the grader drove (the warm-up's tokens were already wrong).
    assert events == [("start", 0, ""), ("call", 0, "untimed warm-up: 8 new tokens"), ("done", 0, "")]


CASE_EVENTS = (CaseStarted, CallStarted, CaseEnded)


def _told(event) -> tuple[str, int, str]:
    """A case event as the live line reads it: start, call (with what the call is) or done."""
    kind = {CaseStarted: "start", CallStarted: "call", CaseEnded: "done"}[type(event)]
    return kind, event.index, getattr(event, "call", "")


def _greedy_case(steps: int, mismatch: int | None) -> CaseResult:
    expected = [(7 * k + 11) % 50000 for k in range(steps)]
    got = [t if mismatch is None or k < mismatch else t + 1 for k, t in enumerate(expected)]
    verdicts = [TokenStep(k, 8 + k, got[k], expected[k], 0.0, "match") for k in range(mismatch or steps)]
    if mismatch is not None:
        verdicts.append(TokenStep(mismatch, 8 + mismatch, got[mismatch], expected[mismatch], 2.5, "mismatch"))
    return CaseResult(
        name="generation",
        status="fail",
        message="token 101 of 224 differs" if mismatch is not None else "too slow",
        steps=verdicts,
        expected_tokens=expected,
        got_tokens=got,
        inputs={"prompt": [464] * 8, "n_new": steps},
    )


def test_a_long_wrong_generation_shows_only_the_steps_around_its_first_mismatch(narrow):
    right = dataclasses.replace(_greedy_case(224, None), name="another prompt", status="pass", message="")
    stage = StageResult(
        id="greedy",
        title="Greedy generation with the cache",
        status="fail",
        cases=[_greedy_case(224, 100), right],
        points=0,
        max_points=10,
        adapter="run_greedy",
        adapters_file="tests/adapters.py",
        lesson="",
        check=TokensCheck(1e-4),
    )
    buffer = io.StringIO()
    render_stage(Console(file=buffer, width=80, no_color=True, highlight=False), stage, 50257)
    text = buffer.getvalue()
    assert_snapshot(text, "wrong_tokens_80.txt")
    assert len(text.splitlines()) < 25  # not 224 rows and two 224-token texts
    # Counted from one as the message counts: the 101st token is marked, three rows above it the 98th.
    assert "97 steps above" in text and text.split("◀")[0].splitlines()[-4].startswith("98 ")
    assert text.split("◀")[0].splitlines()[-1].startswith("101 ")
    assert "97 steps above" in text and "120 steps below" in text
    assert text.count("step | expected") == 1  # the other case's tokens all match: no table for it


def test_stages_list_reads_whole_at_80_columns(cli, narrow, solution_course):
    progress = solution_course / ".theinference" / "progress.json"
    progress.parent.mkdir()
    entries = {"forward": {"status": "pass", "at": "2026-01-01T00:00:00", "weights": "tiny", "timeout": 30.0}}
    progress.write_text(json.dumps({"format_version": 1, "stages": entries}))
    result = cli("stages", "list", "--course", solution_course)
    assert result.exit_code == 0
    assert_snapshot(result.stdout, "stages_list_80.txt")
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines) and len(lines) <= 1 + 3 * 7
    ids = ("forward", "single-step-attention", "prove-one-layer", "decode-step", "per-step-identity", "greedy")
    assert all(any(line.startswith(stage_id + " ") for line in lines) for stage_id in ids)  # never cut
    assert (
        "pass (tiny weights, --timeout 30) ◀" not in result.stdout and "pass (tiny weights, --timeout 30)" in lines[1]
    )
