"""Evidence from the run as a whole, added to a failing stage's diagnosis.

Which of the stage's cases pass, read by prompt length and position ("only the one-token prompt
passes"), and what other stages said on the same weights, in this run or in the course's recorded
progress ("forward passes, so the difference is in code only the cached path runs"). Facts, each
with the cases or stages behind it; the stage keeps one diagnosis, so every failing case gets the
same sentences.
"""

import dataclasses

from theinference.grading.judge.results import CaseResult, Diagnosis, RunResult, StageResult, Status
from theinference.grading.spec.checks import TokensCheck

CACHED_ORACLES = ("layer0-attn-last", "layer0-attn-sublayer", "decode-step-logits", "per-step-logits")


def _length(case: CaseResult) -> int | None:
    ids = case.inputs.get("prompt", case.inputs.get("seq"))
    return len(ids) if isinstance(ids, list) else None


def _names(cases: list[CaseResult]) -> str:
    return ", ".join(c.name for c in cases)


def passing_pattern(result: StageResult, n_layer: int) -> str:
    """What the passing cases share that no failing one has, in words; "" if nothing (or nothing passes)."""
    graded = [c for c in result.cases if c.status in (Status.PASS, Status.FAIL)]
    passed = [c for c in graded if c.status == Status.PASS]
    failed = [c for c in graded if c.status == Status.FAIL]
    if not passed or not failed:
        return ""
    lengths = {_length(c) for c in passed}
    if lengths == {1} and 1 not in {_length(c) for c in failed}:
        if any("prompt" in c.inputs for c in passed):
            return (
                f"only the one-token prompt passes ({_names(passed)}): what ignores the prompt's length (a position, "
                "or prefill's row 0 read instead of its last) is right only when the prompt has one token"
            )
        return (
            f"only the one-token sequence passes ({_names(passed)}): with one position attention sees only itself, "
            "so suspect what involves other positions (the causal mask, the positions, attention across rows)"
        )
    one_row = all(len(c.rows) == 1 for c in graded)
    positions = {c.rows[0].position for c in passed} if one_row else set()
    if len(positions) == 1 and not positions & {c.rows[0].position for c in failed}:
        [p] = positions
        also = f" ({p} is also n_layer, the number of layers: a len() that counts layers?)" if p == n_layer else ""
        return (
            f"only the case at position {p} passes ({_names(passed)}): a position fixed at {p}{also} "
            "instead of the cache's length is right only there"
        )
    return ""


def _passes(stage_id: str, run: RunResult, recorded: dict[str, dict], weights: str) -> str:
    """'this run' or 'recorded progress' when the stage passed on these weights, else ""."""
    for stage in run.stages:
        if stage.id == stage_id:
            return "in this run" if stage.status == Status.PASS else ""
    entry = recorded.get(stage_id) or {}
    return (
        "in this course's recorded progress"
        if entry.get("status") == "pass" and entry.get("weights") == weights
        else ""
    )


def other_stages(result: StageResult, oracle: str, run: RunResult, recorded: dict[str, dict], weights: str) -> str:
    """What the other stages' verdicts on the same weights say about where this stage's difference lies."""
    if oracle in CACHED_ORACLES and (where := _passes("forward", run, recorded, weights)):
        return (
            f"forward passes on these weights ({where}), so the difference is in code only the cached path runs: "
            "prefill/decode_step and the block they call"
        )
    if isinstance(result.check, TokensCheck) and (where := _passes("per-step-identity", run, recorded, weights)):
        return (
            f"per-step-identity passes on these weights ({where}), so every logit is right: the difference is in the "
            "generation loop (the token fed back, its position, the choice, the length)"
        )
    return ""


def _with(diagnosis: Diagnosis, sentences: list[str]) -> Diagnosis:
    extra = "; ".join(sentences)
    evidence = f"{diagnosis.evidence}; from the run: {extra}" if diagnosis.evidence else f"from the run: {extra}"
    return dataclasses.replace(diagnosis, evidence=evidence)


def stage_evidence(
    result: StageResult, oracle: str, run: RunResult, n_layer: int, recorded: dict[str, dict], weights: str
) -> StageResult:
    """The stage with what its passing cases and the other stages say added to its failing diagnoses (a new value;
    result itself is unchanged): the same stage when it passed or nothing is said."""
    if result.status != Status.FAIL:
        return result
    sentences = [
        s for s in (passing_pattern(result, n_layer), other_stages(result, oracle, run, recorded, weights)) if s
    ]
    if not sentences:
        return result
    cases = [
        dataclasses.replace(c, diagnosis=_with(c.diagnosis, sentences))
        if c.status == Status.FAIL and c.diagnosis is not None
        else c
        for c in result.cases
    ]
    cross_case = None if result.cross_case is None else _with(result.cross_case, sentences)
    return dataclasses.replace(result, cases=cases, cross_case=cross_case)


def add_run_evidence(
    run: RunResult, oracles: dict[str, str], n_layer: int, recorded: dict[str, dict], weights: str
) -> RunResult:
    """The run with the evidence of stage_evidence added to each failing stage (oracles: stage id -> oracle)."""
    stages = [stage_evidence(s, oracles.get(s.id, ""), run, n_layer, recorded, weights) for s in run.stages]
    return dataclasses.replace(run, stages=stages)
