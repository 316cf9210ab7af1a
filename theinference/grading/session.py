"""Everything a grading run needs, loaded once: course, stages, weights, oracle cache."""

import dataclasses
import difflib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from theinference.course import Course, CourseError, find_course_root, load_course
from theinference.grading.fingerprint import fingerprint_stage
from theinference.grading.grade import GradeContext, OracleCache, grade
from theinference.proc.launch import Launcher, default_launcher
from theinference.grading.progress import load_progress, next_stage
from theinference.grading.randomcases import with_random_cases
from theinference.proc.runner import DEFAULT_MEMORY_MB
from theinference.grading.results import RunResult
from theinference.model.weights_choice import WeightsChoice, obtain_weights
from theinference.grading.stages import StageSpec, load_stages, stage_dirs
from theinference.trust import stage_origin, untrusted_course
from theinference.model.weights import Model
from theinference.errors import ConfigError, UsageError

# Every error a user can fix by changing their command line or files: exit code 2.
CONFIG_ERRORS = (ConfigError,)


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
        try:
            return select_stages(session.stages, wanted)
        except UsageError as e:
            if session.untrusted:  # the stage may well be in the course's stages/, which was not read
                raise UsageError(f"{e} (untrusted grading reads no stage files from the course directory)") from None
            raise
    upcoming = next_stage(session.stages, load_progress(session.course.root))
    return [upcoming] if upcoming else session.stages


@dataclass(frozen=True)
class RunOptions:
    """How to grade: per-call timeout override, memory cap, trust, random extra cases."""

    timeout: float | None = None
    memory_mb: int | None = DEFAULT_MEMORY_MB
    untrusted: bool = False  # student processes get only the allow-listed environment (theinference.trust)
    seed: int | None = None
    env: dict = field(default_factory=dict)  # extra environment for student processes
    fingerprint: bool = True  # False: leave it to fingerprint_run (watch shows the verdict first)
    all_cases: bool = False  # keep running a stage's cases after one timed out
    submission_timeout: float | None = None  # wall seconds for the whole run, after which the rest times out


@dataclass
class Session:
    course: Course
    stages: list[StageSpec]
    weights: WeightsChoice
    model: Model
    made_weights: bool = False
    cache: OracleCache = field(default_factory=OracleCache)
    launcher: Launcher = field(default_factory=default_launcher)
    untrusted: bool = False  # the submission's stages, weights, stage dirs and timeout were not read
    extra_stage_dirs: list[Path] = field(default_factory=list)  # the instructor's --stages-dir
    notices: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Stop the pre-warmed student-process launcher, if any."""
        self.launcher.close()

    def run(self, selected: list[StageSpec], options: "RunOptions | None" = None) -> RunResult:
        """Grade the selected stages in order (with the seed's random cases added, if any)."""
        options = options or RunOptions()
        budget = options.submission_timeout
        ctx = GradeContext(course=self.course, model=self.model, cache=self.cache, timeout=options.timeout, env=options.env,
                           launcher=self.launcher, memory_mb=options.memory_mb, untrusted=self.untrusted or options.untrusted,
                           fingerprint=options.fingerprint, all_cases=options.all_cases, budget=budget,
                           deadline=time.monotonic() + budget if budget else None)
        selected = self._with_seed(selected, options)
        stages = [dataclasses.replace(grade(stage, ctx), origin=stage_origin(stage.source, self.extra_stage_dirs))
                  for stage in selected]
        return RunResult(
            course=str(self.course.root), weights_path=str(self.model.path), weights_source=self.weights.source,
            weights_why=self.weights.why, synthetic=self.model.synthetic, config=self.model.config.as_dict(),
            stages=stages, notices=[*self.notices, *self.model.notices], seed=options.seed,
            untrusted=self.untrusted or options.untrusted, course_supplied=self._course_supplied(stages, options),
            isolation=self.launcher.isolation.level, isolation_summary=self.launcher.isolation.summary,
        )

    def _course_supplied(self, stages: list, options: "RunOptions") -> list[str]:
        """What in this run the course directory chose rather than the instructor, said in words for every report."""
        lines = []
        ours = [s for s in stages if s.origin == "course"]
        if ours:
            lines.append("stages from the course directory: " + ", ".join(f"{s.id} ({s.max_points:g} points)" for s in ours))
        if self.weights.source == "theinference.toml":
            lines.append(f"weights from the course's theinference.toml: {self.model.path}")
        if self.course.timeout and options.timeout is None:
            lines.append(f"timeout from the course's theinference.toml: {self.course.timeout:g} s per call")
        return lines


    def _with_seed(self, selected: list[StageSpec], options: RunOptions) -> list[StageSpec]:
        if options.seed is None:
            return selected
        return [with_random_cases(s, options.seed, self.model.config) for s in selected]

    def fingerprint_run(self, selected: list[StageSpec], run: RunResult, options: "RunOptions | None" = None) -> None:
        """Fingerprint the failing stages of a run graded with fingerprint=False (same stages and options)."""
        for stage, result in zip(self._with_seed(selected, options or RunOptions()), run.stages):
            fingerprint_stage(stage, result, self.model, self.cache)


def open_session(course_dir: Path | None, weights: str | None, extra_stage_dirs: list[Path],
                 progress: Callable[[int, int], None] | None = None, untrusted: bool = False) -> Session:
    """Load course, stages and weights (making the default synthetic weights if they are the choice).

    untrusted: the course's own stages, stage dirs, weights and timeout are ignored (theinference.trust), and
    student processes run under the strongest isolation available (theinference.proc.sandbox).
    """
    course, notices = untrusted_course(locate_course(course_dir)) if untrusted else (locate_course(course_dir), [])
    stage_root = None if untrusted else course.root
    stages = load_stages(stage_dirs(stage_root, [*course.stages_dirs, *extra_stage_dirs]))
    choice, model, made = obtain_weights(weights, course.weights, progress)
    return Session(course=course, stages=stages, weights=choice, model=model, made_weights=made, untrusted=untrusted,
                   extra_stage_dirs=list(extra_stage_dirs), notices=notices, launcher=default_launcher(untrusted=untrusted))
