"""Sentences the student reads are true where they are printed: adapter names as the edition writes them, the
weights each stage was graded on."""

import dataclasses
import json

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
