"""The terminal report at 80 columns says each thing once: snapshots of real runs through the CLI.

Run with UPDATE_SNAPSHOTS=1 to rewrite the snapshots after an intended change, then read the diff.
Only what follows the header is kept (the header names this machine's paths), with the course's
path, the seconds and float-roundoff-sized numbers replaced by placeholders.
"""

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from rich.console import Console

from theinference.bundled import data_dir
from theinference.cli import stages as stages_cli
from theinference.cli import test as test_cli
from theinference.grading.mutants import build_mutant, load_mutants

from conftest import write_adapters
from test_report import SNAPSHOTS, assert_snapshot


@pytest.fixture
def narrow(monkeypatch):
    """`test` and `stages list` print at 80 columns, as on a narrow terminal."""

    def console(stream):
        return Console(file=stream, width=80, no_color=True, highlight=False, soft_wrap=False)

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
    and the numbers in tables and findings (their last digits depend on the BLAS; unit snapshots pin them)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line[:1] in "✘✔⏱·")
    masked = [_mask_row(line) if " | " in line else line for line in lines[start:]]
    body = "\n".join(masked) + "\n"
    body = body.replace(str(course), "<course>")
    body = re.sub(r"\d+\.\d s\b", "N s", body)
    body = re.sub(r"logit gap [\d.e+-]+", "logit gap #", body)
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
    assert all(len(line) <= 80 for line in body.splitlines())


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
def test_a_wrong_token_greedy_shows_the_steps_around_the_first_mismatch(cli, narrow, short_dir, tiny_path):
    course = _mutant("greedy-feeds-first-token", short_dir / "greedy")
    result = cli("test", "--course", course, "--weights", tiny_path, "--stage", "greedy")
    assert result.exit_code == 1
    body = _body(result.stdout, course)
    assert_same_words(body, "short_greedy_80.txt")
    assert "◀ first mismatch" in body and "steps below" in body
    assert len(body.splitlines()) < 80  # not a row per generated token


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
