"""Plain result objects passed from grading to the renderers (which never compute)."""

from dataclasses import dataclass, field
from enum import StrEnum

from theinference.grading.spec.checks import Check
from theinference.model.weights import Synthetic
from theinference.proc.runner import StepTime


class Status(StrEnum):
    """The verdict of a case or a stage: a str, so JSON, CSV and `status == "pass"` read it unchanged."""

    PASS = "pass"
    FAIL = "fail"
    NOT_STARTED = "not-started"  # the adapter still raises NotImplementedError
    ERROR = "error"
    TIMEOUT = "timeout"
    CRASH = "crash"
    # cache-scaling in grading mode where the CPU meter misses processes that end unseen: a pass cannot be proven
    UNPROVEN = "unproven"


class Guarantee(StrEnum):
    """What a cache-scaling verdict's CPU figures prove, from how they were counted (ScalingResult.guarantee)."""

    RECORD = "record"  # a complete meter (a cgroup: every process ever in the tree): a grade of record
    SELF_CHECK = "self-check"  # an incomplete meter (a process tree) on the student's own run: the verdict stands
    UNPROVABLE = "unprovable"  # an incomplete meter in grading mode: a pass cannot be proven, so none is given


# The student's code gave no answer to judge (JUnit says <error>, not <failure>).
NO_ANSWER = frozenset({Status.ERROR, Status.TIMEOUT, Status.CRASH})


@dataclass(frozen=True)
class RowStats:
    """How one output row (one position) compares with the oracle."""

    row: int
    position: int
    token: int | None  # the token at that position (the one consumed there), if any
    max_abs: float  # inf when the row holds NaN/inf
    max_rel: float
    n_bad: int  # elements outside atol + rtol*|oracle|
    n: int
    n_nonfinite: int
    worst_index: int
    expected: float
    got: float
    ok: bool


@dataclass(frozen=True)
class TokenStep:
    """One greedy step checked along the student's own path."""

    step: int
    position: int
    got: int
    expected: int  # the oracle's argmax at this step (on the student's path so far)
    gap: float  # oracle logit of its argmax minus oracle logit of the student's token
    verdict: str  # match | near-tie | mismatch
    allowed: float = 0.0  # the largest gap accepted as a near-tie at this step (tie rtol * max|logit|)


@dataclass(frozen=True)
class Diagnosis:
    shape: str
    summary: str  # what the shape is, in words
    hint: str  # the stage's hint for it ("" if the stage has none)
    bugs: tuple[str, ...] = ()  # the known bug(s) the output was fingerprinted as, in the order found; () if none
    evidence: str = ""  # the numbers behind the finding, or that the bug is not one of the known ones

    @property
    def bug(self) -> str:
        """The bugs as the reports state them (and JSON's `bug`): comma-separated, "" if none."""
        return ", ".join(self.bugs)


@dataclass(frozen=True)
class TimedCall:
    """One timed call of cache-scaling: its length and what the kernel counted for the student's tree."""

    n_new: int
    cpu_seconds: float  # the whole process tree's CPU during the call, read by the grader
    wall_seconds: float
    stopped: bool = False  # stopped at its CPU budget: cpu_seconds is a lower bound of its cost
    clock: StepTime | None = None  # the call as the grader timed it against its timeout
    prompt_tokens: int = 0  # the random prompt's length
    diagnostic: bool = False  # a long-prompt call that only tells no-cache from too-slow on a stop: not a timing


@dataclass(frozen=True)
class ScalingResult:
    """cache-scaling: the CPU the student's whole process tree used per call, counted by the kernel
    and read by the grader (never reported by the student's process), against the oracle's costs here."""

    lengths: tuple[int, ...]  # n_new values timed, ascending
    # cheapest CPU seconds of one call at each length (a lower bound if stopped; None: the case ended before one ran)
    seconds: tuple[float | None, ...]
    max_ratio: float  # (a): the stage's threshold on ratio
    max_fraction: float  # (b): the stage's threshold on fraction
    accounting: str  # how the CPU was counted: the meter's name (theinference.proc.accounting: a cgroup, or /proc)
    oracle_seconds: float | None = None  # the oracle's full recompute of the longest length here (CPU, 1 thread)
    step_ms: float | None = None  # the oracle's cost of one single-token step here: what a cached token costs
    calls: tuple[TimedCall, ...] = ()  # every timed call, in order
    stopped_at: int | None = None  # the length whose call was stopped at its CPU budget, if one was
    weights_note: str = ""  # why the stage ran on other weights than the graded ones ("" if it did not)
    # Whether the meter counts every process ever in the tree, however it ended (a cgroup), or only those it sees
    # (a process tree: one that ends without being waited for takes its CPU out of the count).
    complete: bool = True
    guarantee: str = Guarantee.RECORD  # a Guarantee: what the figures prove, from `complete` and the run's trust
    floor_ms: float | None = None  # the least CPU ms a token can cost here (scaling.cost_floor): below it, tampering

    @property
    def ms_per_token(self) -> tuple[float | None, ...]:
        return tuple(None if s is None else 1000 * s / n for s, n in zip(self.seconds, self.lengths))

    @property
    def marginal_ms(self) -> tuple[float | None, ...]:
        """CPU ms per extra token between each length and the one before (None for the first, or one not measured)."""
        pairs = zip(self.lengths, self.lengths[1:], self.seconds, self.seconds[1:])
        return (
            None,
            *(1000 * (s1 - s0) / (n1 - n0) if s0 is not None and s1 is not None else None for n0, n1, s0, s1 in pairs),
        )

    @property
    def ratio(self) -> float | None:
        """(a) Per-token cost at the longest length over that at the shortest (None: not both measured)."""
        first, last = self.ms_per_token[0], self.ms_per_token[-1]
        if first is None or last is None:
            return None
        return last / first if first > 0 else float("inf")

    @property
    def fraction(self) -> float | None:
        """(b) The longest call's CPU over the oracle's full recompute of the same tokens."""
        if not self.oracle_seconds or self.seconds[-1] is None:
            return None
        return self.seconds[-1] / self.oracle_seconds

    @property
    def speedup(self) -> float | None:
        """The oracle's recompute time over the student's, at the longest length."""
        last = self.seconds[-1]
        if self.oracle_seconds is None or last is None or last <= 0:
            return None
        return self.oracle_seconds / last


@dataclass(frozen=True)
class CaseResult:
    """One case's verdict, built once by its judge (a later step, such as fingerprinting, makes a new one)."""

    name: str
    status: str  # a Status
    message: str = ""
    detail: str = ""  # finer kind: wrong-shape, non-numeric, syntax, import, missing-function, ...
    inputs: dict = field(default_factory=dict)  # input name -> ids or count
    texts: dict = field(default_factory=dict)  # input name -> the text it was given as
    rows: list[RowStats] = field(default_factory=list)
    steps: list[TokenStep] = field(default_factory=list)
    expected_tokens: list[int] = field(default_factory=list)
    got_tokens: list[int] = field(default_factory=list)
    diagnosis: Diagnosis | None = None
    traceback: str = ""
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0  # the adapter's own compute time
    clock: StepTime | None = None  # the case as the grader timed it: charged against its timeout, CPU, waiting
    loading: StepTime | None = None  # the import of the adapters before it (the first case of each process)
    scaling: ScalingResult | None = None  # cache-scaling: the timings, when they were measured
    at: tuple[str, int] | None = None  # the traceback's deepest frame in the course: (path relative to it, line)

    @property
    def first_bad_row(self) -> int | None:
        return next((r.row for r in self.rows if not r.ok), None)


@dataclass(frozen=True)
class StageResult:
    """One stage's verdict; the student's arrays its fingerprinting reads are kept beside it, never in it
    (theinference.grading.judge.grade.Graded)."""

    id: str
    title: str
    status: str  # a Status
    cases: list[CaseResult]
    points: float
    max_points: float
    adapter: str
    adapters_file: str
    lesson: str
    check: Check  # what the stage checked: its kind and tolerance (theinference.grading.spec.checks)
    seconds: float = 0.0
    adapter_line: int | None = None  # where the adapter function starts in adapter_source, for annotations
    adapter_source: str = ""  # the file defining the function the adapters module exports ("": adapters_file)
    # For stages whose cases return one row each: the shape read across cases, ordered by position.
    cross_case: Diagnosis | None = None
    origin: str = "built-in"  # where the stage file came from: built-in | --stages-dir | course
    visibility: str = "visible"  # when Gradescope shows it to the student (the stage file's `visibility`)
    # Some case's output comes through the student's cache (decode steps after a prefill), so a match proves the
    # cached path equals a recompute; False for a full recompute (forward) and for an instructor's file oracle.
    cached_path: bool = False
    # The cases whose array came back float64 where the oracle's is float32 (a note from the first stage, not a
    # failure: right numbers at several times the work, the cache-scaling stage's `too-slow`).
    float64_cases: tuple[str, ...] = ()

    @property
    def passed_cases(self) -> int:
        return sum(c.status == "pass" for c in self.cases)

    @property
    def diagnosis(self) -> Diagnosis | None:
        """The headline diagnosis: across cases, else that of the failing case with the most rows (the most telling)."""
        if self.cross_case is not None:
            return self.cross_case
        diagnosed = [c for c in self.cases if c.diagnosis is not None]
        best = max(diagnosed, key=lambda c: len(c.rows) + len(c.steps), default=None)
        return best.diagnosis if best else None


@dataclass(frozen=True)
class RunResult:
    """A run's verdicts: fingerprinting and run evidence make a new one (dataclasses.replace), never amend it."""

    course: str
    weights_path: str
    weights_source: str
    weights_why: str
    synthetic: Synthetic | None
    config: dict
    stages: list[StageResult]
    notices: list[str] = field(default_factory=list)
    seed: int | None = None  # the seed of the random extra cases, if any
    untrusted: bool = False  # graded as an untrusted submission (nothing in it chose stages, weights, timeouts)
    # What the course directory chose instead of the instructor (plain `test` only), one sentence each.
    course_supplied: list[str] = field(default_factory=list)
    isolation: str = ""  # how student processes were confined: sandbox | unprivileged | subreaper | process-group
    isolation_summary: str = ""  # the same in words
    # What each job of the process model was given to (launch.mechanisms: launcher, kill, limits, ...) and "cpu",
    # what counts the tree's CPU (accounting.meter_name): chosen by what the machine offers
    processes: dict[str, str] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)  # what to do next, one line each: the terminal report's footer only

    @property
    def passed(self) -> bool:
        return all(s.status == "pass" for s in self.stages)

    @property
    def points(self) -> tuple[float, float]:
        return sum(s.points for s in self.stages), sum(s.max_points for s in self.stages)


@dataclass(frozen=True)
class CheckCell:
    """One subject × stage of `stages check`: what the manifest expected and what grading showed."""

    subject: str  # solution | starter | a mutant's name
    stage: str
    expected: tuple[str, ...]  # acceptable outcomes: pass | not-started | failure shapes
    got: str  # what the grader reported: a status, or the failing stage's shape
    message: str = ""
    expected_bugs: frozenset | None = None  # the bugs the fingerprint must name (None: not checked)
    got_bugs: frozenset = frozenset()  # the bugs it named
    same_as: str = ""  # not graded again: the stage's calls reach the same code as this subject's, graded once

    @property
    def ok(self) -> bool:
        bugs_ok = self.expected_bugs is None or self.got == "pass" or self.got_bugs == self.expected_bugs
        # "fail" accepts any failure shape: whatever observed() reports that is not a status
        shape_ok = self.got in self.expected or ("fail" in self.expected and self.got not in tuple(Status))
        return shape_ok and bugs_ok


@dataclass
class CheckResult:
    """`stages check`: every cell, and the problems found on the way."""

    stages: list[str]
    subjects: list[str]
    cells: list[CheckCell] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # missing lessons, edits that no longer apply, ...
    broken: list[str] = field(default_factory=list)  # the instructor's mistakes in manifests: `stages check` exits 2

    @property
    def ok(self) -> bool:
        return not self.problems and not self.broken and all(c.ok for c in self.cells)
