"""Plain result objects passed from grading to the renderers (which never compute)."""

from dataclasses import dataclass, field

STATUSES = ("pass", "fail", "not-started", "error", "timeout", "crash")


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


@dataclass(frozen=True)
class Diagnosis:
    shape: str
    summary: str  # what the shape is, in words
    hint: str  # the stage's hint for it ("" if the stage has none)


@dataclass
class CaseResult:
    name: str
    status: str  # one of STATUSES
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

    @property
    def first_bad_row(self) -> int | None:
        return next((r.row for r in self.rows if not r.ok), None)


@dataclass
class StageResult:
    id: str
    title: str
    status: str
    cases: list[CaseResult]
    points: float
    max_points: float
    adapter: str
    adapters_file: str
    lesson: str
    atol: float
    rtol: float
    compare: str
    seconds: float = 0.0
    adapter_line: int | None = None  # where the adapter function starts in adapter_source, for annotations
    adapter_source: str = ""  # the file defining the function the adapters module exports ("": adapters_file)
    # For stages whose cases return one row each: the shape read across cases, ordered by position.
    cross_case: Diagnosis | None = None
    origin: str = "built-in"  # where the stage file came from: built-in | --stages-dir | course

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


@dataclass
class RunResult:
    course: str
    weights_path: str
    weights_source: str
    weights_why: str
    synthetic: str | None
    config: dict
    stages: list[StageResult]
    notices: list[str] = field(default_factory=list)
    seed: int | None = None  # the seed of the random extra cases, if any
    untrusted: bool = False  # graded as an untrusted submission (nothing in it chose stages, weights, timeouts)
    # What the course directory chose instead of the instructor (plain `test` only), one sentence each.
    course_supplied: list[str] = field(default_factory=list)
    isolation: str = ""  # how student processes were confined: sandbox | unprivileged | subreaper | process-group
    isolation_summary: str = ""  # the same in words

    @property
    def passed(self) -> bool:
        return all(s.status == "pass" for s in self.stages)

    @property
    def points(self) -> tuple[float, float]:
        return sum(s.points for s in self.stages), sum(s.max_points for s in self.stages)
