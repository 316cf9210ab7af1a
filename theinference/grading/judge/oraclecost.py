"""The cache proof's yardstick: its weights, and what the oracle's generation costs on this machine, measured now.

The proof runs on its own synthetic preset (proof_model) unless the graded weights let cost tell a cache from a
recompute; its lengths fit the context (fit_to_context). The oracle's costs are CPU seconds with one BLAS thread:
a full recompute of each length (recompute_seconds, test (b)'s floor), a single-token step (step_seconds), and from it
the least a token can cost with any cache (cost_floor).
"""

import dataclasses
import time

import numpy as np

from theinference.grading.spec.checks import ScalingCheck
from theinference.grading.spec.stages import StageSpec
from theinference.model import gpt2 as oracle
from theinference.model.weights import Model, load_model
from theinference.model.weights_choice import WeightsChoice, ensure_weights, synthetic_path

# The floor a token's cost cannot go below (cost_floor): a cached decode step still reads every weight once (every
# layer's matrices and the tied LM head), as the oracle's one-token step does, so no honest cache costs less than
# that step divided by FLOOR_SHARE. Measured side by side (bench/cost_floor.py --rounds 2, proof preset, a cgroup
# counting; the reference cache's cheapest call of 12 per token over the floor, each measured quiet (a machine shared
# with five other jobs) and beside two CPU burners per core, crossed):
#   floor quiet 1.19 ms (step 5.93 ms), loaded 1.67 ms; the cache's cheapest quiet 7.68 ms, loaded 9.00 ms
#   cache quiet / floor quiet 6.47, / floor loaded 4.60; cache loaded / floor quiet 7.58, / floor loaded 5.38
# The worst cross (a floor measured starved, a cache run once the machine is free) keeps 4.6x: a cache twice as fast
# as the reference's would still be 2.3x above the floor.
FLOOR_SHARE = 5.0
FLOAT32, FLOAT64 = "float32", "float64"  # the precision the oracle computes in: the weights', or a student's float64

# Transformer work per token (12 · n_layer · n_embd² MACs) at least this fraction of the LM head's
# (n_vocab · n_embd): below it the cost of a token is mostly the LM head, which a cache cannot save.
_SEPARATES = 0.25
PROOF_PRESET = "proof"


def separates(model: Model) -> bool:
    """Whether on these weights a cache's cost can be told from a recompute's (the layers are a fair part of a token)."""
    config = model.config
    return 12 * config.n_layer * config.n_embd >= _SEPARATES * config.n_vocab


def proof_check(stage: StageSpec) -> ScalingCheck:
    assert isinstance(stage.check, ScalingCheck), "cache-scaling stages only"
    return stage.check


def proof_model(stage: StageSpec, model: Model, cache, untrusted: bool = False) -> tuple[Model, str]:
    """The weights the stage runs on, and why: the proof preset, or the graded weights where asked and they separate.

    A proof preset found altered (a student's earlier plain `test`, or a submission graded without a sandbox, could
    write the cache) is made again, and why says so."""
    weights = proof_check(stage).params.weights
    if weights == "graded" and separates(model):
        return model, ""

    def load() -> Model:
        # Never through resolve_weights: a file named like the preset in the working directory would win there.
        choice = WeightsChoice(synthetic_path(PROOF_PRESET), "synthetic-preset", "cache-scaling", PROOF_PRESET)
        notices: list[str] = []
        ensure_weights(choice, untrusted=untrusted, notices=notices)
        made = load_model(choice.path)
        made.notices[:0] = notices
        return made

    proof = cache.memo(("proof-model",), load)
    remade = "".join(f"{notice}; " for notice in proof.notices)  # a synthetic preset's: only that it was made again
    if weights == "proof":
        why = (
            f"{remade}run on the synthetic '{PROOF_PRESET}' preset, the cache proof's own weights (its thresholds were "
            "measured there; a cache is a cache on any weights)"
        )
        return proof, why
    layers = 12 * model.config.n_layer * model.config.n_embd
    share = model.config.n_vocab / (layers + model.config.n_vocab)
    why = (
        f"{remade}run on the synthetic '{PROOF_PRESET}' preset: on the graded weights the LM head is {share:.0%} of a "
        "token's work, which a cache cannot save, so cost cannot tell a cache from a recompute there"
    )
    return proof, why


def fit_to_context(stage: StageSpec, n_ctx: int) -> StageSpec:
    """The stage with its lengths scaled down in proportion where a prompt would overflow n_ctx."""
    if not isinstance(stage.check, ScalingCheck):
        return stage
    spec = stage.check.params
    longest_prompt = max([spec.prompt_tokens, *(len(case.inputs["prompt"]) for case in stage.cases)])
    room = n_ctx - longest_prompt + 1
    if spec.lengths[-1] <= room:
        return stage
    factor = room / spec.lengths[-1]
    lengths = sorted({max(1, int(n * factor)) for n in spec.lengths})
    if len(lengths) < 2:
        return stage  # too little room to scale into: check_case_fits reports the overflow
    cases = tuple(dataclasses.replace(c, inputs={**c.inputs, "n_new": lengths[-1]}) for c in stage.cases)
    check = dataclasses.replace(stage.check, params=dataclasses.replace(spec, lengths=tuple(lengths)))
    return dataclasses.replace(stage, check=check, cases=cases)


def _single_thread_cpu(fn, repeats: int = 3) -> float:
    """The cheapest process CPU seconds of fn() over a few runs, BLAS held to one thread."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    best = float("inf")
    with threadpool_limits(limits=1):
        for _ in range(repeats):
            started = time.process_time()
            fn()
            best = min(best, time.process_time() - started)
    return best


def recompute_seconds(model: Model, prompt_tokens: int, n_new: int, dtype: str = "float32") -> float:
    """CPU seconds (one BLAS thread) for the oracle to generate n_new tokens by full recompute, measured now.

    Step k of a careful recompute runs every layer over prompt + k tokens and the LM head on the last row
    only. Its cost grows about linearly with length, so the n steps cost about n forwards at the middle
    length: that forward is timed and multiplied by n_new. dtype: the precision it computes in (_last_logits).
    """
    ids = [0] * (prompt_tokens + n_new // 2)
    return n_new * _single_thread_cpu(lambda: _last_logits(model, ids, dtype))


def step_seconds(model: Model, dtype: str = "float32") -> float:
    """CPU seconds (one BLAS thread) of one single-token forward here: about what a cached token costs."""
    return _single_thread_cpu(lambda: _last_logits(model, [0], dtype), repeats=5)


def _last_logits(model: Model, ids: list[int], dtype: str) -> np.ndarray:
    """The oracle's logits at the last position, in float32 (the weights'), or in float64 as a student's code computes
    once a float64 array enters it: the activations float64, the weights float32, so every matmul converts them (the
    oracle's float32 constants do not narrow a float64 array, under NumPy 1 and 2 alike)."""
    params, n_head = model.params, model.config.n_head
    if dtype == "float32":
        return oracle.logits(params, ids, n_head, rows=slice(len(ids) - 1, len(ids)))
    x = oracle.embed(params, ids).astype(np.float64)
    for block in params["h"]:
        x = oracle.transformer_block(x, **block, n_head=n_head)
    return oracle.lm_head(params, oracle.layer_norm(x[-1:], **params["ln_f"]))


def cost_floor(step: float) -> float:
    """The least CPU seconds a token can cost with any cache here, from the oracle's one-token step (step_seconds)."""
    return step / FLOOR_SHARE


@dataclasses.dataclass
class Costs:
    """What the oracle's costs are on this machine now, per stage run."""

    recompute: dict[int, float]  # n_new -> CPU seconds of a full recompute
    step: float
    dtype: str = (
        FLOAT32  # the precision the oracle computed in: the weights' (float32), or float64 (see scaling.DTYPE_PROBE)
    )


def oracle_costs(stage: StageSpec, model: Model, cache, dtype: str = FLOAT32) -> Costs:
    spec = proof_check(stage).params

    def measure() -> Costs:
        recompute = {n: recompute_seconds(model, spec.prompt_tokens, n, dtype) for n in spec.lengths}
        return Costs(recompute, step_seconds(model, dtype), dtype)

    # Kept for the session (watch, a batch) only: it is a timing of this machine, measured where it is used.
    key = ("scaling-costs", str(model.path), model.stamp, spec.prompt_tokens, spec.lengths, dtype)
    return cache.memo(key, measure)


# A flat cost stopped over (b) (too-slow) is judged again where the oracle's costs, measured again then, have grown by
# at least _DRIFT since they were first measured (a machine that got busier meanwhile: CPU seconds stretch under
# contention; the reference cache reached 32% of a recompute at load ~100 on 2 cores here, about 16% quiet), against
# them grown by at most _DRIFT_CAP: a careful recompute costs about 100% of the oracle's recompute, over twice (b)'s
# 35% even then.
_DRIFT, _DRIFT_CAP = 1.25, 2.0


def drifted_costs(stage: StageSpec, model: Model, costs: Costs) -> tuple[Costs, float] | None:
    """The oracle's costs as measured now, and how many times the first measurement's they are, where they have grown
    by _DRIFT or more since (capped at _DRIFT_CAP); None where they have not."""
    spec = proof_check(stage).params
    longest = spec.lengths[-1]
    now = recompute_seconds(model, spec.prompt_tokens, longest, costs.dtype)
    grown = min(now / costs.recompute[longest], _DRIFT_CAP) if costs.recompute[longest] > 0 else 0.0
    if grown < _DRIFT:
        return None
    recompute = {n: seconds * grown for n, seconds in costs.recompute.items()}
    return Costs(recompute, costs.step * grown, costs.dtype), grown


def measure_costs(stage: StageSpec, model: Model, cache, untrusted: bool = False) -> None:
    """Measure the oracle's costs for the stage now, kept in cache for its grading (as grade() will ask them).

    They are the grader process's CPU time (time.process_time): grading threads beside the measurement would add
    theirs and loosen (b)'s floor, so a batch measures them before any submission runs (Grader.warm)."""
    proof, _ = proof_model(stage, model, cache, untrusted)
    oracle_costs(fit_to_context(stage, proof.config.n_ctx), proof, cache)
