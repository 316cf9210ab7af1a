"""The screening shortcuts give the same answer as the full computation: the families' (theinference.grading.judge.families)
and the listed bugs' (theinference.grading.oracle.bugs)."""

import dataclasses
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from theinference.grading.oracle import bugs

from theinference.grading.judge import families
from theinference.grading.oracle.registry import resolve_oracle
from theinference.model import defective
from theinference.model import variant as model_variant
from theinference.model.variant import Variant

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
    # A screen computes fewer rows, whose float32 products round differently (1.4e-5 without the attention residual):
    # far inside a tenth of any stage's atol (1e-3), and far below what any wrong row is off by.
    np.testing.assert_allclose(one, whole[row, columns], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("row", [0, 2, 3, 5])
def test_a_decode_row_screened_alone_equals_that_row_of_the_whole_case(tiny_model, row):
    inputs = {"prompt": SEQ[:4], "cont": SEQ[4:]}
    variant = Variant(mask_block=1, positions=tuple(range(2, len(SEQ) + 1)))
    whole = families.variant_output(tiny_model, "per-step-logits", inputs, variant)
    one = families.variant_output(tiny_model, "per-step-logits", inputs, variant, row=row)
    np.testing.assert_allclose(one, whole[row], rtol=1e-5, atol=1e-5)


def test_a_stuck_counter_the_mask_reads_hides_the_keys_after_it(tiny_model):
    # Decode step i at wpe[len(prompt)], seeing keys 0..len(prompt): rows 0 and 1 (prefill's last, the first decode
    # step) are GPT-2's; every later row differs from the same stuck position with the mask counting the cache.
    inputs = {"prompt": SEQ[:4], "cont": SEQ[4:]}
    stuck = tuple(range(4)) + (4,) * (len(SEQ) - 5)
    counter = families.variant_output(
        tiny_model, "per-step-logits", inputs, Variant(positions=stuck, mask_counter=True)
    )
    cache = families.variant_output(tiny_model, "per-step-logits", inputs, Variant(positions=stuck))
    gpt2 = families.variant_output(tiny_model, "per-step-logits", inputs, Variant())
    np.testing.assert_array_equal(counter[:2], gpt2[:2])
    assert all(np.abs(counter[r] - cache[r]).max() > 1e-3 for r in range(2, len(counter)))
    for row in (2, 5):  # screened alone, as the whole case computes it
        one = families.variant_output(
            tiny_model, "per-step-logits", inputs, Variant(positions=stuck, mask_counter=True), row=row
        )
        np.testing.assert_allclose(one, counter[row], rtol=1e-5, atol=1e-5)


def test_float64_runs_the_layers_in_float64_and_its_float32_head_is_a_float64_heads_to_roundoff(tiny_model):
    params, n_head = tiny_model.params, tiny_model.config.n_head
    wide = model_variant.hidden_states(params, SEQ, n_head, Variant(), dtype=np.float64)
    assert wide.dtype == np.float64 and params["wte"]["weight"].dtype == np.float32  # no weight cast in place
    narrow = families.variant_output(tiny_model, "logits", {"seq": SEQ}, Variant())
    exact = families.variant_output(tiny_model, "logits", {"seq": SEQ}, Variant(), float64=True)
    head64 = wide @ params["wte"]["weight"].astype(np.float64).T
    np.testing.assert_allclose(exact, head64, rtol=0, atol=1e-5)
    assert np.abs(narrow - head64).max() > np.abs(exact - head64).max()  # the layers did run wider
    np.testing.assert_allclose(narrow, exact, rtol=1e-3, atol=1e-4)


def test_variants_screened_in_one_pass_equal_each_computed_alone(tiny_model):
    inputs, variants = {"prompt": SEQ[:4], "cont": SEQ[4:]}, list(VARIANTS.values())
    columns = np.arange(0, tiny_model.config.n_vocab, 97)
    together = families.variant_outputs(tiny_model, "per-step-logits", inputs, variants, row=3, columns=columns)
    for variant, out in zip(variants, together):
        alone = families.variant_output(tiny_model, "per-step-logits", inputs, variant, row=3, columns=columns)
        np.testing.assert_allclose(out, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_variants_that_differ_only_in_the_decode_steps_share_their_block_and_equal_each_computed_alone(tiny_model):
    # Each of these shares the prefill block with GPT-2 (computed once in the stack) or with one of the others.
    inputs = {"prompt": SEQ[:4], "cont": SEQ[4:]}
    stuck = tuple(range(4)) + (4,) * (len(SEQ) - 5)
    variants = [
        Variant(),
        Variant(scale_decode=1.0),
        Variant(positions=stuck, mask_counter=True),
        Variant(norms_decode=("ln_1", "ln_1", "ln_f")),
        Variant(mask_decode=-1),
        Variant(scale_block=0.1),
        Variant(scale_block=0.1, scale_decode=1.0),
        Variant(positions=tuple(range(1, len(SEQ))), norms_decode=("ln_2", "ln_2", "ln_f")),
        Variant(positions=tuple(range(1, len(SEQ)))),
    ]
    many = model_variant._Runs(tiny_model.params, [(SEQ[:-1], replace(v, prefill=4)) for v in variants], np.float32)
    assert len(many.x) == 9 * (len(SEQ) - 1) - 6 * 4  # three blocks for nine runs
    for row in (None, 2, 5):
        together = families.variant_outputs(tiny_model, "per-step-logits", inputs, variants, row=row)
        for variant, out in zip(variants, together):
            alone = families.variant_output(tiny_model, "per-step-logits", inputs, variant, row=row)
            np.testing.assert_allclose(out, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("oracle", ["logits", "layer0-attn-sublayer", "layer0-attn-last", "decode-step-logits"])
@pytest.mark.parametrize("float64", [False, True])
def test_cases_computed_in_one_pass_equal_each_computed_alone(tiny_model, oracle, float64):
    seqs = [SEQ[:1], SEQ[:6], SEQ]  # cases of different lengths, each with its own variant (positions per case)
    if oracle == "decode-step-logits":
        cases = [{"prompt": s[:-1] or s, "next_id": s[-1]} for s in seqs]
    else:
        cases = [{"seq": s} for s in seqs]
    runs = [(inputs, v) for inputs, v in zip(cases, [VARIANTS["mask-sees-next"], VARIANTS["scale"], Variant()])]
    runs.append((cases[2], Variant(positions=tuple(range(1, len(SEQ) + 1)))))
    together = list(families.case_outputs(tiny_model, oracle, runs, float64))
    assert len(together) == len(runs)
    for (inputs, variant), out in zip(runs, together):
        alone = families.variant_output(tiny_model, oracle, inputs, variant, float64=float64)
        assert out.shape == alone.shape
        np.testing.assert_allclose(out, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "oracle, inputs",
    [
        ("logits", {"seq": SEQ}),
        ("decode-step-logits", {"prompt": SEQ[:6], "next_id": SEQ[6]}),
        ("per-step-logits", {"prompt": SEQ[:4], "cont": SEQ[4:]}),
    ],
)
@pytest.mark.parametrize("row", [0, 3])
def test_listed_bugs_screened_in_one_pass_equal_each_screened_alone(tiny_model, oracle, inputs, row):
    spec = resolve_oracle(oracle, Path("."))
    listed = [b for b in bugs.BUILTIN_BUGS.values() if oracle in b.oracles]
    columns = np.arange(0, tiny_model.config.n_vocab, 97)
    together = bugs.bug_screens(listed, spec, oracle, tiny_model, inputs, row, columns)
    assert set(together) == {b.name for b in listed if b.defects is not None}  # the others are screened alone
    for bug in listed:
        if bug.defects is not None:
            alone = bugs.bug_screen(bug, spec, oracle, tiny_model, inputs, row, columns)
            assert alone is not None and together[bug.name].shape == alone.shape
            # float32 products over stacked rows round differently: far inside a tenth of any stage's atol (1e-3)
            np.testing.assert_allclose(together[bug.name], alone, rtol=1e-5, atol=1e-4)


@pytest.mark.slow
def test_one_run_of_the_stacked_defective_pass_is_hidden_states_to_the_bit(tiny_model):
    params, n_head = tiny_model.params, tiny_model.config.n_head
    for bug in bugs.BUILTIN_BUGS.values():
        if bug.defects is not None:
            defects = dataclasses.replace(bug.defects, prefill=4)
            (one,) = defective.hidden_states_many(params, [(SEQ, defects)], n_head)
            assert one.tobytes() == defective.hidden_states(params, SEQ, n_head, defects).tobytes(), bug.name


@pytest.mark.parametrize("name", [b.name for b in bugs.BUILTIN_BUGS.values() if "per-step-logits" in b.oracles])
@pytest.mark.parametrize("row", [0, 3, len(SEQ) - 5])
def test_a_listed_bug_screened_on_one_row_equals_that_row_of_its_whole_output(tiny_model, name, row):
    bug, spec = bugs.BUILTIN_BUGS[name], resolve_oracle("per-step-logits", Path("."))
    inputs, history = {"prompt": SEQ[:4], "cont": SEQ[4:]}, [{"prompt": SEQ[:2], "cont": SEQ[2:5]}]
    columns = np.arange(0, tiny_model.config.n_vocab, 97)
    whole = bugs.bug_output(bug, spec, "per-step-logits", tiny_model, inputs, history)
    one = bugs.bug_screen(bug, spec, "per-step-logits", tiny_model, inputs, row, columns, history)
    assert one is not None
    # A screen computes fewer rows, whose float32 products round differently (1.4e-5 without the attention residual):
    # far inside a tenth of any stage's atol (1e-3), and far below what any wrong row is off by.
    np.testing.assert_allclose(one, whole[row, columns], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "load, cores, limit",
    [(0.2, 2, None), (1.9, 2, None), (2.0, 2, 1), (9.0, 2, 1), (3.0, 8, None)],
)
def test_fingerprinting_uses_one_blas_thread_only_on_a_busy_machine(load, cores, limit):
    """bench/fingerprint_threads.py: one thread is slower on a quiet machine, twice as fast or more on a busy one."""
    from theinference.grading.drive.threads import busy_blas_limit

    assert busy_blas_limit(load, cores) == limit


def test_fingerprinting_on_a_busy_machine_runs_blas_on_one_thread(monkeypatch):
    from threadpoolctl import threadpool_info

    from theinference.grading.oracle import threads

    def blas() -> list[int]:
        return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]

    default = blas()
    if not default or max(default) == 1:
        pytest.skip("numpy runs BLAS on one thread here already: nothing to tell apart")
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0), raising=False)
    with threads.blas_threads_for_load():
        assert blas() == default  # quiet: numpy's default
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (100.0, 100.0, 100.0), raising=False)
    with threads.blas_threads_for_load():
        assert set(blas()) == {1}
    assert blas() == default
