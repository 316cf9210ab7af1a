"""What a run of a student's adapter is and what comes back: the job, the runner's events, each call's outcome.

The runner (runner.py: each case in a child process) and the interactive calls (calls.py: one worker, call by
call) both speak in these; every one of them is frozen: an outcome is built whole, never amended.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from theinference.proc import accounting
from theinference.proc.launch import Launcher, SubprocessLauncher
from theinference.proc.limits import Limits
from theinference.proc.rundir import QuotaExceeded

# What ends a run as that submission's error, in its own words: its run directory's quota, its memory together.
OVER_LIMIT = (QuotaExceeded, accounting.MemoryExceeded)


class ProtocolError(Exception):
    """The student's process sent the grader something theinference.proc.child never sends: that submission's error."""


@dataclass(frozen=True)
class AdapterJob:
    course_root: Path
    adapters: Path
    names: tuple[str, ...]  # the function's name, then its accepted aliases
    calls: tuple[tuple, ...]  # the arguments of each call
    weights: Path
    timeout: float  # seconds per call (and for importing the adapters), by the run's rule (spec.timeouts)
    limits: Limits = field(default_factory=Limits)
    untrusted: bool = False  # the student's process gets only the allow-listed environment (theinference.trust)
    launcher: Launcher = field(default_factory=SubprocessLauncher)
    # The bytes call i's returned array may hold (larger: "too-large", not read), from its expected shape.
    output_caps: tuple[int, ...] = ()
    all_cases: bool = False  # run every case even after one timed out (default: skip the stage's rest)
    case_names: tuple[str, ...] = ()  # for messages; indices where empty
    deadline: float | None = None  # time.monotonic() past which nothing more runs (the submission's budget)
    deadline_budget: float | None = None  # the seconds that deadline allowed, for messages
    # Case i's CPU budget (an inner bound inside timeout, from the case's work: grading.spec.timeouts), asked for
    # only once a case has used cpu_floor seconds of CPU (it may compute the oracle's output to time it). None: the
    # timeout alone bounds a case (the instructor's --timeout).
    case_cpu: "Callable[[int], CaseCpu | None] | None" = None
    cpu_floor: float = math.inf


class CaseCpu(Protocol):
    """What AdapterJob.case_cpu gives (grading.spec.timeouts.CpuBudget): a case's CPU budget, and the timeout's
    message for a run that used it without answering."""

    @property
    def seconds(self) -> float: ...

    def message(self, used: float) -> str: ...


@dataclass(frozen=True)
class CaseStarted:
    """The student's process began case `index` (live progress: display only, never used to decide anything)."""

    index: int


@dataclass(frozen=True)
class CaseDone:
    """Case `index` ended with this outcome. Its array (outcome.value) is dropped once the consumer has taken the
    event, so a stage's outputs are never all in memory at once. A later CaseDone for the same index replaces it
    (a run whose process broke a limit afterwards, or killed its monitor: nothing of it counts)."""

    index: int
    outcome: "CallOutcome"


@dataclass(frozen=True)
class RunEnded:
    """Every case's final outcome, in order: the last event."""

    outcomes: list["CallOutcome"]


RunnerEvent = CaseStarted | CaseDone | RunEnded


@dataclass(frozen=True)
class StepTime:
    """One step (importing the adapters, or one case) as the grader measured it, from outside the student's
    processes: the time charged against its timeout, and what makes it up (wall-clock time less run-queue wait)."""

    charged: float  # wall less waited, at least cpu over the cores (StepClock.charge): checked against the timeout
    timeout: float
    cpu: float  # CPU seconds the whole process tree used (the kernel's count)
    waited: float  # seconds the tree's threads spent runnable, waiting for a CPU (psutil: estimated from the load)
    wall: float


@dataclass(frozen=True)
class CallOutcome:
    # protocol.DONE_STATUSES, or TOO_LARGE | TIMEOUT | CRASH (the runner's own conclusions)
    status: str
    value: np.ndarray | None = None
    message: str = ""
    traceback: str = ""
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    cpu_seconds: float | None = None  # interactive calls: the kernel's count for the whole process tree
    # A call cut short: "cpu" (its CPU budget), "wall" (the backstop: machine-busy), "time" (an interactive call's
    # timeout without the CPU for it: it waited)
    limit: str | None = None
    defined_at: tuple[str, int] | None = None  # the adapter function's file and first line, as the child found it
    clock: StepTime | None = None  # the case's step as the grader timed it (None: it never ran)
    loading: StepTime | None = None  # the import before it, on the first case its process ran
