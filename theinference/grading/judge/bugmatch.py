"""Which known bugs a student's rows equal: GPT-2 computed with each bug the stage lists, then the parametric
families (judge/families.py), each fitted to the student's output.

Each candidate is first compared on a screen (one row of the cheapest failing case, of logits the columns furthest
outside the tolerance), so most are ruled out by one small forward; one that passes is computed on every case read,
cheapest failing case first, its outputs cached like the oracle's. A bug matches when the student's output equals
its output at the stage's tolerance in every case read, and its output differs from GPT-2's (otherwise the bug is not
visible in these cases).
"""

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from theinference.grading.judge import families
from theinference.grading.oracle.bugs import (
    BUILTIN_BUGS,
    Bug,
    bug_output,
    bug_screen,
    bug_screens,
    is_inert,
    resolve_bug,
)
from theinference.grading.oracle.store import oracle_version
from theinference.grading.oracle.registry import OracleSpec, resolve_oracle
from theinference.grading.judge.results import CaseResult, Status
from theinference.grading.spec.checks import RowsCheck
from theinference.grading.spec.stages import StageSpec
from theinference.model.weights import Model

# A match this close (a tenth of the stage's atol) is exact: with first_exact, no further candidate is computed
# (a later bug within a fifth of atol of it goes unnamed; `stages check` screens every one). float32 roundoff
# on 12 layers stays well inside it; bugs the cases can tell apart differ by more than the whole atol.
EXACT = 0.1
SCREEN_COLUMNS = 256  # logits columns a family candidate is screened on before it is computed in full
# The student's arrays a fingerprint reads, by case name: kept beside a stage's verdict, never inside it.
Outputs = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Match:
    bug: Bug
    max_abs: float  # largest |your output - this bug's output| over the cases read


def _frozen(inputs: dict) -> tuple:
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in inputs.items())


def _key(model: Model, stage: StageSpec, bug: Bug, inputs: dict, history: list) -> tuple:
    before = tuple(map(_frozen, history)) if bug.uses_history else ()
    return (str(model.path), model.stamp, "bug", stage.oracle, bug.name, bug.stamp, _frozen(inputs), before)


def _durable(stage: StageSpec, spec: OracleSpec, bug: Bug, inputs: dict, history: list) -> tuple:
    """What besides the weights' content determines a bug's output, for the persistent store."""
    return (
        "bug",
        stage.oracle,
        oracle_version(spec.stamp),
        bug.name,
        oracle_version(bug.stamp),
        inputs,
        history if bug.uses_history else [],
    )


def _rows(stage: StageSpec) -> RowsCheck:
    """The tolerance of a stage whose cases return rows (the only ones fingerprinted against bug oracles)."""
    assert isinstance(stage.check, RowsCheck), "bug oracles fingerprint rows only"
    return stage.check


def _distance(got: np.ndarray, target: np.ndarray, stage: StageSpec) -> float | None:
    """The largest |got - target| when got is within the stage's tolerance of target everywhere (np.allclose, NaN
    equal to NaN), else None; row by row, so a wrong candidate is rejected at its first bad row."""
    if got.shape != target.shape:
        return None
    worst, tol = 0.0, _rows(stage)
    for g, t in zip(got, target) if got.ndim > 1 else ((got, target),):
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(g - t)
            fine = diff <= tol.atol + tol.rtol * np.abs(t)
        if not fine.all():  # NaN or inf: np.isclose decides, on those elements only
            if not np.isclose(g[~fine], t[~fine], atol=tol.atol, rtol=tol.rtol, equal_nan=True).all():
                return None
            diff = diff[np.isfinite(diff)]  # equal infinities or NaNs: no distance
        worst = max(worst, float(diff.max()) if diff.size else 0.0)
    return worst


def _close(got: np.ndarray, target: np.ndarray, stage: StageSpec) -> bool:
    return _distance(got, target, stage) is not None


def _read_order(cases: list[CaseResult], outputs: Outputs) -> list[CaseResult]:
    """Failing cases first, smallest first: most candidates fail on the cheapest forward."""
    return sorted(cases, key=lambda c: (c.status == Status.PASS, np.asarray(outputs[c.name]).size))


@dataclass(frozen=True)
class _Screen:
    """Where every candidate is compared first, at a fraction of a whole output's cost: one row of the cheapest
    failing case, the earliest failing one with at least half as many elements off as the worst (computed over the
    positions it depends on), and of logits the vocabulary columns furthest outside the tolerance. GPT-2 fails
    there, so must any candidate that GPT-2 equals there."""

    case: CaseResult
    row: int | None
    columns: np.ndarray | None
    got: np.ndarray


def _screen_row(case: CaseResult, got: np.ndarray) -> int | None:
    """The row a screen on this case (its output: got) compares; None: the whole output."""
    if got.ndim > 1 and case.rows:
        bad = np.array([0 if r.ok else max(r.n_bad, 1) for r in case.rows])
        return int(np.argmax(bad >= bad.max() / 2))
    return None


def _screen(stage: StageSpec, cheapest: CaseResult, got: np.ndarray, expected: np.ndarray) -> _Screen:
    row = _screen_row(cheapest, got)
    if row is not None:
        got, expected = got[row], expected[row]
    columns = None
    if stage.oracle not in families.LAYER0:  # logits
        wide = expected.astype(np.float64)
        with np.errstate(invalid="ignore"):
            excess = np.abs(got - wide) - (_rows(stage).atol + _rows(stage).rtol * np.abs(wide))
        columns = np.sort(np.argsort(-np.nan_to_num(excess, nan=np.inf))[:SCREEN_COLUMNS])
        got = got[columns]
    return _Screen(cheapest, row, columns, got)


def _match(
    bug: Bug,
    cases: list[CaseResult],
    stage: StageSpec,
    spec: OracleSpec,
    model: Model,
    cache,
    histories: dict,
    screen: _Screen,
    screened: dict,
    outputs: Outputs,
) -> Match | None:
    if is_inert(bug, spec, screen.case.inputs):  # the cheapest failing case would be GPT-2's: not this bug
        return None
    quick = (
        screened[bug.name]
        if bug.name in screened
        else bug_screen(
            bug, spec, stage.oracle, model, screen.case.inputs, screen.row, screen.columns, histories[screen.case.name]
        )
    )
    if quick is not None and not _close(screen.got, quick, stage):
        return None
    worst, visible = 0.0, False
    for case in cases:
        got = outputs[case.name]
        expected = cache.get(model, stage, spec, case)
        history = histories[case.name]
        out = (
            expected
            if is_inert(bug, spec, case.inputs)
            else cache.memo(
                _key(model, stage, bug, case.inputs, history),
                lambda: bug_output(bug, spec, stage.oracle, model, case.inputs, history),
                model=model,
                durable=_durable(stage, spec, bug, case.inputs, history),
                label=f"{stage.id}: {case.name} with {bug.name}",
            )
        )
        distance = _distance(got, out, stage)
        if distance is None:
            return None
        visible = visible or not _close(out, expected, stage)
        worst = max(worst, distance)
    return Match(bug, worst) if visible else None


def find_matches(
    stage: StageSpec,
    cases: list[CaseResult],
    outputs: Outputs,
    model: Model,
    cache,
    histories: dict,
    first_exact: bool = False,
) -> list[Match]:
    """The stage's known bugs whose output the student's output (outputs: by case name) equals in every one of
    these cases (with first_exact, the screening stops at the first exact match)."""
    spec = resolve_oracle(stage.oracle, stage.source)
    ordered = _read_order(cases, outputs)
    wide = all(np.asarray(outputs[c.name]).dtype == np.float64 for c in ordered)  # the families may use float64
    got = {c.name: np.asarray(outputs[c.name], dtype=np.float32) for c in ordered}  # once, not once per bug
    failing = [c for c in ordered if c.status == Status.FAIL]
    if not failing:
        return []
    # Every candidate is screened on one row: the failing case whose screen row depends on the fewest positions.
    cheapest = min(
        failing, key=lambda c: families.screen_positions(stage.oracle, c.inputs, _screen_row(c, got[c.name]))
    )
    screen = _screen(stage, cheapest, got[cheapest.name], cache.get(model, stage, spec, cheapest))
    # The built-in bugs a Defects expresses are screened in one pass (the others, and instructors', one by one).
    together = [BUILTIN_BUGS[n] for n in stage.bugs if n in BUILTIN_BUGS and BUILTIN_BUGS[n].defects is not None]
    together = [bug for bug in together if not is_inert(bug, spec, screen.case.inputs)]
    screened = bug_screens(together, spec, stage.oracle, model, screen.case.inputs, screen.row, screen.columns)
    matches = []
    for name in stage.bugs:
        bug = resolve_bug(name, stage.source)
        match = _match(bug, ordered, stage, spec, model, cache, histories, screen, screened, got)
        if match is not None:
            matches.append(match)
            if first_exact and match.max_abs <= EXACT * _rows(stage).atol:
                break
    return matches or find_family_matches(stage, ordered, got, model, cache, screen, wide)


def _verify_family(
    candidate: families.Candidate,
    cases: list[CaseResult],
    outputs: Outputs,
    stage: StageSpec,
    model: Model,
    expected: dict,
    wide: bool,
) -> Match | None:
    """The candidate reproduces every case, computed in float32 (the weights') or, failing that, in float64 when
    the student's output was float64 (wide): an ill-conditioned mistake can separate the two beyond the tolerance.

    In float32 each case is computed alone, cheapest first, so a wrong candidate costs its first mismatch only. The
    float64 round comes after float32 failed on a candidate the screen let through, most often the right one: its
    cases run in one pass over the weights (each cast to float64 once, not once per case)."""
    for float64 in (False, True) if wide else (False,):
        worst, visible = 0.0, False
        outs = (
            families.case_outputs(model, stage.oracle, [(c.inputs, candidate.make(c.inputs)) for c in cases], True)
            if float64
            else (families.variant_output(model, stage.oracle, c.inputs, candidate.make(c.inputs)) for c in cases)
        )
        for case, out in zip(cases, outs):
            got = outputs[case.name]
            distance = _distance(got, out, stage)
            if distance is None:
                break
            visible = visible or not _close(out, expected[case.name], stage)
            worst = max(worst, distance)
        else:
            if not visible:
                return None
            finding = (
                f"{candidate.finding} (its layers computed in float64, as your output is)"
                if float64
                else candidate.finding
            )
            return Match(Bug(candidate.family, finding, ()), worst)
    return None


def find_family_matches(
    stage: StageSpec,
    ordered: list[CaseResult],
    outputs: Outputs,
    model: Model,
    cache,
    screen: _Screen,
    wide: bool = False,
) -> list[Match]:
    """The parametric families (theinference.grading.judge.families) whose fitted parameter reproduces every case read.

    Each candidate is screened first (candidates that coincide there are computed once); one that passes is
    verified on every case. At most one parameter per family is claimed.
    """
    if stage.oracle not in families.SUPPORTED:
        return []
    spec = resolve_oracle(stage.oracle, stage.source)
    expected = {c.name: cache.get(model, stage, spec, c) for c in ordered}
    inputs = screen.case.inputs
    matches: list[Match] = []

    def consider(found: list[families.Candidate]) -> None:
        variants = list(dict.fromkeys(candidate.make(inputs) for candidate in found))  # coinciding ones once
        outs = families.variant_outputs(model, stage.oracle, inputs, variants, screen.row, screen.columns)
        screened = {variant: _close(screen.got, out, stage) for variant, out in zip(variants, outs)}
        for candidate in found:
            if screened[candidate.make(inputs)] and all(m.bug.name != candidate.family for m in matches):
                match = _verify_family(candidate, ordered, outputs, stage, model, expected, wide)
                if match is not None:
                    matches.append(match)

    consider(families.candidates(model, stage.oracle))
    if not matches:  # a scale that is no formula: fitted as a number on the cheapest case
        enough = EXACT * _rows(stage).atol
        consider(list(families.fit_scale(model, stage.oracle, inputs, screen.got, screen.row, screen.columns, enough)))
    return matches
