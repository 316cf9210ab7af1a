"""A run's plan: every setting of one command, resolved once (plan_run) and only read after that.

Every command that reads stages or grades (`test`, `watch`, `demo`, `grade`, `oracle`, `stages list|show|check`,
`autograder`, `init`, `stages new`) calls plan_run once with its command-line values. The plan decides:

  trust        trusted (a student's own `test`) or untrusted (`grade`, `test --untrusted`, CI, Gradescope output):
               decided here and nowhere else
  course       the course as grading may read it (untrusted: without its weights, stages_dirs and timeout,
               each ignored with a notice in `notices`)
  stage_dirs   where stages come from, in order: built-in, the course's own (trusted only), the instructor's
  weights      the instructor's --weights; the course's setting is used only when trusted
  options      limits of the student's processes, seed, budgets, diagnosis
  timeouts     the seconds per adapter call: --timeout, else the course's (trusted), else the stage's

A batch grades many courses with one plan: for_course reads each submission as the plan reads courses.
"""

import dataclasses
import datetime
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from theinference.course import Course, CourseError, course_root, load_course
from theinference.errors import ConfigError, UsageError
from theinference.grading.oracle.cache import OracleCache
from theinference.grading.oracle.store import default_store
from theinference.grading.spec.randomcases import resolve_seed
from theinference.grading.spec.stages import StageSpec, load_stages, stage_dirs
from theinference.grading.spec.timeouts import Timeouts
from theinference.model.weights import Model
from theinference.model.weights_choice import WeightsChoice, obtain_weights
from theinference.proc.launch import Isolation, Launcher, default_launcher
from theinference.proc.limits import DEFAULT_MEMORY_MB, Limits
from theinference.terminals import untrusted_run
from theinference.trust import stage_origin, untrusted_course


class CourseNeed(Enum):
    """Whether a command needs a course directory: `test` does; `oracle` and `stages list` use one if found."""

    REQUIRED = "required"
    OPTIONAL = "optional"
    NONE = "none"  # `grade` (its submissions are courses of their own), `stages check`, `init`


@dataclass(frozen=True)
class RunOptions:
    """How to grade: the student processes' limits, random extra cases, fingerprinting, budgets."""

    limits: Limits = field(default_factory=Limits)  # passed unchanged to every student process
    timeout: float | None = None  # --timeout: seconds per adapter call over every stage's and course's own
    seed: int | None = None
    fingerprint: bool = True  # False: leave it to Grader.fingerprint (watch and `test` show the verdict first)
    diagnosis: bool = True  # False (--no-diagnosis): no fingerprints at all, not even later
    # Stop screening known bugs at the first exact match (`test`, `grade`: cheaper); False names every tie
    # (`stages check` proves the manifests' lists of bugs).
    first_exact: bool = False
    all_cases: bool = False  # keep running a stage's cases after one timed out
    submission_timeout: float | None = None  # wall seconds for the whole run, after which the rest times out
    # An absolute deadline (time.time(), `grade --finish-by`): the run ends by then however late it started, e.g.
    # Gradescope's clock, which started before the grader did and its oracle outputs were computed.
    finish_by: float | None = None

    def deadline(self) -> tuple[float | None, float | None]:
        """When a run starting now must end (time.monotonic()) and the seconds that leaves: the nearer of the
        submission budget, counted from now, and finish_by; (None, None) without either."""
        now = time.monotonic()
        ends = [now + self.submission_timeout] if self.submission_timeout else []
        if self.finish_by is not None:
            ends.append(now + self.finish_by - time.time())
        if not ends:
            return None, None
        end = min(ends)
        return end, round(max(0.0, end - now), 1)


# The levels of proc/sandbox.py, strongest first: what --require-isolation compares the chosen one with.
ISOLATION_LEVELS = ("sandbox", "namespaces", "unprivileged", "subreaper", "process-group")


class IsolationTooWeak(ConfigError):
    """--require-isolation asked for a stronger confinement than this machine gives (exit 2, nothing graded)."""


def check_isolation(isolation: Isolation, required: str) -> None:
    """Raise IsolationTooWeak if isolation is weaker than the required level (one of ISOLATION_LEVELS)."""
    if ISOLATION_LEVELS.index(isolation.level) <= ISOLATION_LEVELS.index(required):
        return
    raise IsolationTooWeak(
        f"--require-isolation {required}: student code would run at the weaker {isolation.level} level here "
        f"({isolation.summary}); nothing was graded. "
        + (
            "bubblewrap is missing or cannot make its namespaces: install it (apt-get install bubblewrap) and check "
            "`bwrap --ro-bind / / --unshare-pid --unshare-net true`; on Ubuntu 24.04 AppArmor forbids unprivileged "
            "user namespaces unless `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`"
            if required == "sandbox"
            else f"grade where the {required} level is available"
        )
    )


def timeouts(course: Course | None, options: RunOptions) -> Timeouts:
    """The timeout rule for grading this course (as the plan read it) with these options."""
    return Timeouts(options.timeout, course.timeout if course is not None else None)


@dataclass(frozen=True)
class RunPlan:
    """Every setting of one command's run (see the module's docstring); made by plan_run, never changed."""

    course: Course | None
    trusted: bool
    stage_dirs: tuple[Path, ...]
    instructor_dirs: tuple[Path, ...] = ()  # --stages-dir
    weights: str | None = None  # --weights
    options: RunOptions = field(default_factory=RunOptions)
    allow_root: bool = False  # the instructor's consent to untrusted grading as root without a sandbox
    require_isolation: str | None = None  # --require-isolation: the weakest level grading may run at
    notices: tuple[str, ...] = ()  # the course's settings that untrusted grading ignored

    @property
    def untrusted(self) -> bool:
        return not self.trusted

    @property
    def timeouts(self) -> Timeouts:
        return timeouts(self.course, self.options)

    def stages(self) -> list[StageSpec]:
        """The stages of every source, in course order."""
        return load_stages(list(self.stage_dirs))

    def stage_origin(self, stage: StageSpec) -> str:
        """ "built-in", "--stages-dir" or "course": where this plan found the stage."""
        return stage_origin(stage.source, list(self.instructor_dirs))

    def load_weights(self, progress: Callable[..., None] | None = None) -> tuple[WeightsChoice, Model, bool]:
        """The weights this run grades against (made if they are a missing preset): choice, model, made."""
        course = self.course
        return obtain_weights(
            self.weights,
            course.weights if course else None,
            progress,
            self.untrusted,
            course.weights_setting if course else None,
        )

    def launcher(self) -> Launcher:
        """How this run's student processes start: the strongest isolation here when untrusted; IsolationTooWeak if
        that is weaker than --require-isolation."""
        launcher = default_launcher(untrusted=self.untrusted, allow_root=self.allow_root)
        if self.require_isolation is not None:
            try:
                check_isolation(launcher.isolation, self.require_isolation)
            except IsolationTooWeak:
                launcher.close()
                raise
        return launcher

    def oracle_cache(self) -> OracleCache:
        """The oracle's cache; the persistent store only for trusted runs (a student process could write to it)."""
        return OracleCache(store=None if self.untrusted else default_store())

    def for_course(self, course: Course) -> "RunPlan":
        """This plan for another course (a batch's submission, the demo's buggy copy), read as this plan reads
        courses; its stages stay this plan's."""
        read, notices = untrusted_course(course) if self.untrusted else (course, [])
        return dataclasses.replace(self, course=read, notices=tuple(notices))

    def reloaded(self) -> "RunPlan":
        """The plan again after the course's theinference.toml or stage files changed (watch: trusted only)."""
        assert self.course is not None and self.trusted
        course = load_course(self.course.root)
        return dataclasses.replace(self, course=course, stage_dirs=_stage_dirs(course, self.instructor_dirs, True))


def plan_run(
    course_dir: Path | None = None,
    *,
    need: CourseNeed = CourseNeed.REQUIRED,
    weights: str | None = None,
    stages_dirs: Sequence[Path] = (),
    timeout: float | None = None,
    memory_limit_mb: int | None = DEFAULT_MEMORY_MB,
    seed: str | None = None,
    untrusted: bool = False,
    gradescope: bool = False,
    all_cases: bool = False,
    submission_timeout: float | None = None,
    diagnosis: bool = True,
    allow_root: bool = False,
    first_exact: bool = True,
    finish_by: str | None = None,
    require_isolation: str | None = None,
) -> RunPlan:
    """The one resolution of a command's settings.

    untrusted: asked for (`--untrusted`, `grade`); gradescope: the report is Gradescope's (a grade); CI=true makes
    untrusted every run of a command that reads a course directory (terminals.untrusted_run). first_exact: stop screening known bugs at the first exact match (a student or a TA needs the bug
    named; `stages check` wants every tie)."""
    trusted = not untrusted_run(untrusted, gradescope, reads_course=need is not CourseNeed.NONE)
    course, notices = _read_course(course_dir, need, trusted)
    instructor = tuple(Path(d) for d in stages_dirs)
    options = RunOptions(
        limits=Limits(memory_mb=memory_limit_mb or None),
        timeout=timeout,
        seed=_seed(seed),
        all_cases=all_cases,
        submission_timeout=submission_timeout or None,
        diagnosis=diagnosis,
        first_exact=first_exact,
        finish_by=_finish_by(finish_by),
    )
    return RunPlan(
        course=course,
        trusted=trusted,
        stage_dirs=_stage_dirs(course, instructor, trusted),
        instructor_dirs=instructor,
        weights=weights,
        options=options,
        allow_root=allow_root,
        require_isolation=require_isolation,
        notices=tuple(notices),
    )


def _stage_dirs(course: Course | None, instructor: tuple[Path, ...], trusted: bool) -> tuple[Path, ...]:
    return tuple(stage_dirs(course, instructor, trusted=trusted))


def _seed(seed: str | None) -> int | None:
    try:
        return resolve_seed(seed)
    except ValueError:
        raise UsageError(f"--seed takes an integer or 'random', not {seed!r}") from None


def _finish_by(text: str | None) -> float | None:
    """--finish-by: Unix seconds (`date +%s`), or an ISO 8601 date and time with its zone."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None and math.isfinite(seconds):
        return seconds
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise UsageError(
            f"--finish-by takes Unix seconds (as `date +%s` prints) or an ISO 8601 time with its zone "
            f"(2026-12-01T23:59:00Z), not {text!r}"
        )
    return moment.timestamp()


def _read_course(course_dir: Path | None, need: CourseNeed, trusted: bool) -> tuple[Course | None, list[str]]:
    """The course this command works on, as the plan may read it, and what of it was ignored."""
    if need is CourseNeed.NONE:
        return None, []
    root = course_root(course_dir)
    if root is None:
        if need is CourseNeed.OPTIONAL:
            return None, []
        raise CourseError(
            f"no course directory here: {Path.cwd()} and its parents hold no theinference.toml or "
            "tests/adapters.py (run in your course directory, pass --course DIR, or start one with `theinference init`)"
        )
    course = load_course(root)
    return untrusted_course(course) if not trusted else (course, [])
