"""grading/judge/results.py: the derived figures every renderer reads off a result (never recomputed there)."""

import math

import pytest

from theinference.grading.judge.results import CheckCell, CheckResult, Diagnosis, Status

from .builders import case, failing_case, run, scaling, stage


def test_ms_per_token_ratio_fraction_and_speedup():
    s = scaling(seconds=(0.08, 9.6), oracle_seconds=24.0)
    assert s.ms_per_token == (10.0, 20.0)
    assert s.ratio == pytest.approx(2.0)
    assert s.fraction == pytest.approx(0.4)
    assert s.speedup == pytest.approx(2.5)
    assert s.marginal_ms[0] is None and s.marginal_ms[1] == pytest.approx(1000 * (9.6 - 0.08) / 472)


def test_figures_not_measured_are_none_never_a_number():
    unmeasured = scaling(seconds=(0.08, None), oracle_seconds=24.0)
    assert (unmeasured.ratio, unmeasured.fraction, unmeasured.speedup) == (None, None, None)
    assert unmeasured.ms_per_token == (10.0, None) and unmeasured.marginal_ms == (None, None)
    no_oracle = scaling(oracle_seconds=None)
    assert no_oracle.fraction is None and no_oracle.speedup is None


def test_a_free_first_call_makes_the_ratio_infinite_not_an_error():
    assert scaling(seconds=(0.0, 4.8)).ratio == math.inf
    assert scaling(seconds=(0.08, 0.0)).speedup is None  # nothing to divide by


def test_a_run_passes_only_when_every_stage_does_and_adds_up_points():
    assert run().passed
    mixed = run([stage(), stage("greedy", Status.FAIL, [failing_case()], points=2.5, max_points=10)])
    assert not mixed.passed and mixed.points == (12.5, 20)
    assert run([]).passed and run([]).points == (0, 0)


def test_passed_cases_and_first_bad_row():
    s = stage("x", Status.FAIL, [case("a"), failing_case("b"), case("c")])
    assert s.passed_cases == 2
    assert failing_case().first_bad_row == 1 and case().first_bad_row is None


def test_the_headline_diagnosis_is_across_cases_else_the_most_telling_case():
    short = Diagnosis("all-rows-off", "short", "")
    long = failing_case("long")  # four rows
    one_row = case("one", Status.FAIL, rows=failing_case().rows[:1], diagnosis=short)
    assert stage("x", Status.FAIL, [one_row, long]).diagnosis == long.diagnosis
    across = Diagnosis("first-decode-row-off", "across", "")
    assert stage("x", Status.FAIL, [one_row, long], cross_case=across).diagnosis == across
    assert stage().diagnosis is None


@pytest.mark.parametrize(
    "expected, got, expected_bugs, got_bugs, ok",
    [
        (("pass",), "pass", None, frozenset(), True),
        (("pass",), "fail", None, frozenset(), False),
        (("fail",), "shifted-by-one", None, frozenset(), True),  # "fail": any failure shape
        (("fail",), "error", None, frozenset(), False),  # ...but a status is no failure shape
        (("fail",), "not-started", None, frozenset(), False),
        (("shifted-by-one",), "all-rows-off", None, frozenset(), False),
        (("shifted-by-one",), "shifted-by-one", frozenset({"wpe"}), frozenset({"wpe"}), True),
        (("shifted-by-one",), "shifted-by-one", frozenset({"wpe"}), frozenset({"wpe", "mask"}), False),
        (("shifted-by-one",), "shifted-by-one", frozenset(), frozenset({"wpe"}), False),  # expected no known bug
        (("pass", "shifted-by-one"), "pass", frozenset({"wpe"}), frozenset(), True),  # a pass names no bug
    ],
)
def test_a_check_cell_is_ok(expected, got, expected_bugs, got_bugs, ok):
    assert CheckCell("m", "s", expected, got, expected_bugs=expected_bugs, got_bugs=got_bugs).ok is ok


def test_a_check_fails_on_any_bad_cell_problem_or_broken_manifest():
    good = [CheckCell("solution", "s", ("pass",), "pass")]
    assert CheckResult(["s"], ["solution"], good).ok
    assert not CheckResult(["s"], ["solution"], good + [CheckCell("m", "s", ("pass",), "fail")]).ok
    assert not CheckResult(["s"], ["solution"], good, problems=["x"]).ok
    assert not CheckResult(["s"], ["solution"], good, broken=["y"]).ok
