"""`stages check`: prove every stage passes the solution, reports the starter not started,
and catches every mutant with the diagnosis its manifest names."""

import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from theinference.course import default_adapters, load_course
from theinference.grading.tools.mutants import (
    MutantError,
    Proposal,
    build_mutant,
    check_manifest,
    gather_mutants,
)
from theinference.grading.judge.results import CheckCell, CheckResult, StageResult, Status
from theinference.grading.spec.stages import StageSpec
from theinference.grading.drive.grader import Grader, RunOptions
from theinference.proc import interrupt


def observed(result: StageResult) -> str:
    """What a stage showed: 'pass', the failing stage's diagnosis shape, 'wrong-shape', or its status."""
    if result.status == Status.FAIL and result.diagnosis is not None and result.diagnosis.shape:
        return result.diagnosis.shape  # (a finding without a shape, e.g. a greedy loop's, reads on)
    if result.status == Status.FAIL and any(c.detail == "wrong-shape" for c in result.cases):
        return "wrong-shape"
    return result.status


def named_bugs(result: StageResult) -> frozenset:
    """The known bugs the stage's fingerprint named (none if it named none)."""
    d = result.diagnosis
    return frozenset(d.bugs) if d is not None else frozenset()


def _first_message(result: StageResult) -> str:
    case = next((c for c in result.cases if c.status != Status.PASS), None)
    return f"{case.name}: {case.message}" if case else ""


def _grade_subject(
    name: str,
    course_dir: Path,
    expectations: dict,
    stages: list[StageSpec],
    grader: Grader,
    options: RunOptions,
    fingerprints: dict,
    on_cell: Callable[[CheckCell], None],
) -> list[CheckCell]:
    run = grader.grade(load_course(course_dir), stages, options)
    cells = []
    for stage, result in zip(stages, run.stages):
        cells.append(
            CheckCell(
                subject=name,
                stage=stage.id,
                expected=expectations.get(stage.id, ("pass",)),
                got=observed(result),
                message=_first_message(result),
                expected_bugs=fingerprints.get(stage.id),
                got_bugs=named_bugs(result),
            )
        )
        on_cell(cells[-1])
    return cells


def _counter(total: int, progress: Callable[[int, int, str], None] | None) -> Callable[[CheckCell], None]:
    """A per-cell callback that reports (done, total, 'subject × stage: got') to progress; cells finish on many threads."""
    lock, done = threading.Lock(), [0]

    def on_cell(cell: CheckCell) -> None:
        with lock:
            done[0] += 1
            if progress:
                progress(done[0], total, f"{cell.subject} × {cell.stage}: {cell.got}{'' if cell.ok else ' (mismatch)'}")

    return on_cell


def _lesson_problems(stages: list[StageSpec]) -> list[str]:
    return [f"{s.source}: lesson file {s.lesson} does not exist" for s in stages if not s.lesson.is_file()]


def check_course(
    source: Path,
    all_stages: list[StageSpec],
    stages: list[StageSpec],
    grader: Grader,
    jobs: int = 2,
    progress: Callable[[int, int, str], None] | None = None,
    only_mutants: list[str] | None = None,
) -> CheckResult:
    """Grade solution, starter and mutants under source/ on the given stages and compare with expectations;
    progress(done, total, what) is called as each subject × stage cell is finished.

    With only_mutants, just those mutants are graded. A manifest that does not load, or names a
    stage or bug that does not exist, is reported in `broken` (the others still run).
    """
    options = grader.plan.options  # the instructor's --timeout; every tie named (first_exact off)
    result = CheckResult(stages=[s.id for s in stages], subjects=[], problems=_lesson_problems(stages))
    solution = source / "solution"
    if not (solution / default_adapters(solution)).is_file():
        result.problems.append(f"{solution}: no reference solution (tests/adapters.py or .ts) to check against")
        return result
    subjects: list[tuple[str, Path, dict, dict]] = []
    if not only_mutants:
        subjects.append(("solution", solution, {}, {}))
        if (source / "starter").is_dir():
            subjects.append(("starter", source / "starter", {s.id: ("not-started",) for s in stages}, {}))
    mutants, result.broken = gather_mutants(source / "mutants", only_mutants)
    known, selected = {s.id: s for s in all_stages}, {s.id for s in stages}
    with tempfile.TemporaryDirectory(prefix="theinference-check-") as tmp:
        for mutant in mutants:
            mistakes = check_manifest(mutant, known)
            if mistakes:
                result.broken.extend(mistakes)
                continue
            try:
                built = build_mutant(mutant, solution, Path(tmp) / mutant.name)
            except MutantError as e:  # an edit that no longer applies: this mutant only
                result.problems.append(str(e))
                continue
            expect = {s: shape for s, shape in mutant.expect.items() if s in selected}
            subjects.append((mutant.name, built, expect, mutant.fingerprint))
        result.subjects = [name for name, *_ in subjects]
        if not subjects:
            return result
        on_cell = _counter(len(subjects) * len(stages), progress)
        # The first subject (the solution) alone: it fills the oracle cache every other subject reuses.
        result.cells.extend(_grade_subject(*subjects[0][:3], stages, grader, options, subjects[0][3], on_cell))
        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        try:
            for cells in pool.map(
                lambda s: _grade_subject(s[0], s[1], s[2], stages, grader, options, s[3], on_cell), subjects[1:]
            ):
                result.cells.extend(cells)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (as in `test`): kill every student process, grade no more
            interrupt.cancel()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return result


PROPOSABLE = ("fail", "error", "wrong-shape")  # besides the diagnosis shapes: what a manifest may say a stage shows


def proposals(result: CheckResult, source: Path) -> list[Proposal]:
    """For each mutant that failed a stage its manifest says nothing about (a stage added after it was written),
    the expectation that would describe what the stage showed: for the instructor to review, never assumed."""
    mutants = {m.name: m for m in gather_mutants(source / "mutants")[0]}
    # Only where the solution passed the stage in this run: otherwise the stage, not the mutant, is what fails
    # (an adapter not yet in the solution); a run of --mutant alone grades no solution, so proposes nothing.
    proven = {c.stage for c in result.cells if c.subject == "solution" and c.got == "pass"}
    found = []
    for cell in result.cells:
        mutant = mutants.get(cell.subject)
        if mutant is None or cell.ok or cell.stage in mutant.expect or cell.stage not in proven:
            continue
        if cell.got in tuple(Status) and cell.got not in PROPOSABLE:  # a timeout or crash: a person looks first
            continue
        bugs = () if cell.stage in mutant.fingerprint else tuple(sorted(cell.got_bugs))
        found.append(Proposal(mutant, cell.stage, cell.got, bugs))
    return found
