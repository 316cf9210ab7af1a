"""Batch grading: many course directories, one oracle, student processes in parallel.

The oracle runs once per case for the whole batch; each submission's student processes run
under their own timeouts and limits, so one that hangs, crashes or exhausts memory is
recorded as such and the batch goes on. Results are appended to a CSV as they finish (drive/gradesheet.py).

Every output records what the batch graded with (`GradedWith`: grader version, weights digest,
stage files digest, seed): in CSV as the last columns of every row, so the header stays the
first line a spreadsheet sees and sorting keeps each row's record; in JSON as "graded_with".
`grade merge` combines only shards that agree on all of it.
"""

import dataclasses
import hashlib
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
from theinference.grading.judge.results import RunResult
from theinference.grading.drive.grader import Grader, OracleProgress, RunOptions
from theinference.grading.spec.stages import StageSpec
from theinference.model.weights import Model, weights_digest
from theinference.errors import ConfigError
from theinference.grading.drive.copies import CodeSnapshot, Copy, code_prints, encode_prints, pairs, read_code


class BatchError(ConfigError):
    """The batch itself is misconfigured (duplicate submission ids, bad shard, unmergeable files)."""


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


def mark_copies(results: list[SubmissionResult]) -> None:
    """Flag each submission whose code is the bundled reference solution's or another submission's (copies.py)."""
    code = {r.id: r.code if r.code is not None else read_code(Path(r.path)) for r in results}
    prints = {sub_id: code_prints(c) for sub_id, c in code.items()}
    found = pairs(prints, {sub_id: dict(c.files) for sub_id, c in code.items()})
    for result in results:
        result.copies, result.prints = found.get(result.id, []), encode_prints(prints[result.id])


BATCH_SCHEMA, BATCH_SCHEMA_VERSION = "theinference.batch", 1
