"""Batch grading, shards, and the hygiene of student processes (limits, secrets, the oracle guard)."""

import csv
import json
import shutil
import time
from pathlib import Path

import pytest

from conftest import slowdown, write_adapters
from test_runner import SOLUTION_IMPORTS

PASSING = SOLUTION_IMPORTS + "def run_layer_equiv(seq_ids):\n    return _solve(seq_ids)\n"
BROKEN = {
    "hang": "import time\ndef run_layer_equiv(seq_ids):\n    time.sleep(600)\n",
    "crash": "import os, signal\ndef run_layer_equiv(seq_ids):\n    os.kill(os.getpid(), signal.SIGSEGV)\n",
    "memory-hog": "def run_layer_equiv(seq_ids):\n    hog = bytearray(8 * 2**30)\n    return hog\n",
    "syntax": "def run_layer_equiv(seq_ids)\n    return 1\n",
}


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def batch(tmp_path):
    root = tmp_path / "submissions"
    for name, source in {**BROKEN, "pass-a": PASSING, "pass-b": PASSING}.items():
        write_adapters(root / name, source)
    return root


@pytest.mark.slow
def test_batch_of_six_records_every_outcome_and_goes_on(cli, batch, tiny_path, tmp_path):
    out = tmp_path / "grades.csv"
    # Passing submissions must start (a fresh sandboxed interpreter each) and pass within the timeout: it and
    # the batch's expected length scale with the machine's load, measured now.
    factor = slowdown()
    timeout = round(2 * factor, 1)
    started = time.monotonic()
    result = cli(
        "grade",
        *sorted(batch.iterdir()),
        "--stage",
        "prove-one-layer",
        "--weights",
        tiny_path,
        "--timeout",
        timeout,
        "--memory-limit",
        "1024",
        "--jobs",
        "2",
        "--out",
        out,
    )
    elapsed = time.monotonic() - started
    assert result.exit_code == 0, result.stderr
    rows = {r["id"]: r for r in read_csv(out)}
    assert list(rows) == sorted(rows) and len(rows) == 6
    status = {k: r["prove-one-layer.status"] for k, r in rows.items()}
    assert status == {
        "crash": "crash",
        "hang": "timeout",
        "memory-hog": "error",
        "pass-a": "pass",
        "pass-b": "pass",
        "syntax": "error",
    }
    assert rows["pass-a"]["points"] == "10" and rows["hang"]["points"] == "0"
    # The hanging submission costs a timeout or two (then its other cases are skipped); the others run alongside.
    assert elapsed < 4 * timeout + 15 * factor
    assert "graded 6 of 6 submissions" in result.stderr


def test_memory_hog_gets_a_clear_message(cli, batch, tiny_path, tmp_path):
    out = tmp_path / "grades.json"
    cli(
        "grade",
        batch / "memory-hog",
        "--stage",
        "prove-one-layer",
        "--weights",
        tiny_path,
        "--memory-limit",
        "1024",
        "--format",
        "json",
        "--out",
        out,
    )
    doc = json.loads(out.read_text())
    case = doc["submissions"][0]["results"]["stages"][0]["cases"][0]
    assert case["status"] == "error" and case["message"].startswith("out of memory")


def test_unloadable_submission_is_a_row_not_an_abort(cli, batch, tiny_path, tmp_path):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "grades.csv"
    result = cli(
        "grade",
        tmp_path / "empty",
        batch / "pass-a",
        "--stage",
        "prove-one-layer",
        "--weights",
        tiny_path,
        "--out",
        out,
    )
    rows = {r["id"]: r for r in read_csv(out)}
    assert result.exit_code == 0
    assert rows["empty"]["status"] == "error" and "adapters file not found" in rows["empty"]["error"]
    assert rows["pass-a"]["status"] == "pass"


@pytest.mark.slow
def test_shards_merged_equal_the_unsharded_result(cli, batch, tiny_path, tmp_path):
    subs = sorted(p for p in batch.iterdir() if p.name != "hang")
    common = ["--stage", "prove-one-layer", "--weights", tiny_path, "--timeout", "5", "--memory-limit", "1024"]
    assert cli("grade", *subs, *common, "--out", tmp_path / "all.csv").exit_code == 0
    parts = []
    for i in (1, 2, 3):
        parts.append(tmp_path / f"shard{i}.csv")
        assert cli("grade", *subs, *common, "--shard", f"{i}/3", "--out", parts[-1]).exit_code == 0
    assert sum(len(read_csv(p)) for p in parts) == len(subs)
    assert cli("grade", "merge", *parts, "--out", tmp_path / "merged.csv").exit_code == 0

    def without_time(rows):
        return [{k: v for k, v in r.items() if k not in ("seconds", "shard")} for r in rows]  # each row keeps its slice

    assert without_time(read_csv(tmp_path / "merged.csv")) == without_time(read_csv(tmp_path / "all.csv"))
    clash = cli("grade", "merge", parts[0], parts[0], "--out", tmp_path / "bad.csv")
    assert clash.exit_code == 2 and "already appears in another shard" in clash.stderr
    assert cli("grade", *subs, "--shard", "4/3", "--weights", tiny_path).exit_code == 2


def test_csv_is_written_incrementally(tmp_path):
    from theinference.grading.drive.batch import GradedWith, SubmissionResult
    from theinference.grading.drive.gradesheet import CsvWriter
    from theinference.grading.spec.stages import load_stages, stage_dirs

    out = tmp_path / "grades.csv"
    writer = CsvWriter(out, load_stages(stage_dirs(None))[:1], GradedWith("0", "sha256:0", "sha256:0", None))
    writer.add(SubmissionResult("zed", "/x", None, error="adapters file not found", seconds=0.1))
    # Before the batch finishes, the row is already on disk.
    assert [r["id"] for r in read_csv(out)] == ["zed"]


def test_adapters_may_not_import_the_oracle(cli, tmp_path, tiny_path):
    write_adapters(
        tmp_path / "c",
        "from theinference.model import gpt2 as oracle\n\ndef run_layer_equiv(seq_ids):\n    return oracle.layer0_attn_sublayer\n",
    )
    result = cli(
        "test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", "prove-one-layer", "--format", "json"
    )
    case = json.loads(result.stdout)["stages"][0]["cases"][0]
    assert result.exit_code == 1 and case["status"] == "error"
    assert "adapters may not use the grader's oracle" in case["message"]


def test_secrets_are_kept_from_students_in_ci(cli, tmp_path, tiny_path, monkeypatch):
    source = SOLUTION_IMPORTS + (
        "import os\n"
        "def run_layer_equiv(seq_ids):\n"
        "    leaked = [k for k in ('MY_API_TOKEN', 'DEPLOY_KEY', 'DB_PASSWORD', 'AWS_SECRET_ACCESS_KEY', 'HARMLESS_SETTING') if k in os.environ]\n"
        "    assert not leaked, f'leaked {leaked}'\n"
        "    return _solve(seq_ids)\n"
    )
    write_adapters(tmp_path / "c", source)
    for name in ("MY_API_TOKEN", "DEPLOY_KEY", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "s3cr3t")
    monkeypatch.setenv("HARMLESS_SETTING", "ok")
    monkeypatch.setenv("CI", "true")
    ok = cli("test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", "prove-one-layer")
    assert ok.exit_code == 0, ok.stdout
    monkeypatch.setenv("CI", "false")
    leaked = cli("test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", "prove-one-layer")
    assert leaked.exit_code == 1 and "leaked" in leaked.stdout


def break_source(course: Path) -> int:
    """Give course's src/kvcache.py a syntax error; return its line."""
    path = course / "src" / "kvcache.py"
    lines = path.read_text().splitlines()
    lines.append("def unfinished(")
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


TWO_STAGES = ["--stage", "prove-one-layer", "--stage", "per-step-identity"]


def test_csv_error_column_and_an_empty_submission_out_of_the_full_points(cli, solution_course, tmp_path, tiny_path):
    subs = tmp_path / "subs"
    shutil.copytree(solution_course, subs / "broken")
    shutil.copytree(solution_course, subs / "good")
    (subs / "empty").mkdir()
    line = break_source(subs / "broken")
    out = tmp_path / "grades.csv"
    result = cli("grade", *sorted(subs.iterdir()), *TWO_STAGES, "--weights", tiny_path, "--out", out)
    assert result.exit_code == 0, result.stderr
    rows = {r["id"]: r for r in read_csv(out)}
    # Both stages fail on the one error: the column says it once, for both, at the student's path.
    assert rows["broken"]["error"] == f"prove-one-layer, per-step-identity: syntax error in src/kvcache.py, line {line}"
    assert rows["good"]["error"] == ""
    assert rows["empty"]["points"] == "0" and rows["empty"]["max_points"] == rows["good"]["max_points"] != "0"
    assert "tests/adapters.py: adapters file not found" in rows["empty"]["error"]


def test_json_format_writes_grades_json_and_records_what_it_graded_with(cli, batch, tiny_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    result = cli(
        "grade",
        batch / "pass-a",
        tmp_path / "empty",
        "--stage",
        "prove-one-layer",
        "--weights",
        tiny_path,
        "--format",
        "json",
    )
    assert result.exit_code == 0 and "into grades.json" in result.stderr
    assert not (tmp_path / "grades.csv").exists()
    doc = json.loads((tmp_path / "grades.json").read_text())
    assert doc["stages"] == ["prove-one-layer"] and doc["graded_with"]["weights"].startswith("sha256:")
    assert "tiny preset, seed 0" in doc["graded_with"]["weights"]
    subs = {s["id"]: s for s in doc["submissions"]}
    assert subs["empty"]["max_points"] == subs["pass-a"]["max_points"] == subs["pass-a"]["results"]["max_points"] > 0


def test_progress_goes_to_stderr_a_line_per_submission(cli, batch, tiny_path, tmp_path):
    result = cli(
        "grade",
        batch / "pass-a",
        batch / "syntax",
        "--stage",
        "prove-one-layer",
        "--weights",
        tiny_path,
        "--out",
        tmp_path / "g.csv",
    )
    lines = result.stderr.splitlines()
    warmed = next(i for i, line in enumerate(lines) if line.startswith("oracle outputs for prove-one-layer: "))
    graded = [i for i, line in enumerate(lines) if line.startswith(("[1/2] ", "[2/2] "))]
    assert len(graded) == 2 and warmed < min(graded)
    assert any(line.startswith("[") and "syntax: fail 0/" in line for line in lines)
    assert result.stdout == ""


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_merge_reads_both_formats_and_refuses_other_weights(cli, batch, tiny_path, tmp_path, fmt):
    from theinference.model.synth import write_synthetic

    write_synthetic(tmp_path / "seed1", preset="tiny", seed=1)
    subs = [batch / "pass-a", batch / "pass-b", batch / "syntax"]
    common = ["--stage", "prove-one-layer", "--format", fmt]
    parts = [tmp_path / f"shard{i}.{fmt}" for i in (1, 2)]
    for i, part in enumerate(parts, 1):
        assert cli("grade", *subs, *common, "--weights", tiny_path, "--shard", f"{i}/2", "--out", part).exit_code == 0
    merged = cli("grade", "merge", *parts, "--out", tmp_path / f"all.{fmt}")
    assert merged.exit_code == 0, merged.stderr
    if fmt == "json":
        ids = [s["id"] for s in json.loads((tmp_path / "all.json").read_text())["submissions"]]
    else:
        ids = [r["id"] for r in read_csv(tmp_path / "all.csv")]
    assert ids == ["pass-a", "pass-b", "syntax"]

    other = tmp_path / f"other.{fmt}"
    assert (
        cli(
            "grade",
            *subs,
            *common,
            "--weights",
            tmp_path / "seed1" / "model.safetensors",
            "--shard",
            "2/2",
            "--out",
            other,
        ).exit_code
        == 0
    )
    refused = cli("grade", "merge", parts[0], other, "--out", tmp_path / f"bad.{fmt}")
    assert refused.exit_code == 2 and not (tmp_path / f"bad.{fmt}").exists()
    message = " ".join(refused.stderr.split())
    assert "graded with weights" in message and "seed 1" in message and "seed 0" in message


def test_merge_refuses_mixed_formats_other_stages_and_has_its_own_help(cli, batch, tiny_path, tmp_path):
    sub = batch / "pass-a"
    csv_a, csv_b, doc = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "a.json"
    assert cli("grade", sub, "--stage", "prove-one-layer", "--weights", tiny_path, "--out", csv_a).exit_code == 0
    assert cli("grade", batch / "pass-b", "--stage", "greedy", "--weights", tiny_path, "--out", csv_b).exit_code == 0
    assert (
        cli(
            "grade", sub, "--stage", "prove-one-layer", "--weights", tiny_path, "--format", "json", "--out", doc
        ).exit_code
        == 0
    )
    stages = cli("grade", "merge", csv_a, csv_b, "--out", tmp_path / "m.csv")
    assert stages.exit_code == 2 and "graded on stages greedy, but" in " ".join(stages.stderr.split())
    mixed = cli("grade", "merge", csv_a, doc, "--out", tmp_path / "m.csv")
    assert mixed.exit_code == 2 and "mix CSV and JSON" in mixed.stderr
    helped = cli("grade", "merge", "--help")
    assert helped.exit_code == 0 and "grade merge" in helped.stdout and "SHARD" in helped.stdout
    assert "SUBMISSION_DIR" not in helped.stdout


@pytest.mark.parametrize(
    "text",
    [
        '{"schema": "theinference.batch", "stages": 5, "submissions": []}',
        '{"schema": "theinference.batch", "stages": [1, 2], "submissions": []}',
        '{"schema": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ],
    ids=["stages-not-a-list", "stages-not-ids", "nested-too-deep"],
)
def test_merge_refuses_a_malformed_json_shard_with_a_message(cli, tmp_path, text):
    shard = tmp_path / "bad.json"
    shard.write_text(text)
    result = cli("grade", "merge", shard, "--out", tmp_path / "m.json")
    assert result.exit_code == 2 and "bad.json" in result.stderr and not (tmp_path / "m.json").exists()


def test_csv_cells_never_start_a_spreadsheet_formula(cli, tiny_path, tmp_path):
    root = tmp_path / "submissions"
    write_adapters(root / "=HYPERLINK(1)", "raise ValueError('=1+1')\n")
    out = tmp_path / "grades.csv"
    assert (
        cli(
            "grade", root / "=HYPERLINK(1)", "--stage", "prove-one-layer", "--out", out, "--weights", tiny_path
        ).exit_code
        == 0
    )
    [row] = read_csv(out)
    assert row["id"] == "'=HYPERLINK(1)" and row["status"] == "fail"
    assert not any(cell.startswith(("=", "+", "-", "@")) for cell in row.values())
    assert "=1+1" in row["error"]


@pytest.mark.parametrize("fmt", ["csv", "json", "gradescope"])
def test_grade_and_merge_refuse_an_out_in_a_missing_directory_before_grading(cli, batch, tiny_path, tmp_path, fmt):
    out = tmp_path / "missing" / "grades.out"
    graded = cli(
        "grade", batch / "pass-a", "--stage", "prove-one-layer", "--format", fmt, "--weights", tiny_path, "--out", out
    )
    assert graded.exit_code == 2 and "missing" in graded.stderr and "[1/1]" not in graded.stderr
    if fmt == "csv":
        shard = tmp_path / "shard.csv"
        assert (
            cli(
                "grade", batch / "pass-a", "--stage", "prove-one-layer", "--weights", tiny_path, "--out", shard
            ).exit_code
            == 0
        )
        merged = cli("grade", "merge", shard, "--out", tmp_path / "missing" / "all.csv")
        assert merged.exit_code == 2 and "missing" in merged.stderr


def test_grade_refuses_an_out_that_is_a_directory_before_grading(cli, batch, tiny_path, tmp_path):
    out = tmp_path / "grades.csv"
    out.mkdir()
    graded = cli("grade", batch / "pass-a", "--stage", "prove-one-layer", "--weights", tiny_path, "--out", out)
    assert graded.exit_code == 2 and "is a directory" in graded.stderr and "[1/1]" not in graded.stderr


def test_a_nan_row_is_said_to_hold_nan_not_to_be_outside_the_tolerance(cli, tmp_path, tiny_path):
    course = write_adapters(tmp_path / "nan", PASSING + "\n_real = run_layer_equiv\n").parent.parent
    adapters = course / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text() + "def run_layer_equiv(seq_ids):\n    return _real(seq_ids) * np.nan\n")
    out = tmp_path / "grades.csv"
    result = cli("grade", course, "--stage", "prove-one-layer", "--weights", tiny_path, "--out", out)
    assert result.exit_code == 0, result.stderr
    [row] = read_csv(out)
    assert row["prove-one-layer.status"] == "fail"
    assert "rows hold NaN or infinity" in row["reason"] and "outside atol" not in row["reason"], row["reason"]


def test_a_too_slow_cache_is_its_own_column_and_field_not_just_a_fail(solution_course, tiny_path):
    import dataclasses

    from theinference.grading.drive.batch import SubmissionResult, graded_with
    from theinference.grading.drive.gradesheet import csv_header, csv_row
    from theinference.grading.drive.grader import Grader
    from theinference.grading.drive.plan import plan_run
    from theinference.grading.drive.session import select_stages
    from theinference.grading.judge.results import Diagnosis
    from theinference.report.jsonout import batch_document

    plan = plan_run(solution_course, weights=str(tiny_path))
    choice, model, _ = plan.load_weights()
    with Grader(weights=choice, model=model, launcher=plan.launcher(), cache=plan.oracle_cache(), plan=plan) as g:
        stages = select_stages(plan.stages(), ["forward", "prove-one-layer"])
        run = g.grade(plan.course, stages)
    # What cache-scaling says of a flat but slow cache (judge/scaling.py), put on the second stage's verdict.
    slow = Diagnosis(shape="too-slow", summary="slow", hint="")
    forward, layer = run.stages
    case = dataclasses.replace(layer.cases[0], status="fail", diagnosis=slow)
    layer = dataclasses.replace(layer, status="fail", points=0.0, cases=[case, *layer.cases[1:]])
    result = SubmissionResult("slow", str(solution_course), dataclasses.replace(run, stages=[forward, layer]))
    graded = graded_with(model, stages, None)
    row = dict(zip(csv_header(stages), csv_row(result, stages, graded)))
    assert row["too_slow"] == "prove-one-layer" and row["prove-one-layer.status"] == "fail"
    passed = SubmissionResult("ok", str(solution_course), run)
    assert dict(zip(csv_header(stages), csv_row(passed, stages, graded)))["too_slow"] == ""
    [doc] = batch_document([result], stages, graded)["submissions"]
    assert doc["too_slow"] == ["prove-one-layer"] and doc["regrade"] == []


def test_grade_refuses_a_directory_that_is_not_there(cli, batch, tiny_path, tmp_path):
    out = tmp_path / "grades.csv"
    result = cli("grade", batch / "pass-a", tmp_path / "pass-b-typo", "--weights", tiny_path, "--out", out)
    assert result.exit_code == 2
    assert "no such directory" in result.stderr and "pass-b-typo" in result.stderr
    assert not out.exists()
