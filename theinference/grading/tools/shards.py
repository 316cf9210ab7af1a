"""Merging what `grade --shard I/N` runs wrote: CSV with CSV, JSON with JSON, and only shards graded alike.

Copies are looked for again over the merged rows, from the fingerprints each row carries (copies.py), so a pair
of submissions graded in different shards is flagged as if one batch had graded them both.
"""

import csv
import dataclasses
import json
from typing import Any
from dataclasses import dataclass
from pathlib import Path

from theinference.files import write_atomic
from theinference.grading.drive.copies import Copy, decode_prints, describe, pairs
from theinference.grading.drive.batch import (
    BATCH_SCHEMA,
    GRADED_WITH_COLUMNS,
    SHARD_COLUMNS,
    BatchError,
    parse_shard,
)
from theinference.grading.drive.gradesheet import (
    FINGERPRINTS,
    INTERRUPTED_MARK,
    check_output,
    spreadsheet_text,
    write_csv,
)

_FIELD_LIMIT = 64 * 1024 * 1024
_WORDS = {"theinference": "theinference version", "weights": "weights", "stage_files": "stage files", "seed": "--seed"}
_HOW = "merge only shards graded alike: the same theinference, --weights, --stages-dir, --stage and --seed"


@dataclass
class Shard:
    path: Path
    format: str  # csv | json
    stages: list[str]
    entries: list[tuple[str, dict, Any]]  # submission id, what it was graded with, its CSV row or JSON document
    head: Any  # the CSV header, or the JSON document without its submissions


def shard_format(path: Path) -> str:
    """'json' if the file holds a JSON document, else 'csv'."""
    with path.open(encoding="utf-8", errors="replace") as f:
        return "json" if f.read(64).lstrip().startswith("{") else "csv"


def _cell(value) -> str:
    return "" if value is None else str(value)


def read_csv_shard(path: Path) -> Shard:
    """A CSV that `grade` wrote; an interrupted one is refused."""
    # A row's fingerprints cell grows with the submission's code (a few KB each; the cap on what is read, 4 MiB of
    # source, makes a few MB): past the csv module's default field limit of 128 KiB.
    csv.field_size_limit(max(csv.field_size_limit(), _FIELD_LIMIT))
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise BatchError(f"{path}: not a CSV file that `theinference grade` wrote: {e}") from None
    if not rows:
        raise BatchError(f"{path}: empty file")
    if rows[0][:2] != ["id", "status"]:
        raise BatchError(f"{path}: not a CSV file that `theinference grade` wrote (its header is not id,status,...)")
    header, entries = rows[0], []
    for row in rows[1:]:
        if row and row[0].startswith(INTERRUPTED_MARK):
            raise BatchError(f"{path}: {row[0][len(INTERRUPTED_MARK) :].strip()}; grade that shard again")
        if row:
            record = dict(zip(header, row))
            entries.append((row[0], {k: record.get(k, "") for k in [*GRADED_WITH_COLUMNS, *SHARD_COLUMNS]}, row))
    stages = [c.removesuffix(".status") for c in header if c.endswith(".status") and c != "status"]
    return Shard(path, "csv", stages, entries, header)


def read_json_shard(path: Path) -> Shard:
    """A batch JSON document that `grade --format json` wrote; an interrupted one is refused."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # RecursionError: nested too deep
        raise BatchError(f"{path}: not a JSON document: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != BATCH_SCHEMA:
        raise BatchError(f"{path}: not the output of `theinference grade --format json` (schema {BATCH_SCHEMA!r})")
    if doc.get("interrupted"):
        raise BatchError(f"{path}: {doc['interrupted']}; grade that shard again")
    recorded = doc["graded_with"] if isinstance(doc.get("graded_with"), dict) else {}
    graded = {k: _cell(recorded.get(k)) for k in GRADED_WITH_COLUMNS}
    subs = doc.get("submissions")
    if not isinstance(subs, list) or not all(isinstance(s, dict) and isinstance(s.get("id"), str) for s in subs):
        raise BatchError(f"{path}: 'submissions' is not a list of submissions with an 'id'")
    stages = doc.get("stages", [])
    if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
        raise BatchError(f"{path}: 'stages' is not a list of stage ids")
    entries = [(s["id"], {**graded, **{k: _cell(s.get(k)) for k in SHARD_COLUMNS}}, s) for s in subs]
    return Shard(path, "json", stages, entries, {**doc, "submissions": []})


def _check_alike(shards: list[Shard]) -> None:
    """Refuse shards graded on other stages, or with another grader, weights, stage files or seed, naming which."""
    first = shards[0]
    for shard in shards[1:]:
        if shard.stages != first.stages:
            raise BatchError(
                f"{shard.path}: graded on stages {', '.join(shard.stages) or 'none'}, but {first.path} "
                f"on {', '.join(first.stages) or 'none'}; {_HOW}"
            )
        if shard.format == "csv" and shard.head != first.head:
            raise BatchError(f"{shard.path}: its columns differ from {first.path}'s (written by another theinference?)")
    records = [(shard.path, graded) for shard in shards for _, graded, _ in shard.entries]
    ref_path, ref = records[0] if records else (None, {})
    for path, graded in records[1:]:
        for key in GRADED_WITH_COLUMNS:
            if graded[key] != ref[key]:
                raise BatchError(
                    f"{path}: graded with {_WORDS[key]} {graded[key] or 'none'}, but {ref_path} "
                    f"with {ref[key] or 'none'}; {_HOW}"
                )


_REPLACE = "to regrade some students, `grade merge --replace GRADES REGRADED... --out FILE` replaces their rows"


def _check_complete(shards: list[Shard]) -> None:
    """Refuse shards of different batches, a slice given twice, or a missing one, naming it."""
    files: dict[str, list[Path]] = {}  # slice label -> the files holding rows of it
    batches: dict[tuple[str, str], Path] = {}
    for shard in shards:
        for sub_id, record, _ in shard.entries:
            if not record["shard"]:
                raise BatchError(
                    f"{shard.path}: the row of '{sub_id}' records no shard (written by another theinference?)"
                )
            batches.setdefault((record["batch_submissions"], record["batch_ids"]), shard.path)
            if shard.path not in files.setdefault(record["shard"], []):
                files[record["shard"]].append(shard.path)
    if len(batches) > 1:
        (size_a, ids_a), path_a = next(iter(batches.items()))
        (size_b, ids_b), path_b = list(batches.items())[1]
        raise BatchError(
            f"{path_b}: from another batch ({size_b} submissions, ids {ids_b}) than {path_a} "
            f"({size_a} submissions, ids {ids_a}): merge the shards of one `grade` run over the same submissions; "
            f"{_REPLACE}"
        )
    for label, paths in files.items():
        if len(paths) > 1 or sum(s.path == paths[0] for s in shards) > 1:
            raise BatchError(
                f"{paths[-1]}: shard {label} already appears in another shard file ({paths[0]}); give each shard once"
            )
    if not batches:
        return
    slices = {label: parse_shard(label) for label in files}
    counts = sorted({count for _, count in slices.values()})
    if len(counts) > 1:
        raise BatchError(f"the shards split the batch {' and '.join(f'{n} ways' for n in counts)}: merge one split")
    (size, _), count = next(iter(batches)), counts[0]
    # A slice is empty only when the batch has fewer submissions than slices: those have no rows to merge.
    missing = [f"{i}/{count}" for i in range(1, min(count, int(size)) + 1) if f"{i}/{count}" not in files]
    if missing:
        have = ", ".join(f"{label} ({paths[0]})" for label, paths in sorted(files.items()))
        raise BatchError(
            f"shard {', '.join(missing)} of the batch of {size} submissions is missing (given: {have}); "
            f"grade it with `theinference grade ... --shard {missing[0]}` and merge it too"
        )
    rows = sum(len(s.entries) for s in shards)
    if rows != int(size):
        raise BatchError(f"the shards hold {rows} submissions, but their batch has {size}: is a shard file cut short?")


def _output(fmt: str, out: Path | None) -> Path:
    out = out or Path(f"grades.{fmt}")
    other = {"csv": ".json", "json": ".csv"}[fmt]
    if out.suffix.lower() == other:
        raise BatchError(f"--out {out}: the shards are {fmt.upper()}; merge them into a .{fmt} file")
    return out


@dataclass(frozen=True)
class Merged:
    out: Path
    count: int  # submissions in it
    replaced: list[str]  # the ids whose rows a regrade replaced
    unprinted: list[str]  # ids whose rows carry no fingerprints: their copies are as their own shard found them


def merge_shards(parts: list[Path], out: Path | None, replace: bool = False) -> Merged:
    """Combine shard files (all CSV or all JSON) into out, sorted by id, the copies found again over all of them.

    Every shard of the batch must be there, once. With replace, the first file is a whole batch's grades
    and the others' rows replace those of the same students (each row keeps its own record of what
    graded it, and when: its shard and batch cells are the regrade's).
    """
    formats = {p: shard_format(p) for p in parts}
    if len(set(formats.values())) > 1:
        listed = ", ".join(f"{p} ({f.upper()})" for p, f in formats.items())
        raise BatchError(f"the shards mix CSV and JSON ({listed}); merge files of one format")
    shards = [read_json_shard(p) if formats[p] == "json" else read_csv_shard(p) for p in parts]
    first = shards[0]
    out = _output(first.format, out)
    check_output(out)
    _check_alike(shards)
    _check_complete(shards[:1] if replace else shards)
    merged: dict[str, Any] = {}
    origin: dict[str, Path] = {}  # the file each merged row comes from
    for shard in shards[:1] if replace else shards:
        for sub_id, _, payload in shard.entries:
            if sub_id in merged:
                raise BatchError(f"{shard.path}: submission '{sub_id}' already appears in another shard; {_REPLACE}")
            merged[sub_id], origin[sub_id] = payload, shard.path
    replaced: dict[str, Path] = {}
    for shard in shards[1:] if replace else []:
        for sub_id, _, payload in shard.entries:
            if sub_id not in merged:
                raise BatchError(f"{shard.path}: '{sub_id}' is not in {first.path}: --replace only replaces rows")
            if sub_id in replaced:
                raise BatchError(f"{shard.path}: '{sub_id}' is regraded in {replaced[sub_id]} too: give one regrade")
            merged[sub_id], replaced[sub_id], origin[sub_id] = payload, shard.path, shard.path
    unprinted = _copies_again(first, merged, origin)
    ordered = [merged[k] for k in sorted(merged)]
    if first.format == "csv":
        write_csv(out, [first.head, *ordered])
    else:
        write_atomic(out, json.dumps({**first.head, "submissions": ordered}, indent=2) + "\n")
    return Merged(out, len(merged), sorted(replaced), unprinted)


def _copies_again(first: Shard, merged: dict[str, Any], origin: dict[str, Path]) -> list[str]:
    """Each merged row's copies found again over every row (amended in place); the ids of rows without fingerprints
    (written before shards carried them), whose copies stay as their shard found them."""
    column = first.head.index(FINGERPRINTS) if first.format == "csv" and FINGERPRINTS in first.head else None
    prints, unprinted = {}, []
    for sub_id, payload in merged.items():
        if first.format == "csv":
            text = payload[column] if column is not None and column < len(payload) else ""
        else:
            text = payload.get(FINGERPRINTS) if isinstance(payload.get(FINGERPRINTS), str) else ""
        if not text:
            unprinted.append(sub_id)
            continue
        try:
            prints[sub_id] = decode_prints(text)
        except ValueError as e:
            raise BatchError(f"{origin[sub_id]}: the row of '{sub_id}': {FINGERPRINTS}: {e}") from None
    found = pairs(prints)
    for sub_id in prints:
        copies = found.get(sub_id, [])
        if first.format == "csv":
            merged[sub_id][first.head.index("copy_of")] = spreadsheet_text(describe(copies))
        else:
            merged[sub_id] = {**merged[sub_id], "copy_of": _copy_documents(merged[sub_id].get("copy_of"), copies)}
    return sorted(unprinted)


def _copy_documents(listed, copies: list[Copy]) -> list[dict]:
    """copies as the batch JSON writes them, each kept as its shard wrote it where that is the same pair with the
    same passages (its excerpts are there); a pair found across shards has its passages' lines but not their text."""
    kept = {_copy_key(d): d for d in listed if isinstance(d, dict)} if isinstance(listed, list) else {}
    documents = []
    for copy in copies:
        document = json.loads(json.dumps(dataclasses.asdict(copy)))
        documents.append(kept.get(_copy_key(document), document))
    return documents


def _copy_key(document: dict) -> str:
    """A copy's document without its excerpts: which pair, how similar, which passages."""
    listed = document.get("regions")
    regions = listed if isinstance(listed, list) else []
    bare = [{k: v for k, v in r.items() if k not in ("text", "other_text")} for r in regions if isinstance(r, dict)]
    return json.dumps([document.get(k) for k in ("of", "files", "similarity")] + [bare], sort_keys=True)
