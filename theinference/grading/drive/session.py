"""A course and its stages with the Grader that grades them; finding the course and choosing its stages; and the
one sequence every run of a course goes through (Session.run): grade, record progress, advise, match known bugs,
each phase told to the run's listener as typed events (grading/judge/events.py)."""

import dataclasses
import difflib
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from theinference.course import Course
from theinference.grading.drive.advice import advise
from theinference.grading.drive.progress import load_progress, next_stage, record_progress
from theinference.grading.judge.events import (
    Listener,
    OracleComputed,
    OracleComputing,
    RunDone,
    RunStarted,
    StageGraded,
    StageMatched,
    VerdictsDone,
    ignore,
)
from theinference.grading.judge.results import RunResult
from theinference.grading.spec.stages import StageSpec
from theinference.errors import UsageError
from theinference.grading.drive.grader import Grader
from theinference.grading.drive.plan import RunPlan
from theinference.model.weights import Model, load_model


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
    def model(self) -> Model:
        """The weights graded against, loaded."""
        return self.grader.model

    @property
    def made_weights(self) -> bool:
        """The default synthetic weights were made for this session."""
        return self.grader.made_weights

    def hide(self, path: Path) -> None:
        """Keep path (a results file) unreadable by student processes."""
        self.grader.hide(path)

    def reload(self, settings: bool = True) -> None:
        """Read again what changed on disk (watch): with settings, the course's theinference.toml and stage files;
        the weights when their file changed (the old file's oracle outputs can never hit again: dropped)."""
        if settings:
            self.grader.plan = self.plan.reloaded()
            self.stages = self.plan.stages()
        grader = self.grader
        if grader.model.is_stale():
            grader.model = load_model(grader.model.path)
            grader.cache.entries.clear()

    def run(
        self,
        selected: list[StageSpec],
        listen: Listener = ignore,
        *,
        verdicts_first: bool = True,
        plan: RunPlan | None = None,
        follow_up: bool = True,
    ) -> RunResult:
        """Grade the selected stages in order, the one sequence of every run: RunStarted (the header), each
        stage's verdict (StageGraded), the course's progress recorded (trusted runs) and the run advised
        (VerdictsDone), each failing stage matched against known bugs (StageMatched), RunDone.

        verdicts_first: every verdict before any known bug is matched (a screen or a streamed report); False, each
        stage matched as it is graded (a report written once). plan: another course graded with this session's
        grader (the demo's buggy copy; default the session's own). follow_up False: neither progress nor advice.
        """
        plan = plan or self.plan
        assert plan.course is not None
        course, options, notices = plan.course, plan.options, list(plan.notices)
        grader = self.grader
        with _oracle_told(grader, listen):
            listen(RunStarted(grader.run_result(course, [], options, notices, selected)))
            run = grader.grade(
                course,
                selected,
                dataclasses.replace(options, fingerprint=False) if verdicts_first else options,
                notices,
                on_case=listen,
                on_stage=lambda result: listen(StageGraded(result)),
            )
            notice = ""
            if follow_up:
                progress = None  # untrusted grading neither reads nor writes the course's progress
                if not plan.untrusted:
                    progress, notice = record_progress(course.root, run, options.timeout)
                run = dataclasses.replace(run, advice=advise(run, self.stages, progress))
            listen(VerdictsDone(run, notice))
            if verdicts_first:
                run = grader.fingerprint(selected, run, options, on_stage=lambda result: listen(StageMatched(result)))
            listen(RunDone(run, notice))
        return run


class _OracleListener:
    """The oracle cache's progress (start/finish of an output it computes), told to a run's listener."""

    def __init__(self, listen: Listener):
        self.listen = listen

    def start(self, label: str) -> None:
        self.listen(OracleComputing(label))

    def finish(self, label: str) -> None:
        self.listen(OracleComputed(label))


@contextmanager
def _oracle_told(grader: Grader, listen: Listener):
    """While a run grades: the oracle outputs its cache computes told to listen."""
    before, grader.cache.progress = grader.cache.progress, _OracleListener(listen)
    try:
        yield
    finally:
        grader.cache.progress = before


def open_session(plan: RunPlan, progress: Callable[..., None] | None = None) -> Session:
    """Load the plan's stages, then open its grader (Grader.open: launcher, weights, oracle cache)."""
    stages = plan.stages()
    return Session(stages=stages, grader=Grader.open(plan, progress))
