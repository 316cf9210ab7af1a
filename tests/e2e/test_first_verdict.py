"""The first seconds of a run: the header before the student's code returns, verdicts before findings,
--no-diagnosis, and bug oracles computed once per `grade` batch (80-column snapshots: test_short_report.py)."""

import ast
import csv
import io
import os
import subprocess
from collections import Counter
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer

from theinference import __version__
from theinference.bundled import data_dir
from theinference.cli import early
from theinference.cli.app import app
from theinference.cli.live import RunProgress
from theinference.grading.judge import bugmatch
from theinference.grading.judge.events import CaseEnded, CaseStarted
from theinference.grading.tools.mutants import build_mutant, load_mutants
from theinference.grading.drive.plan import plan_run
from theinference.grading.drive.session import open_session
from theinference.grading.spec.stages import load_stages, stage_dirs
from theinference.grading.drive.watch import Watch

from conftest import write_adapters


def _mutant(name: str, dest: Path) -> Path:
    mutant = next(m for m in load_mutants(data_dir("course") / "mutants") if m.name == name)
    return build_mutant(mutant, data_dir("course") / "solution", dest)


@pytest.mark.slow
def test_the_header_appears_before_the_adapter_returns(tmp_path, tiny_path):
    # The adapter blocks until the test lets it go: whatever the machine's load, its first call cannot
    # have returned when the header is read.
    gate = tmp_path / "gate"
    course = tmp_path / "course"
    write_adapters(
        course,
        f"""
        import os, time
        import theinference
        from src.gpt2 import forward, load_weights

        def run_forward(seq_ids):
            for _ in range(1200):  # 60 s at most, so a broken test cannot hang forever
                if os.path.exists({str(gate)!r}):
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError("the test never opened the gate: the report did not stream")
            params, n_head = load_weights(theinference.weights_path())
            return forward(params, seq_ids, n_head)
        """,
    )
    env = {**os.environ, "COLUMNS": "80", "THEINFERENCE_LAUNCHER": "subprocess"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "theinference",
            "test",
            "--course",
            course,
            "--weights",
            tiny_path,
            "--stage",
            "forward",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("theinference ") and "grading" in first
        assert not gate.exists() and proc.poll() is None  # the adapter is still waiting: nothing was graded yet
        gate.touch()
        rest = proc.stdout.read()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "✔ forward" in rest and "1 of 1 stage(s) passed" in rest
    if str(course) not in first:  # at 80 columns a long path goes whole on a line of its own, right after
        assert rest.splitlines()[0].strip() == str(course)
        rest = rest.split("\n", 1)[1]
    assert rest.startswith("weights: ")  # the rest of the header follows the early first line, which is not repeated
    assert (
        "grading" not in rest.splitlines()[0]
        and sum(line.startswith("theinference ") for line in rest.splitlines()) == 0
    )


# What the first line may cost: the standard library's os and sys (and re, which the executable's own script
# imports anyway), and the package's light modules. Nothing heavy: not numpy, rich, typer, typing or pathlib.
LIGHT = {"theinference", "theinference.cli", "theinference.cli.early", "theinference.cli.consoles"} | {
    "theinference.courseroot",
    "theinference.headline",
    "theinference.terminals",
    "theinference.untrusted",
}


@pytest.mark.parametrize("argv", [["test", "--stage", "forward"], ["test"], ["test", "--all"], ["test", "--watch"]])
def test_the_first_line_is_printed_before_anything_heavy_is_imported(tmp_path, argv):
    # What makes the first line quick on a busy machine: it needs neither numpy, rich nor the grader.
    course = tmp_path / "course"
    write_adapters(course, "def run_forward(seq_ids):\n    return None\n")
    probe = (
        "import re, sys; before = set(sys.modules); from theinference.cli import early; "
        f"early.announce({argv!r}); print(sorted(set(sys.modules) - before))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=course, capture_output=True, text=True, check=True).stdout
    first, imported = out.splitlines()
    assert first == f"theinference {__version__} grading {course.resolve()}"  # off a terminal: no colour codes
    added = set(ast.literal_eval(imported))  # a list of module names, printed by the probe
    heavy = {"numpy", "rich", "typer", "click", "typing", "pathlib", "tomllib", "theinference.grading"}
    assert not added & heavy and {m for m in added if m.startswith("theinference")} <= LIGHT


def test_on_a_terminal_the_first_line_is_styled_as_the_report_styles_it(tmp_path, monkeypatch, capsys):
    course = tmp_path / "course"
    write_adapters(course, "def run_forward(seq_ids):\n    return None\n")
    monkeypatch.chdir(course)
    monkeypatch.setattr(early, "shown", None)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    early.announce(["test"])
    styled = capsys.readouterr().out
    assert styled == f"\x1b[1mtheinference {__version__}\x1b[0m grading \x1b[36m{course.resolve()}\x1b[0m\n"
    monkeypatch.setenv("NO_COLOR", "1")
    early.announce(["test"])
    assert capsys.readouterr().out == f"theinference {__version__} grading {course.resolve()}\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["test", "--format", "json"],
        ["test", "--format=junit"],
        ["test", "--output", "report.txt"],
        ["test", "--watch", "--untrusted"],  # a usage error follows, not a report
        ["test", "--help"],
        ["test", "--stage"],  # a value option without its value: click says so, not this
        ["test", "--no-such-option"],
        ["stages", "list"],
        ["test", "--course", "no-such-dir"],
    ],
)
def test_the_early_line_stays_silent_unless_test_streams_its_report(tmp_path, monkeypatch, capsys, argv):
    write_adapters(tmp_path, "def run_forward(seq_ids):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(early, "shown", None)
    early.announce(argv)
    assert capsys.readouterr().out == "" and early.shown is None


def test_the_early_line_knows_every_option_of_test():
    # A value option it did not know would make it read the option's value as an option (or the reverse).
    command = typer.main.get_command(app).commands["test"]  # type: ignore[attr-defined]
    options = [o for p in command.params for o in p.opts if o.startswith("--")]
    takes_value = {o for p in command.params for o in p.opts if o.startswith("--") and not p.is_flag}
    assert takes_value == early.VALUE_OPTIONS
    assert set(options) - takes_value == early.FLAG_OPTIONS


@pytest.mark.slow
def test_no_diagnosis_computes_no_bug_oracle(cli, tmp_path, tiny_path, monkeypatch):
    course = _mutant("decode-wpe-off-by-one", tmp_path / "bug")
    calls = []
    real = bugmatch.bug_output
    monkeypatch.setattr(bugmatch, "bug_output", lambda *a, **k: calls.append(a) or real(*a, **k))
    quiet = cli("test", "--course", course, "--weights", tiny_path, "--stage", "per-step-identity", "--no-diagnosis")
    assert quiet.exit_code == 1 and "✘ per-step-identity" in quiet.output
    assert "shape: first-decode-row-off" in quiet.output  # the shape is no fingerprint: it stays
    assert "finding" not in quiet.output and "known bugs" not in quiet.output and calls == []


@pytest.mark.slow
def test_a_batch_computes_each_bug_oracle_once(cli, tmp_path, tiny_path, monkeypatch):
    subs = tmp_path / "subs"
    for name in ("alice", "bob", "carol"):
        _mutant("decode-wpe-off-by-one", subs / name)
    calls: Counter = Counter()
    real = bugmatch.bug_output

    def counted(bug, spec, oracle, model, inputs, history):
        calls[(bug.name, repr(inputs), repr(history))] += 1
        return real(bug, spec, oracle, model, inputs, history)

    monkeypatch.setattr(bugmatch, "bug_output", counted)
    out = tmp_path / "grades.csv"
    result = cli("grade", *sorted(subs.iterdir()), "--weights", tiny_path, "--stage", "per-step-identity", "--out", out)
    assert result.exit_code == 0
    # Three failing submissions with the same bug, graded two at a time: each bug output is computed once.
    assert calls and max(calls.values()) == 1
    assert ("wpe-off-by-one" in {name for name, _, _ in calls}) and len({n for n, _, _ in calls}) < len(_bugs())
    # A spreadsheet shows why each lost its points: the bug the grader named, and the first failing stage's reason.
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["finding"] for r in rows] == ["per-step-identity: wpe-off-by-one"] * 3
    assert all(r["reason"].startswith("per-step-identity: case ") and "rows outside" in r["reason"] for r in rows)


def _bugs() -> tuple[str, ...]:
    """The known bugs per-step-identity screens (the screening stops at the first exact match)."""
    return next(s for s in load_stages(stage_dirs(None, [])) if s.id == "per-step-identity").bugs


def test_off_a_terminal_the_live_line_names_the_running_case(capsys, monkeypatch):
    monkeypatch.setattr(RunProgress, "PLAIN_AFTER", 0.0)  # at once, not after 2 s: no test waits on the clock
    monkeypatch.setattr(RunProgress, "TICK", 0.01)
    progress = RunProgress()
    stage = SimpleNamespace(adapter="run_forward", cases=[SimpleNamespace(name="one"), SimpleNamespace(name="two")])
    progress(CaseStarted(stage, 1))
    said = ""
    for _ in range(2000):  # until the ticker has printed (20 s at most on a loaded machine)
        said += capsys.readouterr().err
        if "running" in said:
            break
        time.sleep(0.01)
    time.sleep(0.1)  # ten more ticks
    progress(CaseEnded(stage, 1))
    progress.close()
    said += capsys.readouterr().err
    assert "running run_forward: case 2 of 2 (two) · " in said
    assert said.count("running") == 1  # then every 30 s, not every tick


def test_watch_mode_tells_the_live_line_each_case_before_the_screen_is_redrawn(solution_course, tiny_path):
    # While the first grade runs (minutes on the gpt2 shape), the live line says which case is running.
    events: list = []
    session = open_session(plan_run(solution_course, weights=str(tiny_path)))
    try:
        Watch(
            session,
            ["forward"],
            lambda regrade: events.append(("screen", regrade.result.stages[0].status)),
            listen=lambda event: (
                isinstance(event, (CaseStarted, CaseEnded)) and events.append((type(event), event.index))
            ),
        ).regrade([])
    finally:
        session.close()
    cases = [(kind, i) for i in range(3) for kind in (CaseStarted, CaseEnded)]
    assert events == [*cases, ("screen", "pass")]
