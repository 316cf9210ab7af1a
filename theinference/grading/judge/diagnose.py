"""Name the shape of a failing case's divergence, so the stage's hint can name the likely bug.

Shapes (stage files map each to a hint):
  nonfinite-row         some rows hold NaN or inf
  shifted-by-one        the student's row k matches the oracle's row k+1 (recorded after consuming)
  all-rows-off          every row is off, by a similar amount
  error-grows           the error grows with position (usually after the first row(s) match)
  first-ok-then-flat    the first row matches; every later row is off by a steady amount
  first-decode-row-off  the first row matches; row 1 is off, the worst, and later rows recover
  token-mismatch        (greedy) a generated token is not the oracle's and not a near-tie
  no-pattern            none of the above
"""

import numpy as np

from theinference.grading.judge.results import Diagnosis, RowStats, TokenStep
from theinference.grading.spec.shapes import SHAPES

FLAT_RATIO = 3.0  # rows whose 90th/10th percentile errors are within this factor are "off alike"
GROWTH_RATIO = 2.0  # the last third's mean error must be this multiple of the first third's
MIN_RANK_CORRELATION = 0.6  # and the error must rise with position, rank-wise
PEAK_RATIO = 2.0  # row 1 "the worst" when its error is this multiple of the later rows' median
MIN_BAD_ROWS = 3  # fewer bad rows than this show no shape

_SUMMARIES = {
    "nonfinite-row": "{nonfinite} NaN or inf, first at row {first_nonfinite}",
    "shifted-by-one": "your row k matches the oracle's row k+1: every row is one step late",
    "all-rows-off": "every row is off, by a similar amount (max |Δ| from {lo:.3g} to {hi:.3g})",
    "error-grows": "{matching}the error grows with position ({lo:.3g} → {hi:.3g})",
    "first-ok-then-flat": "row 0 matches; every later row is off by a steady amount (max |Δ| {lo:.3g} to {hi:.3g})",
    "first-decode-row-off": "row 0 matches; row 1 is already off ({first:.3g}) and later rows recover",
    "token-mismatch": "step {step} generated {got} where the oracle's greedy choice is {expected} (not a near-tie)",
    "no-pattern": "no recognisable pattern ({n_bad} of {n} rows off)",
}
assert set(_SUMMARIES) <= set(SHAPES), "every shape diagnose names is one a stage file may give a hint for"


def _rank_correlation(values: np.ndarray) -> float:
    if len(values) < 2 or np.all(values == values[0]):
        return 0.0
    ranks = np.argsort(np.argsort(values)).astype(np.float64)
    return float(np.corrcoef(np.arange(len(values)), ranks)[0, 1])


def _shifted_by_one(expected: np.ndarray, got: np.ndarray, atol: float, rtol: float) -> bool:
    if expected is None or got is None or len(expected) < 3 or expected.shape != got.shape:
        return False
    return bool(np.allclose(got[:-1], expected[1:], atol=atol, rtol=rtol))


def _spread(values: np.ndarray) -> float:
    lo, hi = np.percentile(values, [10, 90])
    return hi / lo if lo > 0 else np.inf


def _grows(tail: np.ndarray) -> bool:
    third = max(1, len(tail) // 3)
    return (
        _rank_correlation(tail) >= MIN_RANK_CORRELATION and tail[-third:].mean() >= GROWTH_RATIO * tail[:third].mean()
    )


def _shape_of_errors(ok: list[bool], err: np.ndarray) -> str:
    bad = err[~np.array(ok)]
    if len(bad) < MIN_BAD_ROWS:
        return "no-pattern"
    if not any(ok):
        if _grows(err):
            return "error-grows"
        return "all-rows-off" if _spread(bad) <= FLAT_RATIO else "no-pattern"
    n_ok = ok.index(False)
    if n_ok == 0 or any(ok[n_ok:]):
        return "no-pattern"  # a failing row 0, or passing rows among the failing ones
    tail = err[n_ok:]
    if _grows(tail):
        return "error-grows"
    if n_ok == 1 and (tail[0] >= PEAK_RATIO * np.median(tail[1:]) or _rank_correlation(tail) <= -MIN_RANK_CORRELATION):
        return "first-decode-row-off"  # worst at the first decode row, recovering as rows accumulate
    if n_ok == 1 and _spread(tail) <= FLAT_RATIO:
        return "first-ok-then-flat"
    return "no-pattern"


def _rows_before(first_bad: int) -> str:
    """'row 0 matches' or 'rows 0-4 match': the rows before the first one off."""
    return "row 0 matches" if first_bad == 1 else f"rows 0-{first_bad - 1} match"


def classify_rows(rows: list[RowStats], expected=None, got=None, atol=0.0, rtol=0.0) -> tuple[str, dict]:
    """The shape of a failing case's per-row errors, and the numbers its summary quotes."""
    ok = [r.ok for r in rows]
    err = np.array([r.max_abs for r in rows])
    facts: dict[str, object] = {"n": len(rows), "n_bad": ok.count(False)}
    nonfinite = [r.row for r in rows if r.n_nonfinite]
    if nonfinite:
        held = "1 row holds" if len(nonfinite) == 1 else f"{len(nonfinite)} rows hold"
        return "nonfinite-row", {**facts, "nonfinite": held, "first_nonfinite": nonfinite[0]}
    if _shifted_by_one(expected, got, atol, rtol):
        return "shifted-by-one", facts
    shape = _shape_of_errors(ok, err)
    bad = err[~np.array(ok)]
    first_bad = ok.index(False) if False in ok else 0
    matching = f"{_rows_before(first_bad)}; from row {first_bad} on " if first_bad else "every row is off and "
    facts.update(
        lo=float(bad.min()) if len(bad) else 0.0,
        hi=float(bad.max()) if len(bad) else 0.0,
        first=float(err[first_bad]),
        first_bad=first_bad,
        matching=matching,
    )
    return shape, facts


def diagnose_rows(rows, hints: dict, expected=None, got=None, atol=0.0, rtol=0.0) -> Diagnosis:
    """Diagnosis of a failing rows case: shape, a summary in words, and the stage's hint."""
    shape, facts = classify_rows(rows, expected, got, atol, rtol)
    return Diagnosis(shape=shape, summary=_SUMMARIES[shape].format(**facts), hint=hints.get(shape, ""))


def diagnose_tokens(steps: list[TokenStep], hints: dict, describe=str) -> Diagnosis:
    """Diagnosis of a greedy case whose walk ended in a mismatch."""
    last = steps[-1]
    summary = _SUMMARIES["token-mismatch"].format(
        step=last.step + 1, got=describe(last.got), expected=describe(last.expected)
    )
    return Diagnosis(shape="token-mismatch", summary=summary, hint=hints.get("token-mismatch", ""))
