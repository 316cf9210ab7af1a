"""A failing report says each thing once and fits an 80-column screen: graded through the real CLI, off a
terminal and on one, and in watch mode, where the finding follows the verdicts without the report again."""

import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from theinference.bundled import data_dir
from theinference.grading.drive.plan import plan_run
from theinference.grading.drive.session import open_session
from theinference.grading.drive.watch import Watch
from theinference.grading.tools.mutants import build_mutant, load_mutant

WIDTH = 80
_CODE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_LABEL = re.compile(r"^( +)(finding|hint|known bugs): ")


@pytest.fixture
def short_dir():
    """A directory with a short path: the report prints the course's path whole on its first lines (a path
    folded in two cannot be copied), so a test of widths grades a course whose path fits in one."""
    path = Path(tempfile.mkdtemp(prefix="ti-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _mutant(name: str, dest: Path) -> Path:
    mutant = load_mutant(data_dir("course") / "mutants" / name / "manifest.toml")
    return build_mutant(mutant, data_dir("course") / "solution", dest / name)


def _command(course: Path, weights: Path, stage: str) -> list[str]:
    return [sys.executable, "-m", "theinference", "test", "--course", str(course), "--weights", str(weights),
            "--stage", stage]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": str(WIDTH), "LINES": "50"}


def _blocks(lines: list[str]) -> list[str]:
    """Each `finding:`, `hint:` and `known bugs:` block of a report, its continuation lines joined to it."""
    blocks: list[str] = []
    indent = None
    for line in lines:
        label = _LABEL.match(line)
        if label:
            blocks.append(line.strip())
            indent = len(label.group(0))
        elif indent is not None and line.startswith(" " * indent) and line.strip():
            blocks[-1] += " " + line.strip()
        else:
            indent = None
    return blocks


def _assert_once_and_narrow(lines: list[str], stage: str) -> None:
    # The header's path lines are kept whole, so that a path can be copied (the temp paths here are long).
    wide = [line for line in lines if len(line) > WIDTH and not line.startswith(("weights: ", "theinference "))]
    assert not wide, f"{len(wide)} lines wider than {WIDTH}, the first: {wide[0]!r}"
    said = Counter(_blocks(lines))
    assert said, "the report has no finding or hint to check"
    assert [b for b, n in said.items() if n > 1] == []
    assert sum(line.startswith(f"{stage}: matched against known bugs") for line in lines) <= 1


# (mutant, stage, what its report shows): a rows stage whose logits tables have the wide worst-element column,
# a tokens stage, and a stage with a finding whose cases' hints differ (once said twice).
SHAPES = [
    ("forward-no-causal-mask", "forward", "finding: mask-diagonal"),
    ("decode-position-stuck", "per-step-identity", "finding: position-stuck"),
    ("greedy-feeds-first-token", "greedy", "first mismatch"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, stage, shows", SHAPES, ids=[s[1] for s in SHAPES])
def test_a_failing_report_off_a_terminal_fits_80_columns_and_says_each_finding_once(
    short_dir, tiny_path, name, stage, shows
):
    course = _mutant(name, short_dir)
    done = subprocess.run(_command(course, tiny_path, stage), env=_env(), capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert any(shows in line for line in lines), done.stdout
    _assert_once_and_narrow(lines, stage)


def _run_on_a_terminal(command: list[str]) -> str:
    """command's output on a pseudo-terminal 80 columns wide, colour codes and cursor moves taken out."""
    import fcntl
    import struct
    import termios

    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, WIDTH, 0, 0))
    env = {k: v for k, v in _env().items() if k not in ("CI", "NO_COLOR")}
    child = subprocess.Popen(command, stdin=follower, stdout=follower, stderr=subprocess.DEVNULL, env=env)
    os.close(follower)
    out = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif child.poll() is not None:
            break
    child.wait()
    os.close(leader)
    return _CODE.sub("", out.decode("utf-8", "replace")).replace("\r", "")


@pytest.mark.slow
def test_a_failing_report_on_an_80_column_terminal_fits_and_says_its_finding_once(short_dir, tiny_path):
    course = _mutant("forward-no-causal-mask", short_dir)
    text = _run_on_a_terminal(_command(course, tiny_path, "forward"))
    lines = text.splitlines()
    assert any("finding: mask-diagonal" in line for line in lines), text
    _assert_once_and_narrow(lines, "forward")


@pytest.mark.slow
def test_a_watched_regrade_shows_its_report_and_finding_once(short_dir, tiny_path, capsys, monkeypatch):
    from theinference.cli.watch import render_regrade

    monkeypatch.setenv("COLUMNS", str(WIDTH))
    course = _mutant("forward-no-causal-mask", short_dir)
    session = open_session(plan_run(course, weights=str(tiny_path)))
    calls = []

    def show(report) -> None:
        calls.append(report.fingerprinting)
        render_regrade(report, course)

    try:
        Watch(session, ["forward"], show, on_fingerprint=show).regrade([])
    finally:
        session.close()
    assert calls == [True, False]  # the verdicts, then the finding
    lines = capsys.readouterr().out.splitlines()
    _assert_once_and_narrow(lines, "forward")
    once = ("theinference ", "✘ forward", "  case sentence: failed", "forward: matched against known bugs",
            "  finding: mask-diagonal", "0 of 1 stage(s) passed", "watching ")  # fmt: skip
    assert {start: sum(line.startswith(start) for line in lines) for start in once} == dict.fromkeys(once, 1)
    order = [next(i for i, line in enumerate(lines) if line.startswith(start)) for start in once]
    assert order == sorted(order)  # verdicts, finding, points, then how to go on


@pytest.mark.slow
def test_a_report_written_whole_says_a_finding_its_cases_share_once(short_dir, tiny_path):
    """`--output`: the report printed at once, fingerprinted, each case keeping its own hint."""
    course = _mutant("forward-no-causal-mask", short_dir)
    out = short_dir / "report.txt"
    done = subprocess.run([*_command(course, tiny_path, "forward"), "--output", str(out)], env=_env(), text=True)
    assert done.returncode == 1
    lines = out.read_text().splitlines()
    said = Counter(_blocks(lines))
    findings = [b for b in said if b.startswith("finding: mask-diagonal")]
    assert len(findings) == 1 and said[findings[0]] == 1
    assert [b for b, n in said.items() if n > 1] == []
    assert sum(b.startswith("hint: ") for b in said) == 2  # the two cases' shapes have different hints
