"""Batch bookkeeping: shards record I/N and the batch they slice; merge refuses a missing or repeated
shard by name; `grade merge --replace` regrades students and keeps each row's record."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from conftest import write_adapters
from theinference.cli.app import app
from test_batch import BROKEN, PASSING, read_csv

COMMON = ["--stage", "prove-one-layer", "--timeout", "5", "--memory-limit", "1024"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_path):
    """A class of three (hank's code does not parse) graded in two shards, as CSV (once for the module)."""
    root = tmp_path_factory.mktemp("class")
    subs = root / "subs"
    for name, source in {"alice": PASSING, "bob": PASSING, "hank": BROKEN["syntax"]}.items():
        write_adapters(subs / name, source)
    parts = [root / f"grades-{i}.csv" for i in (1, 2)]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("THEINFERENCE_CACHE", str(root / "cache"))
        env.delenv("CI", raising=False)
        for i, part in enumerate(parts, 1):
            args = ["grade", *map(str, sorted(subs.iterdir())), *COMMON, "--weights", str(tiny_path)]
            result = CliRunner().invoke(app, [*args, "--shard", f"{i}/2", "--out", str(part)])
            assert result.exit_code == 0, result.output
    return subs, parts


def message(result) -> str:
    return " ".join(result.stderr.split())


@pytest.mark.slow
def test_shards_record_their_slice_and_merge_refuses_a_missing_or_repeated_one(cli, tmp_path, shards):
    _, (one, two) = shards
    rows = read_csv(one) + read_csv(two)
    assert {r["id"]: r["shard"] for r in rows} == {"alice": "1/2", "hank": "1/2", "bob": "2/2"}
    assert {(r["batch_submissions"], r["batch_ids"]) for r in rows} == {("3", rows[0]["batch_ids"])}
    assert rows[0]["batch_ids"].startswith("sha256:")

    missing = cli("grade", "merge", one, "--out", tmp_path / "m.csv")
    assert missing.exit_code == 2 and not (tmp_path / "m.csv").exists()
    assert "shard 2/2 of the batch of 3 submissions is missing" in message(missing)
    assert "--shard 2/2" in message(missing)

    again = tmp_path / "grades-1-again.csv"
    shutil.copy(one, again)
    repeated = cli("grade", "merge", one, again, two, "--out", tmp_path / "m.csv")
    assert repeated.exit_code == 2 and f"{again}: shard 1/2 already appears in another shard file ({one})" in message(
        repeated
    )

    merged = cli("grade", "merge", one, two, "--out", tmp_path / "all.csv")
    assert merged.exit_code == 0, merged.stderr
    assert [r["id"] for r in read_csv(tmp_path / "all.csv")] == ["alice", "bob", "hank"]


@pytest.mark.slow
def test_a_regrade_replaces_one_students_row_and_keeps_its_record(cli, tmp_path, tiny_path, shards):
    subs, parts = shards
    assert cli("grade", "merge", *parts, "--out", tmp_path / "grades.csv").exit_code == 0
    write_adapters(tmp_path / "late" / "hank", PASSING)  # hank fixed his syntax error (an accepted late fix)
    regrade = tmp_path / "regrade-hank.csv"
    assert cli("grade", tmp_path / "late" / "hank", *COMMON, "--weights", tiny_path, "--out", regrade).exit_code == 0

    refused = cli("grade", "merge", tmp_path / "grades.csv", regrade, "--out", tmp_path / "m.csv")
    assert refused.exit_code == 2 and "from another batch" in message(refused) and "--replace" in message(refused)

    replaced = cli("grade", "merge", "--replace", tmp_path / "grades.csv", regrade, "--out", tmp_path / "final.csv")
    assert replaced.exit_code == 0, replaced.stderr
    assert "replaced 1 submission(s) (hank)" in message(replaced)
    before = {r["id"]: r for r in read_csv(tmp_path / "grades.csv")}
    after = {r["id"]: r for r in read_csv(tmp_path / "final.csv")}
    assert (before["hank"]["status"], after["hank"]["status"]) == ("fail", "pass")
    # hank's row says it came from a run of its own; the others are untouched
    assert (after["hank"]["shard"], after["hank"]["batch_submissions"]) == ("1/1", "1")
    assert {k: after[k] for k in ("alice", "bob")} == {k: before[k] for k in ("alice", "bob")}

    stranger = tmp_path / "subs2" / "zoe"
    write_adapters(stranger, PASSING)
    extra = tmp_path / "zoe.csv"
    assert cli("grade", stranger, *COMMON, "--weights", tiny_path, "--out", extra).exit_code == 0
    unknown = cli("grade", "merge", "--replace", tmp_path / "grades.csv", extra, "--out", tmp_path / "m.csv")
    assert unknown.exit_code == 2 and "'zoe' is not in" in message(unknown)


@pytest.mark.slow
def test_json_shards_record_their_slice_too(cli, tmp_path, tiny_path, shards):
    subs, _ = shards
    out = tmp_path / "grades-2.json"
    cli(
        "grade",
        *sorted(subs.iterdir()),
        *COMMON,
        "--weights",
        tiny_path,
        "--shard",
        "2/2",
        "--format",
        "json",
        "--out",
        out,
    )
    doc = json.loads(out.read_text())
    assert [(s["id"], s["shard"], s["batch_submissions"]) for s in doc["submissions"]] == [("bob", "2/2", 3)]
    missing = cli("grade", "merge", out, "--out", tmp_path / "m.json")
    assert missing.exit_code == 2 and "shard 1/2 of the batch of 3 submissions is missing" in message(missing)
