"""cache-scaling's reading of a stopped call, from the calls' CPU alone (no student process, no oracle run).

The end-to-end tests (tests/e2e/test_scaling.py) grade real submissions; these pin the rules a verdict rests on:
when the diagnostic calls run, what they measure, and what a stop is named with and without them.
"""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from theinference.bundled import data_dir
from theinference.grading.judge import costcase, costverdict, oraclecost
from theinference.grading.judge.results import Status, TimedCall
from theinference.grading.spec.stages import load_stages
from theinference.proc.runner import CallOutcome

STAGE = next(s for s in load_stages([data_dir("stages")]) if s.id == "cache-scaling")  # lengths 8 and 480
RECOMPUTE_480 = 50.0  # CPU seconds of the oracle's full recompute of 480 tokens, as if measured here
STEP = 0.01  # and of its single-token step


def _run(adapters: str = "adapters.py", n_ctx: int = 512, untrusted: bool = False) -> costcase.CostCase:
    costs = oraclecost.Costs({8: 1.0, 480: RECOMPUTE_480}, STEP)
    ctx = SimpleNamespace(
        course=SimpleNamespace(adapters=Path("tests") / adapters),
        model=SimpleNamespace(config=SimpleNamespace(n_ctx=n_ctx, n_vocab=50257), path="proof", stamp=()),
        cache=SimpleNamespace(memo=lambda key, measure: costs),
        on_case=None,
        untrusted=untrusted,
    )
    return costcase.CostCase(STAGE, ctx, timeout=120.0, weights_note="")


def _stop_the_longest(run: costcase.CostCase) -> costverdict.Verdict:
    """The 480-token call stopped at its CPU budget (the floor), as grading does."""
    used = run.timed_budget(480).cpu
    return costcase.judge_stopped(run, CallOutcome(status="timeout", cpu_seconds=used, limit="cpu"), 480)


def _short(run: costcase.CostCase, cpu: float) -> None:
    run.calls.append(TimedCall(8, cpu, cpu, prompt_tokens=4))


def _diagnostics(run: costcase.CostCase, prefill: float, per_token: float) -> None:
    """The three diagnostic calls: twice 1 token after the long prompt, then 1 + m, m as grading sizes it."""
    prompt = run.diagnostic_prompt()
    for cpu in (prefill * 1.3, prefill):  # the dearer one must not count: the cheapest 1-token call does
        run.calls.append(TimedCall(1, cpu, cpu, prompt_tokens=prompt, diagnostic=True))
    n_new = run.diagnostic_length(prefill)
    cpu = prefill + (n_new - 1) * per_token
    run.calls.append(TimedCall(n_new, cpu, cpu, prompt_tokens=prompt, diagnostic=True))


def test_cheap_short_calls_need_no_diagnostic_and_a_stop_is_no_cache():
    run = _run()
    _short(run, 8 * STEP)  # a cache's 8 tokens: one step each
    assert not run.needs_diagnostic()  # a flat cost at that rate finishes far inside the floor
    result = _stop_the_longest(run)
    assert result.status == Status.FAIL and result.diagnosis.shape == "no-cache"
    assert "what 480 tokens cost at the 8-token calls' rate" in result.message


@pytest.mark.parametrize(("per_token", "shape"), [(8 * 0.05, "no-cache"), (0.05, "too-slow")])
def test_dear_short_calls_are_read_by_the_diagnostic_calls(per_token, shape):
    """50 ms a token in the short calls: a flat cost at that rate would be stopped at the floor too."""
    run = _run()
    _short(run, 8 * 0.05)
    assert run.needs_diagnostic()
    _diagnostics(run, prefill=0.3, per_token=per_token)  # a token there: 8 short ones (a recompute's), or 1
    assert run.growth() == pytest.approx(per_token / 0.05)
    result = _stop_the_longest(run)
    assert result.status == Status.FAIL and result.diagnosis.shape == shape
    growth_said = "a token after a 384-token prompt costs 8.0× what one costs in the 8-token calls"
    assert (growth_said in result.message) == (shape == "no-cache"), result.message
    assert ("ms per token at 8 tokens, flat" in result.message) == (shape == "too-slow")


def test_the_diagnostic_prompt_and_length_fit_the_context_and_the_prefill():
    numpy, node = _run(), _run("adapters.ts")
    assert numpy.diagnostic_prompt() == 384 and node.diagnostic_prompt() == 128  # 3/4 and 1/4 of 512
    assert _run(n_ctx=1024).diagnostic_prompt() == 480  # the longest length, where the context has room
    for run in (numpy, node):
        _short(run, 8 * 0.01)
    assert numpy.diagnostic_length(prefill=0.05) == 1 + costcase._MARGINAL  # a cheap prefill: the least m
    assert node.diagnostic_length(prefill=2.0) == 1 + 50  # m = a quarter of the prefill at the short rate
    assert numpy.diagnostic_length(prefill=100.0) == 512 - 1 - 384  # as the context has room


def test_a_short_call_counted_as_no_cpu_reads_a_stop_as_no_cache_without_dividing_by_zero():
    run = _run()
    _short(run, 0.0)  # under a 10 ms clock tick a very fast call can be counted as nothing
    assert not run.needs_diagnostic() and run.growth() is None
    result = _stop_the_longest(run)
    assert result.diagnosis.shape == "no-cache" and "many times what 480 tokens cost" in result.message


def test_a_stopped_diagnostic_call_is_too_slow_and_not_counted_as_a_timing():
    run = _run()
    _short(run, 8 * 0.05)
    outcome = CallOutcome(status="timeout", cpu_seconds=120.0, limit="cpu")
    verdict = costcase.judge_stopped(run, outcome, 1, prompt=384)
    assert verdict.diagnosis.shape == "too-slow"
    assert "the call generating 1 tokens after a 384-token prompt was stopped" in verdict.message
    timing = verdict.scaling
    assert timing.stopped_at is None and timing.seconds == (0.4, None)  # the stopped call is no length's cost
    assert dataclasses.asdict(timing.calls[-1])["diagnostic"] is True
