"""Sentences the student reads are true where they are printed: adapter names as the edition writes them, the
weights each stage was graded on and the weights a run made, counts from one in prose, the cached path named only
after a stage that has one, the first line within the screen's width."""

import dataclasses
import json
import re
import shutil

import pytest

from theinference import __version__
from theinference.bundled import data_dir
from theinference.cli import early
from theinference.grading.tools.mutants import build_mutant, load_mutant
from theinference.grading.drive.progress import record_progress
from theinference.grading.judge.results import CaseResult, RunResult, StageResult
from theinference.grading.spec.checks import ScalingCheck, ScalingSpec, TokensCheck
from theinference.model.weights import Synthetic


def _listed_adapters(cli, course) -> dict[str, str]:
    result = cli("stages", "list", "--course", course)
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()]
    return {row[0]: row[-1] for row in rows[1:] if len(row) > 4}


def test_stages_list_and_show_name_the_adapter_as_each_edition_writes_it(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")  # the adapter column on each stage's own line
    assert cli("init", tmp_path / "py").exit_code == 0
    assert cli("init", tmp_path / "ts", "--edition", "ts").exit_code == 0
    python, typescript = _listed_adapters(cli, tmp_path / "py"), _listed_adapters(cli, tmp_path / "ts")
    assert python["forward"] == "run_forward" and python["per-step-identity"] == "run_per_step_logits"
    assert typescript["forward"] == "runForward" and typescript["per-step-identity"] == "runPerStepLogits"
    shown = cli("stages", "show", "per-step-identity", "--course", tmp_path / "ts").stdout
    assert "adapter runPerStepLogits()" in shown and "run_per_step_logits" not in shown.splitlines()[-1]


def _stage(id_: str, check) -> StageResult:
    case = CaseResult(name="generation", status="pass")
    return StageResult(
        id=id_, title=id_, status="pass", cases=[case], points=10, max_points=10, adapter="run_greedy",
        adapters_file="tests/adapters.py", lesson="x.md", check=check,
    )  # fmt: skip


def test_progress_records_cache_scaling_on_its_own_weights_not_the_graded_ones(tmp_path):
    run = RunResult(
        course=str(tmp_path), weights_path="/w/model.safetensors", weights_source="theinference.toml",
        weights_why="the course's", synthetic=Synthetic("tiny", "0"), config={}, stages=[],
    )  # fmt: skip
    stages = [
        _stage("greedy", TokensCheck(1e-4)),
        _stage("cache-scaling", ScalingCheck(1e-4, ScalingSpec((8, 480), 3, 3.0))),
    ]
    record_progress(tmp_path, dataclasses.replace(run, stages=stages))
    saved = json.loads((tmp_path / ".theinference" / "progress.json").read_text())["stages"]
    assert saved["greedy"]["weights"] == "tiny" and saved["cache-scaling"]["weights"] == "proof"


def test_every_report_names_how_the_students_processes_are_started_killed_and_counted(
    cli, solution_course, tiny_path, monkeypatch
):
    monkeypatch.setenv("THEINFERENCE_METER", "proc")  # what a machine without cgroups counts with
    monkeypatch.setenv("THEINFERENCE_KILL", "psutil")  # and one without a readable /proc kills with
    result = cli("test", "--course", solution_course, "--weights", tiny_path, "--stage", "forward")
    assert result.exit_code == 0, result.output
    header = " ".join(result.stdout.split("✔")[0].split())
    assert "kill: psutil: stopped, then killed" in header and "cpu: process tree (/proc)" in header
    doc = json.loads(cli("test", "--course", solution_course, "--weights", tiny_path, "--format", "json").stdout)
    assert doc["processes"]["cpu"] == "process tree (/proc)" and doc["processes"]["kill"].startswith("psutil")
    assert {"launcher", "spawn", "orphans", "grader-death", "limits", "memory", "hangs"} <= set(doc["processes"])


def _solved(cli, dest, edition: str = "python"):
    """A course made by `init` (its theinference.toml: tiny weights), its starter replaced by the reference solution."""
    assert cli("init", dest, "--edition", edition).exit_code == 0
    solution = data_dir("course") / ("ts/solution" if edition == "ts" else "solution")
    for part in ("src", "tests"):
        shutil.copytree(solution / part, dest / part, dirs_exist_ok=True)
    return dest


CACHED_PATH = "Matching outputs prove the cached path equals a recompute"


@pytest.mark.slow
def test_an_init_course_names_its_weights_and_says_cached_path_only_after_a_stage_with_one(cli, tmp_path):
    course = _solved(cli, tmp_path / "py")
    forward = cli("test", "--course", course, "--stage", "forward")
    assert forward.exit_code == 0, forward.output
    # The course's tiny weights were made by this run (the user cache is the test's own): named as what they are.
    assert "made the synthetic tiny weights (2 layers, n_embd 128" in forward.stderr, forward.stderr
    assert "GPT-2-shape" not in forward.output
    assert CACHED_PATH not in forward.stdout  # forward is the recompute itself: it has no cached path
    per_step = cli("test", "--course", course, "--stage", "per-step-identity")
    assert per_step.exit_code == 0 and CACHED_PATH in per_step.stdout
    assert "made the synthetic" not in per_step.stderr  # made once: the second run finds them


def _mismatch_rows(text: str) -> list[str]:
    return [line.split("|")[0].strip() for line in text.splitlines() if "◀ first mismatch" in line]


@pytest.mark.slow
def test_a_greedy_failure_counts_its_tokens_from_one_in_prose_and_table_alike(cli, tmp_path):
    course = _solved(cli, tmp_path / "py")
    mutant = load_mutant(data_dir("course") / "mutants" / "greedy-runner-up-once" / "manifest.toml")
    build_mutant(mutant, data_dir("course") / "solution", tmp_path / "mutant")
    shutil.copytree(tmp_path / "mutant" / "src", course / "src", dirs_exist_ok=True)
    result = cli("test", "--course", course, "--stage", "greedy")
    assert result.exit_code == 1, result.output
    # The loop picks the runner-up at its first decode step: the second token generated, the first one right.
    said = re.findall(r"token (\d+) of (\d+) differs", result.stdout)
    assert said and {n for n, _ in said} == {"2"}, result.stdout
    assert set(_mismatch_rows(result.stdout)) == {"2"}
    assert "step 2 generated" in result.stdout and "(step 2)" in result.stdout
    assert re.search(r"^  steps 1–\d+:$", result.stdout, re.M)  # the window's text: the table's own numbers
    assert CACHED_PATH not in result.stdout  # nothing passed


@pytest.mark.slow
def test_a_typescript_init_course_names_its_weights_and_its_forward_has_no_cached_path(cli, tmp_path):
    from theinference.proc.node import find_tsx, node_executable, strips_types

    node = node_executable()
    tsx = find_tsx(data_dir("course") / "ts")
    if node is None or (tsx is None and not strips_types(node)):
        pytest.skip("Node.js with tsx (or type stripping) is needed for the TypeScript edition")
    course = _solved(cli, tmp_path / "ts", "ts")
    if tsx is not None:
        (course / "node_modules").symlink_to(tsx.parents[2], target_is_directory=True)
    result = cli("test", "--course", course, "--stage", "forward")
    assert result.exit_code == 0, result.output
    assert "made the synthetic tiny weights" in result.stderr and "GPT-2-shape" not in result.output
    assert CACHED_PATH not in result.stdout


def test_the_first_line_at_80_columns_puts_a_long_course_path_whole_on_its_own_line(tmp_path, monkeypatch, capsys):
    course = tmp_path / ("a-course-directory-with-a-name-long-enough-to-push-the-first-line-past-80" + "-x" * 5)
    course.mkdir()
    (course / "theinference.toml").write_text("")
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(early, "shown", None)
    early.announce(["test", "--course", str(course)])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"theinference {__version__} grading", f"  {course.resolve()}"]
    monkeypatch.setenv("COLUMNS", "400")  # where it fits, one line as before
    early.announce(["test", "--course", str(course)])
    assert capsys.readouterr().out == f"theinference {__version__} grading {course.resolve()}\n"
