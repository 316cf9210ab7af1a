"""The families' screening shortcuts give the same answer as the full computation (theinference.grading.families)."""

import numpy as np
import pytest

from theinference.grading import families
from theinference.model.variant import Float64Params, Variant

SEQ = [464, 3139, 286, 4881, 318, 6342, 11, 290, 262, 3139]
VARIANTS = {
    "gpt2": Variant(),
    "mask-sees-next": Variant(mask_block=1),
    "mask-sees-itself-not": Variant(mask_block=-1),
    "mask-sees-itself-not-unmasked": Variant(mask_block=-1, empty_rows="unmasked"),
    "no-mask": Variant(mask_block=None),
    "positions-from-one": Variant(positions=tuple(range(1, len(SEQ) + 1))),
    "scale": Variant(scale_block=0.1, scale_decode=0.1),
}


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("row", [0, 3, len(SEQ) - 1])
def test_one_row_screened_over_the_positions_it_depends_on_equals_that_row_of_the_whole_case(tiny_model, name, row):
    variant, inputs = VARIANTS[name], {"seq": SEQ}
    whole = families.variant_output(tiny_model, "logits", inputs, variant)
    columns = np.arange(0, tiny_model.config.n_vocab, 97)
    one = families.variant_output(tiny_model, "logits", inputs, variant, row=row, columns=columns)
    np.testing.assert_allclose(one, whole[row, columns], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("row", [0, 2, 3, 5])
def test_a_decode_row_screened_alone_equals_that_row_of_the_whole_case(tiny_model, row):
    inputs = {"prompt": SEQ[:4], "cont": SEQ[4:]}
    variant = Variant(mask_block=1, positions=tuple(range(2, len(SEQ) + 1)))
    whole = families.variant_output(tiny_model, "per-step-logits", inputs, variant)
    one = families.variant_output(tiny_model, "per-step-logits", inputs, variant, row=row)
    np.testing.assert_allclose(one, whole[row], rtol=1e-5, atol=1e-5)


def test_float64_params_are_the_same_weights_read_wider(tiny_model):
    wide = Float64Params(tiny_model.params)
    assert wide["h"][1]["ln_2"]["weight"].dtype == np.float64
    np.testing.assert_array_equal(wide["h"][1]["ln_2"]["weight"], tiny_model.params["h"][1]["ln_2"]["weight"])
    narrow = families.variant_output(tiny_model, "logits", {"seq": SEQ}, Variant())
    exact = families.variant_output(tiny_model, "logits", {"seq": SEQ}, Variant(), float64=True)
    assert narrow.dtype == np.float32 and exact.dtype == np.float64
    np.testing.assert_allclose(narrow, exact, rtol=1e-3, atol=1e-4)
