"""`stages check`: prove every stage passes the solution, reports the starter not started,
and catches every mutant with the diagnosis its manifest names.

The solution is graded first, alone: it fills the oracle cache every other subject reads. A mutant's stage
whose calls reach the same code as the solution's (`reach.stage_digest`: the edit lies where that stage never
goes) is not graded again: its cell is the solution's, marked so, and checked against the manifest like any
other (a manifest that expects such a stage to fail is a mismatch, as grading it would show).
"""

import dataclasses
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from theinference.course import default_adapters, load_course
from theinference.grading.judge.scaling import DTYPE_PROBE
from theinference.grading.spec.checks import ScalingCheck
from theinference.grading.tools.reach import stage_digest
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


def called_adapters(stage: StageSpec) -> tuple[str, ...]:
    """The adapter functions grading the stage calls: its own (and its aliases); the cost stage also asks the
    decode step which precision it computes in."""
    return (stage.adapter, *stage.aliases, *(DTYPE_PROBE if isinstance(stage.check, ScalingCheck) else ()))


@dataclass(frozen=True)
class _Subject:
    name: str
    path: Path
    expect: dict  # stage id -> acceptable outcomes (absent: "pass")
    fingerprint: dict  # stage id -> the bugs its fingerprint must name


def _cell(subject: _Subject, stage: StageSpec, result: StageResult) -> CheckCell:
    return CheckCell(
        subject=subject.name,
        stage=stage.id,
        expected=subject.expect.get(stage.id, ("pass",)),
        got=observed(result),
        message=_first_message(result),
        expected_bugs=subject.fingerprint.get(stage.id),
        got_bugs=named_bugs(result),
    )


def _grade_subject(
    subject: _Subject,
    stages: list[StageSpec],
    grader: Grader,
    options: RunOptions,
    on_cell: Callable[[CheckCell], None],
    same: dict[str, CheckCell] | None = None,
) -> list[CheckCell]:
    """The subject's cells, in stage order: each stage in same (stage id -> the solution's passing cell, the same
    code reached) taken from it, the others graded in one run."""
    same = same or {}
    taken = {
        stage_id: dataclasses.replace(
            cell,
            subject=subject.name,
            expected=subject.expect.get(stage_id, ("pass",)),
            expected_bugs=subject.fingerprint.get(stage_id),
            same_as=cell.subject,
        )
        for stage_id, cell in same.items()
    }
    for cell in taken.values():
        on_cell(cell)
    graded = [s for s in stages if s.id not in same]
    if graded:
        run = grader.grade(load_course(subject.path), graded, options)
        for stage, result in zip(graded, run.stages):
            taken[stage.id] = _cell(subject, stage, result)
            on_cell(taken[stage.id])
    return [taken[s.id] for s in stages]


def _passed_with_code(reference: _Subject, stages: list[StageSpec], cells: list[CheckCell]) -> dict:
    """stage id -> (the digest of the code its calls reach in reference, reference's cell), for each stage it passed."""
    passed = {c.stage: c for c in cells if c.got == "pass"}
    return {s.id: (stage_digest(reference.path, called_adapters(s)), passed[s.id]) for s in stages if s.id in passed}


def _same_code(subject: _Subject, stages: list[StageSpec], passed: dict) -> dict[str, CheckCell]:
    """The reference's passing cells (see _passed_with_code) for the stages whose calls reach the same code in
    subject."""
    return {
        s.id: passed[s.id][1]
        for s in stages
        if s.id in passed and stage_digest(subject.path, called_adapters(s)) == passed[s.id][0]
    }


def _counter(total: int, progress: Callable[[int, int, str], None] | None) -> Callable[[CheckCell], None]:
    """A per-cell callback that reports (done, total, 'subject × stage: got') to progress; cells finish on many threads."""
    lock, done = threading.Lock(), [0]

    def on_cell(cell: CheckCell) -> None:
        with lock:
            done[0] += 1
            if progress:
                same = f" (the same code as the {cell.same_as}'s)" if cell.same_as else ""
                progress(
                    done[0], total, f"{cell.subject} × {cell.stage}: {cell.got}{same}{'' if cell.ok else ' (mismatch)'}"
                )

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
    reuse: bool = True,
) -> CheckResult:
    """Grade solution, starter and mutants under source/ on the given stages and compare with expectations;
    progress(done, total, what) is called as each subject × stage cell is finished.

    With only_mutants, just those mutants are graded. With reuse, a mutant's stage whose calls reach the same code
    as in the solution takes the solution's passing cell (marked same_as) instead of being graded again. A manifest that does not load, or names a
    stage or bug that does not exist, is reported in `broken` (the others still run).
    """
    options = grader.plan.options  # the instructor's --timeout; every tie named (first_exact off)
    result = CheckResult(stages=[s.id for s in stages], subjects=[], problems=_lesson_problems(stages))
    solution = source / "solution"
    if not (solution / default_adapters(solution)).is_file():
        result.problems.append(f"{solution}: no reference solution (tests/adapters.py or .ts) to check against")
        return result
    subjects: list[_Subject] = []
    if not only_mutants:
        subjects.append(_Subject("solution", solution, {}, {}))
        if (source / "starter").is_dir():
            subjects.append(_Subject("starter", source / "starter", {s.id: ("not-started",) for s in stages}, {}))
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
            subjects.append(_Subject(mutant.name, built, expect, mutant.fingerprint))
        result.subjects = [s.name for s in subjects]
        if not subjects:
            return result
        on_cell = _counter(len(subjects) * len(stages), progress)
        # The first subject (the solution) alone: it fills the oracle cache every other subject reuses.
        first = subjects[0]
        result.cells.extend(_grade_subject(first, stages, grader, options, on_cell))
        # Only the solution's cells stand in for a mutant's: every mutant is the solution with one edit.
        passed = _passed_with_code(first, stages, result.cells) if reuse and first.name == "solution" else {}

        def grade(subject: _Subject) -> list[CheckCell]:
            same = _same_code(subject, stages, passed) if subject.name != "starter" else {}
            return _grade_subject(subject, stages, grader, options, on_cell, same)

        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        try:
            for cells in pool.map(grade, subjects[1:]):
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
