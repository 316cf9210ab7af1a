"""Per-row statistics and the greedy walk, on hand-made arrays."""

import math

import numpy as np

from theinference.grading.judge.compare import compare_rows, shape_problem, walk_tokens


def _rows(expected, got, atol=1e-3, rtol=1e-2):
    n = len(expected)
    return compare_rows(np.asarray(expected, np.float32), np.asarray(got), atol, rtol, list(range(n)), [None] * n)


def test_identical_rows_pass_with_zero_error():
    x = np.random.default_rng(0).standard_normal((4, 50)).astype(np.float32)
    rows = _rows(x, x.copy())
    assert all(r.ok and r.max_abs == 0 and r.n_bad == 0 for r in rows)


def test_tolerance_is_atol_plus_rtol_times_oracle():
    expected = [[100.0, 1.0]]
    assert _rows(expected, [[100.9, 1.0]])[0].ok  # 0.9 <= 1e-3 + 1e-2*100
    row = _rows(expected, [[100.0, 1.02]])[0]  # 0.02 > 1e-3 + 1e-2*1
    assert not row.ok and row.n_bad == 1 and row.worst_index == 1
    assert math.isclose(row.max_abs, 0.02, rel_tol=1e-4) and math.isclose(row.max_rel, 0.02, rel_tol=1e-4)
    assert (row.expected, round(row.got, 4)) == (1.0, 1.02)


def test_nan_and_inf_rows_fail_and_are_counted():
    rows = _rows([[1.0, 2.0], [1.0, 2.0], [0.0, 0.0]], np.array([[1.0, np.nan], [np.inf, 2.0], [0.0, 0.0]]))
    assert [r.ok for r in rows] == [False, False, True]
    assert [r.n_nonfinite for r in rows] == [1, 1, 0]
    assert rows[0].max_abs == math.inf and rows[0].worst_index == 1


def test_relative_error_against_zero_is_nan_safe():
    row = _rows([[0.0, 0.0]], [[0.0, 1e-9]])[0]
    assert row.ok and math.isfinite(row.max_abs) and not math.isnan(row.max_rel)


def test_rows_are_compared_in_chunks_without_mixing():
    expected = np.zeros((20, 3), np.float32)
    got = expected.copy()
    got[13, 2] = 5.0
    rows = _rows(expected, got)
    assert [r.row for r in rows if not r.ok] == [13]
    assert rows[13].worst_index == 2


def test_shape_problem():
    assert shape_problem((3, 4), np.zeros((3, 4))) is None
    assert shape_problem((3, 4), np.zeros((4, 3))) == "expected shape [3, 4], got [4, 3]"


def test_walk_accepts_near_ties_and_stops_at_the_first_mismatch():
    logits = np.array(
        [
            [5.0, 1.0, 0.0],  # argmax 0; student 0: match
            [-100.0, -99.995, 0.0],  # argmax 2, student 2: match
            [-100.0, -99.995, -200.0],  # argmax 1; student 0: gap 0.005 <= 1e-4 * 200: near-tie
            [0.0, 3.0, 1.0],  # argmax 1; student 2: gap 2: mismatch
            [9.0, 0.0, 0.0],  # never reached
        ]
    )
    steps = walk_tokens([0, 2, 0, 2, 0], logits, 1e-4, start_position=7)
    assert [s.verdict for s in steps] == ["match", "match", "near-tie", "mismatch"]
    assert steps[2].allowed == 1e-4 * 200
    assert [s.position for s in steps] == [7, 8, 9, 10]
    assert steps[3].expected == 1 and steps[3].gap == 2.0


def test_a_gap_beyond_float_noise_is_no_near_tie():
    # The old allowance (atol 1e-3 + rtol 1e-2 of the logit) accepted a runner-up 0.05 below on logits near 5.
    steps = walk_tokens([1], np.array([[5.0, 4.95, 0.0]]), 1e-4, start_position=0)
    assert steps[0].verdict == "mismatch"
