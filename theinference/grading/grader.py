"""The Grader: what stays warm between runs (weights, model, oracle cache, launcher); it grades any course.

`test`, `watch` and `demo` hold one for their course (through a Session), `grade` one for every
submission, `stages check` one for every subject. It is a context manager: leaving it stops the
launcher's pre-warmed processes.
"""

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from theinference.course import Course
from theinference.grading import scaling
from theinference.grading.evidence import add_run_evidence
from theinference.grading.progress import load_progress, weights_name
from theinference.grading.fingerprint import fingerprint_stage
from theinference.grading.grade import GradeContext, OracleCache, check_case_fits, grade
from theinference.grading.oracle_registry import resolve_oracle
from theinference.grading.randomcases import with_random_cases
from theinference.grading.results import RunResult, StageResult
from theinference.grading.stages import TOKEN_COMPARES, StageSpec
from theinference.model.weights import Model
from theinference.model.weights_choice import WeightsChoice
from theinference.proc.launch import Launcher, default_launcher
from theinference.proc.limits import Limits
from theinference.trust import stage_origin


OracleProgress = Callable[[str, int, int], None]  # (stage id, cases done, cases in that stage)


@dataclass(frozen=True)
class RunOptions:
    """How to grade: the student processes' limits, random extra cases, fingerprinting, budgets."""

    limits: Limits = field(default_factory=Limits)  # passed unchanged to every student process
    seed: int | None = None
    fingerprint: bool = True  # False: leave it to Grader.fingerprint (watch shows the verdict first)
    all_cases: bool = False  # keep running a stage's cases after one timed out
    submission_timeout: float | None = None  # wall seconds for the whole run, after which the rest times out


@dataclass
class Grader:
    weights: WeightsChoice
    model: Model
    made_weights: bool = False  # the default synthetic weights were made for this run
    cache: OracleCache = field(default_factory=OracleCache)
    launcher: Launcher = field(default_factory=default_launcher)
    untrusted: bool = False  # submissions choose nothing: not their stages, weights, stage dirs or timeout
    extra_stage_dirs: list[Path] = field(default_factory=list)  # the instructor's --stages-dir

    def __enter__(self) -> "Grader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the pre-warmed student-process launcher, if any."""
        self.launcher.close()

    def grade(
        self, course: Course, stages: list[StageSpec], options: RunOptions | None = None, notices: Iterable[str] = ()
    ) -> RunResult:
        """Grade the stages in order on the course (with the seed's random cases added, if any)."""
        options = options or RunOptions()
        budget = options.submission_timeout
        untrusted = self.untrusted or options.limits.untrusted
        ctx = GradeContext(
            course=course,
            model=self.model,
            cache=self.cache,
            limits=options.limits,
            launcher=self.launcher,
            fingerprint=options.fingerprint,
            all_cases=options.all_cases,
            budget=budget,
            deadline=time.monotonic() + budget if budget else None,
        )
        results = [
            dataclasses.replace(grade(stage, ctx), origin=stage_origin(stage.source, self.extra_stage_dirs))
            for stage in self.with_seed(stages, options)
        ]
        run = RunResult(
            course=str(course.root),
            weights_path=str(self.model.path),
            weights_source=self.weights.source,
            weights_why=self.weights.why,
            synthetic=self.model.synthetic,
            config=self.model.config.as_dict(),
            stages=results,
            notices=[*notices, *self.model.notices],
            seed=options.seed,
            untrusted=untrusted,
            course_supplied=self._course_supplied(course, results, options),
            isolation=self.launcher.isolation.level,
            isolation_summary=self.launcher.isolation.summary,
        )
        if options.fingerprint:
            self._run_evidence(stages, run)
        return run

    def _run_evidence(self, stages: list[StageSpec], run: RunResult) -> None:
        """Each failing stage's diagnosis gets what its passing cases and the other stages (this run, or the
        course's recorded progress when the course is trusted) say."""
        recorded = {} if run.untrusted else load_progress(Path(run.course))
        oracles = {s.id: s.oracle for s in stages}
        add_run_evidence(run, oracles, self.model.config.n_layer, recorded, weights_name(run))

    def fingerprint(self, stages: list[StageSpec], run: RunResult, options: RunOptions | None = None) -> None:
        """Fingerprint the failing stages of a run graded with fingerprint=False (same stages and options)."""
        for stage, result in zip(self.with_seed(stages, options or RunOptions()), run.stages):
            fingerprint_stage(stage, result, self.model, self.cache)
        self._run_evidence(stages, run)

    def with_seed(self, stages: list[StageSpec], options: RunOptions) -> list[StageSpec]:
        """The stages with the seed's random cases added (the same ones for every course graded)."""
        if options.seed is None:
            return stages
        return [with_random_cases(s, options.seed, self.model.config) for s in stages]

    def warm(self, stages: list[StageSpec], on_case: OracleProgress | None = None) -> None:
        """Compute every case's oracle output once, before student processes compete for the CPU."""
        for stage in stages:
            spec = resolve_oracle(stage.oracle, stage.source)
            stage = scaling.fit_to_context(stage, self.model.config.n_ctx)  # as grade() does, before checking the fit
            for done, case in enumerate(stage.cases, 1):
                check_case_fits(stage, case, self.model)
                if stage.compare not in TOKEN_COMPARES:  # greedy tokens are verified on each student's own path
                    self.cache.get(self.model, stage, spec, case)
                    if on_case:
                        on_case(stage.id, done, len(stage.cases))

    def _course_supplied(self, course: Course, stages: list[StageResult], options: RunOptions) -> list[str]:
        """What in this run the course directory chose rather than the instructor, said in words for every report."""
        lines = []
        ours = [s for s in stages if s.origin == "course"]
        if ours:
            lines.append(
                "stages from the course directory: " + ", ".join(f"{s.id} ({s.max_points:g} points)" for s in ours)
            )
        if self.weights.source == "theinference.toml":
            lines.append(f"weights from the course's theinference.toml: {self.model.path}")
        if course.timeout and options.limits.timeout is None:
            lines.append(f"timeout from the course's theinference.toml: {course.timeout:g} s per call")
        return lines
