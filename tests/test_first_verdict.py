"""The first seconds of a run: the header before the student's code returns, verdicts before findings,
--no-diagnosis, and bug oracles computed once per `grade` batch."""

import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from theinference.bundled import data_dir
from theinference.grading import fingerprint
from theinference.grading.mutants import build_mutant, load_mutants
from theinference.grading.stages import load_stages, stage_dirs

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


def test_the_verdict_prints_before_the_finding_and_no_diagnosis_skips_it(cli, tmp_path, tiny_path, monkeypatch):
    course = _mutant("decode-wpe-off-by-one", tmp_path / "bug")
    shown = cli("test", "--course", course, "--weights", tiny_path, "--stage", "per-step-identity")
    assert shown.exit_code == 1
    out = shown.output
    assert out.index("✘ per-step-identity") < out.index("finding: wpe-off-by-one") < out.index("stage(s) passed")
    assert out.count("finding: wpe-off-by-one") == 1  # said once for the stage, not once per case
    assert out.count("shape: first-decode-row-off") == 3  # each failing case keeps its shape

    calls = []
    real = fingerprint.bug_output
    monkeypatch.setattr(fingerprint, "bug_output", lambda *a, **k: calls.append(a) or real(*a, **k))
    quiet = cli("test", "--course", course, "--weights", tiny_path, "--stage", "per-step-identity", "--no-diagnosis")
    assert quiet.exit_code == 1 and "✘ per-step-identity" in quiet.output
    assert "finding" not in quiet.output and "known bugs" not in quiet.output and calls == []


def test_an_error_repeated_in_every_stage_shows_one_traceback(cli, tmp_path, tiny_path):
    course = tmp_path / "broken"
    write_adapters(course, "import src.does_not_exist\n")
    result = cli("test", "--course", course, "--weights", tiny_path, "--all", "--format", "rich")
    assert result.exit_code == 1
    assert result.output.count("Traceback (most recent call last)") == 1
    assert result.output.count("same error as forward") >= 5


@pytest.mark.slow
def test_a_batch_computes_each_bug_oracle_once(cli, tmp_path, tiny_path, monkeypatch):
    subs = tmp_path / "subs"
    for name in ("alice", "bob"):
        _mutant("decode-wpe-off-by-one", subs / name)
    calls: list[str] = []
    real = fingerprint.bug_output
    monkeypatch.setattr(fingerprint, "bug_output", lambda bug, *a, **k: calls.append(bug.name) or real(bug, *a, **k))

    def grade(*ids: str) -> str:
        out = tmp_path / f"{'-'.join(ids)}.csv"
        result = cli(
            "grade", *(subs / i for i in ids), "--weights", tiny_path, "--stage", "per-step-identity", "--out", out
        )
        assert result.exit_code == 0
        return out.read_text()

    grade("alice")
    one = len(calls)
    assert "wpe-off-by-one" in calls  # the failing submission was fingerprinted
    stage = next(s for s in load_stages(stage_dirs(None, [])) if s.id == "per-step-identity")
    assert len(set(calls)) < len(stage.bugs)  # screening stopped at the exact match
    calls.clear()
    table = grade("alice", "bob")
    # The second failing submission with the same bug adds no bug-oracle forward to what one costs.
    assert len(calls) == one
    # A spreadsheet shows why each lost its points: the bug the grader named, and the first failing stage's reason.
    rows = list(csv.DictReader(io.StringIO(table)))
    assert [r["finding"] for r in rows] == ["per-step-identity: wpe-off-by-one"] * 2
    assert all(r["reason"].startswith("per-step-identity: case ") and "rows outside" in r["reason"] for r in rows)
    shutil.rmtree(subs)
