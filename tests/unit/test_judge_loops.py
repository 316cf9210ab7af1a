"""judge/loops.py: a greedy failure matched exactly against a generation loop with a known mistake.

Each mistaken loop is written out here by full recompute (model/gpt2.py's logits over what that loop feeds),
independently of loops.py's one teacher-forced pass, and its tokens must be named as that mistake and no other.
"""

import numpy as np
import pytest

from theinference.grading.judge import loops
from theinference.model import gpt2

PROMPT, N_NEW, TIE = [464, 2068, 7586], 4, 1e-4


def _last_logits(model, ids: list[int]) -> np.ndarray:
    return gpt2.logits(model.params, ids, model.config.n_head, rows=slice(len(ids) - 1, len(ids)))[0]


def run_loop(model, fed_rule, rank: int = 0, n_new: int = N_NEW) -> list[int]:
    """A greedy loop by full recompute: each step the rank-th best token after the prompt and what fed_rule feeds."""
    tokens: list[int] = []
    for _ in range(n_new):
        fed = fed_rule(PROMPT, tokens)
        tokens.append(int(np.argsort(_last_logits(model, PROMPT + fed))[::-1][rank]))
    return tokens


RIGHT = lambda p, t: t  # noqa: E731 - feeds back each token it chose
MISTAKES = {
    "feeds back the prompt's last token": lambda p, t: [p[-1]] * len(t),
    "feeds back the first generated token": lambda p, t: t[:1] * len(t),
    "one step behind": lambda p, t: ([p[-1]] + t)[: len(t)],
}


@pytest.fixture(scope="module")
def bugs(tiny_model):
    return loops.loop_bugs(tiny_model)


@pytest.fixture(scope="module")
def right(tiny_model) -> list[int]:
    return run_loop(tiny_model, RIGHT)


def named(bugs, model, tokens, n_new: int = N_NEW) -> list[tuple[str, str, str]]:
    """(bug, finding, fitted) of every modelled mistake that reproduces tokens."""
    found = []
    for bug in bugs:
        fitted = loops.reproduces(bug, model, PROMPT, n_new, tokens, TIE)
        if fitted is not None:
            found.append((bug.name, bug.finding, fitted))
    return found


def test_the_right_loop_is_the_oracles_greedy(tiny_model, right):
    assert right == gpt2.greedy(tiny_model.params, PROMPT, N_NEW, tiny_model.config.n_head)


FAMILIES = ["greedy-fed-token", "greedy-position", "greedy-runner-up", "greedy-one-short", "greedy-prefill-first-row"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_right_loop_matches_no_mistake(bugs, tiny_model, right, family):
    assert named([b for b in bugs if b.name == family], tiny_model, right) == []


def test_the_right_loop_is_a_stop_at_endoftext_that_never_met_one(bugs, tiny_model, right):
    """The one mistake a right loop cannot be told from (greedy is fingerprinted only once it failed)."""
    assert {b.name for b in bugs} == {*FAMILIES, "greedy-stops-at-eot"}
    eot = [b for b in bugs if b.name == "greedy-stops-at-eot"]
    assert [name for name, _, _ in named(eot, tiny_model, right)] == ["greedy-stops-at-eot"]


@pytest.mark.parametrize("finding", MISTAKES)
def test_a_loop_feeding_back_the_wrong_token_is_named_and_not_another(bugs, tiny_model, finding):
    tokens = run_loop(tiny_model, MISTAKES[finding])
    fed_bugs = [b for b in bugs if b.name == "greedy-fed-token"]
    assert [text for _, text, _ in named(fed_bugs, tiny_model, tokens)] == [
        next(b.finding for b in fed_bugs if finding in b.finding)
    ]


def test_the_runner_up_at_every_step_is_named(bugs, tiny_model):
    tokens = run_loop(tiny_model, RIGHT, rank=1)
    every = [b for b in bugs if b.choice == "runner-up"]
    assert named(every, tiny_model, tokens) == [
        ("greedy-runner-up", "picks the runner-up token instead of the argmax at every step", "")
    ]


def test_the_runner_up_once_is_named_with_its_step(bugs, tiny_model, right):
    tokens = right[:2]
    second = int(np.argsort(_last_logits(tiny_model, PROMPT + tokens))[::-1][1])
    tokens = tokens + [second]
    tokens += run_loop(tiny_model, lambda p, t: tokens + t, n_new=N_NEW - 3)  # the right loop after it
    assert len(tokens) == N_NEW
    once = [b for b in bugs if b.choice == "runner-up-once"]
    assert named(once, tiny_model, tokens) == [
        ("greedy-runner-up", "picks the runner-up token instead of the argmax at one step", "step 3")
    ]
    assert named(once, tiny_model, right) == []  # no step off: not "once"


def test_one_token_short_is_named(bugs, tiny_model, right):
    found = named(bugs, tiny_model, right[:-1])
    assert [name for name, _, _ in found] == ["greedy-one-short"]


def test_lengths_no_loop_returns_are_never_matched(bugs, tiny_model, right):
    assert named(bugs, tiny_model, []) == []
    assert named(bugs, tiny_model, right + right[:1]) == []  # more than n_new: not even a stop at <|endoftext|>


def test_a_stop_at_endoftext_needs_endoftext_chosen(bugs, tiny_model, right):
    """Tokens cut short are a stop at <|endoftext|> only if the loop would have chosen it next."""
    eot = next(b for b in bugs if b.name == "greedy-stops-at-eot")
    assert loops.reproduces(eot, tiny_model, PROMPT, N_NEW, right[:2], TIE) is None  # the oracle's next is not eot
    assert loops.reproduces(eot, tiny_model, PROMPT, N_NEW, right, TIE) == ""  # never met it: all n_new
    with_eot_inside = [right[0], loops.ENDOFTEXT_ID, *right[2:]]
    assert loops.reproduces(eot, tiny_model, PROMPT, N_NEW, with_eot_inside, TIE) is None


def test_every_position_candidate_is_a_distinct_finding(bugs):
    positions = [b.finding for b in bugs if b.name == "greedy-position"]
    assert len(positions) == len(set(positions)) > 5
    assert not any("len(prompt) + i instead of len(prompt) + i" in text for text in positions)  # the right loop
    assert any("n_layer (2)" in text for text in positions)  # the model's own n_layer in the words
