"""Batch grading: many course directories, one oracle, student processes in parallel.

The oracle runs once per case for the whole batch; each submission's student processes run
under their own timeouts and limits, so one that hangs, crashes or exhausts memory is
recorded as such and the batch goes on. Results are appended to a CSV as they finish.
"""

import csv
import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from theinference.proc import interrupt
from theinference.course import CourseError, load_course
from theinference.proc.launch import ConfinementError
from theinference.grading.results import RunResult
from theinference.grading.grader import Grader, RunOptions
from theinference.grading.stages import StageSpec
from theinference.trust import untrusted_course
from theinference.errors import ConfigError


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

    @property
    def status(self) -> str:
        if self.run is None:
            return "error"
        return "pass" if self.run.passed else "fail"


def submissions(paths: list[Path]) -> list[Submission]:
    """Submissions sorted by id (the directory name); ids must be unique."""
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


def _grade_one(sub: Submission, grader: Grader, stages: list[StageSpec], options: RunOptions) -> SubmissionResult:
    started = time.perf_counter()
    try:
        course, notices = untrusted_course(load_course(sub.path))
    except CourseError as e:
        return SubmissionResult(sub.id, str(sub.path), None, error=str(e), seconds=time.perf_counter() - started)
    # A submission chooses nothing: not its stages, weights or timeouts (see theinference.trust).
    try:
        run = grader.grade(course, stages, options, notices)
    except ConfinementError as e:  # e.g. a submission directory its confined user cannot read
        return SubmissionResult(sub.id, str(sub.path), None, error=str(e), seconds=time.perf_counter() - started)
    return SubmissionResult(sub.id, str(sub.path), run, seconds=time.perf_counter() - started)


def grade_batch(subs: list[Submission], grader: Grader, stages: list[StageSpec], options: RunOptions, jobs: int,
                on_result: Callable[[SubmissionResult], None]) -> list[SubmissionResult]:
    """Grade every submission (jobs at a time); on_result is called as each finishes.

    On Ctrl-C or SIGTERM every student process is killed at once and BatchInterrupted carries
    the submissions finished until then.
    """
    if options.seed is not None:
        stages = grader.with_seed(stages, options)
        options = dataclasses.replace(options, seed=None)
    lock = threading.Lock()
    results = []

    def work(sub: Submission) -> None:
        result = _grade_one(sub, grader, stages, options)
        with lock:
            if not interrupt.cancelled():  # a submission whose processes were killed midway has no grade
                results.append(result)
                on_result(result)

    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        grader.warm(stages)
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


def csv_header(stage_ids: list[str]) -> list[str]:
    columns = ["id", "status", "points", "max_points"]
    for stage_id in stage_ids:
        columns += [f"{stage_id}.status", f"{stage_id}.points"]
    return columns + ["seconds", "error"]


def csv_row(result: SubmissionResult, stage_ids: list[str]) -> list[str]:
    by_id = {s.id: s for s in result.run.stages} if result.run else {}
    earned, possible = result.run.points if result.run else (0.0, 0.0)
    row = [result.id, result.status, f"{earned:g}", f"{possible:g}"]
    for stage_id in stage_ids:
        stage = by_id.get(stage_id)
        row += [stage.status, f"{stage.points:g}"] if stage else ["error", "0"]
    return row + [f"{result.seconds:.2f}", result.error]


class CsvWriter:
    """Appends one row per finished submission and flushes it: an interrupted batch keeps its rows."""

    def __init__(self, path: Path, stage_ids: list[str]):
        self.path, self.stage_ids = path, stage_ids
        self.file = path.open("w", newline="", encoding="utf-8")
        self.writer = csv.writer(self.file)
        self.writer.writerow(csv_header(stage_ids))
        self.file.flush()

    def add(self, result: SubmissionResult) -> None:
        self.writer.writerow(csv_row(result, self.stage_ids))
        self.file.flush()

    def finish(self, results: list[SubmissionResult], mark: str = "") -> None:
        """Rewrite the file sorted by id, now that every row is in; a mark (why the batch stopped) ends it."""
        self.file.close()
        rows = [csv_header(self.stage_ids), *(csv_row(r, self.stage_ids) for r in results)]
        write_csv(self.path, rows + ([[f"{INTERRUPTED_MARK} {mark}"]] if mark else []))


def write_csv(path: Path, rows: list[list[str]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    tmp.replace(path)


def merge_csv(out: Path, parts: list[Path]) -> int:
    """Combine shard CSVs into one, sorted by id; headers must agree and ids must not repeat."""
    header: list[str] | None = None
    rows: dict[str, list[str]] = {}
    for part in parts:
        with part.open(newline="", encoding="utf-8") as f:
            reader = list(csv.reader(f))
        if not reader:
            raise BatchError(f"{part}: empty file")
        if header is not None and reader[0] != header:
            raise BatchError(f"{part}: its columns differ from {parts[0]}'s (were the shards graded with the same stages?)")
        header = reader[0]
        for row in reader[1:]:
            if row and row[0].startswith(INTERRUPTED_MARK):
                raise BatchError(f"{part}: {row[0][len(INTERRUPTED_MARK):].strip()}; grade that shard again")
            if row[0] in rows:
                raise BatchError(f"{part}: submission '{row[0]}' already appears in another shard")
            rows[row[0]] = row
    write_csv(out, [header or [], *(rows[k] for k in sorted(rows))])
    return len(rows)
