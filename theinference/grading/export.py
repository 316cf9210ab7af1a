"""The oracle's inputs and expected arrays for a stage's cases, for debugging against exact numbers."""

import json

import numpy as np

from theinference.model import gpt2 as oracle
from theinference.grading.oracle_registry import compute_expected, resolve_oracle
from theinference.grading.stages import CaseSpec, StageSpec
from theinference.model.weights import Model


def oracle_arrays(stage: StageSpec, model: Model, cases: list[CaseSpec]) -> dict[str, np.ndarray]:
    """Arrays keyed '<case>.<input>', '<case>.expected' (and for greedy '<case>.logits'), plus 'meta'."""
    spec = resolve_oracle(stage.oracle, stage.source)
    arrays = {}
    for case in cases:
        for name, value in case.inputs.items():
            arrays[f"{case.name}.{name}"] = np.asarray(value)
        expected = compute_expected(spec, model, case.inputs, f"stage '{stage.id}'", case.name)
        arrays[f"{case.name}.expected"] = expected
        if stage.compare == "tokens":  # the logits each greedy choice was made from
            arrays[f"{case.name}.logits"] = oracle.per_step_logits(
                model.params, case.inputs["prompt"], list(expected), model.config.n_head
            )
    meta = {
        "stage": stage.id,
        "weights": str(model.path),
        "atol": stage.atol,
        "rtol": stage.rtol,
        "cases": [c.name for c in cases],
        "adapter": stage.adapter,
    }
    arrays["meta"] = np.asarray(json.dumps(meta))
    return arrays
