"""grade(stage, context): oracle + runner + compare + diagnose -> StageResult."""

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, assert_never

import numpy as np

from theinference.grading.judge import events, oraclecost, scaling
from theinference.grading.judge.context import GradeContext
from theinference.grading.oracle.cache import OracleCache
from theinference.grading.judge.compare import compare_rows, promoted, shape_problem
from theinference.course import Course
from theinference.grading.judge.diagnose import diagnose_rows
from theinference.grading.judge.fingerprint import Outputs, fingerprint_stage
from theinference.grading.judge.frames import course_file, deepest_course_frame
from theinference.grading.spec.inputs import ID_INPUTS, consumed_sequence, positions_needed
from theinference.grading.oracle.registry import OracleSpec, resolve_oracle
from theinference.grading.judge.results import NO_ANSWER, CaseResult, Diagnosis, StageResult, Status
from theinference.proc import protocol
from theinference.proc.runner import AdapterJob, CallOutcome, CaseDone, CaseStarted, RunEnded, run_adapter
from theinference.grading.spec.checks import Check, RowsCheck, ScalingCheck, TokensCheck
from theinference.grading.spec.stages import CaseSpec, StageSpec
from theinference.grading.spec.timeouts import CPU_FLOOR, CpuBudget, cpu_budget
from theinference.proc.node import is_node_adapters
from theinference.grading.judge.verification import verify_tokens
from theinference.model.weights import Model
from theinference.errors import ConfigError


class GradeError(ConfigError):
    """The stage cannot be graded against these weights (a configuration error, exit 2)."""


def check_case_fits(stage: StageSpec, case: CaseSpec, model: Model) -> None:
    """Raise GradeError if a case needs more context or a token id the model does not have."""
    config = model.config
    needed = positions_needed(case.inputs)
    if needed > config.n_ctx:
        raise GradeError(
            f"{stage.source}: case '{case.name}' needs {needed} positions; the weights have n_ctx={config.n_ctx}"
        )
    for name, value in case.inputs.items():
        ids = value if isinstance(value, list) else [value] if name in ID_INPUTS else []
        if ids and max(ids) >= config.n_vocab:
            raise GradeError(
                f"{stage.source}: case '{case.name}': token id {max(ids)} in '{name}' is >= n_vocab={config.n_vocab}"
            )


def _consumed_tokens(inputs: dict, positions: list[int]) -> list[int | None]:
    sequence = consumed_sequence(inputs)
    return [sequence[p] if 0 <= p < len(sequence) else None for p in positions]


@dataclass(frozen=True)
class Judged:
    """One case's verdict and, beside it, the student's array when fingerprinting may read it (else None)."""

    case: CaseResult
    output: np.ndarray | None = None
    float64: bool = False  # the array came back float64 where the oracle's is float32 (compare.promoted)


@dataclass(frozen=True)
class Graded:
    """A stage's verdict and, beside it, the student's arrays its fingerprinting will read (by case name): empty
    once fingerprinted, or when no fingerprint will be (--no-diagnosis, or nothing kept)."""

    result: StageResult
    outputs: Outputs = field(default_factory=dict)


def _judge_rows(
    ran: CaseResult, check: RowsCheck, stage: StageSpec, case: CaseSpec, value, ctx: GradeContext, spec: OracleSpec
) -> Judged:
    """A rows stage's case: every row of the adapter's array allclose to the oracle's."""
    expected, got = ctx.cache.get(ctx.model, stage, spec, case), value
    problem = shape_problem(expected.shape, got)
    if problem:
        return Judged(dataclasses.replace(ran, status=Status.FAIL, detail="wrong-shape", message=problem))
    # kept until fingerprinted: a match must hold on every case with numbers, passing ones too
    output = got if stage.bugs else None
    positions = spec.positions(ran.inputs) or list(range(len(expected)))
    rows = compare_rows(expected, got, check.atol, check.rtol, positions, _consumed_tokens(ran.inputs, positions))
    float64 = promoted(expected, got)
    if all(r.ok for r in rows):
        return Judged(dataclasses.replace(ran, status=Status.PASS, rows=rows), output, float64)
    bad = sum(not r.ok for r in rows)
    message = f"{bad} of {len(rows)} rows outside atol={check.atol:g} rtol={check.rtol:g}"
    # one row has no shape; single-row stages are read across cases
    diagnosis = diagnose_rows(rows, stage.hints, expected, got, check.atol, check.rtol) if len(rows) > 1 else None
    failed = dataclasses.replace(ran, status=Status.FAIL, message=message, rows=rows, diagnosis=diagnosis)
    return Judged(failed, output, float64)


def _judge_tokens(
    ran: CaseResult, check: TokensCheck | ScalingCheck, stage: StageSpec, case: CaseSpec, value, ctx: GradeContext
) -> Judged:
    """A greedy stage's case: its tokens verified on the student's own path (no oracle continuation needed)."""
    output = np.asarray(value)  # kept until fingerprinted against the greedy-loop mistakes
    label = f"{stage.id}: {case.name}"
    return Judged(verify_tokens(ran, value, ctx.model, check.tie_rtol, stage.hints, ctx.cache, label), output)


def _judge_value(
    ran: CaseResult, stage: StageSpec, case: CaseSpec, value, ctx: GradeContext, spec: OracleSpec
) -> Judged:
    """The one table of judges: a returned value judged by the kind of check its stage makes."""
    match stage.check:
        case RowsCheck() as check:
            return _judge_rows(ran, check, stage, case, value, ctx, spec)
        case (TokensCheck() | ScalingCheck()) as check:
            return _judge_tokens(ran, check, stage, case, value, ctx)
        case _:
            assert_never(stage.check)


_FAILED_OUTCOMES = NO_ANSWER | {Status.NOT_STARTED}
# A returned array may hold this many times the expected output's float64 bytes (plus a floor)
# before the grader refuses to read it: its memory stays bounded whatever the student returns.
_OUTPUT_SLACK = 4
_OUTPUT_FLOOR = 1 << 20


def _expected_shape(stage: StageSpec, spec: OracleSpec, case: CaseSpec, ctx: GradeContext) -> tuple[int, ...]:
    """The shape of the case's right answer, known before the student's process runs: greedy token ids from
    n_new, a built-in oracle's from its shape rule; an instructor's oracle is computed to know it."""
    match stage.check:
        case TokensCheck() | ScalingCheck():
            return (case.inputs["n_new"],)
        case RowsCheck():
            if spec.shape is not None:
                return spec.shape(ctx.model.config, case.inputs)
            return ctx.cache.get(ctx.model, stage, spec, case).shape
        case _:
            assert_never(stage.check)


def _output_cap(shape: tuple[int, ...]) -> int:
    return _OUTPUT_SLACK * int(np.prod(shape)) * 8 + _OUTPUT_FLOOR


MACHINE_BUSY = "machine-busy"  # CaseResult.detail of a case the machine gave too little CPU to finish


def judge_case(stage: StageSpec, case: CaseSpec, outcome: CallOutcome, ctx: GradeContext, spec: OracleSpec) -> Judged:
    """One case's verdict from what its call came to in the student's process (and the array kept beside it)."""
    ran = CaseResult(
        name=case.name,
        status=outcome.status,
        message=outcome.message,
        inputs=case.inputs,
        texts=case.texts,
        traceback=outcome.traceback,
        stdout=outcome.stdout,
        stderr=outcome.stderr,
        seconds=outcome.seconds,
        clock=outcome.clock,
        loading=outcome.loading,
        at=deepest_course_frame(outcome.traceback, ctx.course.root),
        # the wall-clock backstop with little CPU used, even after its retries: the machine's, to be regraded
        detail=MACHINE_BUSY if outcome.limit == "wall" else "",
    )
    if outcome.status in _FAILED_OUTCOMES:
        return Judged(ran)
    if outcome.status == protocol.BAD_OUTPUT:
        return Judged(dataclasses.replace(ran, status=Status.FAIL, detail="non-numeric"))
    if outcome.status == protocol.TOO_LARGE:
        message = f"{outcome.message}; expected {list(_expected_shape(stage, spec, case, ctx))}"
        return Judged(dataclasses.replace(ran, status=Status.FAIL, detail="wrong-shape", message=message))
    assert outcome.value is not None, 'an "ok" outcome carries the adapter\'s array'
    return _judge_value(ran, stage, case, outcome.value, ctx, spec)


def cross_case_diagnosis(stage: StageSpec, cases: list[CaseResult]) -> Diagnosis | None:
    """For a stage whose cases each give one row: the shape of those rows ordered by position."""
    compared = [c for c in cases if c.rows]  # cases that errored or returned no numbers say nothing
    if not isinstance(stage.check, RowsCheck) or len(compared) < 3 or any(len(c.rows) != 1 for c in compared):
        return None
    if all(c.status == Status.PASS for c in compared):
        return None
    rows = sorted((c.rows[0] for c in compared), key=lambda r: r.position)
    rows = [dataclasses.replace(r, row=i) for i, r in enumerate(rows)]
    diagnosis = diagnose_rows(rows, stage.hints)
    read = f" (read across the {len(compared)} of {len(cases)} cases that returned numbers)"
    return dataclasses.replace(diagnosis, summary=diagnosis.summary + read)


def _stage_status(cases: list[CaseResult]) -> str:
    return next((c.status for c in cases if c.status != Status.PASS), Status.PASS)


def _points(stage: StageSpec, cases: list[CaseResult]) -> float:
    passed = sum(c.status == Status.PASS for c in cases)
    if stage.credit == "per-case":
        return stage.points * passed / len(cases)
    return stage.points if passed == len(cases) else 0.0


def adapter_definition(course: Course, outcomes: list[CallOutcome], names: tuple[str, ...]) -> tuple[str, int | None]:
    """The file and line of the function the adapters module exports, as its process reported them (when
    that file lies in the course directory); else the first `def NAME(` in the adapters file."""
    root = course.root.resolve()
    for found in (o.defined_at for o in outcomes if o.defined_at):
        path = course_file(root, found[0])  # the child's word only
        if path is not None:
            return str(path), found[1]
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


def _judged_as_they_arrive(
    stage: StageSpec, job: AdapterJob, ctx: GradeContext, spec: OracleSpec
) -> tuple[list[CallOutcome], dict[int, Judged]]:
    """Run the stage's cases, each compared as its array arrives (the runner drops the array after); the live
    line told as each starts and ends."""
    graded: dict[int, Judged] = {}
    started: set[int] = set()
    for event in run_adapter(job):
        match event:
            case CaseStarted(index=index):
                started.add(index)
                if ctx.on_case is not None:
                    ctx.on_case(events.CaseStarted(stage, index))
            case CaseDone(index=index, outcome=outcome):
                first = index not in graded  # a later one replaces it (nothing of that run counts)
                graded[index] = judge_case(stage, stage.cases[index], outcome, ctx, spec)
                if first and index in started and ctx.on_case is not None:  # ended in the student's process
                    ctx.on_case(events.CaseEnded(stage, index))
            case RunEnded(outcomes=outcomes):
                return outcomes, graded
            case _:
                assert_never(event)
    raise AssertionError("run_adapter always ends with RunEnded")


def _case_cpu(stage: StageSpec, ctx: GradeContext, spec: OracleSpec):
    """Each case's CPU budget from its work (spec.timeouts.cpu_budget: the oracle's CPU for it, timed by the cache),
    or None where the timeout alone bounds a case: the instructor's --timeout, and cache-scaling (its own budgets)."""
    if not ctx.timeouts.cpu_budgeted or not judge_for(stage.check).cpu_budgeted:
        return None
    node = is_node_adapters(ctx.course.adapters)

    def budget(index: int) -> CpuBudget:
        case = stage.cases[index]
        return cpu_budget(ctx.cache.cost(ctx.model, stage, spec, case), node, case.inputs)

    return budget


def student_job(stage: StageSpec, ctx: GradeContext, spec: OracleSpec) -> AdapterJob:
    """The one constructor of a student's job: what runs, under which limits, timeout and environment, all read
    from the context the run's plan made (ctx.model: the weights the stage runs on)."""
    return AdapterJob(
        course_root=ctx.course.root,
        adapters=ctx.course.adapters,
        names=stage.adapter_names,
        calls=tuple(tuple(case.inputs[k] for k in stage.inputs) for case in stage.cases),
        weights=ctx.model.path,
        timeout=ctx.timeouts.for_stage(stage),
        limits=ctx.limits,
        untrusted=ctx.untrusted,
        launcher=ctx.launcher,
        output_caps=tuple(_output_cap(_expected_shape(stage, spec, case, ctx)) for case in stage.cases),
        all_cases=ctx.all_cases,
        case_names=tuple(c.name for c in stage.cases),
        deadline=ctx.deadline,
        deadline_budget=ctx.budget,
        case_cpu=_case_cpu(stage, ctx, spec),
        cpu_floor=CPU_FLOOR,
    )


def _cached_path(stage: StageSpec, spec: OracleSpec) -> bool:
    """Whether some case runs positions past the oracle's prefill block, i.e. through the student's cache. Only a
    built-in oracle says where its prefill ends (an instructor's file oracle has no `defective` twin either)."""
    if spec.defective is None and not isinstance(stage.check, (TokensCheck, ScalingCheck)):
        return False
    return any(positions_needed(case.inputs) > spec.prefill(case.inputs) for case in stage.cases)


def grade(stage: StageSpec, ctx: GradeContext) -> StageResult:
    """Grade one stage of the course against the oracle; student faults become results, never exceptions.

    The verdict only: fingerprinted already when ctx asks for it, the student's arrays dropped."""
    return grade_stage(stage, ctx).result


def grade_stage(stage: StageSpec, ctx: GradeContext) -> Graded:
    """grade(), with the student's arrays kept beside the verdict while its fingerprinting is still to come
    (ctx.fingerprint False, ctx.diagnosis True)."""
    started = time.perf_counter()
    spec = resolve_oracle(stage.oracle, stage.source)
    judge = judge_for(stage.check)
    stage, ctx, weights_note = judge.prepared(stage, ctx)
    for case in stage.cases:
        check_case_fits(stage, case, ctx.model)
    job = student_job(stage, ctx, spec)
    judged, outcomes = judge.run(stage, ctx, spec, job, weights_note)
    cases = [j.case for j in judged]
    source, line = adapter_definition(ctx.course, outcomes, stage.adapter_names)
    result = StageResult(
        id=stage.id,
        title=stage.title,
        status=_stage_status(cases),
        cases=cases,
        points=_points(stage, cases),
        max_points=stage.points,
        adapter=stage.adapter,
        adapters_file=str(ctx.course.adapters),
        lesson=str(stage.lesson),
        check=stage.check,
        seconds=time.perf_counter() - started,
        adapter_line=line,
        adapter_source=source,
        cross_case=cross_case_diagnosis(stage, cases),
        visibility=stage.visibility,
        cached_path=_cached_path(stage, spec),
        float64_cases=tuple(j.case.name for j in judged if j.float64),
    )
    if not ctx.diagnosis:  # never fingerprinted: nothing is kept
        return Graded(result)
    outputs = {j.case.name: j.output for j in judged if j.output is not None}
    if not ctx.fingerprint:
        return Graded(result, outputs)
    found = fingerprint_stage(stage, result, outputs, ctx.model, ctx.cache, ctx.first_exact)
    return Graded(dataclasses.replace(found, seconds=time.perf_counter() - started))


class StageJudge(Protocol):
    """How a kind of check runs a stage's cases and judges them (judge_for chooses it): each case as its array
    arrives, or the cost proof's calls driven one by one."""

    exclusive: bool  # graded while no other stage is: what it measures is CPU (drive/costlock.py)
    cpu_budgeted: bool  # each case gets a CPU budget from its work (spec.timeouts); else its own budgets

    def warm(self, stage: StageSpec, model: Model, cache: OracleCache, untrusted: bool) -> None:
        """Measure ahead what judging will need, before grading threads run beside the measurement."""
        ...

    def prepared(self, stage: StageSpec, ctx: GradeContext) -> tuple[StageSpec, GradeContext, str]:
        """The stage and context it runs on (its lengths fitted to their context), and what the report says of the
        weights ("" for the graded ones)."""
        ...

    def run(
        self, stage: StageSpec, ctx: GradeContext, spec: OracleSpec, job: AdapterJob, weights_note: str
    ) -> tuple[list[Judged], list[CallOutcome]]:
        """Every case run and judged: its verdict, and each case's outcome."""
        ...


class EachCase:
    """Rows and tokens: the stage's cases run in the student's process, each judged as its array arrives."""

    exclusive = False
    cpu_budgeted = True

    def warm(self, stage: StageSpec, model: Model, cache: OracleCache, untrusted: bool) -> None:
        """Nothing to measure ahead (the oracle outputs are the grader's to warm)."""

    def prepared(self, stage: StageSpec, ctx: GradeContext) -> tuple[StageSpec, GradeContext, str]:
        return stage, ctx, ""

    def run(
        self, stage: StageSpec, ctx: GradeContext, spec: OracleSpec, job: AdapterJob, weights_note: str
    ) -> tuple[list[Judged], list[CallOutcome]]:
        outcomes, graded = _judged_as_they_arrive(stage, job, ctx, spec)
        judged = [
            graded.get(i) or judge_case(stage, case, outcome, ctx, spec)
            for i, (case, outcome) in enumerate(zip(stage.cases, outcomes))
        ]
        return judged, outcomes


class CostProof:
    """cache-scaling: run where cost can tell a cache from a recompute (its proof weights), the grader driving each
    timed call itself, judged by its CPU cost (judge/scaling.py)."""

    exclusive = True
    cpu_budgeted = False  # its calls have budgets of their own

    def warm(self, stage: StageSpec, model: Model, cache: OracleCache, untrusted: bool) -> None:
        """The oracle's costs the proof compares with (oraclecost.measure_costs)."""
        oraclecost.measure_costs(stage, model, cache, untrusted)

    def prepared(self, stage: StageSpec, ctx: GradeContext) -> tuple[StageSpec, GradeContext, str]:
        proof, weights_note = oraclecost.proof_model(stage, ctx.model, ctx.cache, ctx.untrusted)
        return oraclecost.fit_to_context(stage, proof.config.n_ctx), dataclasses.replace(ctx, model=proof), weights_note

    def run(
        self, stage: StageSpec, ctx: GradeContext, spec: OracleSpec, job: AdapterJob, weights_note: str
    ) -> tuple[list[Judged], list[CallOutcome]]:
        cap = lambda n: _output_cap((n,))  # noqa: E731 - token ids: n_new of them
        ran = [scaling.grade_case(stage, ctx, i, job, cap, weights_note) for i in range(len(stage.cases))]
        return [Judged(r) for r, _ in ran], [o for _, o in ran]


_EACH_CASE, _COST_PROOF = EachCase(), CostProof()


def judge_for(check: Check) -> StageJudge:
    """The one choice of a stage's judge, by the kind of check it makes."""
    match check:
        case RowsCheck() | TokensCheck():
            return _EACH_CASE
        case ScalingCheck():
            return _COST_PROOF
        case _:
            assert_never(check)
