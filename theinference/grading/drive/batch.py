"""Batch grading: many course directories, one oracle, student processes in parallel.

The oracle runs once per case for the whole batch; each submission's student processes run
under their own timeouts and limits, so one that hangs, crashes or exhausts memory is
recorded as such and the batch goes on. Results are appended to a CSV as they finish.

Every output records what the batch graded with (`GradedWith`: grader version, weights digest,
stage files digest, seed): in CSV as the last columns of every row, so the header stays the
first line a spreadsheet sees and sorting keeps each row's record; in JSON as "graded_with".
`grade merge` combines only shards that agree on all of it.
"""

import csv
import dataclasses
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from theinference import __version__
from theinference.proc import interrupt
from theinference.course import CourseError, load_course
from theinference.proc.node import NodeMissing
from theinference.proc.launch import ConfinementError
from theinference.grading.oracle.registry import BUILTIN_ORACLES
from theinference.grading.judge.grade import MACHINE_BUSY
from theinference.grading.judge.results import CaseResult, RunResult
from theinference.grading.drive.grader import BUDGET_STOPPED, Grader, OracleProgress, RunOptions
from theinference.grading.spec.stages import StageSpec
from theinference.model.weights import Model, weights_digest
from theinference.untrusted import for_terminal
from theinference.errors import ConfigError
from theinference.files import atomic_file
from theinference.grading.drive.copies import CodeSnapshot, Copy, code_prints, encode_prints, pairs, read_code
from theinference.grading.drive.copies import describe as describe_copies


class BatchError(ConfigError):
    """The batch itself is misconfigured (duplicate submission ids, bad shard, unmergeable files)."""


INTERRUPTED_MARK = "#"  # a last CSV row starting with this says the batch was interrupted, and after how many


class BatchInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped the batch: `results` are the submissions graded before it, sorted by id."""

    def __init__(self, results: list["SubmissionResult"], total: int):
        super().__init__(f"interrupted after {len(results)} of {total} submissions")
        self.results, self.total = results, total


@dataclass
class Submission:
    id: str
    path: Path


@dataclass
class SubmissionResult:
    id: str
    path: str
    run: RunResult | None  # None when the submission could not be graded at all
    error: str = ""
    seconds: float = 0.0
    copies: list[Copy] = field(default_factory=list)  # its code is the reference solution's or another's (copies.py)
    code: CodeSnapshot | None = None  # its source files as they were when it was graded (copies.read_code)
    prints: str = ""  # its code's fingerprints (copies.encode_prints): what `grade merge` compares across shards

    @property
    def status(self) -> str:
        if self.run is None:
            return "error"
        return "pass" if self.run.passed else "fail"

    def points(self, stages: list[StageSpec]) -> tuple[float, float]:
        """Points earned and possible; a submission that could not be graded earns 0 of the whole course's."""
        return self.run.points if self.run else (0.0, sum(s.points for s in stages))


def submissions(paths: list[Path]) -> list[Submission]:
    """Submissions sorted by id (the directory name); ids must be unique, and each must be a directory (a mistyped
    path is the instructor's slip, refused before grading, never a student's `error` row)."""
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        what = "no such directory" if len(missing) == 1 else "no such directories"
        raise BatchError(f"{what}: {', '.join(missing)} (grade takes the course directories of the submissions)")
    found = sorted((Submission(p.name, p.resolve()) for p in paths), key=lambda s: s.id)
    ids = [s.id for s in found]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise BatchError(f"submission ids must be unique; repeated: {', '.join(duplicates)}")
    return found


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N) with 1 <= I <= N."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise BatchError(f"--shard takes I/N (e.g. 2/5), not {text!r}") from None
    if not 1 <= index <= count:
        raise BatchError(f"--shard {text}: need 1 <= I <= N")
    return index, count


def shard(items: list[Submission], index: int, count: int) -> list[Submission]:
    """The index-th (1-based) of count deterministic slices: every count-th submission by id."""
    return items[index - 1 :: count]


@dataclass(frozen=True)
class ShardRecord:
    """Which slice of which batch a `grade` run graded: `grade merge` checks that every slice is there once."""

    index: int  # 1-based
    count: int
    submissions: int  # how many submissions the whole batch has (before slicing)
    ids: str  # "sha256:<16 hex>" over the whole batch's submission ids, sorted

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    def cells(self) -> list[str]:
        return [self.label, str(self.submissions), self.ids]


SHARD_COLUMNS = ["shard", "batch_submissions", "batch_ids"]


def shard_record(subs: list[Submission], index: int = 1, count: int = 1) -> ShardRecord:
    """The record of slice index/count of the batch subs (every submission, before slicing)."""
    digest = hashlib.sha256("\n".join(sorted(s.id for s in subs)).encode()).hexdigest()[:16]
    return ShardRecord(index, count, len(subs), f"sha256:{digest}")


def _grade_one(sub: Submission, grader: Grader, stages: list[StageSpec], options: RunOptions) -> SubmissionResult:
    started = time.perf_counter()
    try:
        # Read as the batch's plan reads courses: a submission chooses nothing, not its stages, weights or timeouts.
        read = grader.plan.for_course(load_course(sub.path))
    except CourseError as e:
        return SubmissionResult(sub.id, str(sub.path), None, error=str(e), seconds=time.perf_counter() - started)
    assert read.course is not None
    try:
        run = grader.grade(read.course, stages, options, read.notices)
    except (ConfinementError, NodeMissing) as e:  # e.g. a directory its confined user cannot read; no tsx in it
        return SubmissionResult(sub.id, str(sub.path), None, error=str(e), seconds=time.perf_counter() - started)
    return SubmissionResult(sub.id, str(sub.path), run, seconds=time.perf_counter() - started)


def grade_batch(
    subs: list[Submission],
    grader: Grader,
    stages: list[StageSpec],
    options: RunOptions,
    jobs: int,
    on_result: Callable[[SubmissionResult], None],
    on_oracle: OracleProgress | None = None,
) -> list[SubmissionResult]:
    """Grade every submission (jobs at a time); on_oracle follows the oracle's warm-up, on_result each submission.

    On Ctrl-C or SIGTERM every student process is killed at once and BatchInterrupted carries
    the submissions finished until then.
    """
    if options.seed is not None:
        stages = grader.with_seed(stages, options)
        options = dataclasses.replace(options, seed=None)
    lock = threading.Lock()
    results = []

    def work(sub: Submission) -> None:
        code = read_code(sub.path)  # read as graded: copies are found in these, not in what is left at the end
        result = _grade_one(sub, grader, stages, options)
        result.code = code
        with lock:
            if not interrupt.cancelled():  # a submission whose processes were killed midway has no grade
                results.append(result)
                on_result(result)

    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        grader.warm(stages, on_oracle)
        for future in [pool.submit(work, sub) for sub in subs]:
            future.result()
    except KeyboardInterrupt as e:
        interrupt.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        with lock:
            raise BatchInterrupted(sorted(results, key=lambda r: r.id), len(subs)) from e
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return sorted(results, key=lambda r: r.id)


@dataclass(frozen=True)
class GradedWith:
    """What a batch graded every submission with; shards merge only when all of it agrees."""

    theinference: str  # the grader's version
    weights: str  # "sha256:<16 hex> (tiny preset, seed 0)": the weights file's content digest, and its maker
    stage_files: str  # "sha256:<16 hex>" over the stage files and instructor oracle files, in id order
    seed: int | None  # the random extra cases' seed, if any

    def cells(self) -> list[str]:
        return [self.theinference, self.weights, self.stage_files, "" if self.seed is None else str(self.seed)]


GRADED_WITH_COLUMNS = [f.name for f in dataclasses.fields(GradedWith)]


def weights_identity(model: Model) -> str:
    """The weights file's content digest, and what made it if `weights synth` did."""
    digest = weights_digest(model.path)[:16]
    return f"sha256:{digest}" + (f" ({model.synthetic})" if model.synthetic else "")


def stage_files_identity(stages: list[StageSpec]) -> str:
    """A digest of the stage files and the instructor oracle files they name (built-in oracles: the version)."""
    digest = hashlib.sha256()
    for stage in sorted(stages, key=lambda s: s.id):
        files = [stage.source]
        if stage.oracle not in BUILTIN_ORACLES:
            files.append(stage.source.parent / stage.oracle.partition(":")[0])
        for path in (p for p in files if p.is_file()):  # a missing oracle file is reported when the oracle loads
            digest.update(b"%s\0%s\0" % (path.name.encode(), path.read_bytes()))
    return f"sha256:{digest.hexdigest()[:16]}"


def graded_with(model: Model, stages: list[StageSpec], seed: int | None) -> GradedWith:
    """The record of what this batch grades with (hashes the weights file once)."""
    return GradedWith(__version__, weights_identity(model), stage_files_identity(stages), seed)


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


def mark_copies(results: list[SubmissionResult]) -> None:
    """Flag each submission whose code is the bundled reference solution's or another submission's (copies.py)."""
    code = {r.id: r.code if r.code is not None else read_code(Path(r.path)) for r in results}
    prints = {sub_id: code_prints(c) for sub_id, c in code.items()}
    found = pairs(prints, {sub_id: dict(c.files) for sub_id, c in code.items()})
    for result in results:
        result.copies, result.prints = found.get(result.id, []), encode_prints(prints[result.id])


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


BATCH_SCHEMA, BATCH_SCHEMA_VERSION = "theinference.batch", 1
