"""A course and its stages with the Grader that grades them; finding the course and choosing its stages."""

import difflib
from collections.abc import Callable
from dataclasses import dataclass

from theinference.course import Course
from theinference.grading.drive.progress import load_progress, next_stage
from theinference.grading.judge.results import RunResult, StageResult
from theinference.grading.spec.stages import StageSpec
from theinference.errors import UsageError
from theinference.grading.drive.grader import CaseEvent, Grader
from theinference.grading.drive.plan import RunOptions, RunPlan


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
            if session.plan.untrusted:  # the stage may well be in the course's stages/, which was not read
                raise UsageError(f"{e} (untrusted grading reads no stage files from the course directory)") from None
            raise
    upcoming = next_stage(session.stages, load_progress(session.course.root))
    return [upcoming] if upcoming else session.stages


@dataclass
class Session:
    """One course and its stages, graded by a Grader: what `test`, `watch` and `demo` hold. The course and its
    settings are the grader's plan's (grader.plan, made once by plan_run; watch replaces it when files change)."""

    stages: list[StageSpec]
    grader: Grader

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the grader's pre-warmed student-process launcher, if any."""
        self.grader.close()

    @property
    def plan(self) -> RunPlan:
        return self.grader.plan

    @property
    def course(self) -> Course:
        assert self.plan.course is not None  # a session's plan needs its course (CourseNeed.REQUIRED)
        return self.plan.course

    @property
    def notices(self) -> list[str]:
        """The course's settings that untrusted grading ignored."""
        return list(self.plan.notices)

    def reload(self) -> None:
        """Read the course's theinference.toml and stage files again (watch, after they changed)."""
        self.grader.plan = self.plan.reloaded()
        self.stages = self.plan.stages()

    def run(
        self,
        selected: list[StageSpec],
        options: RunOptions | None = None,
        on_case: CaseEvent | None = None,
        on_stage: Callable[[StageResult], None] | None = None,
    ) -> RunResult:
        """Grade the selected stages of this course in order (see Grader.grade for the callbacks)."""
        return self.grader.grade(self.course, selected, options, self.notices, on_case=on_case, on_stage=on_stage)


def open_session(plan: RunPlan, progress: Callable[..., None] | None = None) -> Session:
    """Load the plan's stages and weights (making the default synthetic weights if they are the choice), and start
    its launcher: under the strongest isolation available when the plan is untrusted (theinference.proc.sandbox)."""
    launcher = plan.launcher()
    launcher.warm()  # a zygote imports numpy while stages and weights load
    try:
        stages = plan.stages()
        choice, model, made = plan.load_weights(progress)
    except BaseException:
        launcher.close()
        raise
    grader = Grader(
        weights=choice, model=model, made_weights=made, cache=plan.oracle_cache(), launcher=launcher, plan=plan
    )
    return Session(stages=stages, grader=grader)
