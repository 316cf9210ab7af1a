"""judge/families.py: families of mistakes whose parameter is fitted, each candidate a variant of GPT-2.

What a finding rests on: with no mistake, a variant's output is the oracle's; a screen of one row is that row of
the whole output; a family's candidates are the mistakes its words say; a fitted scale is the one used.
"""

import math

import numpy as np
import pytest

from theinference.grading.judge import families
from theinference.model import gpt2
from theinference.model.variant import Variant

INPUTS = {
    "logits": {"seq": [464, 2068, 7586, 21831]},
    "layer0-attn-sublayer": {"seq": [464, 2068, 7586, 21831]},
    "layer0-attn-last": {"seq": [464, 2068, 7586, 21831]},
    "decode-step-logits": {"prompt": [464, 2068, 7586], "next_id": 21831},
    "per-step-logits": {"prompt": [464, 2068], "cont": [7586, 21831, 318]},
}


def oracle_output(model, name: str, inputs: dict) -> np.ndarray:
    """What the built-in oracle of that name computes (model/gpt2.py), for comparison."""
    p, n_head = model.params, model.config.n_head
    if name == "logits":
        return gpt2.logits(p, inputs["seq"], n_head)
    if name == "layer0-attn-sublayer":
        return gpt2.layer0_attn_sublayer(p, inputs["seq"], n_head)
    if name == "layer0-attn-last":
        return gpt2.layer0_attn_sublayer(p, inputs["seq"], n_head)[-1]
    if name == "decode-step-logits":
        return gpt2.logits(p, [*inputs["prompt"], inputs["next_id"]], n_head)[-1]
    return gpt2.per_step_logits(p, inputs["prompt"], inputs["cont"], n_head)


def test_every_built_in_schedule_is_supported():
    assert set(families.SUPPORTED) == set(INPUTS)


@pytest.mark.parametrize("name", INPUTS)
def test_no_mistake_is_the_oracle(tiny_model, name):
    got = families.variant_output(tiny_model, name, INPUTS[name], Variant())
    expected = oracle_output(tiny_model, name, INPUTS[name])
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["logits", "per-step-logits", "layer0-attn-sublayer"])
def test_a_screen_of_one_row_is_that_row_of_the_whole(tiny_model, name):
    mistake = Variant(scale_block=1.0, scale_decode=1.0)
    whole = families.variant_output(tiny_model, name, INPUTS[name], mistake)
    for row in range(len(whole)):
        one = families.variant_output(tiny_model, name, INPUTS[name], mistake, row=row)
        np.testing.assert_allclose(one, whole[row], atol=2e-4, rtol=1e-4)


def test_case_outputs_are_each_cases_whole_output(tiny_model):
    name = "decode-step-logits"
    cases = [INPUTS[name], {"prompt": [318, 257], "next_id": 1110}]
    runs = [(inputs, Variant(n_head=1)) for inputs in cases]
    outs = list(families.case_outputs(tiny_model, name, runs))
    for (inputs, variant), out in zip(runs, outs):
        np.testing.assert_allclose(out, families.variant_output(tiny_model, name, inputs, variant), atol=2e-4)


def test_a_mistake_changes_the_output(tiny_model):
    name, inputs = "per-step-logits", INPUTS["per-step-logits"]
    right = families.variant_output(tiny_model, name, inputs, Variant())
    for candidate in families.candidates(tiny_model, name)[:: max(1, len(families.candidates(tiny_model, name)) // 8)]:
        out = families.variant_output(tiny_model, name, inputs, candidate.make(inputs))
        assert np.max(np.abs(out - right)) > 1e-3, candidate.finding


def test_scale_formulas_start_with_the_right_one_and_are_distinct(tiny_model):
    formulas = families.scale_formulas(tiny_model)  # tiny: n_embd 128, n_head 2, head_dim 64
    assert formulas[0] == ("1/sqrt(head_dim)", 1 / 8)
    values = [v for _, v in formulas]
    assert len(values) == len(set(values))
    # 1/head_dim = 1/64 and 1/sqrt(n_head)... are kept; a value equal to an earlier one is not repeated
    assert "1/n_head" in dict(formulas) and dict(formulas)["1/n_head"] == 0.5


def test_describe_scale_names_a_formula_or_says_none(tiny_model):
    assert families.describe_scale(tiny_model, 1 / math.sqrt(128)) == "c = 0.08839 = 1/sqrt(n_embd)"
    assert families.describe_scale(tiny_model, 0.3) == (
        "c = 0.3 (none of 1/sqrt(head_dim), 1/sqrt(n_embd), 1/n_head, 1/head_dim, 1)"
    )


def test_the_scale_candidates_never_propose_the_right_scale(tiny_model):
    texts = [c.finding for c in families.scale_candidates(tiny_model, "per-step-logits")]
    assert texts and not any("c = 0.125 = 1/sqrt(head_dim) instead" in t for t in texts)
    assert any("on the single-query decode steps' scores" in t for t in texts)
    logits_only = [c.finding for c in families.scale_candidates(tiny_model, "logits")]
    assert not any("decode steps" in t for t in logits_only)  # a whole-sequence forward has no decode steps


def test_fit_scale_recovers_a_scale_no_formula_gives(tiny_model):
    name, inputs = "layer0-attn-sublayer", INPUTS["layer0-attn-sublayer"]  # no LM head: a cheap fit
    mistake = Variant(scale_block=0.3, scale_decode=0.3)
    got = families.variant_output(tiny_model, name, inputs, mistake).astype(np.float64)
    (found,) = families.fit_scale(tiny_model, name, inputs, got, enough=1e-4)
    assert found.family == "attention-scale" and "c = 0.3 (none of" in found.finding
    refit = families.variant_output(tiny_model, name, inputs, found.make(inputs))
    assert np.max(np.abs(refit - got)) < 1e-3


def test_fit_scale_claims_nothing_when_the_scale_is_right(tiny_model):
    name, inputs = "layer0-attn-sublayer", INPUTS["layer0-attn-sublayer"]
    got = families.variant_output(tiny_model, name, inputs, Variant()).astype(np.float64)
    assert list(families.fit_scale(tiny_model, name, inputs, got, enough=1e-4)) == []


def test_head_counts_are_only_those_that_divide_n_embd_and_differ(tiny_model):
    texts = [c.finding for c in families.head_candidates(tiny_model, "logits")]
    counts = [int(t.split()[0]) for t in texts]
    assert 2 not in counts and all(128 % n == 0 for n in counts)
    assert "1 attention heads instead of n_head = 2 (head_dim 128 instead of 64)" in texts


def test_layer0_outputs_get_no_ln_1_or_decode_only_position_mistakes(tiny_model):
    """A layer-0 sublayer output reads only ln_1, and its block has no other positions to confuse."""
    norms = [c.finding for c in families.norm_candidates(tiny_model, "layer0-attn-sublayer")]
    assert norms and all("'s parameters in ln_1" in t for t in norms)
    positions = [c.finding for c in families.position_candidates(tiny_model, "layer0-attn-sublayer")]
    assert not any("the block's position i embedded" in t for t in positions)


def test_position_candidates_make_the_positions_their_words_say(tiny_model):
    name, inputs = "per-step-logits", INPUTS["per-step-logits"]  # prefill 2, then 2 decode rows
    made = {c.finding: c.make(inputs).positions for c in families.position_candidates(tiny_model, name)}
    stuck = next(t for t in made if t.startswith("decode step i embedded at wpe[len(prompt)] instead"))
    assert made[stuck] == (0, 1, 2, 2)
    off = next(t for t in made if t.startswith("decode step i embedded at wpe[len(prompt) + i + 1]"))
    assert made[off] == (0, 1, 3, 4)
    block = next(t for t in made if t == "the block's position i embedded at wpe[i + 1]")
    assert made[block] == (1, 2, 2, 3)


def test_stuck_counters_only_where_a_counter_stands_over_several_steps(tiny_model):
    assert list(families.stuck_candidates(tiny_model, "decode-step-logits")) == []
    stuck = list(families.stuck_candidates(tiny_model, "per-step-logits"))
    assert len(stuck) == 4 and all(c.make(INPUTS["per-step-logits"]).mask_counter for c in stuck)


def test_screen_positions_counts_the_rows_a_screen_computes():
    assert families.screen_positions("per-step-logits", INPUTS["per-step-logits"], 1) == 3  # prompt[-1] row + 1
    assert families.screen_positions("per-step-logits", INPUTS["per-step-logits"], None) == 0
    assert families.screen_positions("decode-step-logits", INPUTS["decode-step-logits"], 0) == 0
    assert families.screen_positions("an-instructors-oracle", {}, 0) == 0


def test_an_oracle_the_families_cannot_compute_has_no_candidates(tiny_model):
    assert families.candidates(tiny_model, "my_oracles.py:forward") == []
    assert len(families.candidates(tiny_model, "per-step-logits")) > 50
