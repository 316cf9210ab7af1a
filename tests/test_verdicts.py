"""Verdicts at the seams, without the CLI: each judge builds a frozen verdict once; fingerprinting and run evidence
return new results and leave the graded ones as they were; the student's arrays live beside a verdict, never in it,
and are gone once fingerprinted."""

import copy
import dataclasses

import numpy as np
import pytest

from theinference.bundled import data_dir
from theinference.course import load_course
from theinference.grading.drive.grader import Grader, RunOptions, Unmatched
from theinference.grading.drive.plan import plan_run
from theinference.grading.drive.session import open_session
from theinference.grading.judge.events import (
    RunDone,
    RunStarted,
    StageGraded,
    StageMatched,
    VerdictsDone,
)
from theinference.grading.judge.evidence import stage_evidence
from theinference.grading.judge.fingerprint import fingerprint_stage, needs_fingerprint
from theinference.grading.judge.grade import GradeContext, Judged, cross_case_diagnosis, judge_case
from theinference.grading.judge.results import CaseResult, StageResult, Status
from theinference.grading.oracle.bugs import bug_output, resolve_bug
from theinference.grading.oracle.registry import resolve_oracle
from theinference.grading.spec.stages import StageSpec, load_stages
from theinference.grading.tools.mutants import build_mutant, load_mutant
from theinference.model import gpt2 as oracle
from theinference.model.weights_choice import WeightsChoice
from theinference.proc.launch import SubprocessLauncher
from theinference.proc.runner import CallOutcome

STAGES = {s.id: s for s in load_stages([data_dir("stages")])}
FORWARD = STAGES["forward"]  # rows, with bugs listed: its outputs are kept for fingerprinting
BUG = "mask-off-by-one"  # invisible on a one-token sequence, visible on every longer one


@pytest.fixture
def ctx(tiny_model) -> GradeContext:
    return GradeContext(course=load_course(data_dir("course") / "solution"), model=tiny_model)


def _judged(stage: StageSpec, ctx: GradeContext, value_of) -> list[Judged]:
    """Every case of the stage judged directly, as if the student's process returned value_of(case)."""
    spec = resolve_oracle(stage.oracle, stage.source)
    return [judge_case(stage, c, CallOutcome(status="ok", value=value_of(c)), ctx, spec) for c in stage.cases]


def _buggy(stage: StageSpec, ctx: GradeContext):
    spec = resolve_oracle(stage.oracle, stage.source)
    bug = resolve_bug(BUG, stage.source)
    return lambda case: bug_output(bug, spec, stage.oracle, ctx.model, case.inputs)


def _stage_result(stage: StageSpec, cases: list[CaseResult]) -> StageResult:
    failing = next((c.status for c in cases if c.status != Status.PASS), Status.PASS)
    return StageResult(
        id=stage.id,
        title=stage.title,
        status=failing,
        cases=cases,
        points=0.0,
        max_points=stage.points,
        adapter=stage.adapter,
        adapters_file="tests/adapters.py",
        lesson=str(stage.lesson),
        check=stage.check,
        cross_case=cross_case_diagnosis(stage, cases),
    )


def _grader(ctx: GradeContext) -> Grader:
    return Grader(WeightsChoice(ctx.model.path, "--weights", ""), ctx.model, launcher=SubprocessLauncher())


def _arrays_in(value, seen=None) -> list[np.ndarray]:
    """Every numpy array reachable from value through dataclass fields, lists, tuples and dicts."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, np.ndarray):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        children = [getattr(value, f.name) for f in dataclasses.fields(value)]
    elif isinstance(value, dict):
        children = [*value.keys(), *value.values()]
    elif isinstance(value, list | tuple):
        children = list(value)
    else:
        return []
    return [a for child in children for a in _arrays_in(child, seen)]


def test_a_verdict_cannot_be_amended(ctx):
    judged = _judged(FORWARD, ctx, _buggy(FORWARD, ctx))
    case, result = judged[-1].case, _stage_result(FORWARD, [j.case for j in judged])
    run = _grader(ctx).run_result(ctx.course, [result], RunOptions())
    for verdict, field, value in [
        (case, "status", Status.PASS),
        (case, "diagnosis", None),
        (result, "status", Status.PASS),
        (result, "cross_case", None),
        (run, "advice", []),
        (run, "stages", []),
    ]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(verdict, field, value)
    assert case.status == Status.FAIL and case.diagnosis is not None
    assert judged[-1].output is not None and not hasattr(case, "output")  # the array is beside the verdict


def test_a_wrong_shape_output_fails_as_wrong_shape_and_keeps_no_array(ctx):
    [judged, *_] = _judged(FORWARD, ctx, lambda case: np.zeros((1, 3), dtype=np.float32))
    assert judged.case.status == Status.FAIL and judged.case.detail == "wrong-shape"
    assert "shape" in judged.case.message and judged.case.diagnosis is None and judged.case.rows == []
    assert judged.output is None  # nothing a fingerprint could read


def test_a_right_output_passes_and_is_kept_beside_its_verdict(ctx):
    spec = resolve_oracle(FORWARD.oracle, FORWARD.source)
    for judged in _judged(FORWARD, ctx, lambda case: ctx.cache.get(ctx.model, FORWARD, spec, case)):
        assert judged.case.status == Status.PASS and judged.case.message == "" and judged.case.diagnosis is None
        assert judged.case.rows and all(r.ok for r in judged.case.rows)
        assert judged.output is not None  # a match must hold on passing cases too


def test_a_failing_output_gets_its_shape(ctx):
    one_token, *longer = _judged(FORWARD, ctx, _buggy(FORWARD, ctx))
    assert one_token.case.status == Status.PASS  # the bug is invisible there
    for judged in longer:
        case = judged.case
        assert case.status == Status.FAIL and case.message.endswith("rows outside atol=0.001 rtol=0.01")
        assert case.diagnosis is not None and case.diagnosis.shape and case.diagnosis.bugs == ()
        assert case.first_bad_row == next(r.row for r in case.rows if not r.ok)


@pytest.mark.slow
def test_greedy_tokens_are_judged_on_the_students_path(ctx):
    greedy = dataclasses.replace(STAGES["greedy"], cases=STAGES["greedy"].cases[:1])
    model = ctx.model

    def right(case):
        return np.asarray(oracle.greedy(model.params, case.inputs["prompt"], case.inputs["n_new"], model.config.n_head))

    [passed] = _judged(greedy, ctx, right)
    assert passed.case.status == Status.PASS and passed.case.got_tokens == passed.case.expected_tokens
    assert passed.output is not None  # kept for the greedy-loop mistakes
    [short] = _judged(greedy, ctx, lambda case: right(case)[:-1])
    assert short.case.status == Status.FAIL and short.case.detail == "wrong-shape" and short.case.steps == []
    wrong = lambda case: np.concatenate([right(case)[:1], (right(case)[1:] + 1) % model.config.n_vocab])  # noqa: E731
    [failed] = _judged(greedy, ctx, wrong)
    assert failed.case.status == Status.FAIL and failed.case.diagnosis is not None
    assert failed.case.diagnosis.shape == "token-mismatch" and failed.case.steps[-1].verdict == "mismatch"


def test_fingerprinting_returns_a_new_stage_result_and_leaves_the_graded_one(ctx):
    judged = _judged(FORWARD, ctx, _buggy(FORWARD, ctx))
    graded = _stage_result(FORWARD, [j.case for j in judged])
    before = copy.deepcopy(graded)
    outputs = {j.case.name: j.output for j in judged if j.output is not None}
    assert needs_fingerprint(FORWARD, graded, outputs) and not needs_fingerprint(FORWARD, graded, {})
    found = fingerprint_stage(FORWARD, graded, outputs, ctx.model, ctx.cache, first_exact=True)
    assert found is not graded and graded == before  # the graded verdict is as it was
    assert graded.diagnosis is not None and graded.diagnosis.bugs == ()
    assert found.diagnosis is not None and BUG in found.diagnosis.bugs and found.diagnosis.evidence
    assert [c.status for c in found.cases] == [c.status for c in graded.cases]
    assert all(a is b for a, b in zip(found.cases, graded.cases) if a.status == Status.PASS)  # untouched: shared
    assert not _arrays_in(found)


def test_run_evidence_returns_a_new_stage_result(ctx):
    graded = _stage_result(FORWARD, [j.case for j in _judged(FORWARD, ctx, _buggy(FORWARD, ctx))])
    grader = _grader(ctx)
    run = grader.run_result(ctx.course, [graded], RunOptions())
    before = copy.deepcopy(graded)
    said = stage_evidence(graded, FORWARD.oracle, run, ctx.model.config.n_layer, {}, "tiny")
    assert graded == before and said is not graded
    assert said.diagnosis is not None and "only the one-token sequence passes" in said.diagnosis.evidence
    assert "from the run" not in (graded.diagnosis.evidence if graded.diagnosis else "")


@pytest.mark.slow
def test_the_grader_fingerprints_a_new_run_and_keeps_no_arrays_after(ctx):
    judged = _judged(FORWARD, ctx, _buggy(FORWARD, ctx))
    graded = _stage_result(FORWARD, [j.case for j in judged])
    grader = _grader(ctx)
    run = grader.run_result(ctx.course, [graded], RunOptions())
    grader.unmatched = Unmatched(run, ({j.case.name: j.output for j in judged if j.output is not None},))
    assert _arrays_in(grader.unmatched) and not _arrays_in(run)  # the arrays are beside the run, never in it
    told: list[StageResult] = []
    done = grader.fingerprint([FORWARD], run, RunOptions(first_exact=True), on_stage=told.append)
    assert grader.unmatched is None and not _arrays_in(done)  # taken, then dropped
    assert done is not run and run.stages == [graded] and run.stages[0].diagnosis.bugs == ()
    assert told == done.stages and BUG in done.stages[0].diagnosis.bugs
    again = grader.fingerprint([FORWARD], run, RunOptions(first_exact=True))  # nothing kept for it any more
    assert again.stages[0].diagnosis.bugs == ()


PHASES = (RunStarted, StageGraded, VerdictsDone, StageMatched, RunDone)


@pytest.mark.slow
def test_a_run_tells_each_verdict_before_its_finding_and_keeps_no_arrays_after(tiny_path, tmp_path):
    mutant = load_mutant(data_dir("course") / "mutants" / BUG / "manifest.toml")
    course = build_mutant(mutant, data_dir("course") / "solution", tmp_path / BUG)
    session = open_session(plan_run(course, weights=str(tiny_path)))
    try:
        wanted = [s for s in session.stages if s.id == "forward"]
        told: list = []
        run = session.run(wanted, told.append)
        phases = [type(e) for e in told if isinstance(e, PHASES)]  # the cases and oracle outputs between
        assert phases == [RunStarted, StageGraded, VerdictsDone, StageMatched, RunDone]
        graded, matched = (e.result for e in told if isinstance(e, (StageGraded, StageMatched)))
        assert graded.status == Status.FAIL and graded.diagnosis.bugs == () and BUG in matched.diagnosis.bugs
        assert run.stages == [matched] and session.grader.unmatched is None and not _arrays_in(run)
        # The grader keeps a verdict-only run's arrays beside it until they are matched, then drops them.
        verdicts = session.grader.grade(session.course, wanted, RunOptions(fingerprint=False))
        unmatched = session.grader.unmatched
        assert unmatched is not None and unmatched.run is verdicts and _arrays_in(unmatched)
        done = session.grader.fingerprint(wanted, verdicts, RunOptions())
        assert session.grader.unmatched is None and not _arrays_in(done) and BUG in done.stages[0].diagnosis.bugs
        full = session.run(wanted, verdicts_first=False)  # fingerprinted as graded: nothing kept beside it
        assert session.grader.unmatched is None and BUG in full.stages[0].diagnosis.bugs
    finally:
        session.close()
