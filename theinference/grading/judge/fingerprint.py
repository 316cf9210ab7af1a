"""Fingerprinting: does a failing stage's output equal GPT-2 computed with one of the known bugs?

Runs only for stages with failing cases that produced numbers (or tokens). Rows are matched against the stage's
listed bugs and the families (judge/bugmatch.py); a greedy stage's tokens against loops with one known mistake
(judge/loops.py). A match becomes the diagnosis, stated with its numbers; no match keeps the shape's list of
suspects and says that the bug is not one of the known ones.
"""

import dataclasses
from collections.abc import Mapping
from typing import assert_never

import numpy as np

from theinference.grading.judge import families, loops
from theinference.grading.judge.bugmatch import Match, Outputs, find_matches
from theinference.grading.judge.results import CaseResult, Diagnosis, StageResult, Status
from theinference.grading.spec.checks import RowsCheck, ScalingCheck, TokensCheck
from theinference.grading.spec.stages import StageSpec
from theinference.model.weights import Model

UNKNOWN = "not one of the known bugs"


def _finding(matches: list[Match], cases: list[CaseResult], stage: StageSpec) -> Diagnosis:
    off = max((r.max_abs for c in cases for r in c.rows), default=0.0)
    where = f"at every position of {len(cases)} case(s)"
    if len(matches) == 1:
        evidence = (
            f"your output equals GPT-2 with {matches[0].bug.finding}, to {matches[0].max_abs:.2g} {where}; "
            f"the correct output differs by up to {off:.3g}"
        )
    else:
        each = "; ".join(f"{m.bug.finding} (to {m.max_abs:.2g})" for m in matches)
        evidence = (
            f"your output equals GPT-2 with each of these bugs {where}, which these cases cannot tell apart: "
            f"{each}; the correct output differs by up to {off:.3g}"
        )
    hint = " ".join(stage.bug_hints[m.bug.name] for m in matches if stage.bug_hints.get(m.bug.name))
    return Diagnosis(shape="", summary="", hint=hint, bugs=tuple(m.bug.name for m in matches), evidence=evidence)


def _apply(diagnosis: Diagnosis, found: Diagnosis | None, checked: str) -> Diagnosis:
    if found is None:
        return dataclasses.replace(
            diagnosis, evidence=f"{UNKNOWN} ({checked} checked): the shape alone cannot name the cause"
        )
    return dataclasses.replace(diagnosis, hint=found.hint or diagnosis.hint, bugs=found.bugs, evidence=found.evidence)


def _histories(cases: list[CaseResult]) -> dict:
    """The earlier cases whose calls ran in the same student process before each case's (the
    runner starts a fresh process after a crash or a timeout)."""
    histories: dict[str, list] = {}
    earlier: list = []
    for case in cases:
        histories[case.name] = list(earlier)
        earlier = [] if case.status in (Status.CRASH, Status.TIMEOUT) else [*earlier, case.inputs]
    return histories


def fingerprint_stage(
    stage: StageSpec, result: StageResult, outputs: Outputs, model: Model, cache, first_exact: bool = False
) -> StageResult:
    """The graded stage with its failing diagnoses turned into findings where a known bug's output matches the
    student's (outputs: the arrays kept beside the verdict, by case name); result itself is unchanged.

    The caller drops outputs afterwards: a batch keeps every result until it ends, never the arrays.
    """
    match stage.check:
        case TokensCheck() as check:
            return _fingerprint_tokens(stage, check, result, outputs, model)
        case RowsCheck():
            return _fingerprint_rows(stage, result, outputs, model, cache, first_exact)
        case ScalingCheck():
            return result
        case _:
            assert_never(stage.check)


def needs_fingerprint(stage: StageSpec, result: StageResult, outputs: Outputs) -> bool:
    """Whether fingerprint_stage has anything to match: a failing greedy stage (its loop mistakes), or a failing
    case with numbers in a stage listing bugs (the listed bugs, then the families)."""
    match stage.check:
        case TokensCheck():
            return any(c.status == Status.FAIL for c in result.cases)
        case RowsCheck():
            failing = [c for c in result.cases if c.rows and c.name in outputs and c.status == Status.FAIL]
            return bool(stage.bugs and failing)
        case ScalingCheck():  # judged on cost; its tokens are the greedy stage's to fingerprint
            return False
        case _:
            assert_never(stage.check)


def _token_list(output) -> list[int] | None:
    got = np.asarray(output)
    if got.ndim != 1 or got.dtype.kind not in "iuf" or not np.all(np.isfinite(got) & (got == np.round(got))):
        return None
    return [int(t) for t in got]


def _with_diagnoses(result: StageResult, diagnoses: Mapping[str, Diagnosis | None], **changes) -> StageResult:
    """The stage with these cases' diagnoses (by case name) in place of theirs, and any other changes."""
    cases = [dataclasses.replace(c, diagnosis=diagnoses[c.name]) if c.name in diagnoses else c for c in result.cases]
    return dataclasses.replace(result, cases=cases, **changes)


def _fingerprint_tokens(
    stage: StageSpec, check: TokensCheck, result: StageResult, outputs: Outputs, model: Model
) -> StageResult:
    """A greedy stage: is every case's token list exactly what a loop with one known mistake returns (the loop
    mistakes, then the stage's listed built-in bugs: a right loop over GPT-2 with that bug)?"""
    cases = [c for c in result.cases if c.status in (Status.PASS, Status.FAIL) and c.name in outputs]
    tokens = {c.name: _token_list(outputs[c.name]) for c in cases}
    cases = sorted(
        (c for c in cases if tokens[c.name]), key=lambda c: (c.status == Status.PASS, len(tokens[c.name] or []))
    )
    failing = [c for c in result.cases if c.status == Status.FAIL]
    if not failing or not cases or cases[0].status != Status.FAIL:
        return result
    found: list[tuple[loops.LoopBug, str]] = []
    tried = loops.loop_bugs(model) + loops.listed_loop_bugs(stage.bugs)
    for bug in tried:
        details = []
        for case in cases:
            detail = loops.reproduces(
                bug, model, list(case.inputs["prompt"]), case.inputs["n_new"], tokens[case.name] or [], check.tie_rtol
            )
            if detail is None:
                break
            details.append(detail)
        else:
            fitted = sorted({d for d in details if d})
            if all(b.name != bug.name for b, _ in found):  # one parameter per family: the simplest that fits
                found.append((bug, f" ({', '.join(fitted)})" if fitted else ""))
    if not found:
        checked = f"{len(loops.loop_bugs(model))} greedy-loop mistakes"
        if len(tried) > len(loops.loop_bugs(model)):
            checked += f" and {len(tried) - len(loops.loop_bugs(model))} listed bugs"
        unknown = {c.name: _apply(c.diagnosis, None, checked) for c in failing if c.diagnosis is not None}
        return _with_diagnoses(result, unknown)
    where = f"in every one of the {len(cases)} case(s) that returned tokens"
    each = "; ".join(f"{bug.finding}{fitted}" for bug, fitted in found)
    evidence = f"your tokens are exactly those of a greedy loop that {each}, {where}"
    if len(found) > 1:
        evidence = f"your tokens are exactly those of a greedy loop with each of these mistakes {where}: {each}"
    names = tuple(dict.fromkeys(b.name for b, _ in found))
    hint = " ".join(stage.bug_hints[name] for name in names if stage.bug_hints.get(name))
    diagnosis = Diagnosis(shape="", summary="", hint=hint, bugs=names, evidence=evidence)
    return _with_diagnoses(
        result,
        {c.name: diagnosis if c.diagnosis is None else _apply(c.diagnosis, diagnosis, "") for c in failing},
    )


def _fingerprint_rows(
    stage: StageSpec, result: StageResult, outputs: Outputs, model: Model, cache, first_exact: bool
) -> StageResult:
    if not needs_fingerprint(stage, result, outputs):
        return result
    numeric = [c for c in result.cases if c.rows and c.name in outputs]
    failing = [c for c in numeric if c.status == Status.FAIL]
    # Read across cases, every case with numbers must match; otherwise the failing ones.
    cases = numeric if result.cross_case is not None else failing
    histories = _histories(result.cases)
    matches = find_matches(stage, cases, outputs, model, cache, histories, first_exact)
    found = _finding(matches, cases, stage) if matches else None
    checked = f"{len(stage.bugs)}"
    if stage.oracle in families.SUPPORTED:
        checked += " listed bugs and the families: attention scale, positions, layer norms, mask diagonal, q/k/v split, head count"
    cross_case = None if result.cross_case is None else _apply(result.cross_case, found, checked)
    diagnoses: dict[str, Diagnosis | None] = {}
    for case in failing:
        if case.diagnosis is not None:
            diagnoses[case.name] = _apply(case.diagnosis, found, checked)
        elif found is not None and cross_case is None:  # a one-row case has no shape, but the bug explains it too
            diagnoses[case.name] = found
    matched = _with_diagnoses(result, diagnoses, cross_case=cross_case)
    headline = matched.diagnosis
    if found is not None or headline is None:
        return matched
    # one stage, one list of suspects: the most telling case's
    hinted = {name: dataclasses.replace(d, hint=headline.hint) for name, d in diagnoses.items() if d is not None}
    return _with_diagnoses(matched, hinted)
