"""The cache-scaling verdict: does the cost of a token stay flat as its position grows?

The timings come from the student's process (theinference.proc.timing); here they become a
ScalingResult and a pass, or a "no-cache" failure stated in numbers.
"""

import dataclasses
import platform

from theinference.model import gpt2 as oracle
from theinference.proc import timing
from theinference.grading.oracle_store import oracle_version
from theinference.grading.results import CaseResult, Diagnosis, ScalingResult
from theinference.grading.stages import StageSpec
from theinference.model.weights import Model

_NO_CACHE = (
    "the cost of a token grows with its position, as it does when every step recomputes the "
    "whole sequence. With a cache, token k costs about the same as token 1."
)


def fit_to_context(stage: StageSpec, n_ctx: int) -> StageSpec:
    """The stage with its lengths scaled down in proportion where a case would overflow n_ctx."""
    spec = stage.scaling
    if spec is None:
        return stage
    room = min(n_ctx - len(case.inputs["prompt"]) + 1 for case in stage.cases)
    if spec.lengths[-1] <= room:
        return stage
    factor = room / spec.lengths[-1]
    lengths = sorted({max(1, int(n * factor)) for n in spec.lengths})
    if len(lengths) < 2:
        return stage  # too little room to scale into: check_case_fits reports the overflow
    cases = tuple(dataclasses.replace(c, inputs={**c.inputs, "n_new": lengths[-1]}) for c in stage.cases)
    return dataclasses.replace(stage, scaling=dataclasses.replace(spec, lengths=tuple(lengths)), cases=cases)


def job_scaling(stage: StageSpec) -> dict | None:
    """What the student's process needs to time each call (None for other stages)."""
    if stage.scaling is None:
        return None
    return {"lengths": list(stage.scaling.lengths), "repeats": stage.scaling.repeats}


def recompute_seconds(cache, model: Model, prompt: list[int], n_new: int) -> float:
    """Estimated CPU seconds (one BLAS thread) for the oracle to generate n_new tokens by full recompute.

    A recompute's step k runs a forward over prompt + k tokens; its cost grows about linearly
    with length, so the n steps cost about n forwards of the middle length. One such forward is
    timed (not all n of them, which takes minutes on the gpt2 shape) and multiplied by n_new.
    """

    def estimate() -> float:
        middle = [*prompt, *([prompt[-1]] * (n_new // 2))]
        _, seconds = timing.single_thread_cpu(
            lambda: oracle.logits(model.params, middle, model.config.n_head, rows=slice(len(middle) - 1, len(middle)))
        )
        return seconds * n_new

    # Kept across runs like an oracle output (it only informs the report), but per machine: it is a timing.
    host = ("recompute-estimate", platform.node(), platform.machine(), oracle_version(()), prompt, n_new)
    return float(
        cache.memo(
            ("recompute-estimate", str(model.path), model.stamp, tuple(prompt), n_new),
            estimate,
            model=model,
            durable=host,
        )
    )


def judge_timing(result: CaseResult, stage: StageSpec, timing: dict, oracle_seconds: float | None) -> None:
    """Given right tokens and the timings: pass, or fail as no-cache with the growth in numbers."""
    spec = stage.scaling
    assert spec is not None, "called for cache-scaling stages only"
    blas = [pool["threads"] for pool in timing.get("blas", [])]
    result.scaling = ScalingResult(
        lengths=spec.lengths,
        seconds=tuple(timing["seconds"]),
        max_ratio=spec.max_ratio,
        blas_threads=max(blas, default=1),
        oracle_seconds=oracle_seconds,
    )
    ratio = result.scaling.ratio
    if ratio <= spec.max_ratio:
        result.status = "pass"
        return
    first, last = spec.lengths[0], spec.lengths[-1]
    result.status = "fail"
    result.message = (
        f"per-token cost grows {ratio:.1f}× from {first} to {last} tokens (at most {spec.max_ratio:g}× passes)"
    )
    result.diagnosis = Diagnosis(shape="no-cache", summary=_NO_CACHE, hint=stage.hints.get("no-cache", ""))


def judge_timeout(result: CaseResult, stage: StageSpec) -> None:
    """A timed generation that ran past the stage's timeout: no cache, said so."""
    assert stage.scaling is not None, "called for cache-scaling stages only"
    lengths = ", ".join(str(n) for n in stage.scaling.lengths)
    result.status = "fail"
    result.message = (
        f"{result.message}: generating {lengths} tokens ({stage.scaling.repeats} times each) "
        "takes seconds with a cache; this took longer than the whole stage allows"
    )
    result.diagnosis = Diagnosis(shape="no-cache", summary=_NO_CACHE, hint=stage.hints.get("no-cache", ""))
