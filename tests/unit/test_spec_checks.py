"""grading/spec/checks.py: what a stage checks, as a type, and its tolerance as the stage file gives it."""

from theinference.grading.spec.checks import COMPARES, checks_tokens, tolerance

from .builders import ROWS, SCALING, TOKENS


def test_the_compare_words_a_stage_file_may_use():
    assert COMPARES == ("rows", "tokens", "scaling")
    assert (ROWS.kind, TOKENS.kind, SCALING.kind) == COMPARES


def test_tolerance_as_the_stage_file_gives_it():
    assert tolerance(ROWS) == {"atol": 1e-4, "rtol": 1e-3}
    assert tolerance(TOKENS) == tolerance(SCALING) == {"tie_rtol": 1e-4}


def test_greedy_tokens_are_checked_for_tokens_and_for_the_cache_proof():
    assert not checks_tokens(ROWS) and checks_tokens(TOKENS) and checks_tokens(SCALING)
