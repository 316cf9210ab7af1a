"""The failure-shape classifier on synthetic per-row error series."""

import numpy as np
import pytest

from theinference.grading.judge.diagnose import classify_rows, diagnose_rows
from theinference.grading.judge.results import RowStats

ATOL = 1e-3


def rows_from_errors(errors, nonfinite=()):
    """RowStats for a series of max-abs errors; a row is ok when its error is within ATOL."""
    return [
        RowStats(
            row=i,
            position=i,
            token=None,
            max_abs=float(e),
            max_rel=float(e),
            n_bad=int(e > ATOL),
            n=10,
            n_nonfinite=1 if i in nonfinite else 0,
            worst_index=0,
            expected=0.0,
            got=float(e),
            ok=bool(e <= ATOL) and i not in nonfinite,
        )
        for i, e in enumerate(errors)
    ]


rng = np.random.default_rng(7)
NOISE = rng.normal(1.0, 0.08, 40)  # ±8% jitter, as real error series have

SERIES = {
    "error-grows": np.r_[1e-6, 0.05 * np.arange(1, 40) * NOISE[1:]],
    "all-rows-off": 0.8 * NOISE,
    "first-ok-then-flat": np.r_[1e-6, 2.0 * NOISE[1:]],
    "first-decode-row-off": np.r_[1e-6, 5.0, 2.0 * NOISE[2:]],
    "first-decode-row-off (recovering)": np.r_[1e-6, 4.0 / np.sqrt(np.arange(1, 40)) * NOISE[1:]],
    "error-grows (two rows ok)": np.r_[1e-6, 1e-6, 0.1 * np.arange(1, 39) * NOISE[2:]],
}


@pytest.mark.parametrize("name", SERIES)
def test_named_shapes(name):
    shape, _ = classify_rows(rows_from_errors(SERIES[name]))
    assert shape == name.split(" ")[0]


def test_nonfinite_row_wins_over_everything():
    shape, facts = classify_rows(rows_from_errors(SERIES["first-ok-then-flat"], nonfinite={7}))
    assert shape == "nonfinite-row" and facts["first_nonfinite"] == 7


def test_shifted_by_one_is_read_from_the_arrays():
    expected = np.random.default_rng(0).standard_normal((6, 50)).astype(np.float32)
    got = np.vstack([expected[1:], expected[:1] + 3])  # row k holds the oracle's row k+1
    rows = rows_from_errors([1.0] * 6)
    assert classify_rows(rows, expected, got, 1e-3, 1e-2)[0] == "shifted-by-one"
    assert classify_rows(rows, expected, expected + 1.0, 1e-3, 1e-2)[0] == "all-rows-off"


@pytest.mark.parametrize("seed", range(20))
def test_random_noise_is_not_given_a_name(seed):
    r = np.random.default_rng(seed)
    n = int(r.integers(8, 60))
    errors = 10 ** r.uniform(-6, 1, n)  # errors spanning seven orders of magnitude, in random order
    errors[r.random(n) < 0.3] = 1e-6  # and a random third of the rows passing
    errors[1] = 5.0  # make sure the case fails somewhere
    assert classify_rows(rows_from_errors(errors))[0] == "no-pattern"


def test_too_few_bad_rows_show_no_shape():
    assert classify_rows(rows_from_errors([1e-6, 3.0]))[0] == "no-pattern"


def test_diagnosis_carries_the_stages_hint_and_a_summary():
    d = diagnose_rows(rows_from_errors(SERIES["error-grows"]), {"error-grows": "your position counter isn't advancing"})
    assert d.shape == "error-grows" and d.hint == "your position counter isn't advancing"
    assert d.summary.startswith("row 0 matches; from row 1 on the error grows with position")
    assert diagnose_rows(rows_from_errors(SERIES["all-rows-off"]), {}).hint == ""
