"""Batch grading, shards, and the hygiene of student processes (limits, secrets, the oracle guard)."""

import csv
import json
import time
from pathlib import Path

import pytest

from conftest import write_adapters
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


def test_batch_of_six_records_every_outcome_and_goes_on(cli, batch, tiny_path, tmp_path):
    out = tmp_path / "grades.csv"
    started = time.monotonic()
    result = cli("grade", *sorted(batch.iterdir()), "--stage", "prove-one-layer", "--weights", tiny_path,
                 "--timeout", "2", "--memory-limit", "1024", "--jobs", "2", "--out", out)
    elapsed = time.monotonic() - started
    assert result.exit_code == 0, result.stderr
    rows = {r["id"]: r for r in read_csv(out)}
    assert list(rows) == sorted(rows) and len(rows) == 6
    status = {k: r["prove-one-layer.status"] for k, r in rows.items()}
    assert status == {"crash": "crash", "hang": "timeout", "memory-hog": "error", "pass-a": "pass", "pass-b": "pass",
                      "syntax": "error"}
    assert rows["pass-a"]["points"] == "10" and rows["hang"]["points"] == "0"
    # Four cases time out at 2 s each for the hanging submission; the others run alongside.
    assert elapsed < 4 * 2 + 15
    assert "graded 6 of 6 submissions" in result.stderr


def test_memory_hog_gets_a_clear_message(cli, batch, tiny_path, tmp_path):
    out = tmp_path / "grades.json"
    cli("grade", batch / "memory-hog", "--stage", "prove-one-layer", "--weights", tiny_path, "--memory-limit", "1024",
        "--format", "json", "--out", out)
    doc = json.loads(out.read_text())
    case = doc["submissions"][0]["results"]["stages"][0]["cases"][0]
    assert case["status"] == "error" and case["message"].startswith("out of memory")


def test_unloadable_submission_is_a_row_not_an_abort(cli, batch, tiny_path, tmp_path):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "grades.csv"
    result = cli("grade", tmp_path / "empty", batch / "pass-a", "--stage", "prove-one-layer", "--weights", tiny_path, "--out", out)
    rows = {r["id"]: r for r in read_csv(out)}
    assert result.exit_code == 0
    assert rows["empty"]["status"] == "error" and "adapters file not found" in rows["empty"]["error"]
    assert rows["pass-a"]["status"] == "pass"


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
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    assert without_time(read_csv(tmp_path / "merged.csv")) == without_time(read_csv(tmp_path / "all.csv"))
    clash = cli("grade", "merge", parts[0], parts[0], "--out", tmp_path / "bad.csv")
    assert clash.exit_code == 2 and "already appears in another shard" in clash.stderr
    assert cli("grade", *subs, "--shard", "4/3", "--weights", tiny_path).exit_code == 2


def test_csv_is_written_incrementally(tmp_path):
    from theinference.grading.batch import CsvWriter, SubmissionResult

    out = tmp_path / "grades.csv"
    writer = CsvWriter(out, ["prove-one-layer"])
    writer.add(SubmissionResult("zed", "/x", None, error="adapters file not found", seconds=0.1))
    # Before the batch finishes, the row is already on disk.
    assert [r["id"] for r in read_csv(out)] == ["zed"]


def test_adapters_may_not_import_the_oracle(cli, tmp_path, tiny_path):
    write_adapters(tmp_path / "c", "from theinference.model import gpt2 as oracle\n\ndef run_layer_equiv(seq_ids):\n    return oracle.layer0_attn_sublayer\n")
    result = cli("test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", "prove-one-layer", "--format", "json")
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
