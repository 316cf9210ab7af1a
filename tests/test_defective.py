"""model/defective.py is model/gpt2.py when no defect is set, to the bit, on the full and the cached path."""

import numpy as np
import pytest

from theinference.grading.oracle.registry import BUILTIN_ORACLES
from theinference.model import defective
from theinference.model import gpt2
from theinference.model.defective import Defects

IDS = [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 198, 50256]


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_logits_are_bit_identical_at_every_row_with_no_defect(tiny_model):
    params, n_head = tiny_model.params, tiny_model.config.n_head
    expected = gpt2.logits(params, IDS, n_head)
    assert _same_bits(defective.logits(params, IDS, n_head, Defects()), expected)
    assert _same_bits(defective.hidden_states(params, IDS, n_head, Defects()), gpt2.hidden_states(params, IDS, n_head))


@pytest.mark.parametrize("prefill", [0, 1, 5, len(IDS) - 1, len(IDS)])
def test_the_cached_path_is_bit_identical_with_no_defect(tiny_model, prefill):
    """A prefill block, then one single-query decode step per row: exactly GPT-2 when nothing is wrong."""
    params, n_head, exact = tiny_model.params, tiny_model.config.n_head, Defects(prefill=prefill)
    assert _same_bits(defective.logits(params, IDS, n_head, exact), gpt2.logits(params, IDS, n_head))
    assert _same_bits(
        defective.layer0_attn_sublayer(params, IDS, n_head, exact), gpt2.layer0_attn_sublayer(params, IDS, n_head)
    )
    prompt = IDS[: max(prefill, 1)]  # the prompt is the prefill block; every later token one decode step
    cont = IDS[len(prompt) :]
    assert _same_bits(
        defective.per_step_logits(params, prompt, cont, n_head, exact),
        gpt2.per_step_logits(params, prompt, cont, n_head),
    )


INPUTS = {
    "layer0-attn-last": {"seq": IDS},
    "layer0-attn-sublayer": {"seq": IDS},
    "logits": {"seq": IDS},
    "decode-step-logits": {"prompt": IDS[:-1], "next_id": IDS[-1]},
    "per-step-logits": {"prompt": IDS[:4], "cont": IDS[4:]},
}


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_every_built_in_oracle_with_no_defect_is_the_oracle(tiny_model, name):
    """What fingerprinting computes for a bug that changes nothing is the oracle itself, on the stage's schedule."""
    spec, inputs = BUILTIN_ORACLES[name], INPUTS[name]
    assert spec.defective is not None
    exact = Defects(prefill=spec.prefill(inputs))
    assert _same_bits(spec.defective(tiny_model, exact, **inputs), spec.compute(tiny_model, **inputs))


def test_a_decode_defect_changes_only_the_decode_rows(tiny_model):
    params, n_head = tiny_model.params, tiny_model.config.n_head
    bug = defective.logits(params, IDS, n_head, Defects(prefill=5, scale_decode=False))
    exact = gpt2.logits(params, IDS, n_head)
    assert _same_bits(bug[:5], exact[:5])
    assert not np.allclose(bug[5:], exact[5:], atol=1e-3)
