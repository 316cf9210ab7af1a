"""What judging a stage needs of the run it is part of (GradeContext): the course, the weights, the oracle's cache,
how student processes start and are limited, and the run's settings; every judge reads it, none builds it (the
grader does, drive/grader.py)."""

from collections.abc import Callable
from dataclasses import dataclass, field

from theinference.course import Course
from theinference.grading.judge.events import CaseEvent
from theinference.grading.oracle.cache import OracleCache
from theinference.grading.spec.timeouts import Timeouts
from theinference.model.weights import Model
from theinference.proc.launch import Launcher, SubprocessLauncher
from theinference.proc.limits import Limits


@dataclass
class GradeContext:
    course: Course
    model: Model
    cache: OracleCache = field(default_factory=OracleCache)
    limits: Limits = field(default_factory=Limits)  # the student's process: memory, run directory, environment
    timeouts: Timeouts = field(default_factory=Timeouts)  # the run's rule for seconds per call (spec.timeouts)
    launcher: Launcher = field(default_factory=SubprocessLauncher)  # how student processes start
    fingerprint: bool = True  # match failing outputs against the stage's bug oracles (watch defers it)
    diagnosis: bool = True  # False (--no-diagnosis): never fingerprint, so keep no outputs for it
    first_exact: bool = False  # fingerprints stop at the first exact match (see bugmatch.EXACT)
    # Told as the student's process starts and finishes each case (and, cache-scaling, starts each call).
    on_case: Callable[[CaseEvent], None] | None = None
    all_cases: bool = False  # keep running a stage's cases after one timed out
    deadline: float | None = None  # time.monotonic() by which the whole submission must be done
    budget: float | None = None  # the seconds that deadline allowed, for messages
    # The submission chooses nothing: a made preset (the proof's too) that was altered is an error, not remade, and
    # the student's process gets only the allow-listed environment. Decided by the run's plan (drive/plan.py).
    untrusted: bool = False
