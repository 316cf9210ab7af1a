"""One case of the cache proof as measured so far: its calls, and the figures and findings read from them.

CostCase holds the case's calls (TimedCall) and the oracle's costs they are set against (judge/oraclecost.py): the
short calls' rate, the diagnostic calls' growth and marginal cost, each call's budget, the ScalingResult the report
shows, and the findings no call-by-call rule can wait for: wrong tokens, a count that cannot be what the tree did
(tampered), a call stopped at its budget (judge_stopped). judge/scaling.py makes the calls; judge/costverdict.py
judges the finished rounds.
"""

import dataclasses
import math
from typing import Any

from theinference.grading.judge.context import GradeContext
from theinference.grading.judge.costverdict import BUSY, NO_CACHE, TAMPERED, TOO_SLOW, Verdict, fail
from theinference.grading.judge.oraclecost import FLOAT32, FLOOR_SHARE, Costs, cost_floor, oracle_costs, proof_check
from theinference.grading.judge.results import Diagnosis, Guarantee, ScalingResult, Status, TimedCall
from theinference.grading.judge.verification import check_steps, token_problem
from theinference.grading.spec.stages import StageSpec
from theinference.model.weights import Model
from theinference.proc.calls import DEADLINE, Budget
from theinference.proc.node import is_node_adapters
from theinference.proc.runner import CallOutcome

_KILL_AT = 1.0  # the longest call is stopped at this multiple of max_fraction of a full recompute: over (b)
_GROWN = 2.0  # a stopped call whose cost passed this multiple of its length at the short rate grew with position
# A longest call stopped though a flat cost at the short calls' rate would have finished is no-cache. When the short
# calls are too dear for that to show, diagnostic calls on a long prompt (the longest length, at most 3/4 of the
# context for numpy and 1/4 for Node: diagnostic_prompt) tell a recompute from a slow cache: twice 1 new token, then 1 + m. The difference is what m tokens cost there, the
# prompt's prefill cancelled out: a cache's decode steps cost about what they cost after a short prompt; a
# recompute's run every layer over the whole prompt. m is at least _MARGINAL, and large enough that the prefill's
# noise (a JavaScript prefill costs a row's forward per prompt token) cannot hide m tokens: a quarter of the
# prefill's cost at the short rate (for a recompute, whose prefill is one forward, m stays _MARGINAL: 17 forwards).
# The marginal cost per token over the short calls' rate, measured side by side (bench/cache_scaling.py --diagnostic
# --repeats 1 [--load]; proof preset, 8 and 480 tokens, so a 384-token prompt for numpy and 128 for Node):
#   subject                                   shared machine (3 runs)   two burners per core
#   reference cache                           0.60, 1.57, 0.99          0.52
#   a cache burning 40 ms a token (too-slow)  0.81, 0.94                1.02
#   recomputes: careful, plain, 3 mutants     4.67-24.1                 4.46-19.7
#   tricks (memo, warmup-prefix)              17.3-23.3                 22.3-31.9
#   padded recompute (short calls padded)     4.01, 4.60                3.76
#   TS reference cache                        1.03                      0.14
#   TS recomputes (careful, plain)            19.2, 21.5                19.7, 14.9
# _GROWTH sits 1.6x above the caches' highest and 1.5x below the recomputes' lowest (the padded one; 1.8x below
# lm-head-every-position, the dearest-looking honest mistake).
_MARGINAL = 16
_GROWTH = 2.5
# The TypeScript edition runs on Node, whose arithmetic costs about 3.5x numpy's on these shapes (the reference
# caches: 9-15% of the numpy oracle's recompute in Python, 26-35% in TypeScript): (b)'s floor is measured
# against the numpy oracle, so for Node it is scaled by this factor. Measured side by side
# (bench/cache_scaling.py --edition ts --load, proof preset, 8 and 480 tokens; margin: how far on its side):
#   subject                                  (a) ratio, margin   (b) of the numpy recompute, margin (floor 105%)
#   TS reference cache, shared machine       1.30, 2.3           29.7%, 3.5
#   TS reference cache, two burners per core 1.12, 2.7           26.2%, 4.0
#   TS careful recompute, both               stopped             >105%, >1 (stopped at the floor, as graded)
# To its end the careful recompute would cost about 20x the numpy recompute (estimated from its rows per token:
# about half an hour of CPU a call, not run). The reference cache stays 2.3x or more inside both tests under load,
# so the factor stays. A stopped JavaScript recompute's short calls are dear (9-24 numpy oracle steps per token), so
# its finding comes from the diagnostic calls (see _GROWTH): 19-21x, against about 1x for the TS reference cache.
NODE_FACTOR = 3.0
# _RESOLUTION covers the coarsest meter's rounding (clock ticks: 10 ms on Linux, 15.6 ms on Windows; a thread or
# child that ends loses under one tick of its count): a count below the floor, or fallen, by less says nothing.
_RESOLUTION = 0.05
# (b)'s floor compares like with like: a cache that computes in float64 (a NumPy float64 scalar promotes float32
# arrays under NumPy 2: `1.0 / np.sqrt(head_dim)`) is set against the oracle's recompute in float64. What precision the
# student computes in is read from the array its decode step returns (judge/scaling.py: DTYPE_PROBE, one call),
# asked only when a flat-cost longest call was stopped over the float32 floor. The answer is the student's, so a
# false one must gain nothing: the float64 floor is one no recompute meets either (a float32 careful recompute that
# says float64 reads as a recompute over it: see the table in stages/cache-scaling.toml).
# The claim is also weighed by cost, which cannot be faked downward: in the float64 run the diagnostic calls always
# run, and a token after their long prompt must cost at most _CLAIM times the oracle's float64 single-token step (a
# float64 cache converts every weight at every step, the LM head's above all, and costs about that step at any
# position: 1.1-1.3x; a float32 recompute there costs a forward over the prompt, 2.5x and more: see the table).
_CLAIM = 2.0
REFUSED = "float64-refused"  # Verdict.detail of a float64 run whose diagnostic calls deny the claim


def budget(cpu: float, timeout: float) -> Budget:
    """A call's CPU budget, and the stage's timeout for time not spent on a CPU (a call that waits)."""
    return Budget(cpu=cpu, timeout=max(cpu, timeout))


class WatchedMeter:
    """The session's CPU meter, read through, adding up every fall of its count (a complete count never falls).

    The falls are summed, not the largest kept: work hidden in many short processes that end unseen falls a little
    at each, where the count saw them run."""

    def __init__(self, meter: Any):
        self.meter, self.name, self.complete = meter, meter.name, meter.complete
        self.last: float | None = None
        self.fell = 0.0  # CPU seconds the count lost, in all

    def cpu_seconds(self) -> float:
        value = self.meter.cpu_seconds()
        if self.last is not None and value < self.last:
            self.fell += self.last - value
        self.last = value
        return value

    def __getattr__(self, name: str):
        return getattr(self.meter, name)


class CostCase:
    """One case of the stage: the session and the calls so far, which the verdict is read from."""

    def __init__(
        self,
        stage: StageSpec,
        ctx: GradeContext,
        timeout: float,
        weights_note: str,
        dtype: str = FLOAT32,
        costs: Costs | None = None,
    ):
        self.check = proof_check(stage)
        self.stage, self.spec, self.ctx = stage, self.check.params, ctx
        self.factor = NODE_FACTOR if is_node_adapters(ctx.course.adapters) else 1.0
        if self.factor != 1.0:
            self.spec = dataclasses.replace(self.spec, max_fraction=self.spec.max_fraction * self.factor)
            weights_note += (
                f"{'; ' if weights_note else ''}TypeScript edition: (b)'s floor is {self.factor:g}× the Python "
                "edition's, as Node's arithmetic costs about that much more than numpy's"
            )
        self.timeout = timeout
        self.calls: list[TimedCall] = []
        self.costs = costs or oracle_costs(stage, ctx.model, ctx.cache, dtype)
        if dtype != FLOAT32:
            weights_note += (
                f"{'; ' if weights_note else ''}your decode step returns {dtype} logits, so (b)'s full recompute by "
                f"the oracle was measured in {dtype} too"
            )
        self.flat_stop = False  # the longest call was stopped over (b) with no sign of growth: too-slow, so far
        self.accounting = ""
        self.complete = True  # the meter's: counts every process ever in the tree (set once the session has one)
        self.untrusted = ctx.untrusted
        self.meter: WatchedMeter | None = None
        self.weights_note = weights_note

    def short_calls(self) -> list[TimedCall]:
        return [c for c in self.calls if c.n_new == self.spec.lengths[0] and not (c.stopped or c.diagnostic)]

    def short_rate(self) -> float | None:
        """CPU seconds per token of the cheapest finished call at the shortest length (None before one)."""
        return min((c.cpu_seconds / c.n_new for c in self.short_calls()), default=None)

    def needs_diagnostic(self) -> bool:
        """Whether a stop of the longest call could be a flat cost's, at the short calls' rate (so not read as growth)."""
        rate, last = self.short_rate(), self.spec.lengths[-1]
        if self.costs.dtype != FLOAT32:  # the float64 claim is weighed by the diagnostic calls (see _CLAIM)
            return True
        return rate is not None and _GROWN * rate * last >= self.timed_budget(last).cpu

    def diagnostic_prompt(self) -> int:
        """The diagnostic calls' prompt length: the longest length, with room in the context for the long call.

        At most 3/4 of the context for numpy, whose forward costs mostly its operations' overhead up to a few hundred
        rows (a recompute's rows show only on a long prompt); 1/4 for Node, where every row costs its share, so a
        shorter prompt shows them and keeps the prefill (a row's forward per token) small against m tokens."""
        n_ctx = self.ctx.model.config.n_ctx
        share = (3 * n_ctx) // 4 if self.factor == 1.0 else n_ctx // 4
        return max(self.spec.prompt_tokens, min(self.spec.lengths[-1], share, n_ctx - 1 - _MARGINAL))

    def diagnostic_length(self, prefill: float) -> int:
        """The long diagnostic call's new tokens: 1 + m (see _MARGINAL), as the context has room."""
        rate, room = self.short_rate() or 1.0, self.ctx.model.config.n_ctx - 1 - self.diagnostic_prompt()
        return 1 + min(room - 1, max(_MARGINAL, math.ceil(prefill / (4 * rate))))

    def marginal(self) -> float | None:
        """CPU seconds a token costs after the diagnostic prompt (the long call less a one-token one), once measured."""
        ones = [c.cpu_seconds for c in self.calls if c.diagnostic and c.n_new == 1 and not c.stopped]
        long = [c for c in self.calls if c.diagnostic and c.n_new > 1 and not c.stopped]
        if not (ones and long):
            return None
        return (long[0].cpu_seconds - min(ones)) / (long[0].n_new - 1)

    def refused(self) -> Verdict | None:
        """In the float64 run: the verdict that its diagnostic calls deny the claim (see _CLAIM), else None."""
        marginal = self.marginal()
        if self.costs.dtype == FLOAT32 or marginal is None or marginal <= _CLAIM * self.costs.step:
            return None
        message = (
            f"your decode step returns {self.costs.dtype} logits, but a token after a {self.diagnostic_prompt()}-token "
            f"prompt costs {1000 * marginal:.3g} ms, {marginal / self.costs.step:.1f}× the oracle's {self.costs.dtype} "
            f"single-token step (a {self.costs.dtype} cache costs about that step at any position; over {_CLAIM:g}× is "
            f"not one), so (b) stays set against the float32 recompute"
        )
        return Verdict(Status.FAIL, message, detail=REFUSED)

    def growth(self) -> float | None:
        """What a token costs after the diagnostic prompt over one at the short calls' rate, once measured."""
        ones = [c.cpu_seconds for c in self.calls if c.diagnostic and c.n_new == 1 and not c.stopped]
        long = [c for c in self.calls if c.diagnostic and c.n_new > 1 and not c.stopped]
        rate = self.short_rate()
        if not (ones and long and rate) or long[0].n_new < 2:  # (a context too short for m tokens after the prompt)
            return None
        return (long[0].cpu_seconds - min(ones)) / (long[0].n_new - 1) / rate

    def timed_budget(self, n_new: int) -> Budget:
        """A short call may use the stage's timeout in CPU; the longest is stopped once it is surely over (b)."""
        if n_new != self.spec.lengths[-1]:
            return budget(self.timeout, self.timeout)
        return budget(min(self.timeout, _KILL_AT * self.spec.max_fraction * self.costs.recompute[n_new]), self.timeout)

    def wrong_tokens(self, outcome: CallOutcome, prompt: list[int], n_new: int, what: str) -> Verdict | None:
        """None when the call returned n_new tokens the oracle agrees with; else the case's failure, said briefly."""
        assert outcome.value is not None, 'an "ok" outcome carries the adapter\'s array'
        model = self.ctx.model
        problem = token_problem(outcome.value, n_new, model.config.n_vocab)
        steps = [] if problem else _checked(model, prompt, [int(t) for t in outcome.value], self.check.tie_rtol)
        if not problem and steps[-1].verdict != "mismatch":
            return None
        why = problem or (
            f"token {len(steps)} of {n_new} is {steps[-1].got}, the oracle's greedy choice is {steps[-1].expected}"
        )
        diagnosis = Diagnosis(
            shape="token-mismatch",
            summary="the tokens are wrong, so the cost of generating them says nothing; pass the greedy stage first",
            hint=self.stage.hints.get("token-mismatch", ""),
        )
        message = f"{what}: {why}; the timing was not judged"
        return Verdict(Status.FAIL, message, detail="token-mismatch", diagnosis=diagnosis)

    def scaling_result(self, stopped_at: int | None = None) -> ScalingResult:
        timed = [c for c in self.calls if not c.diagnostic]
        best = {n: min((c.cpu_seconds for c in timed if c.n_new == n), default=None) for n in self.spec.lengths}
        return ScalingResult(
            lengths=self.spec.lengths,
            seconds=tuple(best[n] for n in self.spec.lengths),
            max_ratio=self.spec.max_ratio,
            max_fraction=self.spec.max_fraction,
            accounting=self.accounting,
            oracle_seconds=self.costs.recompute[self.spec.lengths[-1]],
            step_ms=1000 * self.costs.step,
            calls=tuple(self.calls),
            stopped_at=stopped_at,
            weights_note=self.weights_note,
            complete=self.complete,
            guarantee=self.guarantee(),
            floor_ms=1000 * cost_floor(self.costs.step),
        )

    def guarantee(self) -> Guarantee:
        """What the figures prove: a grade of record where every process is counted; else a self-check, or in
        grading mode nothing a pass could rest on."""
        if self.complete:
            return Guarantee.RECORD
        return Guarantee.UNPROVABLE if self.untrusted else Guarantee.SELF_CHECK

    def tampered(self, cpu: float, n_new: int, what: str) -> Verdict | None:
        """The case's failure when the count cannot be what the tree did: it fell, or a finished call (n_new > 0) was
        counted less than any cache costs; else None."""
        fell = max(self.meter.fell if self.meter is not None else 0.0, -cpu)
        if fell > _RESOLUTION:
            message = (
                f"the CPU count of your process tree fell by {fell:.3g} s in all by the end of {what}: a complete count "
                "never falls, so a process of the tree ended with its CPU uncounted (a child nobody waited for); "
                "the cost cannot be read"
            )
            return fail(self.stage, "cost-tampered", TAMPERED, message, self.scaling_result())
        floor = cost_floor(self.costs.step)
        if n_new and cpu + _RESOLUTION < n_new * floor:
            message = (
                f"{what} was counted {cpu:.3g} s of CPU for {n_new} tokens ({1000 * cpu / n_new:.3g} ms a token): "
                f"no cache costs less than {1000 * floor:.3g} ms a token here (1/{FLOOR_SHARE:g} of the oracle's "
                f"one-token step, {1000 * self.costs.step:.3g} ms with one BLAS thread), so the work was done where "
                "the count does not see it"
            )
            return fail(self.stage, "cost-tampered", TAMPERED, message, self.scaling_result())
        return None


def _checked(model: Model, prompt: list[int], tokens: list[int], tie_rtol: float):
    """check_steps with BLAS held to one thread: the teacher-forced forward over 480 tokens is the grader's largest
    cost in the stage, and a second BLAS thread spinning beside busy cores made it 2-3x dearer in CPU and in time
    (0.55 s against 1.85 s of CPU on the proof preset, beside two CPU burners per core)."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    with threadpool_limits(limits=1):
        return check_steps(model, prompt, tokens, tie_rtol)


def judge_stopped(run: CostCase, outcome: CallOutcome, n_new: int, prompt: int = 0) -> Verdict:
    """A call stopped at a budget: no cache, too slow to tell, or a busy machine, as the evidence says.

    prompt: the diagnostic call's long prompt (0: a timed call, on the stage's short prompt)."""
    used = outcome.cpu_seconds or 0.0
    call = TimedCall(n_new, used, outcome.seconds, stopped=True, clock=outcome.clock, prompt_tokens=prompt)
    run.calls.append(dataclasses.replace(call, diagnostic=bool(prompt)))
    timing = run.scaling_result(stopped_at=None if prompt else n_new)
    after = f" after a {prompt}-token prompt" if prompt else ""
    if outcome.limit == DEADLINE:  # the run's end, not the code's: no verdict on its cost
        run.calls.pop()
        done = sum(1 for c in run.calls if not c.diagnostic)
        message = f"{outcome.message} (the call generating {n_new} tokens{after}; {done} timed call{'' if done == 1 else 's'} had finished)"
        return Verdict(Status.TIMEOUT, message, detail=DEADLINE, scaling=run.scaling_result())
    if outcome.limit == "time":  # past the timeout without using the CPU for it: the code waited
        return Verdict(Status.TIMEOUT, f"{outcome.message} (a call generating {n_new} tokens{after})", scaling=timing)
    if outcome.limit == "wall":
        message = f"the call generating {n_new} tokens{after} {outcome.message}: the wall-clock backstop, not a verdict"
        return fail(run.stage, "machine-busy", BUSY, message, timing, status=Status.TIMEOUT)
    step_ms = 1000 * run.costs.step
    rate = run.short_rate()  # CPU s per token at the shortest length
    if n_new != run.spec.lengths[-1] or prompt:
        message = (
            f"the call generating {n_new} tokens{after} was stopped after {used:.3g} s of CPU, its budget (the oracle's "
            f"single-token step costs {step_ms:.3g} ms here)"
        )
        return fail(run.stage, "too-slow", TOO_SLOW, message, timing)
    recompute = run.costs.recompute[n_new]
    floor = (
        f"(b) fails: it passed {used / recompute:.0%} of a full recompute of those tokens by the oracle here in "
        f"{run.costs.dtype} ({recompute:.3g} s), and at most {run.spec.max_fraction:.0%} passes"
    )
    grown = _grown(run, used, n_new)
    if grown:
        message = f"the {n_new}-token call was stopped after {used:.3g} s of CPU, {grown}: {floor}"
        return fail(run.stage, "no-cache", NO_CACHE, message, timing)
    per_token = f"{1000 * rate:.3g} ms per token at {run.spec.lengths[0]} tokens" if rate else "no call finished"
    run.flat_stop = True
    message = (
        f"the {n_new}-token call was stopped after {used:.3g} s of CPU ({per_token}, flat; the oracle's "
        f"single-token step costs {step_ms:.3g} ms here): {floor}"
    )
    return fail(run.stage, "too-slow", TOO_SLOW, message, timing)


def _grown(run: CostCase, used: float, n_new: int) -> str:
    """Why the stopped longest call is a recompute's (its cost grew with position), or "" if the calls do not show it."""
    rate, first = run.short_rate(), run.spec.lengths[0]
    if rate is None:
        return ""
    if used > _GROWN * rate * n_new:  # (a short call the kernel counted no CPU for: any stop is growth)
        times = f"{used / (rate * n_new):.1f}×" if rate > 0 else "many times"
        return f"{times} what {n_new} tokens cost at the {first}-token calls' rate ({1000 * rate:.3g} ms per token)"
    growth = run.growth()
    return _growth_said(run, growth) if growth is not None and growth > _GROWTH else ""


def _growth_said(run: CostCase, growth: float) -> str:
    """The diagnostic calls' finding, in words."""
    return (
        f"a token after a {run.diagnostic_prompt()}-token prompt costs {growth:.1f}× "
        f"what one costs in the {run.spec.lengths[0]}-token calls (from the diagnostic calls; with a cache a decode "
        f"step costs about the same at any position, and over {_GROWTH:g}× is a recompute's)"
    )
