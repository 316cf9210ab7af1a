"""Per-row allclose statistics and the greedy token walk. Pure functions over arrays."""

import numpy as np

from theinference.grading.judge.results import RowStats, TokenStep

_CHUNK = 8  # rows compared at a time: float64 temporaries stay small for 50257-wide logits


def shape_problem(expected_shape: tuple[int, ...], got: np.ndarray) -> str | None:
    """Why `got` cannot be compared with an oracle output of expected_shape, or None."""
    if got.shape != expected_shape:
        return f"expected shape {list(expected_shape)}, got {list(got.shape)}"
    return None


def promoted(expected: np.ndarray, got: np.ndarray) -> bool:
    """Whether the student's array is float64 where the oracle's is float32: float64 arithmetic somewhere (right
    numbers, several times the work), which the cost stage would otherwise be the first to show."""
    return expected.dtype == np.float32 and got.dtype == np.float64


def _chunk_stats(expected: np.ndarray, got: np.ndarray, atol: float, rtol: float):
    exp = expected.astype(np.float64)
    diff = np.abs(got.astype(np.float64) - exp)
    # NaN anywhere (got NaN, or inf - inf) is the worst possible error, never within tolerance.
    diff[np.isnan(diff)] = np.inf
    bad = diff > atol + rtol * np.abs(exp)
    worst = diff.argmax(axis=1)
    with np.errstate(over="ignore", invalid="ignore"):  # a huge ratio is inf, which is what it is
        rel = diff / np.maximum(np.abs(exp), np.finfo(np.float64).tiny)
    rel[np.isnan(rel)] = np.inf
    return diff, bad, worst, rel.max(axis=1), (~np.isfinite(got)).sum(axis=1)


def compare_rows(
    expected: np.ndarray, got: np.ndarray, atol: float, rtol: float, positions: list[int], tokens: list[int | None]
) -> list[RowStats]:
    """Compare two [n_rows, n_cols] arrays row by row (a 1-D array is a single row)."""
    if expected.ndim == 1:
        expected, got = expected[None, :], got[None, :]
    expected, got = expected.reshape(len(expected), -1), got.reshape(len(got), -1)
    rows = []
    for start in range(0, len(expected), _CHUNK):
        e, g = expected[start : start + _CHUNK], got[start : start + _CHUNK]
        diff, bad, worst, max_rel, nonfinite = _chunk_stats(e, g, atol, rtol)
        n_bad = bad.sum(axis=1)
        for i in range(len(e)):
            row, w = start + i, int(worst[i])
            rows.append(
                RowStats(
                    row=row,
                    position=positions[row],
                    token=tokens[row],
                    max_abs=float(diff[i, w]),
                    max_rel=float(max_rel[i]),
                    n_bad=int(n_bad[i]),
                    n=e.shape[1],
                    n_nonfinite=int(nonfinite[i]),
                    worst_index=w,
                    expected=float(e[i, w]),
                    got=float(g[i, w]),
                    ok=int(n_bad[i]) == 0,
                )
            )
    return rows


def token_summary(got: list[int], path_logits: np.ndarray) -> np.ndarray:
    """What the token walk reads of each step's logits: [n, 4] = argmax, its logit, got's logit, max |logit|."""
    rows = np.arange(len(got))
    best = np.argmax(path_logits, axis=1)
    return np.stack(
        [best, path_logits[rows, best], path_logits[rows, got], np.abs(path_logits).max(axis=1)], axis=1
    ).astype(np.float64)


def walk_tokens(got: list[int], path_logits: np.ndarray, tie_rtol: float, start_position: int) -> list[TokenStep]:
    """Check each student token against the oracle's logits on the student's own path.

    A token equal to the oracle's argmax matches; one whose logit is within tie_rtol * max|logit|
    of the argmax's is a near-tie and accepted; the first other token is a mismatch and ends the walk.
    """
    return walk_summary(got, token_summary(got, path_logits), tie_rtol, start_position)


def walk_summary(got: list[int], summary: np.ndarray, tie_rtol: float, start_position: int) -> list[TokenStep]:
    """walk_tokens over the token_summary of the path's logits."""
    steps = []
    for k, token in enumerate(got):
        best, best_logit, token_logit, largest = summary[k]
        best = int(best)
        gap = float(best_logit) - float(token_logit)
        allowed = tie_rtol * float(largest)
        verdict = "match" if token == best else "near-tie" if gap <= allowed else "mismatch"
        steps.append(
            TokenStep(
                step=k, position=start_position + k, got=token, expected=best, gap=gap, verdict=verdict, allowed=allowed
            )
        )
        if verdict == "mismatch":
            break
    return steps
