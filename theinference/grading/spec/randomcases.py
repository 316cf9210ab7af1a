"""Randomised extra cases (--seed): random token ids of random lengths within the model's context,
so an adapter that hard-codes the fixed cases' answers fails."""

import dataclasses
import random

from theinference.grading.spec.inputs import COUNT_INPUTS, ID_INPUTS
from theinference.grading.spec.checks import ScalingCheck
from theinference.grading.spec.stages import CaseSpec, StageSpec
from theinference.model.weights import GPT2Config

EXTRA_CASES = 2
MAX_TOKENS = 40  # random sequences stay short: the point is unpredictability, not length


def resolve_seed(seed: str | None) -> int | None:
    """--seed N -> N; --seed random -> a fresh seed (recorded in the results); none -> None."""
    if seed is None:
        return None
    if seed == "random":
        return random.SystemRandom().randrange(2**31)
    return int(seed)


def _random_case(rng: random.Random, stage: StageSpec, config: GPT2Config, index: int) -> CaseSpec:
    budget = min(config.n_ctx, MAX_TOKENS)
    inputs: dict[str, int | list[int]] = {}
    for name in stage.inputs:
        if name in COUNT_INPUTS:
            inputs[name] = rng.randint(1, budget // 2)
        elif name in ID_INPUTS:
            inputs[name] = rng.randrange(config.n_vocab)
        else:
            inputs[name] = [rng.randrange(config.n_vocab) for _ in range(rng.randint(1, budget // 2))]
    return CaseSpec(name=f"random-{index}", inputs=inputs)


def with_random_cases(stage: StageSpec, seed: int, config: GPT2Config) -> StageSpec:
    """The stage with EXTRA_CASES generated cases appended (deterministic per seed and stage)."""
    if isinstance(
        stage.check, ScalingCheck
    ):  # its lengths are the instructor's tuned choice, and timing them is costly
        return stage
    rng = random.Random(f"{seed}:{stage.id}")
    extra = tuple(_random_case(rng, stage, config, i + 1) for i in range(EXTRA_CASES))
    return dataclasses.replace(stage, cases=stage.cases + extra)
