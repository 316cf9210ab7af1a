"""The cache proof's verdicts: what a case's timed calls come to, said in numbers.

Two tests, both required:
  (a) flat: per-token CPU at the longest length over that at the shortest is at most max_ratio;
  (b) floor: the longest call's CPU is at most max_fraction of a full recompute of the same tokens
      by the oracle, measured here now with one BLAS thread. Padding short calls flattens (a),
      never beats (b).
A pass on a count that misses processes earns nothing in grading mode (unproven). The words of each finding (a
Diagnosis's summary) are here, for the verdicts of a stopped or tampered call (judge/costcase.py) as well.
"""

import dataclasses

from theinference.grading.judge.results import Diagnosis, Guarantee, ScalingResult, Status
from theinference.grading.spec.stages import StageSpec

NO_CACHE = (
    "the cost of a token grows with its position, as it does when every step recomputes the "
    "whole sequence. With a cache, token k costs about the same as token 1."
)
_OVER_FLOOR = (
    "the generation costs too large a part of a full recompute of the same tokens: a cache does the same "
    "work for a small fraction of it. The per-token cost may look flat (short calls padded, or every token "
    "slow), but the total cannot be faked."
)
TOO_SLOW = (
    "every token costs far more than the oracle's single-token step on this machine, so the cost cannot show "
    "whether there is a cache. Common causes: float64 arithmetic (a NumPy float64 scalar such as "
    "`1.0 / np.sqrt(head_dim)` promotes float32 activations, and every matmul then converts the weights), "
    "copying the whole cache at every step, or Python loops over elements."
)
TAMPERED = (
    "the CPU the kernel counted for your process tree cannot be what it did: a complete count never falls, and no "
    "cache generates a token for less than the floor (every decode step reads every weight once). Work that leaves "
    "the counted tree (a process that ends without being waited for, so its CPU leaves the count with it) is "
    "tampering with the measurement, and fails."
)
BUSY = "the machine was too busy to finish, or the code waited (sleep, I/O): re-run when it is quieter"

# Rounds stop early once the verdict is clear: a pass whose figures sit this far inside both thresholds, or a (a)
# failure this far beyond it. More rounds only lower the longest call's cheapest cost, so (b) can only get better
# for the student; (a) may move either way, but it cannot flip from a margin this wide (the reference's rounds
# differ by under 1.3x under load).
_CLEAR = 1.5


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a case of the stage came to, before its printed output is read: its CaseResult is built from it once."""

    status: str  # a Status
    message: str = ""
    detail: str = ""
    diagnosis: Diagnosis | None = None
    scaling: ScalingResult | None = None
    traceback: str = ""
    stdout: str = ""  # a call's own, when the adapters failed to load (else the whole session's is read after)
    stderr: str = ""


def fail(
    stage: StageSpec, shape: str, summary: str, message: str, scaling: ScalingResult, status=Status.FAIL
) -> Verdict:
    """A finding: its shape and words, and the stage's hint for it."""
    diagnosis = Diagnosis(shape=shape, summary=summary, hint=stage.hints.get(shape, ""))
    return Verdict(status, message, diagnosis=diagnosis, scaling=scaling)


def judge(stage: StageSpec, scaling: ScalingResult) -> Verdict:
    """Given every timed call with right tokens: pass, or fail on (a) or (b), stated in numbers."""
    assert scaling.ratio is not None and scaling.seconds[-1] is not None, "judged once every length has a call"
    first, last = scaling.lengths[0], scaling.lengths[-1]
    fraction = scaling.fraction if scaling.fraction is not None else 0.0
    if scaling.ratio > scaling.max_ratio:
        message = (
            f"per-token CPU grows {scaling.ratio:.1f}× from {first} to {last} tokens "
            f"(at most {scaling.max_ratio:g}× passes)"
        )
        return fail(stage, "no-cache", NO_CACHE, message, scaling)
    if fraction > scaling.max_fraction:
        message = (
            f"the {last}-token generation used {scaling.seconds[-1]:.3g} s of CPU, {fraction:.0%} of a full recompute "
            f"of those tokens by the oracle here ({scaling.oracle_seconds:.3g} s); at most {scaling.max_fraction:.0%} "
            f"passes. Per token: {scaling.ms_per_token[-1]:.3g} ms, the oracle's single-token step "
            f"{scaling.step_ms:.3g} ms"
        )
        return fail(stage, "no-cache", _OVER_FLOOR, message, scaling)
    return Verdict(Status.PASS, scaling=scaling)


def unproven(verdict: Verdict) -> Verdict:
    """A pass on a count that misses processes, in grading mode: no credit, and what would make it provable.

    Failures stand: a meter that misses processes can only miss CPU, so a cost found too high is higher still."""
    scaling = verdict.scaling
    if verdict.status != Status.PASS or scaling is None or scaling.guarantee != Guarantee.UNPROVABLE:
        return verdict
    message = (
        f"no credit: in grading mode a count by the {scaling.accounting} cannot prove a cache (it misses a process "
        "that ends without being waited for). A grade of record needs a cgroup to count the CPU: run the grader as "
        "root (with a writable cgroup file system), or inside a delegated cgroup v2 subtree (for example under "
        "systemd's user manager: `systemd-run --user --scope -p Delegate=yes theinference grade ...`)"
    )
    return dataclasses.replace(verdict, status=Status.UNPROVEN, message=message)


def clear(scaling: ScalingResult) -> bool:
    """Whether the rounds so far settle the verdict beyond _CLEAR: no later round could change it."""
    if scaling.ratio is None or scaling.fraction is None:
        return False
    inside = scaling.ratio * _CLEAR <= scaling.max_ratio and scaling.fraction * _CLEAR <= scaling.max_fraction
    return inside or scaling.ratio >= _CLEAR * scaling.max_ratio
