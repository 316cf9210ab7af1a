"""Everything a grading run needs, loaded once: course, stages, weights, oracle cache."""

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from theinference.course import Course, CourseError, find_course_root, load_course
from theinference.fingerprint import fingerprint_stage
from theinference.grade import GradeContext, GradeError, OracleCache, grade
from theinference.launch import default_launcher
from theinference.oracles import OracleError
from theinference.progress import load_progress, next_stage
from theinference.randomcases import with_random_cases
from theinference.runner import DEFAULT_MEMORY_MB
from theinference.results import RunResult
from theinference.sources import WeightsChoice, obtain_weights
from theinference.stages import StageError, StageSpec, load_stages, stage_dirs
from theinference.weights import Model, WeightsError

# Every error a user can fix by changing their command line or files: exit code 2.
CONFIG_ERRORS = (CourseError, StageError, WeightsError, GradeError, OracleError)


class UsageError(Exception):
    """The command line asks for something that does not exist (exit code 2)."""


def locate_course(course_dir: Path | None) -> Course:
    """The course given with --course, else the nearest ancestor of the working directory."""
    if course_dir is None:
        root = find_course_root(Path.cwd())
        if root is None:
            raise CourseError(
                f"no course directory here: {Path.cwd()} and its parents hold no theinference.toml or "
                "tests/adapters.py (run in your course directory, pass --course DIR, or start one with `theinference init`)"
            )
        course_dir = root
    return load_course(course_dir)


def select_stages(stages: list[StageSpec], wanted: list[str]) -> list[StageSpec]:
    """The stages named (in course order), or all of them; unknown ids raise UsageError."""
    by_id = {s.id: s for s in stages}
    for stage_id in wanted:
        if stage_id not in by_id:
            close = difflib.get_close_matches(stage_id, by_id, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise UsageError(f"unknown stage '{stage_id}'.{hint} Known stages: {', '.join(by_id)}")
    return [s for s in stages if s.id in wanted] if wanted else stages


def choose_stages(session: "Session", wanted: list[str] | None) -> list[StageSpec]:
    """Stages to grade: those named; all for []; for None, the first not yet passed (all once every one has)."""
    if wanted is not None:
        return select_stages(session.stages, wanted)
    upcoming = next_stage(session.stages, load_progress(session.course.root))
    return [upcoming] if upcoming else session.stages


@dataclass(frozen=True)
class RunOptions:
    """How to grade: per-call timeout override, memory cap, CI hygiene, random extra cases."""

    timeout: float | None = None
    memory_mb: int | None = DEFAULT_MEMORY_MB
    scrub_secrets: bool = False
    seed: int | None = None
    env: dict = field(default_factory=dict)  # extra environment for student processes
    fingerprint: bool = True  # False: leave it to fingerprint_run (watch shows the verdict first)


@dataclass
class Session:
    course: Course
    stages: list[StageSpec]
    weights: WeightsChoice
    model: Model
    made_weights: bool = False
    cache: OracleCache = field(default_factory=OracleCache)
    launcher: object = field(default_factory=default_launcher)

    def close(self) -> None:
        """Stop the pre-warmed student-process launcher, if any."""
        self.launcher.close()

    def run(self, selected: list[StageSpec], options: "RunOptions | None" = None) -> RunResult:
        """Grade the selected stages in order (with the seed's random cases added, if any)."""
        options = options or RunOptions()
        ctx = GradeContext(course=self.course, model=self.model, cache=self.cache, timeout=options.timeout, env=options.env,
                           launcher=self.launcher, memory_mb=options.memory_mb, scrub_secrets=options.scrub_secrets,
                           fingerprint=options.fingerprint)
        selected = self._with_seed(selected, options)
        return RunResult(
            course=str(self.course.root), weights_path=str(self.model.path), weights_source=self.weights.source,
            weights_why=self.weights.why, synthetic=self.model.synthetic, config=self.model.config.as_dict(),
            stages=[grade(stage, ctx) for stage in selected], notices=list(self.model.notices), seed=options.seed,
        )


    def _with_seed(self, selected: list[StageSpec], options: RunOptions) -> list[StageSpec]:
        if options.seed is None:
            return selected
        return [with_random_cases(s, options.seed, self.model.config) for s in selected]

    def fingerprint_run(self, selected: list[StageSpec], run: RunResult, options: "RunOptions | None" = None) -> None:
        """Fingerprint the failing stages of a run graded with fingerprint=False (same stages and options)."""
        for stage, result in zip(self._with_seed(selected, options or RunOptions()), run.stages):
            fingerprint_stage(stage, result, self.model, self.cache)


def open_session(course_dir: Path | None, weights: str | None, extra_stage_dirs: list[Path],
                 progress: Callable[[int, int], None] | None = None) -> Session:
    """Load course, stages and weights (making the default synthetic weights if they are the choice)."""
    course = locate_course(course_dir)
    stages = load_stages(stage_dirs(course.root, [*course.stages_dirs, *extra_stage_dirs]))
    choice, model, made = obtain_weights(weights, course.weights, progress)
    return Session(course=course, stages=stages, weights=choice, model=model, made_weights=made)
