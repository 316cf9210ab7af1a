"""judge/verification.py: a greedy case's verdict from the student's token ids, on the student's own path."""

import numpy as np
import pytest

from theinference.grading.judge.results import Status
from theinference.grading.judge.verification import check_steps, token_problem, verify_tokens
from theinference.grading.oracle.cache import OracleCache
from theinference.model import gpt2 as oracle

from .builders import case

PROMPT, N_NEW = [464, 2068], 5
HINTS = {"token-mismatch": "Check what your loop feeds back."}


@pytest.fixture(scope="module")
def greedy_tokens(tiny_model) -> list[int]:
    return oracle.greedy(tiny_model.params, PROMPT, N_NEW, tiny_model.config.n_head)


def ran() -> object:
    """The case as the student's call came back, before its verdict."""
    return case("sentence", Status.PASS, rows=[], inputs={"prompt": PROMPT, "n_new": N_NEW}, seconds=0.1)


@pytest.mark.parametrize(
    "got, problem",
    [
        (np.array([1, 2, 3]), None),
        (np.array([1.0, 2.0, 3.0]), None),  # integral floats are token ids
        (np.array([1, 2]), "expected 3 token ids (shape [3]), got shape [2]"),
        (np.array([[1, 2, 3]]), "expected 3 token ids (shape [3]), got shape [1, 3]"),
        (np.array([1.0, 2.5, 3.0]), "expected integer token ids, got non-integer values"),
        (np.array([1.0, np.nan, 3.0]), "expected integer token ids, got non-integer values"),
        (np.array([1.0, np.inf, 3.0]), "expected integer token ids, got non-integer values"),
        (np.array([1, 50257, 3]), "token ids must be in [0, 50257); got 50257"),
        (np.array([1, -1, 3]), "token ids must be in [0, 50257); got -1"),
    ],
)
def test_token_problem(got, problem):
    assert token_problem(got, 3, 50257) == problem


def test_the_oracles_own_tokens_pass(tiny_model, greedy_tokens):
    verdict = verify_tokens(ran(), np.array(greedy_tokens), tiny_model, 1e-4, HINTS)
    assert verdict.status == Status.PASS
    assert verdict.got_tokens == verdict.expected_tokens == greedy_tokens
    assert [s.verdict for s in verdict.steps] == ["match"] * N_NEW
    assert verdict.seconds == 0.1 and verdict.message == ""  # the rest of the case as it came back


def test_a_wrong_token_fails_at_its_step_with_the_oracles_continuation(tiny_model, greedy_tokens):
    wrong = list(greedy_tokens)
    wrong[2] = (wrong[2] + 1) % 50257
    verdict = verify_tokens(ran(), np.array(wrong), tiny_model, 1e-4, HINTS)
    assert verdict.status == Status.FAIL
    assert verdict.message == f"token 3 of {N_NEW} differs from the oracle's greedy choice"
    assert [s.verdict for s in verdict.steps] == ["match", "match", "mismatch"]  # the walk stops there
    assert verdict.steps[-1].expected == greedy_tokens[2] and verdict.steps[-1].gap > 0
    assert verdict.steps[-1].position == len(PROMPT) + 1
    # the expected column: the student's tokens up to the mismatch, then the oracle's greedy from there
    continued = oracle.greedy(tiny_model.params, PROMPT + greedy_tokens[:3], N_NEW - 3, tiny_model.config.n_head)
    assert verdict.expected_tokens == greedy_tokens[:3] + continued
    assert verdict.diagnosis is not None and verdict.diagnosis.shape == "token-mismatch"
    assert verdict.diagnosis.hint == HINTS["token-mismatch"]


def test_the_path_after_a_student_token_is_the_students(tiny_model, greedy_tokens):
    """A first token chosen differently but within a generous near-tie: later steps are judged after it."""
    second_best = int(np.argsort(oracle.per_step_logits(tiny_model.params, PROMPT, [0], 2)[0])[-2])
    own_path = [second_best] + oracle.greedy(tiny_model.params, PROMPT + [second_best], N_NEW - 1, 2)
    verdict = verify_tokens(ran(), np.array(own_path), tiny_model, 1.0, HINTS)
    assert verdict.status == Status.PASS
    assert [s.verdict for s in verdict.steps][:1] == ["near-tie"]


def test_wrong_shape_is_a_failure_with_nothing_walked(tiny_model):
    verdict = verify_tokens(ran(), np.array([1, 2]), tiny_model, 1e-4, HINTS)
    assert (verdict.status, verdict.detail) == (Status.FAIL, "wrong-shape")
    assert verdict.message == f"expected {N_NEW} token ids (shape [{N_NEW}]), got shape [2]"
    assert verdict.steps == [] and verdict.got_tokens == []


def _verdicts(steps) -> list[tuple]:
    return [(s.step, s.position, s.got, s.expected, s.verdict) for s in steps]


def test_the_walk_through_the_oracle_cache_gives_the_same_verdicts(tiny_model, greedy_tokens):
    """The cache computes on its own BLAS threads (oracle/threads.py), so gaps may differ in float32's last bits;
    the verdicts may not."""
    cache = OracleCache(store=None)
    wrong = greedy_tokens[:3] + [(greedy_tokens[3] + 1) % 50257] + greedy_tokens[4:]
    plain = check_steps(tiny_model, PROMPT, wrong, 1e-4)
    cached = check_steps(tiny_model, PROMPT, wrong, 1e-4, cache)
    assert _verdicts(cached) == _verdicts(plain) and plain[-1].verdict == "mismatch"
    assert [s.gap for s in cached] == pytest.approx([s.gap for s in plain], rel=1e-5, abs=1e-5)
    assert check_steps(tiny_model, PROMPT, wrong, 1e-4, cache) == cached  # the memo, read back


def test_submissions_wrong_at_the_same_step_share_the_oracles_continuation(tiny_model, greedy_tokens, monkeypatch):
    """The expected column's tail after a mismatch is a full recompute per token: through the cache it is computed
    once per path, as every submission going wrong at the same step of the same path needs the same one."""
    calls = []
    greedy = oracle.greedy
    monkeypatch.setattr(oracle, "greedy", lambda *a: calls.append(a) or greedy(*a))
    cache = OracleCache(store=None)
    verdicts = []
    for shift in (1, 2):  # two different wrong tokens at step 3
        wrong = greedy_tokens[:2] + [(greedy_tokens[2] + shift) % 50257] + greedy_tokens[3:]
        verdicts.append(verify_tokens(ran(), np.array(wrong), tiny_model, 1e-4, HINTS, cache))
    plain = verify_tokens(ran(), np.array(wrong), tiny_model, 1e-4, HINTS)  # no cache: computed again
    assert len(calls) == 2
    assert verdicts[0].expected_tokens == verdicts[1].expected_tokens == plain.expected_tokens
    assert all(isinstance(t, int) for t in verdicts[1].expected_tokens)
