"""The batch's spreadsheet: one CSV row per submission, rewritten whole as each finishes.

Each row's cells say what a teacher sorts and reads by (points per stage, each stage's first error, the bug the
grader named, the first reason points were lost, machine-busy stages to regrade, copies), made safe for a
spreadsheet (no cell starts as a formula), and end with what the batch graded with (batch.GradedWith) and its shard.
The same summaries go into the batch's JSON (report/jsonout.py).
"""

import csv
import os
import stat
from pathlib import Path

from theinference.grading.judge.grade import MACHINE_BUSY
from theinference.grading.judge.results import CaseResult
from theinference.grading.drive.grader import BUDGET_STOPPED
from theinference.grading.drive.batch import (
    GRADED_WITH_COLUMNS,
    SHARD_COLUMNS,
    BatchError,
    GradedWith,
    ShardRecord,
    SubmissionResult,
)
from theinference.grading.drive.copies import describe as describe_copies
from theinference.grading.spec.stages import StageSpec
from theinference.untrusted import for_terminal
from theinference.files import atomic_file

INTERRUPTED_MARK = "#"  # a last CSV row starting with this says the batch was interrupted, and after how many
ERROR_STATUSES = ("error", "crash", "timeout")
_ERROR_CELL_CHARS = 500  # a spreadsheet cell, not a log: the JSON keeps every message whole


def _one_line(text: str, root: str) -> str:
    text = for_terminal(" ".join(text.replace(root.rstrip("/") + "/", "").split()))
    return text if len(text) <= _ERROR_CELL_CHARS else text[: _ERROR_CELL_CHARS - 1] + "…"


def first_errors(result: SubmissionResult) -> str:
    """Each stage's first error, crash or timeout message, on one line, paths relative to the submission;
    stages with the same message share it.

    It starts with stage ids or the grader's own message about the submission, never with the
    student's text, so a spreadsheet never reads the cell as a formula.
    """
    if result.run is None:
        return _one_line(result.error, result.path)
    stages_by_message: dict[str, list[str]] = {}
    for stage in result.run.stages:
        case = next((c for c in stage.cases if c.status in ERROR_STATUSES), None)
        if case is not None:
            stages_by_message.setdefault(_one_line(case.message or case.status, result.path), []).append(stage.id)
    return " | ".join(f"{', '.join(ids)}: {message}" for message, ids in stages_by_message.items())


def findings(result: SubmissionResult) -> str:
    """The known bugs the fingerprint named, per stage: `per-step-identity: wpe-off-by-one | greedy: …`."""
    if result.run is None:
        return ""
    named = []
    for stage in result.run.stages:
        diagnoses = [stage.cross_case, *(c.diagnosis for c in stage.cases)]
        bugs = dict.fromkeys(b for d in diagnoses if d is not None for b in d.bugs)
        if bugs:
            named.append(f"{stage.id}: {', '.join(bugs)}")
    return " | ".join(named)


def machine_busy(result: SubmissionResult) -> list[tuple[str, str]]:
    """(stage, case) of every case that ended machine-busy even after its retries (the wall-clock backstop with
    little CPU used): not a verdict on the code, so the row must be regraded on a quieter machine."""
    if result.run is None:
        return []
    return [(s.id, c.name) for s in result.run.stages for c in s.cases if c.detail == MACHINE_BUSY]


def machine_busy_cell(result: SubmissionResult) -> str:
    """The CSV's `machine_busy` cell: `forward: two-tokens | greedy: sentence` (stage ids first, like `error`)."""
    by_stage: dict[str, list[str]] = {}
    for stage, case in machine_busy(result):
        by_stage.setdefault(stage, []).append(case)
    return " | ".join(f"{stage}: {', '.join(cases)}" for stage, cases in by_stage.items())


def regrade(result: SubmissionResult) -> list[str]:
    """The stages whose points are the wall clock's, not the code's: a case ended machine-busy, or the submission's
    time budget (or --finish-by) stopped it or left it unrun. Regrade them on a quieter machine or with more time."""
    if result.run is None:
        return []
    unverdicted = (MACHINE_BUSY, BUDGET_STOPPED)
    return [s.id for s in result.run.stages if any(c.detail in unverdicted for c in s.cases)]


TOO_SLOW = "too-slow"  # cache-scaling's shape for a cache whose cost is flat but too high: slow, not wrong


def too_slow(result: SubmissionResult) -> list[str]:
    """The failing stages whose verdict is a slow cache (shape too-slow), not a wrong or missing one."""
    if result.run is None:
        return []
    return [
        s.id
        for s in result.run.stages
        if s.status == "fail" and s.diagnosis is not None and s.diagnosis.shape == TOO_SLOW
    ]


def first_reason(result: SubmissionResult) -> str:
    """Why the first failing stage failed, on one line: `greedy: case sentence: token 2 of 4 differs …`.

    Like the error cell, it starts with a stage id (or the grader's own message), never with the student's text.
    """
    if result.run is None:
        return _one_line(result.error, result.path)
    stage = next((s for s in result.run.stages if s.status != "pass"), None)
    if stage is None:
        return ""
    case = next(c for c in stage.cases if c.status != "pass")
    message = _nonfinite_reason(case) or case.message or case.status
    diagnosis = stage.cross_case or case.diagnosis
    shape = diagnosis.shape if diagnosis is not None else ""
    return _one_line(f"{stage.id}: case {case.name}: {message}" + (f" ({shape})" if shape else ""), result.path)


def _nonfinite_reason(case: CaseResult) -> str:
    """A failing case's reason when rows hold NaN or infinity: no tolerance can say how far those are."""
    nonfinite = sum(r.n_nonfinite > 0 for r in case.rows)
    if not nonfinite:
        return ""
    outside = sum(not r.ok and r.n_nonfinite == 0 for r in case.rows)
    more = f", {outside} more outside the tolerance" if outside else ""
    return f"{nonfinite} of {len(case.rows)} rows hold NaN or infinity{more}"


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what makes Excel or Sheets read a cell as a formula


def spreadsheet_text(text: str) -> str:
    """text as a spreadsheet shows it, never runs it: a leading = + - @ (tab, CR) gets a quote before it."""
    return "'" + text if text.startswith(_FORMULA_START) else text


def csv_header(stages: list[StageSpec]) -> list[str]:
    columns = ["id", "status", "points", "max_points"]
    for stage in stages:
        columns += [f"{stage.id}.status", f"{stage.id}.points"]
    return columns + [
        "seconds",
        "copy_of",
        *GRADED_WITH_COLUMNS,
        *SHARD_COLUMNS,
        "machine_busy",
        "regrade",
        "too_slow",
        "finding",
        "reason",
        "error",
        FINGERPRINTS,
    ]


FINGERPRINTS = "fingerprints"  # the last column: copies.encode_prints of the code, for `grade merge` (no source)


def csv_row(
    result: SubmissionResult, stages: list[StageSpec], graded: GradedWith, shard: ShardRecord | None = None
) -> list[str]:
    by_id = {s.id: s for s in result.run.stages} if result.run else {}
    earned, possible = result.points(stages)
    row = [spreadsheet_text(result.id), result.status, f"{earned:g}", f"{possible:g}"]  # the id: a directory's name
    for stage in stages:
        found = by_id.get(stage.id)
        row += [found.status, f"{found.points:g}"] if found else ["error", "0"]
    shard_cells = shard.cells() if shard else [""] * len(SHARD_COLUMNS)
    reasons = [spreadsheet_text(findings(result)), spreadsheet_text(first_reason(result))]
    copy_of = spreadsheet_text(describe_copies(result.copies))
    return row + [
        f"{result.seconds:.2f}",
        copy_of,
        *graded.cells(),
        *shard_cells,
        spreadsheet_text(_one_line(machine_busy_cell(result), result.path)),
        spreadsheet_text(", ".join(regrade(result))),
        spreadsheet_text(", ".join(too_slow(result))),
        *reasons,
        spreadsheet_text(first_errors(result)),
        result.prints,
    ]


class CsvWriter:
    """Appends one row per finished submission and flushes it: an interrupted batch keeps its rows."""

    def __init__(self, path: Path, stages: list[StageSpec], graded: GradedWith, shard: ShardRecord | None = None):
        self.path, self.stages, self.graded, self.shard = path, stages, graded, shard
        self.rows = [csv_header(stages)]
        write_csv(path, self.rows)

    def add(self, result: SubmissionResult) -> None:
        # Rewritten whole each time (theinference.files): never appended to through a link planted meanwhile.
        self.rows.append(csv_row(result, self.stages, self.graded, self.shard))
        write_csv(self.path, self.rows)

    def finish(self, results: list[SubmissionResult], mark: str = "") -> None:
        """Rewrite the file sorted by id, now that every row is in; a mark (why the batch stopped) ends it."""
        rows = [csv_header(self.stages), *(csv_row(r, self.stages, self.graded, self.shard) for r in results)]
        write_csv(self.path, rows + ([[f"{INTERRUPTED_MARK} {mark}"]] if mark else []))


def check_output(out: Path) -> None:
    """Refuse, before any work, an output that could not be written at the end (the grades would be lost)."""
    if not out.parent.is_dir():
        raise BatchError(f"--out {out}: no directory {out.parent} to write it in")
    # Not through a link: the file replaces a link found there (theinference.files), and a link's target may be
    # one the grader cannot even look at (a student's link into a private directory: no traceback, no exit 3).
    if _is_directory(out):
        raise BatchError(f"--out {out}: is a directory, not a file")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise BatchError(f"--out {out}: the directory {out.parent} is not writable")


def _is_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def write_csv(path: Path, rows: list[list[str]]) -> None:
    with atomic_file(path, newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
