"""A course and its stages with the Grader that grades them; finding the course and choosing its stages."""

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from theinference.course import Course, CourseError, course_root, load_course
from theinference.proc.launch import default_launcher
from theinference.grading.oracle.cache import OracleCache
from theinference.grading.oracle.store import default_store
from theinference.grading.drive.progress import load_progress, next_stage
from theinference.grading.judge.results import RunResult, StageResult
from theinference.model.weights_choice import obtain_weights
from theinference.grading.spec.stages import StageSpec, load_stages, stage_dirs
from theinference.trust import untrusted_course
from theinference.errors import UsageError
from theinference.grading.drive.grader import CaseEvent, Grader, RunOptions


def locate_course(course_dir: Path | None) -> Course:
    """The course given with --course, else the nearest ancestor of the working directory."""
    root = course_root(course_dir)
    if root is None:
        raise CourseError(
            f"no course directory here: {Path.cwd()} and its parents hold no theinference.toml or "
            "tests/adapters.py (run in your course directory, pass --course DIR, or start one with `theinference init`)"
        )
    return load_course(root)


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


@dataclass
class Session:
    """One course and its stages, graded by a Grader: what `test`, `watch` and `demo` hold."""

    course: Course
    stages: list[StageSpec]
    grader: Grader
    notices: list[str] = field(default_factory=list)  # settings of the course that untrusted grading ignored

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the grader's pre-warmed student-process launcher, if any."""
        self.grader.close()

    @property
    def untrusted(self) -> bool:
        return self.grader.untrusted

    def run(
        self,
        selected: list[StageSpec],
        options: RunOptions | None = None,
        on_case: CaseEvent | None = None,
        on_stage: Callable[[StageResult], None] | None = None,
    ) -> RunResult:
        """Grade the selected stages of this course in order (see Grader.grade for the callbacks)."""
        return self.grader.grade(self.course, selected, options, self.notices, on_case=on_case, on_stage=on_stage)


def open_session(
    course_dir: Path | None,
    weights: str | None,
    extra_stage_dirs: list[Path],
    progress: Callable[..., None] | None = None,
    untrusted: bool = False,
    allow_root: bool = False,
) -> Session:
    """Load course, stages and weights (making the default synthetic weights if they are the choice).

    untrusted: the course's own stages, stage dirs, weights and timeout are ignored (theinference.trust), and
    student processes run under the strongest isolation available (theinference.proc.sandbox).
    """
    course, notices = untrusted_course(locate_course(course_dir)) if untrusted else (locate_course(course_dir), [])
    launcher = default_launcher(untrusted=untrusted, allow_root=allow_root)
    launcher.warm()  # a zygote imports numpy while stages and weights load
    try:
        stages = load_stages(stage_dirs(course, extra_stage_dirs, trusted=not untrusted))
        choice, model, made = obtain_weights(weights, course.weights, progress, untrusted, course.weights_setting)
    except BaseException:
        launcher.close()
        raise
    # The persistent store is read by trusted runs only: a student process could have written into it.
    cache = OracleCache(store=None if untrusted else default_store())
    grader = Grader(
        weights=choice,
        model=model,
        made_weights=made,
        untrusted=untrusted,
        cache=cache,
        extra_stage_dirs=list(extra_stage_dirs),
        launcher=launcher,
    )
    return Session(course=course, stages=stages, grader=grader, notices=notices)
