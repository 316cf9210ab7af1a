"""The cache-scaling stage: does the student's generation cost what a cache costs?

Outputs cannot tell a cache from a recompute; cost can, if the cost is the kernel's and the inputs
are the grader's. The grader drives one worker call by call (theinference.proc.calls): an untimed
warm-up on the case's prompt, then `repeats` rounds of one call per length, each on a fresh random
prompt sent only when the call starts (nothing can be computed ahead or reused). Each call's cost
is the CPU the kernel counted for the student's whole process tree during it, read by the grader.
Every call's tokens are checked against the oracle (teacher-forced) before the next is sent.

Two tests, both required:
  (a) flat: per-token CPU at the longest length over that at the shortest is at most max_ratio;
  (b) floor: the longest call's CPU is at most max_fraction of a full recompute of the same tokens
      by the oracle, measured here now with one BLAS thread. Padding short calls flattens (a),
      never beats (b).
Budgets are CPU seconds; the wall-clock limit is a backstop that says "busy machine", never
"no cache".
"""

import dataclasses
import random
import time

from theinference.grading.results import CaseResult, Diagnosis, ScalingResult, Status, TimedCall
from theinference.grading.stages import CaseSpec, StageSpec
from theinference.grading.verification import check_steps, token_problem
from theinference.model import gpt2 as oracle
from theinference.model.weights import Model, load_model
from theinference.model.weights_choice import WeightsChoice, ensure_weights, synthetic_path
from theinference.proc import protocol
from theinference.proc.calls import Budget, CallSession
from theinference.proc.node import is_node_adapters
from theinference.proc.runner import MONITOR_LOST, AdapterJob, CallOutcome

_NO_CACHE = (
    "the cost of a token grows with its position, as it does when every step recomputes the "
    "whole sequence. With a cache, token k costs about the same as token 1."
)
_OVER_FLOOR = (
    "the generation costs too large a part of a full recompute of the same tokens: a cache does the same "
    "work for a small fraction of it. The per-token cost may look flat (short calls padded, or every token "
    "slow), but the total cannot be faked."
)
_TOO_SLOW = (
    "every token costs far more than the oracle's single-token step on this machine, so the cost cannot show "
    "whether there is a cache. Common causes: float64 arithmetic (a NumPy float64 scalar such as "
    "`1.0 / np.sqrt(head_dim)` promotes float32 activations, and every matmul then converts the weights), "
    "copying the whole cache at every step, or Python loops over elements."
)
_BUSY = "the machine was too busy to finish, or the code waited (sleep, I/O): re-run when it is quieter"
_KILL_AT = 1.0  # the longest call is stopped at this multiple of max_fraction of a full recompute: over (b)
_GROWN = 2.0  # a stopped call whose cost passed this multiple of its length at the short rate grew with position
_CHEAP = 4.0  # short calls at most this many oracle single-token steps per token cost what a cache's do
# The TypeScript edition runs on Node, whose arithmetic costs about 3.5x numpy's on these shapes (the reference
# caches: 9-15% of the numpy oracle's recompute in Python, 31-35% in TypeScript): (b)'s floor and the cheap
# rate are measured against the numpy oracle, so for Node they are scaled by this factor.
NODE_FACTOR = 3.0


# Transformer work per token (12 · n_layer · n_embd² MACs) at least this fraction of the LM head's
# (n_vocab · n_embd): below it the cost of a token is mostly the LM head, which a cache cannot save.
_SEPARATES = 0.25
PROOF_PRESET = "proof"


def separates(model: Model) -> bool:
    """Whether on these weights a cache's cost can be told from a recompute's (the layers are a fair part of a token)."""
    config = model.config
    return 12 * config.n_layer * config.n_embd >= _SEPARATES * config.n_vocab


def proof_model(stage: StageSpec, model: Model, cache) -> tuple[Model, str]:
    """The weights the stage runs on, and why: the proof preset, or the graded weights where asked and they separate."""
    assert stage.scaling is not None, "cache-scaling stages only"
    if stage.scaling.weights == "graded" and separates(model):
        return model, ""

    def load() -> Model:
        # Never through resolve_weights: a file named like the preset in the working directory would win there.
        choice = WeightsChoice(synthetic_path(PROOF_PRESET), "synthetic-preset", "cache-scaling", PROOF_PRESET)
        ensure_weights(choice)
        return load_model(choice.path)

    proof = cache.memo(("proof-model",), load)
    if stage.scaling.weights == "proof":
        why = (
            f"run on the synthetic '{PROOF_PRESET}' preset, the cache proof's own weights (its thresholds were "
            "measured there; a cache is a cache on any weights)"
        )
        return proof, why
    layers = 12 * model.config.n_layer * model.config.n_embd
    share = model.config.n_vocab / (layers + model.config.n_vocab)
    why = (
        f"run on the synthetic '{PROOF_PRESET}' preset: on the graded weights the LM head is {share:.0%} of a "
        "token's work, which a cache cannot save, so cost cannot tell a cache from a recompute there"
    )
    return proof, why


def fit_to_context(stage: StageSpec, n_ctx: int) -> StageSpec:
    """The stage with its lengths scaled down in proportion where a prompt would overflow n_ctx."""
    spec = stage.scaling
    if spec is None:
        return stage
    longest_prompt = max([spec.prompt_tokens, *(len(case.inputs["prompt"]) for case in stage.cases)])
    room = n_ctx - longest_prompt + 1
    if spec.lengths[-1] <= room:
        return stage
    factor = room / spec.lengths[-1]
    lengths = sorted({max(1, int(n * factor)) for n in spec.lengths})
    if len(lengths) < 2:
        return stage  # too little room to scale into: check_case_fits reports the overflow
    cases = tuple(dataclasses.replace(c, inputs={**c.inputs, "n_new": lengths[-1]}) for c in stage.cases)
    return dataclasses.replace(stage, scaling=dataclasses.replace(spec, lengths=tuple(lengths)), cases=cases)


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


def recompute_seconds(model: Model, prompt_tokens: int, n_new: int) -> float:
    """CPU seconds (one BLAS thread) for the oracle to generate n_new tokens by full recompute, measured now.

    Step k of a careful recompute runs every layer over prompt + k tokens and the LM head on the last row
    only. Its cost grows about linearly with length, so the n steps cost about n forwards at the middle
    length: that forward is timed and multiplied by n_new.
    """
    ids = [0] * (prompt_tokens + n_new // 2)
    return n_new * _single_thread_cpu(
        lambda: oracle.logits(model.params, ids, model.config.n_head, rows=slice(len(ids) - 1, len(ids)))
    )


def step_seconds(model: Model) -> float:
    """CPU seconds (one BLAS thread) of one single-token forward here: about what a cached token costs."""
    return _single_thread_cpu(lambda: oracle.logits(model.params, [0], model.config.n_head), repeats=5)


@dataclasses.dataclass
class _Costs:
    """What the oracle's costs are on this machine now, per stage run."""

    recompute: dict[int, float]  # n_new -> CPU seconds of a full recompute
    step: float


def _costs(stage: StageSpec, model: Model, cache) -> _Costs:
    spec = stage.scaling
    assert spec is not None, "cache-scaling stages only"

    def measure() -> _Costs:
        return _Costs({n: recompute_seconds(model, spec.prompt_tokens, n) for n in spec.lengths}, step_seconds(model))

    # Kept for the session (watch, a batch) only: it is a timing of this machine, measured where it is used.
    return cache.memo(("scaling-costs", str(model.path), model.stamp, spec.prompt_tokens, spec.lengths), measure)


def _budget(cpu: float, timeout: float) -> Budget:
    """A call's CPU budget, and the stage's timeout for time not spent on a CPU (a call that waits)."""
    return Budget(cpu=cpu, timeout=max(cpu, timeout))


def _fresh_prompt(rng: random.Random, length: int, n_vocab: int) -> list[int]:
    return [rng.randrange(n_vocab) for _ in range(length)]


class _Run:
    """One case of the stage: the session, the calls so far, and the verdict they lead to."""

    def __init__(self, stage: StageSpec, ctx, result: CaseResult, timeout: float, weights_note: str):
        assert stage.scaling is not None and stage.tie_rtol is not None, "cache-scaling stages only"
        self.stage, self.spec, self.ctx, self.result = stage, stage.scaling, ctx, result
        self.factor = NODE_FACTOR if is_node_adapters(ctx.course.adapters) else 1.0
        if self.factor != 1.0:
            self.spec = dataclasses.replace(self.spec, max_fraction=self.spec.max_fraction * self.factor)
            weights_note += (
                f"{'; ' if weights_note else ''}TypeScript edition: (b)'s floor is {self.factor:g}× the Python "
                "edition's, as Node's arithmetic costs about that much more than numpy's"
            )
        self.timeout = timeout
        self.calls: list[TimedCall] = []
        self.costs = _costs(stage, ctx.model, ctx.cache)
        self.accounting = ""
        self.weights_note = weights_note

    def timed_budget(self, n_new: int) -> Budget:
        """A short call may use the stage's timeout in CPU; the longest is stopped once it is surely over (b)."""
        if n_new != self.spec.lengths[-1]:
            return _budget(self.timeout, self.timeout)
        return _budget(min(self.timeout, _KILL_AT * self.spec.max_fraction * self.costs.recompute[n_new]), self.timeout)

    def tokens_right(self, outcome: CallOutcome, prompt: list[int], n_new: int, what: str) -> bool:
        """Whether the call returned n_new tokens the oracle agrees with; if not, the case fails, said briefly."""
        assert outcome.value is not None, 'an "ok" outcome carries the adapter\'s array'
        model = self.ctx.model
        problem = token_problem(outcome.value, n_new, model.config.n_vocab)
        tie = self.stage.tie_rtol or 0.0
        steps = [] if problem else check_steps(model, prompt, [int(t) for t in outcome.value], tie)
        if not problem and steps[-1].verdict != "mismatch":
            return True
        why = problem or (
            f"token {len(steps) - 1} of {n_new} is {steps[-1].got}, the oracle's greedy choice is {steps[-1].expected}"
        )
        self.result.status, self.result.detail = Status.FAIL, "token-mismatch"
        self.result.message = f"{what}: {why}; the timing was not judged"
        self.result.diagnosis = Diagnosis(
            shape="token-mismatch",
            summary="the tokens are wrong, so the cost of generating them says nothing; pass the greedy stage first",
            hint=self.stage.hints.get("token-mismatch", ""),
        )
        return False

    def scaling_result(self, stopped_at: int | None = None) -> ScalingResult:
        best = {n: min((c.cpu_seconds for c in self.calls if c.n_new == n), default=0.0) for n in self.spec.lengths}
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
        )


def _fail(result: CaseResult, stage: StageSpec, shape: str, summary: str, message: str, status=Status.FAIL) -> None:
    result.status, result.message = status, message
    result.diagnosis = Diagnosis(shape=shape, summary=summary, hint=stage.hints.get(shape, ""))


def judge(result: CaseResult, stage: StageSpec, scaling: ScalingResult) -> None:
    """Given every timed call with right tokens: pass, or fail on (a) or (b), stated in numbers."""
    result.scaling = scaling
    first, last = scaling.lengths[0], scaling.lengths[-1]
    fraction = scaling.fraction if scaling.fraction is not None else 0.0
    if scaling.ratio > scaling.max_ratio:
        message = (
            f"per-token CPU grows {scaling.ratio:.1f}× from {first} to {last} tokens "
            f"(at most {scaling.max_ratio:g}× passes)"
        )
        _fail(result, stage, "no-cache", _NO_CACHE, message)
    elif fraction > scaling.max_fraction:
        message = (
            f"the {last}-token generation used {scaling.seconds[-1]:.3g} s of CPU, {fraction:.0%} of a full recompute "
            f"of those tokens by the oracle here ({scaling.oracle_seconds:.3g} s); at most {scaling.max_fraction:.0%} "
            f"passes. Per token: {scaling.ms_per_token[-1]:.3g} ms, the oracle's single-token step "
            f"{scaling.step_ms:.3g} ms"
        )
        _fail(result, stage, "no-cache", _OVER_FLOOR, message)
    else:
        result.status = Status.PASS


def judge_stopped(result: CaseResult, run: _Run, outcome: CallOutcome, n_new: int) -> None:
    """A timed call stopped at a budget: no cache, too slow to tell, or a busy machine, as the evidence says."""
    used = outcome.cpu_seconds or 0.0
    run.calls.append(TimedCall(n_new, used, outcome.seconds, stopped=True))
    result.scaling = run.scaling_result(stopped_at=n_new)
    if outcome.limit == "time":  # past the timeout without using the CPU for it: the code waited
        result.status, result.message = Status.TIMEOUT, f"{outcome.message} (a call generating {n_new} tokens)"
        return
    if outcome.limit == "wall":
        message = f"the call generating {n_new} tokens {outcome.message}: the wall-clock backstop, not a verdict"
        _fail(result, run.stage, "machine-busy", _BUSY, message, status=Status.TIMEOUT)
        return
    step_ms = 1000 * run.costs.step
    short = [c for c in run.calls if c.n_new == run.spec.lengths[0] and not c.stopped]
    rate = min((c.cpu_seconds / c.n_new for c in short), default=None)  # CPU s per token at the shortest length
    if n_new != run.spec.lengths[-1]:
        message = (
            f"the call generating {n_new} tokens was stopped after {used:.3g} s of CPU, its budget (the oracle's "
            f"single-token step costs {step_ms:.3g} ms here)"
        )
        _fail(result, run.stage, "too-slow", _TOO_SLOW, message)
        return
    recompute = run.costs.recompute[n_new]
    floor = (
        f"(b) fails: it passed {used / recompute:.0%} of a full recompute of those tokens by the oracle here "
        f"({recompute:.3g} s), and at most {run.spec.max_fraction:.0%} passes"
    )
    if rate is not None and (used > _GROWN * rate * n_new or rate <= _CHEAP * run.factor * run.costs.step):
        message = (
            f"the {n_new}-token call was stopped after {used:.3g} s of CPU, {used / (rate * n_new):.1f}× what "
            f"{n_new} tokens cost at the {run.spec.lengths[0]}-token calls' rate ({1000 * rate:.3g} ms per token, "
            f"{rate / run.costs.step:.1f} oracle single-token steps): {floor}"
        )
        _fail(result, run.stage, "no-cache", _NO_CACHE, message)
        return
    per_token = f"{1000 * rate:.3g} ms per token at {run.spec.lengths[0]} tokens" if rate else "no call finished"
    message = (
        f"the {n_new}-token call was stopped after {used:.3g} s of CPU ({per_token}, flat; the oracle's "
        f"single-token step costs {step_ms:.3g} ms here): {floor}"
    )
    _fail(result, run.stage, "too-slow", _TOO_SLOW, message)


def _ended(result: CaseResult, outcome: CallOutcome, what: str) -> None:
    """A call that ended in an error, a crash or bad output: the student's status, with its message."""
    result.status = Status.FAIL if outcome.status == protocol.BAD_OUTPUT else outcome.status
    result.message = ": ".join(part for part in (what, outcome.message) if part)
    result.traceback, result.stdout, result.stderr = outcome.traceback, outcome.stdout, outcome.stderr


def _timed_rounds(session: CallSession, run: _Run, rng: random.Random, output_cap) -> None:
    spec, result, n_vocab = run.spec, run.result, run.ctx.model.config.n_vocab
    index = 1
    for _ in range(spec.repeats):
        for n_new in spec.lengths:
            prompt = _fresh_prompt(rng, spec.prompt_tokens, n_vocab)
            outcome = session.call(index, [prompt, n_new], output_cap(n_new), run.timed_budget(n_new))
            index += 1
            what = f"timed call {index - 1} ({n_new} tokens after {spec.prompt_tokens} random ones)"
            if outcome.status == protocol.TIMEOUT and outcome.limit:
                judge_stopped(result, run, outcome, n_new)
                return
            if outcome.status != protocol.OK:
                _ended(result, outcome, what)
                return
            if not run.tokens_right(outcome, prompt, n_new, what):
                return
            run.calls.append(TimedCall(n_new, outcome.cpu_seconds or 0.0, outcome.seconds))
    judge(result, run.stage, run.scaling_result())


def grade_case(
    stage: StageSpec, ctx, index: int, job: AdapterJob, output_cap, weights_note: str = ""
) -> tuple[CaseResult, CallOutcome]:
    """Run one case of a cache-scaling stage: warm-up, timed rounds, verdict. Never raises for student faults.

    ctx.model and job.weights are the weights the stage runs on (proof_model's choice).
    """
    case = stage.cases[index]
    result = CaseResult(name=case.name, status=Status.PASS, inputs=case.inputs, texts=case.texts)
    run = _Run(stage, ctx, result, job.timeout, weights_note)
    if job.on_event is not None:  # the live line: the case runs from the worker's start to its last call
        job.on_event(protocol.START, index)
    try:
        return _run_case(run, case, job, output_cap)
    finally:
        if job.on_event is not None:
            job.on_event(protocol.DONE, index)


def _run_case(run: _Run, case: CaseSpec, job: AdapterJob, output_cap) -> tuple[CaseResult, CallOutcome]:
    result = run.result
    warm_n = run.spec.lengths[0]
    with CallSession(job, _budget(job.timeout, job.timeout)) as session:
        run.accounting = session.accounting
        if session.failure is not None:  # the adapters did not load: the import's error is the verdict
            outcome = session.failure
            _ended(result, outcome, "")
            return result, outcome
        outcome = session.call(
            0, [case.inputs["prompt"], warm_n], output_cap(warm_n), _budget(job.timeout, job.timeout)
        )
        if outcome.status == protocol.TIMEOUT and outcome.limit:
            judge_stopped(result, run, outcome, warm_n)
        elif outcome.status != protocol.OK:
            _ended(result, outcome, "the warm-up call")
        elif run.tokens_right(outcome, case.inputs["prompt"], warm_n, f"the warm-up call on {case.name!r}"):
            _timed_rounds(session, run, random.SystemRandom(), output_cap)
        whole = session.output()  # what the student's code printed in every call, not only the last
        result.stdout, result.stderr = whole.stdout, whole.stderr
    if session.monitor_lost:  # known once the worker is gone: whatever its calls showed, none of it counts
        outcome = CallOutcome(status=protocol.ERROR, message=MONITOR_LOST)
        result.status, result.message, result.scaling, result.diagnosis = Status.ERROR, MONITOR_LOST, None, None
    return result, outcome
