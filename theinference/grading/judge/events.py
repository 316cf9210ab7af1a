"""What a grading run tells its listener as it goes: one stream of typed events, in the order they happen.

A run (drive/session.py: Session.run) tells RunStarted (the report's header), then for each stage its cases
(CaseStarted, CallStarted for a stage the grader drives call by call, CaseEnded) and any oracle output it
computes (OracleComputing, OracleComputed), then StageGraded with the stage's verdict; once every verdict is out,
VerdictsDone (the run advised, its progress recorded), then StageMatched for each failing stage matched against
known bugs, and RunDone with the finished run. The live line, the streamed report and watch mode's screen are
listeners: each takes the events it shows and ignores the others.
"""

from collections.abc import Callable
from dataclasses import dataclass

from theinference.grading.judge.results import RunResult, StageResult
from theinference.grading.spec.stages import StageSpec


@dataclass(frozen=True)
class CaseStarted:
    """Case index of stage started in the student's process."""

    stage: StageSpec
    index: int


@dataclass(frozen=True)
class CallStarted:
    """A call of case index started, in a stage the grader drives call by call (cache-scaling): what it is."""

    stage: StageSpec
    index: int
    call: str


@dataclass(frozen=True)
class CaseEnded:
    """Case index of stage ended in the student's process."""

    stage: StageSpec
    index: int


@dataclass(frozen=True)
class OracleComputing:
    """The oracle started computing an output it does not hold (minutes on the gpt2 shape, once)."""

    label: str


@dataclass(frozen=True)
class OracleComputed:
    """The output OracleComputing named is computed."""

    label: str


@dataclass(frozen=True)
class RunStarted:
    """Before any student code runs: the run as the report's header shows it (no stage graded yet)."""

    run: RunResult


@dataclass(frozen=True)
class StageGraded:
    """A stage's verdict, as soon as its cases are compared (before the next stage runs)."""

    result: StageResult


@dataclass(frozen=True)
class VerdictsDone:
    """Every verdict is out: the run, advised; notice: what recording the course's progress said ("" if nothing)."""

    run: RunResult
    notice: str = ""


@dataclass(frozen=True)
class StageMatched:
    """A failing stage once matched against known bugs (its verdict was told before)."""

    result: StageResult


@dataclass(frozen=True)
class RunDone:
    """The finished run: every verdict, finding and piece of advice in it (notice: as VerdictsDone's)."""

    run: RunResult
    notice: str = ""


CaseEvent = CaseStarted | CallStarted | CaseEnded
Event = CaseEvent | OracleComputing | OracleComputed | RunStarted | StageGraded | VerdictsDone | StageMatched | RunDone
Listener = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The listener of a run nobody watches."""


def tee(*listeners: Listener) -> Listener:
    """One listener telling each event to every one of listeners, in order."""

    def tell(event: Event) -> None:
        for listener in listeners:
            listener(event)

    return tell
