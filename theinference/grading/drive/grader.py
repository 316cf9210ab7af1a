"""The Grader: what stays warm between runs (weights, model, oracle cache, launcher); it grades any course.

`test`, `watch` and `demo` hold one for their course (through a Session), `grade` one for every
submission, `stages check` one for every subject. It is a context manager: leaving it stops the
launcher's pre-warmed processes.
"""

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from theinference.course import Course
from theinference.grading.judge import oraclecost
from theinference.grading.judge.evidence import stage_evidence
from theinference.grading.judge.fingerprint import Outputs, fingerprint_stage, needs_fingerprint
from theinference.grading.drive.progress import load_progress, weights_name
from theinference.grading.judge.events import CaseEvent
from theinference.grading.judge.context import GradeContext
from theinference.grading.judge.grade import Graded, judge_for, check_case_fits, grade_stage
from theinference.grading.oracle.cache import OracleCache
from theinference.grading.oracle.registry import resolve_oracle
from theinference.grading.spec.randomcases import with_random_cases
from theinference.grading.judge.results import CaseResult, RunResult, StageResult, Status
from theinference.grading.spec.stages import StageSpec
from theinference.grading.drive.threads import blas_threads_for_load
from theinference.grading.drive.costlock import LOCK_NAME, CostLock
from theinference.model.weights import Model
from theinference.model.weights_choice import WeightsChoice
from theinference.proc.accounting import meter_name
from theinference.proc.launch import Launcher, default_launcher, mechanisms
from theinference.proc.sandbox import Isolation, lock_dir
from theinference.grading.drive.plan import RunOptions, RunPlan, timeouts

__all__ = ["Grader", "OracleProgress", "RunOptions"]


OracleProgress = Callable[[str, int, int], None]  # (stage id, cases done, cases in that stage)


@dataclass(frozen=True)
class Unmatched:
    """A run graded with fingerprint=False and, beside it, each stage's arrays its fingerprinting will read."""

    run: RunResult
    outputs: tuple[Outputs, ...]  # one per stage of run, in order


@dataclass
class Grader:
    weights: WeightsChoice
    model: Model
    made_weights: bool = False  # the default synthetic weights were made for this run
    cache: OracleCache = field(default_factory=OracleCache)
    launcher: Launcher = field(default_factory=default_launcher)
    # The run's settings, resolved once (drive/plan.py): trust, stage sources, options. The default: a trusted run
    # of the built-in stages with default options (benches, and tests that grade a course directly).
    plan: RunPlan = field(default_factory=lambda: RunPlan(course=None, trusted=True, stage_dirs=()))
    # The last run graded with fingerprint=False and its outputs, until fingerprint() reads them (or grade() runs).
    unmatched: Unmatched | None = field(default=None, repr=False)
    # The cost stage runs while no other stage does (costlock.py): across the graders of this machine too when grading
    # is untrusted (a student's own `test` shares its machine with nobody).
    cost_lock: CostLock = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.cost_lock = CostLock(Path(lock_dir()) / LOCK_NAME if self.plan.untrusted else None)

    @classmethod
    def open(cls, plan: RunPlan, progress: Callable[..., None] | None = None) -> "Grader":
        """The grader of a plan: its launcher started ahead (a zygote imports numpy while the weights load: under
        the strongest isolation available when the plan is untrusted), its weights loaded (made if they are a
        missing preset; progress is told as they are), its oracle cache (the persistent store when trusted)."""
        launcher = plan.launcher()
        launcher.warm()
        try:
            choice, model, made = plan.load_weights(progress)
        except BaseException:
            launcher.close()
            raise
        return cls(choice, model, made, cache=plan.oracle_cache(), launcher=launcher, plan=plan)

    @property
    def untrusted(self) -> bool:
        return self.plan.untrusted

    def __enter__(self) -> "Grader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the pre-warmed student-process launcher, if any."""
        self.launcher.close()

    @property
    def isolation(self) -> Isolation:
        """How far the student processes are confined here (the launcher's)."""
        return self.launcher.isolation

    def hide(self, path: Path) -> None:
        """Keep path (a results file) unreadable by student processes."""
        self.launcher.hide(path)

    def grade(
        self,
        course: Course,
        stages: list[StageSpec],
        options: RunOptions | None = None,
        notices: Iterable[str] = (),
        on_case: Callable[[CaseEvent], None] | None = None,
        on_stage: Callable[[StageResult], None] | None = None,
    ) -> RunResult:
        """Grade the stages in order on the course (with the seed's random cases added, if any).

        on_case is told as each case starts and ends in the student's process; on_stage gets each stage's
        result as soon as its cases are compared (before the next stage runs).
        """
        options = options or self.plan.options
        deadline, budget = options.deadline()
        # With a deadline, every verdict comes first and known bugs are matched in the time left (fingerprint()).
        deferred = deadline is not None and options.fingerprint and options.diagnosis
        ctx = GradeContext(
            course=course,
            model=self.model,
            cache=self.cache,
            limits=options.limits,
            timeouts=timeouts(course, options),
            launcher=self.launcher,
            fingerprint=options.fingerprint and not deferred,
            diagnosis=options.diagnosis,
            first_exact=options.first_exact,
            all_cases=options.all_cases,
            budget=budget,
            deadline=deadline,
            on_case=on_case,
            untrusted=self.plan.untrusted,
        )
        self.unmatched = None  # an earlier run's arrays go before this one's come
        results, outputs = [], []
        for stage in self.with_seed(stages, options):
            waiting = time.monotonic()
            with self._stage_lock(stage):
                # The time spent waiting for other submissions' cost stage is not this one's budget (but finish_by,
                # the autograder's own end, does not move).
                ctx.deadline = _moved(ctx.deadline, time.monotonic() - waiting, options)
                began = time.monotonic()
                if _past(ctx.deadline):
                    graded = Graded(not_reached(stage, course, budget))
                else:
                    graded = _stopped(grade_stage(stage, ctx), ctx.deadline)
                    if graded.result.status == Status.TIMEOUT:
                        # A stage that hung (or was starved) takes nothing from the stages after it: they keep
                        # the budget they had, so a hang never zeroes correct later stages (never past finish_by).
                        ctx.deadline = _moved(ctx.deadline, time.monotonic() - began, options)
            results.append(dataclasses.replace(graded.result, origin=self.plan.stage_origin(stage)))
            outputs.append(graded.outputs)
            if on_stage is not None:
                on_stage(results[-1])
        run = self.run_result(course, results, options, notices)
        if deferred:  # its own outputs, never through self.unmatched: a batch grades submissions in threads
            return self._match(stages, run, outputs, options, until=ctx.deadline)
        if options.fingerprint:
            return dataclasses.replace(run, stages=self._run_evidence(stages, run, run.stages))
        if options.diagnosis:  # kept for fingerprint(), beside the run
            self.unmatched = Unmatched(run, tuple(outputs))
        return run

    def _stage_lock(self, stage: StageSpec):
        """The lock a stage is graded under: exclusive for the one judged on cost, shared for every other."""
        return self.cost_lock.exclusive() if judge_for(stage.check).exclusive else self.cost_lock.shared()

    def run_result(
        self,
        course: Course,
        results: list[StageResult],
        options: RunOptions,
        notices: Iterable[str] = (),
        planned: list[StageSpec] | None = None,
    ) -> RunResult:
        """A run's result around these stage results; with planned (the stages about to be graded) and no results
        yet, what a report's header says before grading, the course's own stages named as they will be."""
        if planned is None:
            ours = [(s.id, s.max_points) for s in results if s.origin == "course"]
        else:
            ours = [(s.id, s.points) for s in planned if self.plan.stage_origin(s) == "course"]
        return RunResult(
            course=str(course.root),
            weights_path=str(self.model.path),
            weights_source=self.weights.source,
            weights_why=self.weights.why,
            synthetic=self.model.synthetic,
            config=self.model.config.as_dict(),
            stages=results,
            notices=[*notices, *self.model.notices],
            seed=options.seed,
            untrusted=self.plan.untrusted,
            course_supplied=self._course_supplied(course, ours, options),
            isolation=self.launcher.isolation.level,
            isolation_summary=self.launcher.isolation.summary,
            processes=self.processes,
        )

    @functools.cached_property
    def processes(self) -> dict[str, str]:
        """The mechanisms this machine gave the process model's jobs, and the CPU meter (for every report's header)."""
        return {**mechanisms(self.plan.untrusted), "cpu": meter_name()}

    def _run_evidence(self, stages: list[StageSpec], run: RunResult, results: list[StageResult]) -> list[StageResult]:
        """The stages of results, each failing one with what its passing cases and the other stages (this run, or
        the course's recorded progress when the course is trusted) say added to its diagnosis."""
        recorded = {} if run.untrusted else load_progress(Path(run.course))
        oracles = {s.id: s.oracle for s in stages}
        n_layer, weights = self.model.config.n_layer, weights_name(run)
        return [stage_evidence(r, oracles.get(r.id, ""), run, n_layer, recorded, weights) for r in results]

    def fingerprint(
        self,
        stages: list[StageSpec],
        run: RunResult,
        options: RunOptions | None = None,
        on_stage: Callable[[StageResult], None] | None = None,
        until: float | None = None,
    ) -> RunResult:
        """The run graded last with fingerprint=False (same stages and options), its failing stages fingerprinted:
        a new RunResult (run is unchanged); the outputs kept for it are dropped. on_stage gets each stage that had
        failing outputs to match, once matched. until (time.monotonic()): no stage is matched after it, and the
        run's notices say which were not."""
        return self._match(stages, run, self._take_outputs(run), options or self.plan.options, on_stage, until)

    def _match(
        self,
        stages: list[StageSpec],
        run: RunResult,
        kept: list[Outputs],
        options: RunOptions,
        on_stage: Callable[[StageResult], None] | None = None,
        until: float | None = None,
    ) -> RunResult:
        """fingerprint(), given the arrays kept for run's stages (one per stage; emptied as each is matched)."""
        results, unmatched = [], []
        for i, (stage, graded) in enumerate(zip(self.with_seed(stages, options), run.stages)):
            outputs: Outputs = {}
            if i < len(kept):
                outputs, kept[i] = kept[i], {}  # each stage's arrays go once it is matched
            matched = options.diagnosis and needs_fingerprint(stage, graded, outputs)
            if matched and _past(until):
                matched = False
                unmatched.append(stage.id)
            result = graded
            if matched:
                with blas_threads_for_load():  # one thread on a busy machine (grading/drive/threads.py)
                    result = fingerprint_stage(stage, graded, outputs, self.model, self.cache, options.first_exact)
            if options.diagnosis:
                [result] = self._run_evidence(stages, run, [result])
            results.append(result)
            if matched and on_stage is not None:
                on_stage(result)
        skipped = [f"known bugs not matched for {', '.join(unmatched)}: the time budget ran out"] if unmatched else []
        return dataclasses.replace(
            run, stages=[*results, *run.stages[len(results) :]], notices=[*run.notices, *skipped]
        )

    def _take_outputs(self, run: RunResult) -> list[Outputs]:
        """The arrays kept for run's stages, taken from the grader ([] if none are): those of the same stage results,
        whatever else of the run was replaced since (its advice)."""
        unmatched = self.unmatched
        if unmatched is None or len(unmatched.run.stages) != len(run.stages):
            return []
        if any(kept is not given for kept, given in zip(unmatched.run.stages, run.stages)):
            return []
        self.unmatched = None
        return list(unmatched.outputs)

    def with_seed(self, stages: list[StageSpec], options: RunOptions) -> list[StageSpec]:
        """The stages with the seed's random cases added (the same ones for every course graded)."""
        if options.seed is None:
            return stages
        return [with_random_cases(s, options.seed, self.model.config) for s in stages]

    def warm(self, stages: list[StageSpec], on_case: OracleProgress | None = None) -> None:
        """Compute every case's oracle output once, before student processes compete for the CPU, and the oracle's
        costs for the cache proof before grading threads run beside their measurement (oraclecost.measure_costs)."""
        for stage in stages:
            spec = resolve_oracle(stage.oracle, stage.source)
            judge_for(stage.check).warm(stage, self.model, self.cache, self.untrusted)
            # the cache proof's lengths fitted to the context, as its judge does, before checking the fit
            stage = oraclecost.fit_to_context(stage, self.model.config.n_ctx)
            for done, case in enumerate(stage.cases, 1):
                check_case_fits(stage, case, self.model)
                if not stage.checks_tokens:  # greedy tokens are verified on each student's own path
                    self.cache.get(self.model, stage, spec, case)
                    if on_case:
                        on_case(stage.id, done, len(stage.cases))

    def _course_supplied(self, course: Course, ours: list[tuple[str, float]], options: RunOptions) -> list[str]:
        """What in this run the course directory chose rather than the instructor, said in words for every report
        (ours: the course directory's own stages, id and points)."""
        lines = []
        if ours:
            lines.append(
                "stages from the course directory: "
                + ", ".join(f"{stage_id} ({points:g} points)" for stage_id, points in ours)
            )
        if self.weights.source == "theinference.toml":
            lines.append(f"weights from the course's theinference.toml: {self.model.path}")
        if timeouts(course, options).chosen_by_course:
            lines.append(f"timeout from the course's theinference.toml: {course.timeout:g} s per call")
        return lines


def _moved(deadline: float | None, waited: float, options: RunOptions) -> float | None:
    """The run's deadline moved by the seconds it waited for the cost lock, never past finish_by."""
    if deadline is None or waited <= 0:
        return deadline
    moved = deadline + waited
    if options.finish_by is not None:
        moved = min(moved, time.monotonic() + options.finish_by - time.time())
    return moved


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


BUDGET_STOPPED = "budget-stopped"  # CaseResult.detail of a case the run's deadline stopped or left unrun: regrade


def _stopped(graded: Graded, deadline: float | None) -> Graded:
    """A stage that timed out once the run's deadline had passed, its timed-out cases marked BUDGET_STOPPED: the
    deadline may have cut them, which is the wall clock's verdict, not the code's."""
    result = graded.result
    if result.status != Status.TIMEOUT or not _past(deadline):
        return graded
    cases = [
        dataclasses.replace(c, detail=BUDGET_STOPPED) if c.status == Status.TIMEOUT and not c.detail else c
        for c in result.cases
    ]
    return dataclasses.replace(graded, result=dataclasses.replace(result, cases=cases))


def not_reached(stage: StageSpec, course: Course, budget: float | None) -> StageResult:
    """A stage the run's deadline passed before it started: not run, each case timed out, 0 points."""
    message = f"not run: the submission's time budget of {budget or 0:g} s ran out before this stage started"
    cases = [
        CaseResult(
            name=c.name, status=Status.TIMEOUT, message=message, detail=BUDGET_STOPPED, inputs=c.inputs, texts=c.texts
        )
        for c in stage.cases
    ]
    return StageResult(
        id=stage.id,
        title=stage.title,
        status=Status.TIMEOUT,
        cases=cases,
        points=0.0,
        max_points=stage.points,
        adapter=stage.adapter,
        adapters_file=str(course.adapters),
        lesson=str(stage.lesson),
        check=stage.check,
        visibility=stage.visibility,
    )
