"""The JSON results document (schema "theinference.results", version 1; see README)."""

import dataclasses
import json
import math
from typing import assert_never

from theinference import __version__
from theinference.grading.drive.batch import (
    BATCH_SCHEMA,
    BATCH_SCHEMA_VERSION,
    SHARD_COLUMNS,
    GradedWith,
    ShardRecord,
    SubmissionResult,
)
from theinference.grading.drive.gradesheet import first_errors, machine_busy, regrade, too_slow
from theinference.grading.judge.results import CaseResult, Diagnosis, RunResult, ScalingResult, StageResult, StepTime
from theinference.grading.spec.stages import StageSpec
from theinference.grading.spec.checks import Check, RowsCheck, ScalingCheck, TokensCheck

SCHEMA = "theinference.results"
SCHEMA_VERSION = 1


def _number(value: float):
    # JSON has no NaN or infinity; they are written as the strings "nan", "inf", "-inf".
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _clean(obj):
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return _number(obj)


def step_document(step: StepTime | None) -> dict | None:
    """A step as the grader timed it: charged against its timeout, and the CPU and run-queue wait behind it."""
    if step is None:
        return None
    return {
        "charged_seconds": step.charged,
        "timeout": step.timeout,
        "cpu_seconds": step.cpu,
        "waited_seconds": step.waited,
        "wall_seconds": step.wall,
    }


def scaling_document(scaling: ScalingResult | None) -> dict | None:
    """The cache-scaling numbers, derived ones included, so readers need not recompute them."""
    if scaling is None:
        return None
    return {
        "lengths": scaling.lengths,
        "cpu_seconds": scaling.seconds,
        "ms_per_token": scaling.ms_per_token,
        "marginal_ms_per_token": scaling.marginal_ms,
        "ratio": scaling.ratio,
        "max_ratio": scaling.max_ratio,
        "fraction_of_recompute": scaling.fraction,
        "max_fraction": scaling.max_fraction,
        "accounting": scaling.accounting,
        "accounting_complete": scaling.complete,
        "guarantee": scaling.guarantee,
        "floor_ms_per_token": scaling.floor_ms,
        "oracle_cpu_seconds": scaling.oracle_seconds,
        "oracle_step_ms": scaling.step_ms,
        "speedup": scaling.speedup,
        "stopped_at": scaling.stopped_at,
        "weights_note": scaling.weights_note,
        "calls": [
            {
                "n_new": c.n_new,
                "cpu_seconds": c.cpu_seconds,
                "wall_seconds": c.wall_seconds,
                "stopped": c.stopped,
                "prompt_tokens": c.prompt_tokens,
                "diagnostic": c.diagnostic,
                "clock": step_document(c.clock),
            }
            for c in scaling.calls
        ],
    }


def _diagnosis(diagnosis: Diagnosis | None) -> dict | None:
    """A diagnosis: its fields, `bugs` a list, and `bug` the same comma-separated (as documents have always had it)."""
    return None if diagnosis is None else {**dataclasses.asdict(diagnosis), "bug": diagnosis.bug}


def case_document(case: CaseResult) -> dict:
    doc = {
        "name": case.name,
        "status": case.status,
        "message": case.message,
        "detail": case.detail,
        "inputs": case.inputs,
        "texts": case.texts,
        "seconds": case.seconds,
        "clock": step_document(case.clock),
        "loading": step_document(case.loading),
        "first_bad_row": case.first_bad_row,
        "rows": [dataclasses.asdict(r) for r in case.rows],
        "steps": [dataclasses.asdict(s) for s in case.steps],
        "expected_tokens": case.expected_tokens,
        "got_tokens": case.got_tokens,
        "diagnosis": _diagnosis(case.diagnosis),
        "traceback": case.traceback,
        "stdout": case.stdout,
        "stderr": case.stderr,
        "at": {"file": case.at[0], "line": case.at[1]} if case.at else None,
        "scaling": scaling_document(case.scaling),
    }
    return doc


def _tolerance(check: Check) -> dict:
    """The stage's tolerance, as its file gives it: [tie] for greedy tokens, [tolerance] for rows."""
    match check:
        case RowsCheck(atol=atol, rtol=rtol):
            return {"tolerance": {"atol": atol, "rtol": rtol}}
        case TokensCheck(tie_rtol=tie) | ScalingCheck(tie_rtol=tie):
            return {"tie": {"rtol": tie}}
        case _:
            assert_never(check)


def stage_document(stage: StageResult) -> dict:
    return {
        "id": stage.id,
        "title": stage.title,
        "status": stage.status,
        "points": stage.points,
        "max_points": stage.max_points,
        "passed_cases": stage.passed_cases,
        "total_cases": len(stage.cases),
        "adapter": stage.adapter,
        "adapters_file": stage.adapters_file,
        "lesson": stage.lesson,
        "compare": stage.check.kind,
        **_tolerance(stage.check),
        "seconds": stage.seconds,
        "diagnosis": _diagnosis(stage.diagnosis),
        "cross_case": stage.cross_case is not None,
        "source": stage.origin,
        "visibility": stage.visibility,
        "float64_cases": list(stage.float64_cases),
        "cases": [case_document(c) for c in stage.cases],
    }


def run_document(run: RunResult, version: str) -> dict:
    earned, possible = run.points
    return _clean(
        {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "theinference_version": version,
            "status": "pass" if run.passed else "fail",
            "points": earned,
            "max_points": possible,
            "course": run.course,
            "seed": run.seed,
            "weights": {
                "path": run.weights_path,
                "source": run.weights_source,
                "why": run.weights_why,
                "synthetic": None if run.synthetic is None else str(run.synthetic),
                "config": run.config,
            },
            "untrusted": run.untrusted,
            "course_supplied": run.course_supplied,
            "notices": run.notices,
            "isolation": {"level": run.isolation, "summary": run.isolation_summary},
            "processes": dict(run.processes),
            "stages": [stage_document(s) for s in run.stages],
        }
    )


def render_json(run: RunResult, version: str) -> str:
    return json.dumps(run_document(run, version), indent=2, allow_nan=False) + "\n"


def batch_document(
    results: list[SubmissionResult],
    stages: list[StageSpec],
    graded: GradedWith,
    interrupted: str = "",
    shard: ShardRecord | None = None,
) -> dict:
    """The batch JSON document (schema "theinference.batch", see README): every run's full results."""
    # Each submission keeps which slice of which batch graded it, so merged and regraded documents keep it too.
    record = dict(zip(SHARD_COLUMNS, [shard.label, shard.submissions, shard.ids])) if shard else {}
    docs = []
    for r in results:
        earned, possible = r.points(stages)
        docs.append(
            {
                "id": r.id,
                "path": r.path,
                "status": r.status,
                "points": earned,
                "max_points": possible,
                "error": first_errors(r),
                "seconds": r.seconds,
                **record,
                "copy_of": [json.loads(json.dumps(dataclasses.asdict(c))) for c in r.copies],  # JSON's lists
                "fingerprints": r.prints,  # what `grade merge` compares across shards (copies.py): no source
                # cases the machine gave too little CPU to finish, even after their retries: regrade this row
                "machine_busy": [{"stage": stage, "case": case} for stage, case in machine_busy(r)],
                "regrade": regrade(r),  # stages whose points are the wall clock's (busy machine, time budget)
                "too_slow": too_slow(r),  # failing stages whose cache is flat but slow, not wrong
                "results": run_document(r.run, __version__) if r.run else None,
            }
        )
    return {
        "schema": BATCH_SCHEMA,
        "schema_version": BATCH_SCHEMA_VERSION,
        "graded_with": dataclasses.asdict(graded),
        "stages": [s.id for s in stages],
        "seed": graded.seed,
        "interrupted": interrupted or None,
        "submissions": docs,
    }
