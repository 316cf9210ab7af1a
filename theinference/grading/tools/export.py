"""The oracle's inputs and expected arrays for a stage's cases, for debugging against exact numbers."""

import json

import numpy as np

from theinference.model import gpt2 as oracle
from theinference.grading.oracle.registry import compute_expected, resolve_oracle
from theinference.grading.spec.stages import CaseSpec, StageSpec
from theinference.model.weights import Model


def block_outputs(model: Model, name: str, seq: list[int]) -> dict[str, np.ndarray]:
    """Every block's residual stream for one sequence: '<name>.embed' (wte + wpe), '<name>.block<i>.attn'
    (after block i's attention sublayer) and '<name>.block<i>.mlp' (after its MLP), each [n, n_embd]."""
    params, n_head = model.params, model.config.n_head
    x = oracle.embed(params, seq)
    arrays = {f"{name}.embed": x}
    for i, block in enumerate(params["h"]):
        x = x + oracle.mha(oracle.layer_norm(x, **block["ln_1"]), **block["attn"], n_head=n_head)
        arrays[f"{name}.block{i}.attn"] = x
        x = x + oracle.ffn(oracle.layer_norm(x, **block["ln_2"]), **block["mlp"])
        arrays[f"{name}.block{i}.mlp"] = x
    arrays[f"{name}.ln_f"] = oracle.layer_norm(x, **params["ln_f"])
    return arrays


def oracle_arrays(stage: StageSpec, model: Model, cases: list[CaseSpec]) -> dict[str, np.ndarray]:
    """Arrays keyed '<case>.<input>', '<case>.expected' (for forward also every block's output: block_outputs;
    for the token stages, greedy and cache-scaling, '<case>.logits'), plus 'meta'."""
    spec = resolve_oracle(stage.oracle, stage.source)
    arrays = {}
    for case in cases:
        for name, value in case.inputs.items():
            arrays[f"{case.name}.{name}"] = np.asarray(value)
        expected = compute_expected(spec, model, case.inputs, f"stage '{stage.id}'", case.name)
        arrays[f"{case.name}.expected"] = expected
        if stage.oracle == "logits":  # what "compare layer by layer" needs
            arrays.update(block_outputs(model, case.name, case.inputs["seq"]))
        if stage.checks_tokens:  # the logits each greedy choice was made from
            arrays[f"{case.name}.logits"] = oracle.per_step_logits(
                model.params, case.inputs["prompt"], list(expected), model.config.n_head
            )
    meta = {
        "stage": stage.id,
        "weights": str(model.path),
        **stage.tolerance,  # token stages are checked with a near-tie tolerance, not atol/rtol
        "cases": [c.name for c in cases],
        "adapter": stage.adapter,
    }
    arrays["meta"] = np.asarray(json.dumps(meta))
    return arrays
