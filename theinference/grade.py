"""grade(stage, context): oracle + runner + compare + diagnose -> StageResult."""

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from theinference import oracle, tokenizer
from theinference.compare import compare_rows, shape_problem, walk_tokens
from theinference.course import Course
from theinference.diagnose import diagnose_rows, diagnose_tokens
from theinference.launch import SubprocessLauncher
from theinference.oracles import ID_INPUTS, OracleSpec, compute_expected, positions_needed, resolve_oracle
from theinference.results import CaseResult, Diagnosis, StageResult
from theinference.runner import DEFAULT_MEMORY_MB, AdapterJob, CallOutcome, run_adapter
from theinference.stages import CaseSpec, StageSpec
from theinference.weights import Model


class GradeError(Exception):
    """The stage cannot be graded against these weights (a configuration error, exit 2)."""


@dataclass
class OracleCache:
    """Oracle outputs per (weights file, oracle, case inputs); lives as long as a watch or batch session."""

    entries: dict = field(default_factory=dict)

    def get(self, model: Model, stage: StageSpec, spec: OracleSpec, case: CaseSpec) -> np.ndarray:
        key = (str(model.path), model.stamp, stage.oracle, spec.stamp,
               tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in case.inputs.items()))
        if key not in self.entries:
            self.entries[key] = compute_expected(spec, model, case.inputs)
        return self.entries[key]


@dataclass
class GradeContext:
    course: Course
    model: Model
    cache: OracleCache = field(default_factory=OracleCache)
    timeout: float | None = None  # overrides every stage's timeout
    env: dict = field(default_factory=dict)  # extra environment for the student's process
    launcher: object = field(default_factory=SubprocessLauncher)  # how student processes start
    memory_mb: int | None = DEFAULT_MEMORY_MB  # address-space cap per student process
    untrusted: bool = False  # only the allow-listed environment for the student's process
    all_cases: bool = False  # keep running a stage's cases after one timed out
    deadline: float | None = None  # time.monotonic() by which the whole submission must be done
    budget: float | None = None  # the seconds that deadline allowed, for messages


def check_case_fits(stage: StageSpec, case: CaseSpec, model: Model) -> None:
    """Raise GradeError if a case needs more context or a token id the model does not have."""
    config = model.config
    needed = positions_needed(case.inputs)
    if needed > config.n_ctx:
        raise GradeError(f"{stage.source}: case '{case.name}' needs {needed} positions; the weights have n_ctx={config.n_ctx}")
    for name, value in case.inputs.items():
        ids = value if isinstance(value, list) else [value] if name in ID_INPUTS else []
        if ids and max(ids) >= config.n_vocab:
            raise GradeError(f"{stage.source}: case '{case.name}': token id {max(ids)} in '{name}' is >= n_vocab={config.n_vocab}")


def _consumed_tokens(inputs: dict, positions: list[int]) -> list[int | None]:
    tail = [inputs["next_id"]] if "next_id" in inputs else list(inputs.get("cont", []))
    sequence = inputs.get("seq") or list(inputs.get("prompt", [])) + tail
    return [sequence[p] if 0 <= p < len(sequence) else None for p in positions]


def _rows_result(result: CaseResult, stage: StageSpec, spec: OracleSpec, expected: np.ndarray, got: np.ndarray) -> None:
    problem = shape_problem(expected.shape, got)
    if problem:
        result.status, result.detail, result.message = "fail", "wrong-shape", problem
        return
    positions = spec.positions(result.inputs) or list(range(len(expected)))
    result.rows = compare_rows(expected, got, stage.atol, stage.rtol, positions, _consumed_tokens(result.inputs, positions))
    if all(r.ok for r in result.rows):
        result.status = "pass"
        return
    bad = sum(not r.ok for r in result.rows)
    result.status, result.message = "fail", f"{bad} of {len(result.rows)} rows outside atol={stage.atol:g} rtol={stage.rtol:g}"
    if len(result.rows) > 1:  # one row has no shape; single-row stages are read across cases
        result.diagnosis = diagnose_rows(result.rows, stage.hints, expected, got, stage.atol, stage.rtol)


def _token_problem(got: np.ndarray, n_new: int, n_vocab: int) -> str | None:
    if got.shape != (n_new,):
        return f"expected {n_new} token ids (shape [{n_new}]), got shape {list(got.shape)}"
    if got.dtype.kind == "f" and not np.all(np.isfinite(got) & (got == np.round(got))):
        return "expected integer token ids, got non-integer values"
    if np.any((got < 0) | (got >= n_vocab)):
        return f"token ids must be in [0, {n_vocab}); got {got[(got < 0) | (got >= n_vocab)][0]}"
    return None


def _tokens_result(result: CaseResult, stage: StageSpec, model: Model, expected: np.ndarray, got: np.ndarray) -> None:
    prompt, n_new = result.inputs["prompt"], result.inputs["n_new"]
    problem = _token_problem(got, n_new, model.config.n_vocab)
    if problem:
        result.status, result.detail, result.message = "fail", "wrong-shape", problem
        return
    result.got_tokens = [int(t) for t in got]
    if result.got_tokens == [int(t) for t in expected]:
        result.status, result.expected_tokens = "pass", list(result.got_tokens)
        return
    # The student's path differs from the oracle's: check it step by step, allowing near-ties.
    path_logits = oracle.per_step_logits(model.params, prompt, result.got_tokens, model.config.n_head)
    result.steps = walk_tokens(result.got_tokens, path_logits, stage.atol, stage.rtol, len(prompt) - 1)
    result.expected_tokens = [s.expected if s.verdict == "mismatch" else s.got for s in result.steps]
    if result.steps[-1].verdict != "mismatch":
        result.status = "pass"
        return
    k = len(result.steps)
    result.expected_tokens += oracle.greedy(model.params, prompt + result.expected_tokens, n_new - k, model.config.n_head)
    result.status = "fail"
    result.message = f"token {k - 1} of {n_new} differs from the oracle's greedy choice"
    result.diagnosis = diagnose_tokens(result.steps, stage.hints, lambda t: f"{t} {tokenizer.token_text(t)!r}")


_FAILED_OUTCOMES = {"not-started", "error", "timeout", "crash"}
# A returned array may hold this many times the expected output's float64 bytes (plus a floor)
# before the grader refuses to read it: its memory stays bounded whatever the student returns.
_OUTPUT_SLACK = 4
_OUTPUT_FLOOR = 1 << 20


def _output_cap(expected: np.ndarray) -> int:
    return _OUTPUT_SLACK * expected.size * 8 + _OUTPUT_FLOOR


def _case_result(stage: StageSpec, case: CaseSpec, outcome: CallOutcome, ctx: GradeContext, spec: OracleSpec) -> CaseResult:
    result = CaseResult(name=case.name, status=outcome.status, message=outcome.message, inputs=case.inputs,
                        texts=case.texts, traceback=outcome.traceback, stdout=outcome.stdout, stderr=outcome.stderr,
                        seconds=outcome.seconds)
    if outcome.status in _FAILED_OUTCOMES:
        return result
    if outcome.status == "bad-output":
        result.status, result.detail = "fail", "non-numeric"
        return result
    expected = ctx.cache.get(ctx.model, stage, spec, case)
    if outcome.status == "too-large":
        result.status, result.detail = "fail", "wrong-shape"
        result.message = f"{outcome.message}; expected {list(expected.shape)}"
        return result
    if stage.compare == "tokens":
        _tokens_result(result, stage, ctx.model, expected, outcome.value)
    else:
        _rows_result(result, stage, spec, expected, outcome.value)
    return result


def cross_case_diagnosis(stage: StageSpec, cases: list[CaseResult]) -> Diagnosis | None:
    """For a stage whose cases each give one row: the shape of those rows ordered by position."""
    compared = [c for c in cases if c.rows]
    if stage.compare != "rows" or len(compared) < 3 or any(len(c.rows) != 1 for c in compared):
        return None
    if all(c.status == "pass" for c in compared):
        return None
    rows = sorted((c.rows[0] for c in compared), key=lambda r: r.position)
    rows = [dataclasses.replace(r, row=i) for i, r in enumerate(rows)]
    return diagnose_rows(rows, stage.hints)


def _stage_status(cases: list[CaseResult]) -> str:
    return next((c.status for c in cases if c.status != "pass"), "pass")


def _points(stage: StageSpec, cases: list[CaseResult]) -> float:
    passed = sum(c.status == "pass" for c in cases)
    if stage.credit == "per-case":
        return stage.points * passed / len(cases)
    return stage.points if passed == len(cases) else 0.0


def adapter_definition(course: Course, outcomes: list[CallOutcome], names: tuple[str, ...]) -> tuple[str, int | None]:
    """The file and line of the function the adapters module exports, as its process reported them (when
    that file lies in the course directory); else the first `def NAME(` in the adapters file."""
    root = course.root.resolve()
    for found in (o.defined_at for o in outcomes if o.defined_at):
        try:
            path = Path(found[0]).resolve()
            if path.is_relative_to(root) and path.is_file():
                return str(path), found[1]
        except (OSError, ValueError):  # the child's word only: a NUL byte, a loop of links
            pass
    return "", adapter_line(course.adapters, names)


def adapter_line(path: Path, names: tuple[str, ...]) -> int | None:
    """The line where the first of names is defined in the adapters file (for CI annotations)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for name in names:
        for number, line in enumerate(lines, 1):
            if line.lstrip().startswith(f"def {name}("):
                return number
    return None


def grade(stage: StageSpec, ctx: GradeContext) -> StageResult:
    """Grade one stage of the course against the oracle; student faults become results, never exceptions."""
    started = time.perf_counter()
    spec = resolve_oracle(stage.oracle, stage.source)
    for case in stage.cases:
        check_case_fits(stage, case, ctx.model)
    graded: dict[int, CaseResult] = {}

    def output_cap(index: int) -> int:  # the oracle runs only for cases that returned something
        return _output_cap(ctx.cache.get(ctx.model, stage, spec, stage.cases[index]))

    def consume(index: int, outcome: CallOutcome) -> None:  # compared as it arrives, then its array is dropped
        graded[index] = _case_result(stage, stage.cases[index], outcome, ctx, spec)

    job = AdapterJob(
        course_root=ctx.course.root, adapters=ctx.course.adapters, names=stage.adapter_names,
        calls=tuple(tuple(case.inputs[k] for k in stage.inputs) for case in stage.cases),
        weights=ctx.model.path, timeout=ctx.timeout or ctx.course.timeout or stage.timeout, env=ctx.env,
        launcher=ctx.launcher, memory_mb=ctx.memory_mb, untrusted=ctx.untrusted, output_cap=output_cap, consume=consume,
        all_cases=ctx.all_cases, case_names=tuple(c.name for c in stage.cases), deadline=ctx.deadline,
        deadline_budget=ctx.budget,
    )
    outcomes = run_adapter(job)
    cases = [graded.get(i) or _case_result(stage, case, outcome, ctx, spec)
             for i, (case, outcome) in enumerate(zip(stage.cases, outcomes))]
    source, line = adapter_definition(ctx.course, outcomes, stage.adapter_names)
    return StageResult(
        id=stage.id, title=stage.title, status=_stage_status(cases), cases=cases,
        points=_points(stage, cases), max_points=stage.points, adapter=stage.adapter,
        adapters_file=str(ctx.course.adapters), lesson=str(stage.lesson), atol=stage.atol, rtol=stage.rtol,
        compare=stage.compare, seconds=time.perf_counter() - started,
        adapter_line=line, adapter_source=source,
        cross_case=cross_case_diagnosis(stage, cases),
    )
