"""Copies across the shards of a batch: `grade merge` finds, from the fingerprints each shard row carries (no
source), the pairs graded in different shards, and shows them in the merged CSV, JSON and HTML report as one
batch would."""

import csv
import json
from pathlib import Path

import pytest

from test_copies import DISGUISES, disguised, independent
from theinference.grading.drive.copies import Print, code_prints, decode_prints, encode_prints, read_code

STAGE = ("--stage", "prove-one-layer")


def _rows(path: Path) -> dict[str, dict]:
    with path.open(newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def class_dirs(tmp_path_factory) -> list[Path]:
    """alice and bob (a disguised copy of alice) fall in different shards of two (every second id); carol and dave
    are independent solutions."""
    root = tmp_path_factory.mktemp("class")
    alice = independent("independent-a", root / "alice")
    disguised(alice, root / "bob", DISGUISES["all-at-once"][:4])
    independent("independent-b", root / "carol")
    independent("independent-c", root / "dave")
    return sorted(root.iterdir())


def test_fingerprints_read_back_as_written_and_carry_no_source(class_dirs):
    found = code_prints(read_code(class_dirs[0]))
    text = encode_prints(found)
    assert decode_prints(text) == found and "\n" not in text
    source = (class_dirs[0] / "src" / "kvcache.py").read_text()
    assert not any(line.strip() in text for line in source.splitlines() if len(line.strip()) > 12)
    for damaged in ("", "tp9:AAAA", "tp1:not base64!", "tp1:" + text[4:40]):
        with pytest.raises(ValueError):
            decode_prints(damaged)
    assert decode_prints(encode_prints({7: Print("a.py", (1, 2))})) == {7: Print("a.py", (1, 2))}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_a_pair_in_different_shards_is_flagged_when_merged_as_in_one_batch(cli, class_dirs, tiny_path, tmp_path, fmt):
    common = [*STAGE, "--weights", tiny_path, "--format", fmt]
    whole = tmp_path / f"all.{fmt}"
    assert cli("grade", *class_dirs, *common, "--out", whole).exit_code == 0
    parts = [tmp_path / f"shard{i}.{fmt}" for i in (1, 2)]
    for i, part in enumerate(parts, 1):
        assert cli("grade", *class_dirs, *common, "--shard", f"{i}/2", "--out", part).exit_code == 0
    merged = tmp_path / f"merged.{fmt}"
    done = cli("grade", "merge", *parts, "--out", merged)
    assert done.exit_code == 0, done.stderr
    assert "carry no fingerprints" not in done.stderr
    if fmt == "csv":
        shard_one, rows, batch = _rows(parts[0]), _rows(merged), _rows(whole)
        assert "bob" not in shard_one["alice"]["copy_of"]  # alone, the shard holding alice has no bob to compare
        assert rows["alice"]["copy_of"].startswith("bob ") and rows["bob"]["copy_of"].startswith("alice ")
        assert {i: r["copy_of"] for i, r in rows.items()} == {i: r["copy_of"] for i, r in batch.items()}
        assert rows["carol"]["copy_of"] == rows["dave"]["copy_of"] == ""
        return
    subs = {s["id"]: s for s in json.loads(merged.read_text())["submissions"]}
    batch = {s["id"]: s for s in json.loads(whole.read_text())["submissions"]}
    [pair] = subs["alice"]["copy_of"]
    [same] = batch["alice"]["copy_of"]
    assert pair["of"] == "bob" and pair["similarity"] == same["similarity"] >= 0.5
    # The passages' lines as one batch found them; their text is not in the shard files (fingerprints only).
    assert [(r["file"], r["lines"], r["other_lines"]) for r in pair["regions"]] == [
        (r["file"], r["lines"], r["other_lines"]) for r in same["regions"]
    ]
    assert all(r["text"] == "" for r in pair["regions"]) and any(r["text"] for r in same["regions"])
    assert subs["carol"]["copy_of"] == subs["dave"]["copy_of"] == []
    report = tmp_path / "report.html"
    assert cli("report", merged, "--out", report).exit_code == 0
    page = report.read_text()
    assert 'data-submission="alice" data-of="bob"' in page and 'data-submission="bob" data-of="alice"' in page
    assert "the passages' text is not in the shard files" in page


@pytest.mark.slow
def test_shards_written_without_fingerprints_still_merge_and_say_what_was_not_compared(
    cli, class_dirs, tiny_path, tmp_path
):
    parts = [tmp_path / f"shard{i}.json" for i in (1, 2)]
    for i, part in enumerate(parts, 1):
        common = [*STAGE, "--weights", tiny_path, "--format", "json", "--shard", f"{i}/2", "--out", part]
        assert cli("grade", *class_dirs, *common).exit_code == 0
        doc = json.loads(part.read_text())
        for sub in doc["submissions"]:
            del sub["fingerprints"]  # as a theinference before shards carried them wrote it
        part.write_text(json.dumps(doc))
    done = cli("grade", "merge", *parts, "--out", tmp_path / "merged.json")
    assert done.exit_code == 0, done.stderr
    assert "4 row(s) carry no fingerprints" in done.stderr and "not looked for across shards" in done.stderr
    subs = {s["id"]: s for s in json.loads((tmp_path / "merged.json").read_text())["submissions"]}
    assert subs["alice"]["copy_of"] == []  # as its shard found it: bob was in the other one
    damaged = json.loads(parts[0].read_text())
    damaged["submissions"][0]["fingerprints"] = "tp1:AAAA"
    parts[0].write_text(json.dumps(damaged))
    refused = cli("grade", "merge", *parts, "--out", tmp_path / "bad.json")
    assert refused.exit_code == 2 and f"{parts[0]}: the row of 'alice': fingerprints: damaged fingerprints" in " ".join(
        refused.stderr.split()
    )


def test_a_large_submissions_fingerprints_are_read_back_from_a_csv_shard(tmp_path):
    """Past the csv module's default limit of 128 KiB a field: a course of 200 KB of code (a cell of 200 KB)."""
    from theinference.grading.drive.copies import CodeSnapshot
    from theinference.grading.tools.shards import read_csv_shard

    text = "\n".join(f"def f{i}(a, b):\n    return a * {i} + b.mean(axis={i % 3})" for i in range(4000))
    cell = encode_prints(code_prints(CodeSnapshot((("src/big.py", text),))))
    assert len(cell) > 131072
    shard = tmp_path / "shard.csv"
    with shard.open("w", newline="") as f:
        csv.writer(f).writerows([["id", "status", "fingerprints"], ["big", "pass", cell]])
    [(sub_id, _, row)] = read_csv_shard(shard).entries
    assert sub_id == "big" and decode_prints(row[2]) == decode_prints(cell)
