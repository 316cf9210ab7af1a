"""spec/randomcases.py: the --seed extra cases, unpredictable to an adapter but the same for the same seed."""

import pytest

from theinference.grading.spec.inputs import positions_needed
from theinference.grading.spec.randomcases import EXTRA_CASES, MAX_TOKENS, resolve_seed, with_random_cases
from theinference.model.weights import GPT2Config

from .builders import SCALING, TOKENS, stage_spec

CONFIG = GPT2Config(n_vocab=50257, n_ctx=256, n_embd=128, n_head=2, n_layer=2)
KINDS = [
    stage_spec("forward", inputs=("seq",)),
    stage_spec("per-step-identity", inputs=("prompt", "cont")),
    stage_spec("decode-step", inputs=("prompt", "next_id")),
    stage_spec("greedy", inputs=("prompt", "n_new"), check=TOKENS),
]


def test_seed_words():
    assert resolve_seed(None) is None
    assert resolve_seed("42") == 42
    fresh = {resolve_seed("random") for _ in range(5)}
    assert all(isinstance(s, int) and 0 <= s < 2**31 for s in fresh) and len(fresh) > 1
    with pytest.raises(ValueError):
        resolve_seed("forty-two")


@pytest.mark.parametrize("spec", KINDS, ids=lambda s: s.id)
def test_extra_cases_are_appended_after_the_stages_own(spec):
    extended = with_random_cases(spec, 1234, CONFIG)
    assert extended.cases[: len(spec.cases)] == spec.cases
    assert [c.name for c in extended.cases[len(spec.cases) :]] == [f"random-{i + 1}" for i in range(EXTRA_CASES)]


@pytest.mark.parametrize("spec", KINDS, ids=lambda s: s.id)
def test_the_same_seed_and_stage_give_the_same_cases(spec):
    assert with_random_cases(spec, 1234, CONFIG) == with_random_cases(spec, 1234, CONFIG)


def test_another_seed_or_another_stage_gives_other_cases():
    spec = KINDS[0]
    first = with_random_cases(spec, 1, CONFIG).cases[-EXTRA_CASES:]
    assert with_random_cases(spec, 2, CONFIG).cases[-EXTRA_CASES:] != first
    renamed = with_random_cases(stage_spec("forward-again"), 1, CONFIG).cases[-EXTRA_CASES:]
    assert [c.inputs for c in renamed] != [c.inputs for c in first]


@pytest.mark.parametrize("spec", KINDS, ids=lambda s: s.id)
def test_random_inputs_are_valid_for_the_model(spec):
    """Every input the stage names, token ids in the vocabulary, counts >= 1, and within the context."""
    small = GPT2Config(n_vocab=300, n_ctx=16, n_embd=8, n_head=2, n_layer=1)
    for seed in range(30):
        for extra in with_random_cases(spec, seed, small).cases[-EXTRA_CASES:]:
            assert set(extra.inputs) == set(spec.inputs)
            for name, value in extra.inputs.items():
                if name == "n_new":
                    assert value >= 1
                else:
                    ids = value if isinstance(value, list) else [value]
                    assert ids and all(0 <= t < small.n_vocab for t in ids)
            assert positions_needed(extra.inputs) <= min(small.n_ctx, MAX_TOKENS)


def test_sequences_stay_short_on_a_long_context():
    longest = max(
        len(c.inputs["seq"]) for seed in range(50) for c in with_random_cases(KINDS[0], seed, CONFIG).cases[1:]
    )
    assert longest <= MAX_TOKENS // 2


def test_the_cache_proof_gets_no_random_cases():
    cost = stage_spec("cache-scaling", inputs=("n_new",), check=SCALING)
    assert with_random_cases(cost, 1, CONFIG) is cost
