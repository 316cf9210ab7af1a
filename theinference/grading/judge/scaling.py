"""The cache-scaling stage: does the student's generation cost what a cache costs?

Outputs cannot tell a cache from a recompute; cost can, if the cost is the kernel's and the inputs
are the grader's. The grader drives one worker call by call (theinference.proc.calls): an untimed
warm-up on the case's prompt, then `repeats` rounds of one call per length, each on a fresh random
prompt sent only when the call starts (nothing can be computed ahead or reused). Each call's cost
is the CPU the kernel counted for the student's whole process tree during it, read by the grader.
Every call's tokens are checked against the oracle (teacher-forced) before the next is sent. Where the
short calls are too dear for a stopped longest call to show growth by itself, three diagnostic calls on a long
prompt tell a recompute (no-cache) from a slow cache (too-slow): see costcase._GROWTH.

The case's calls are one Schedule (PlannedCall: which calls, in what order, on which budget, which are
diagnostic); what they measure is a CostCase (judge/costcase.py), set against the oracle's costs here
(judge/oraclecost.py: test (b)'s floor); the finished rounds are judged by judge/costverdict.py: (a) flat per-token
cost, (b) at most a fraction of a full recompute. Budgets are CPU seconds; the wall-clock limit is a backstop that
says "busy machine", never "no cache".

What the count proves depends on the meter (ScalingResult.guarantee). A cgroup counts every process ever in the
tree: its verdicts are grades of record. A process tree misses one that ends without being waited for, so it can
only miss CPU, never add it: a failure on cost stands, but a pass is a self-check on the student's own run, and in
grading mode (an untrusted run) no pass is given at all: Status.UNPROVEN. Whatever the meter, a count no cache
could cost (below cost_floor per token) or a count that fell is evidence that work left the count: tampering.
"""

import dataclasses
import random
import time
from collections.abc import Iterator
from typing import Any, cast

import numpy as np

from theinference.grading.judge import events
from theinference.grading.judge.context import GradeContext
from theinference.grading.judge.costcase import REFUSED, CostCase, WatchedMeter, budget, judge_stopped
from theinference.grading.judge.costverdict import Verdict, clear, judge, unproven
from theinference.grading.judge.oraclecost import FLOAT32, FLOAT64, drifted_costs
from theinference.grading.judge.results import CaseResult, Status, TimedCall
from theinference.grading.spec.stages import CaseSpec, StageSpec
from theinference.proc import protocol
from theinference.proc.calls import DEADLINE, Budget, CallSession
from theinference.proc.runner import MONITOR_LOST, AdapterJob, CallOutcome

DTYPE_PROBE = ("run_decode_step", "runDecodeStep")


def _fresh_prompt(rng: random.Random, length: int, n_vocab: int) -> list[int]:
    return [rng.randrange(n_vocab) for _ in range(length)]


def _ended(outcome: CallOutcome, what: str) -> Verdict:
    """A call that ended in an error, a crash or bad output: the student's status, with its message."""
    return Verdict(
        Status.FAIL if outcome.status == protocol.BAD_OUTPUT else outcome.status,
        ": ".join(part for part in (what, outcome.message) if part),
        detail=DEADLINE if outcome.limit == DEADLINE else "",  # the adapters' load, stopped at the run's end
        traceback=outcome.traceback,
        stdout=outcome.stdout,
        stderr=outcome.stderr,
    )


def _tell(run: CostCase, case: int, detail: str) -> None:
    """The live line: which call of the case is running."""
    if run.ctx.on_case is not None:
        run.ctx.on_case(events.CallStarted(run.stage, case, detail))


@dataclasses.dataclass(frozen=True)
class PlannedCall:
    """One call of a case as its Schedule sets it."""

    index: int  # the call's number in the session (0: the untimed warm-up)
    n_new: int
    prompt_tokens: int  # of a fresh random prompt, sent when the call starts
    label: str  # the live line's words for it
    budget: Budget
    diagnostic: int = 0  # which diagnostic call it is, 1 to DIAGNOSTIC_CALLS (0: a timed call)

    @property
    def what(self) -> str:
        """The call, as a verdict's message names it."""
        kind = "diagnostic" if self.diagnostic else "timed"
        return f"{kind} call {self.index} ({self.n_new} tokens after {self.prompt_tokens} random ones)"


class Schedule:
    """A case's calls after its warm-up, in order, numbered as they are made: `repeats` rounds of one timed call per
    length on the stage's short prompt, each on the case's timed budget (CostCase.timed_budget), ending early once the
    verdict is clear (costverdict.clear); in the first round, before its longest call and where the case needs them
    (CostCase.needs_diagnostic), the diagnostic calls on a long prompt, each on the stage's whole timeout: twice 1 new
    token, then 1 + m, m sized from the first two (CostCase.diagnostic_length). Iterated as the calls are made: what
    comes next depends on what the calls so far measured."""

    DIAGNOSTIC_CALLS = 3

    def __init__(self, run: CostCase):
        self.run, self.made = run, 0

    def __iter__(self) -> Iterator[PlannedCall]:
        spec = self.run.spec
        for round_ in range(spec.repeats):
            for k, n_new in enumerate(spec.lengths):
                if round_ == 0 and n_new == spec.lengths[-1] and self.run.needs_diagnostic():
                    yield from self._diagnostic()
                yield self._timed(round_, k, n_new)
            if clear(self.run.scaling_result()):
                return

    def _number(self) -> int:
        self.made += 1
        return self.made

    def _timed(self, round_: int, k: int, n_new: int) -> PlannedCall:
        spec = self.run.spec
        label = (
            f"timed call {round_ * len(spec.lengths) + k + 1} of {spec.repeats * len(spec.lengths)}: {n_new} new tokens"
        )
        return PlannedCall(self._number(), n_new, spec.prompt_tokens, label, self.run.timed_budget(n_new))

    def _diagnostic(self) -> Iterator[PlannedCall]:
        prompt, whole = self.run.diagnostic_prompt(), budget(self.run.timeout, self.run.timeout)
        for k in range(1, self.DIAGNOSTIC_CALLS + 1):
            if k < self.DIAGNOSTIC_CALLS:
                n_new, tokens = 1, "1 new token"
            else:  # sized by the one-token calls before it: they have run by now
                n_new = self.run.diagnostic_length(min(c.cpu_seconds for c in self.run.calls if c.diagnostic))
                tokens = f"{n_new} new tokens"
            label = f"diagnostic call {k} of {self.DIAGNOSTIC_CALLS}: {tokens} after {prompt} (tells no-cache from too-slow)"
            yield PlannedCall(self._number(), n_new, prompt, label, whole, diagnostic=k)


def _timed_rounds(session: CallSession, run: CostCase, rng: random.Random, output_cap, case: int) -> Verdict:
    """The case's scheduled calls, each judged as it ends; the verdict of the rounds once they are done."""
    for call in Schedule(run):
        if ended := _call(session, run, rng, output_cap, case, call):
            return ended
        if call.diagnostic == Schedule.DIAGNOSTIC_CALLS and (refused := run.refused()):
            return refused
    return unproven(judge(run.stage, run.scaling_result()))


def _call(session: CallSession, run: CostCase, rng, output_cap, case: int, call: PlannedCall) -> Verdict | None:
    """One call on a fresh prompt, its tokens checked; the case's verdict once it ended the case, else None."""
    prompt = _fresh_prompt(rng, call.prompt_tokens, run.ctx.model.config.n_vocab)
    _tell(run, case, call.label)
    outcome = session.call(call.index, [prompt, call.n_new], output_cap(call.n_new), call.budget)
    if outcome.status == protocol.TIMEOUT and outcome.limit:
        stopped = judge_stopped(run, outcome, call.n_new, call.prompt_tokens if call.diagnostic else 0)
        return run.tampered(outcome.cpu_seconds or 0.0, 0, call.what) or stopped
    if outcome.status != protocol.OK:
        return _ended(outcome, call.what)
    if wrong := run.wrong_tokens(outcome, prompt, call.n_new, call.what):
        return wrong
    cpu = outcome.cpu_seconds or 0.0
    timed = TimedCall(call.n_new, cpu, outcome.seconds, clock=outcome.clock, prompt_tokens=call.prompt_tokens)
    run.calls.append(dataclasses.replace(timed, diagnostic=bool(call.diagnostic)))
    return run.tampered(cpu, call.n_new, call.what)


def grade_case(
    stage: StageSpec, ctx: GradeContext, index: int, job: AdapterJob, output_cap, weights_note: str = ""
) -> tuple[CaseResult, CallOutcome]:
    """Run one case of a cache-scaling stage: warm-up, timed rounds, verdict. Never raises for student faults.

    ctx.model and job.weights are the weights the stage runs on (proof_model's choice).
    """
    run = CostCase(stage, ctx, job.timeout, weights_note)
    if ctx.on_case is not None:  # the live line: the case runs from the worker's start to its last call
        ctx.on_case(events.CaseStarted(stage, index))
    try:
        result, outcome = _run_case(run, index, job, output_cap)
        if run.flat_stop and run.factor == 1.0 and not _past(job):
            dtype = _probe_dtype(run, index, job, output_cap)
            if dtype == FLOAT64 and not _past(job):  # like with like: the whole case again, against float64's floor
                wide = CostCase(stage, ctx, job.timeout, weights_note, dtype)
                again, outcome_again = _run_case(wide, index, job, output_cap)
                if again.detail == REFUSED:  # the first verdict stands, and says why the claim did not count
                    return dataclasses.replace(result, message=f"{result.message}. {again.message}"), outcome
                return again, outcome_again
        if run.flat_stop and not _past(job) and (drift := drifted_costs(stage, ctx.model, run.costs)):
            costs, grown = drift  # the machine got busier since the oracle's costs were measured: like with like
            note = (
                f"{weights_note}{'; ' if weights_note else ''}the oracle's costs, measured again after a first run "
                f"that was too slow, had grown {grown:.2g}× since they were first measured (a busier machine): the "
                "case was run again against them"
            )
            return _run_case(CostCase(stage, ctx, job.timeout, note, run.costs.dtype, costs), index, job, output_cap)
        return result, outcome
    finally:
        if ctx.on_case is not None:
            ctx.on_case(events.CaseEnded(stage, index))


def _past(job: AdapterJob) -> bool:
    return job.deadline is not None and time.monotonic() >= job.deadline


def _probe_dtype(run: CostCase, index: int, job: AdapterJob, output_cap) -> str:
    """The precision the student's decode step computes in, from the logits it returns (see DTYPE_PROBE): FLOAT64,
    FLOAT32, or "" when it gave none (not written, failed, or not an array of floats)."""
    probe = dataclasses.replace(job, names=DTYPE_PROBE)
    prompt, n_vocab = run.stage.cases[index].inputs["prompt"], run.ctx.model.config.n_vocab
    _tell(run, index, "one decode step: which precision your arrays are in")
    with CallSession(probe, budget(job.timeout, job.timeout)) as session:
        if session.failure is not None:
            return ""
        outcome = session.call(0, [prompt, 0], output_cap(n_vocab), budget(job.timeout, job.timeout))
    value = outcome.value if outcome.status == protocol.OK else None
    if value is None or value.dtype.kind != "f":
        return ""
    return FLOAT64 if value.dtype == np.float64 else FLOAT32


def _case_result(case: CaseSpec, verdict: Verdict) -> CaseResult:
    return CaseResult(
        name=case.name,
        status=verdict.status,
        message=verdict.message,
        detail=verdict.detail,
        inputs=case.inputs,
        texts=case.texts,
        diagnosis=verdict.diagnosis,
        traceback=verdict.traceback,
        stdout=verdict.stdout,
        stderr=verdict.stderr,
        scaling=verdict.scaling,
    )


def _run_case(run: CostCase, index: int, job: AdapterJob, output_cap) -> tuple[CaseResult, CallOutcome]:
    case = run.stage.cases[index]
    warm_n = run.spec.lengths[0]
    with CallSession(job, budget(job.timeout, job.timeout)) as session:
        run.accounting = session.accounting
        if session.failure is not None:  # the adapters did not load: the import's error is the verdict
            outcome = session.failure
            return _case_result(case, _ended(outcome, "")), outcome
        assert session.meter is not None, "a loaded session has a meter"
        run.complete = session.meter.complete
        # Every reading the session takes goes through the watch, which adds up the count's falls.
        run.meter = WatchedMeter(session.meter)
        session.meter = cast(Any, run.meter)
        _tell(run, index, f"untimed warm-up: {warm_n} new tokens")
        outcome = session.call(0, [case.inputs["prompt"], warm_n], output_cap(warm_n), budget(job.timeout, job.timeout))
        if outcome.status == protocol.TIMEOUT and outcome.limit:
            verdict = run.tampered(outcome.cpu_seconds or 0.0, 0, "the warm-up call") or judge_stopped(
                run, outcome, warm_n
            )
        elif outcome.status != protocol.OK:
            verdict = _ended(outcome, "the warm-up call")
        else:
            verdict = (
                run.wrong_tokens(outcome, case.inputs["prompt"], warm_n, f"the warm-up call on {case.name!r}")
                or run.tampered(outcome.cpu_seconds or 0.0, 0, "the warm-up call")
                or _timed_rounds(session, run, random.SystemRandom(), output_cap, index)
            )
        whole = session.output()  # what the student's code printed in every call, not only the last
    if session.monitor_lost:  # known once the worker is gone: whatever its calls showed, none of it counts
        outcome = CallOutcome(status=protocol.ERROR, message=MONITOR_LOST)
        verdict = Verdict(Status.ERROR, MONITOR_LOST, detail=verdict.detail, traceback=verdict.traceback)
    return _case_result(case, dataclasses.replace(verdict, stdout=whole.stdout, stderr=whole.stderr)), outcome
