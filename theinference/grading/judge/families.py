"""Parametric fingerprints: families of mistakes whose parameter is fitted from the failing output.

A listed bug is a point; the mistakes students make are families: a wrong constant (the attention
scale), an offset (a position, the mask's diagonal), the wrong tensor of a matching shape (which
layer norm's parameters, which third of c_attn is q), a wrong count (heads). Each family proposes
candidates from the model's dimensions and the case's schedule (theinference.model.variant computes
them); a candidate is screened on the cheapest failing case, and claimed only when it reproduces
the student's output at the stage's tolerance in every case read, exactly as a listed bug is. The
attention scale is also fitted as a number when no formula reproduces it.
"""

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from theinference.grading.oracle.registry import SCHEDULES
from theinference.model import variant as model_variant
from theinference.grading.judge import positions
from theinference.model.variant import Variant, counted
from theinference.model.weights import Model

LAYER0 = tuple(name for name, schedule in SCHEDULES.items() if schedule.layer0)
SUPPORTED = tuple(SCHEDULES)  # every built-in oracle that is one causal pass


@dataclass(frozen=True)
class Candidate:
    family: str  # the bug name a finding reports
    finding: str  # completes "your output equals GPT-2 with ..."
    make: Callable[[dict], Variant]  # the case's inputs -> the variant (positions depend on the case)


def variant_output(
    model: Model,
    oracle_name: str,
    inputs: dict,
    variant: Variant,
    row: int | None = None,
    columns=None,
    float64: bool = False,
) -> np.ndarray:
    """What the stage's adapter returns for these inputs with the variant's mistake: one causal pass.

    row, columns: only that row of a multi-row output, and of logits only those vocabulary columns
    (screening: a necessary condition at a fraction of the LM head's cost). float64: the layers computed in
    float64 instead of the weights' float32 (a mistake that makes the model ill-conditioned, a layer norm fed the
    wrong parameters, can separate the two by more than the stage's tolerance).
    """
    return variant_outputs(model, oracle_name, inputs, [variant], row, columns, float64)[0]


def variant_outputs(
    model: Model,
    oracle_name: str,
    inputs: dict,
    variants: list[Variant],
    row: int | None = None,
    columns=None,
    float64: bool = False,
) -> list[np.ndarray]:
    """variant_output for each variant, in one pass over the weights for all of them."""
    schedule = SCHEDULES[oracle_name]
    ids, own = schedule.consumed(inputs), schedule.rows(inputs)
    variants = [replace(v, prefill=schedule.prefill(inputs)) for v in variants]
    params, n_head, dtype = model.params, model.config.n_head, np.float64 if float64 else np.float32
    if oracle_name in LAYER0:
        outs = [
            o[own] for o in model_variant.layer0_attn_sublayer_many(params, [(ids, v) for v in variants], n_head, dtype)
        ]
        return [o if row is None or o.ndim == 1 else o[row] for o in outs]
    if isinstance(own, slice) and row is not None:
        own = int(own.start) + row
    if isinstance(own, slice):
        hidden = model_variant.hidden_states_many(params, [(ids, v) for v in variants], n_head, dtype)
        return [model_variant.lm_head(params, h[own], columns) for h in hidden]
    at = int(own)  # one row: an int
    runs = [_truncated(ids, v, at, model.config.n_layer) for v in variants]
    hidden = model_variant.hidden_states_many(params, runs, n_head, dtype)
    return list(model_variant.lm_head(params, np.stack([h[at] for h in hidden]), columns))


def case_outputs(
    model: Model, oracle_name: str, runs: list[tuple[dict, Variant]], float64: bool = False
) -> Iterator[np.ndarray]:
    """variant_output (whole) for each (inputs, variant) of several cases, their layers in one pass over the weights
    for all of them (a float64 pass casts each weight to float64 once, not once per case); the LM head is applied to
    each case's rows only when its output is asked for, so a caller that stops at a case that does not match
    spends no LM head on the cases after it."""
    schedule = SCHEDULES[oracle_name]
    params, n_head, dtype = model.params, model.config.n_head, np.float64 if float64 else np.float32
    passes, owns = [], []
    for inputs, variant in runs:
        ids, own = schedule.consumed(inputs), schedule.rows(inputs)
        variant = replace(variant, prefill=schedule.prefill(inputs))
        if oracle_name in LAYER0 or isinstance(own, slice):
            passes.append((ids, variant))
        else:  # one row: only the rows it depends on, as variant_output computes it
            passes.append(_truncated(ids, variant, int(own), model.config.n_layer))
        owns.append(own)
    if oracle_name in LAYER0:
        yield from (
            o[own] for o, own in zip(model_variant.layer0_attn_sublayer_many(params, passes, n_head, dtype), owns)
        )
        return
    for h, own in zip(model_variant.hidden_states_many(params, passes, n_head, dtype), owns):
        yield (
            model_variant.lm_head(params, h[own])
            if isinstance(own, slice)
            else model_variant.lm_head(params, h[own][None])[0]
        )


def screen_positions(oracle_name: str, inputs: dict, row: int | None) -> int:
    """How many positions a screen on this row of a multi-row output computes (attention is causal: those up to the
    row), which is what screening every candidate there costs. 0 (no case is cheaper: the smallest output's is kept)
    for a screen that is not one row of several, an output of one row (decode-step: its shortest prompt screened
    worse, more candidates passing to a whole verification), and an oracle the families cannot compute."""
    if oracle_name not in SCHEDULES or row is None:
        return 0
    own = SCHEDULES[oracle_name].rows(inputs)
    return int(own.start) + row + 1 if isinstance(own, slice) else 0


def _truncated(ids: list, variant: Variant, at: int, n_layer: int) -> tuple[list, Variant]:
    """Only the rows row `at` depends on: attention is causal, so none after it (screening one early row of a
    long case costs a few positions, not all of them), except the block rows a mask that sees ahead lets in,
    once per layer, and the whole block when the mask leaves a row no key (that row sees every key present)."""
    keep, ahead = at + 1, variant.mask_block
    if at < variant.prefill:
        keep = variant.prefill if ahead is None or ahead < 0 else min(variant.prefill, at + 1 + ahead * n_layer)
    keep = min(keep, len(ids))
    positions = None if variant.positions is None else variant.positions[:keep]
    return ids[:keep], replace(variant, prefill=min(variant.prefill, keep), positions=positions)


def _fixed(variant: Variant) -> Callable[[dict], Variant]:
    """The same variant whatever the case."""
    return lambda inputs: variant


def _schedule(oracle_name: str, inputs: dict) -> tuple[int, int]:
    schedule = SCHEDULES[oracle_name]
    return len(schedule.consumed(inputs)), schedule.prefill(inputs)


# --- attention scale -------------------------------------------------------------------------------


def scale_formulas(model: Model) -> list[tuple[str, float]]:
    """The constants a student may scale the scores by, with the formula each is (the right one first)."""
    c = model.config
    head_dim = c.n_embd // c.n_head
    named = [
        ("1/sqrt(head_dim)", 1 / math.sqrt(head_dim)),
        ("1 (no scale)", 1.0),
        ("1/sqrt(n_embd)", 1 / math.sqrt(c.n_embd)),
        ("1/n_head", 1 / c.n_head),
        ("1/head_dim", 1 / head_dim),
        ("1/sqrt(n_head)", 1 / math.sqrt(c.n_head)),
        ("sqrt(head_dim) (multiplied, not divided)", math.sqrt(head_dim)),
        ("1/n_embd", 1 / c.n_embd),
    ]
    seen: list[tuple[str, float]] = []
    for name, value in named:  # keep the first name of each distinct value
        if all(abs(value - v) > 1e-9 * v for _, v in seen):
            seen.append((name, value))
    return seen


def describe_scale(model: Model, value: float) -> str:
    """'0.0884 = 1/sqrt(n_embd)', or the value and that it is none of the usual formulas."""
    for name, formula in scale_formulas(model):
        if abs(value - formula) <= 2e-3 * formula:
            return f"c = {value:.4g} = {name}"
    return f"c = {value:.4g} (none of 1/sqrt(head_dim), 1/sqrt(n_embd), 1/n_head, 1/head_dim, 1)"


def _scale_paths(oracle_name: str) -> list[tuple[str, Callable[[float], Variant]]]:
    both = ("on the attention scores", lambda c: Variant(scale_block=c, scale_decode=c))
    decode = (
        "on the single-query decode steps' scores (the block has the right one)",
        lambda c: Variant(scale_decode=c),
    )
    if oracle_name == "logits":
        return [("on the attention scores", lambda c: Variant(scale_block=c))]
    if oracle_name == "layer0-attn-sublayer":
        return [both]
    return [both, decode]


def scale_candidates(model: Model, oracle_name: str) -> Iterator[Candidate]:
    right = scale_formulas(model)[0][1]
    for where, make in _scale_paths(oracle_name):
        for name, value in scale_formulas(model)[1:]:
            text = (
                f"the attention scale {describe_scale(model, value)} instead of 1/sqrt(head_dim) = {right:.4g} {where}"
            )
            yield Candidate("attention-scale", text, _fixed(make(value)))


def fit_scale(
    model: Model,
    oracle_name: str,
    inputs: dict,
    got: np.ndarray,
    row=None,
    columns=None,
    enough: float = 0.0,
    rounds: int = 9,
) -> Iterator[Candidate]:
    """The scale c that best reproduces one case (got: its row and columns, if given), per path: a coarse grid in
    log c, then rounds of a grid three times finer around the best point so far (each grid one pass for all its
    points; nine rounds narrow log10 c to 2.5e-5), until one reproduces got to within `enough`."""
    right = scale_formulas(model)[0][1]
    for where, make in _scale_paths(oracle_name):
        tried: dict[float, float] = {}

        def measure(xs, make=make, tried=tried) -> None:
            outs = variant_outputs(model, oracle_name, inputs, [make(10.0**x) for x in xs], row, columns)
            for x, out in zip(xs, outs):
                tried[float(x)] = float(np.max(np.abs(out.astype(np.float64) - got)))

        step = 0.5
        measure(np.linspace(-3.0, 1.0, 9))
        for _ in range(rounds):
            best, step = min(tried, key=tried.__getitem__), step / 3
            if tried[best] <= enough:
                break
            measure([best + k * step for k in (-3, -2, -1, 1, 2, 3)])
        value = 10.0 ** min(tried, key=tried.__getitem__)
        if abs(value - right) <= 1e-3 * right:
            continue
        text = f"the attention scale {describe_scale(model, value)} instead of 1/sqrt(head_dim) = {right:.4g} {where}"
        yield Candidate("attention-scale", text, _fixed(make(value)))


# --- positions -------------------------------------------------------------------------------------


def _position_text(block: int, base: str, slope: int, k: int, n_layer: int) -> str:
    parts = []
    if block:
        parts.append(f"the block's position i embedded at wpe[i {'+' if block > 0 else '-'} {abs(block)}]")
    if base:
        expr, why = positions.expression(base, slope, k, n_layer), positions.WHY[base, slope][0]
        parts.append(f"decode step i embedded at wpe[{expr}] instead of wpe[len(prompt) + i]: {why}")
    return "; ".join(parts)


def position_candidates(model: Model, oracle_name: str) -> Iterator[Candidate]:
    n_layer = model.config.n_layer
    blocks = (0, 1, -1, 2)
    decodes: list[tuple[str, int, int]] = [("", 1, 0)]
    if oracle_name != "logits":
        decodes.extend(positions.counters())
    for block in blocks if oracle_name not in ("layer0-attn-sublayer",) else (0,):
        for base, slope, k in decodes:
            if not block and not base:
                continue

            def make(inputs, block=block, base=base, slope=slope, k=k) -> Variant:
                n, prefill = _schedule(oracle_name, inputs)
                steps = counted(base or "prompt", slope, k, prefill, n - prefill, n_layer)
                return Variant(positions=(*(i + block for i in range(prefill)), *steps))

            yield Candidate("position-offset", _position_text(block, base, slope, k, n_layer), make)


def stuck_candidates(model: Model, oracle_name: str) -> Iterator[Candidate]:
    """A decode position counter stuck at len(prompt) + k that also builds the decode mask (a loop passing one
    `start` to both wpe and `j <= start + i`): every decode step is embedded at that position and sees only the
    keys up to it, so from the step after it on it sees neither itself nor the tokens decoded before it. (A stuck
    counter the mask does not read, the mask built from the cache's length, is the listed bug position-stuck and
    position-offset's wpe[len(prompt) + k].)"""
    if oracle_name != "per-step-logits":  # a counter stands still over several decode steps (decode-step has one)
        return
    for k in (0, 1, -1, 2):
        at = f"len(prompt) {'+' if k > 0 else '-'} {abs(k)}" if k else "len(prompt)"
        text = (
            f"every decode step embedded at wpe[{at}] and its causal mask built from the same stuck counter "
            f"(it sees keys 0..{at} only): the position does not advance"
        )

        def make(inputs, k=k) -> Variant:
            n, prefill = _schedule(oracle_name, inputs)
            pos = tuple(range(prefill)) + (prefill + k,) * (n - prefill)
            return Variant(positions=pos, mask_counter=True)

        yield Candidate("position-stuck", text, make)


# --- layer norms, mask, q/k/v, heads ----------------------------------------------------------------


def norm_candidates(model: Model, oracle_name: str) -> Iterator[Candidate]:
    wrong = [
        ("ln_2", "ln_2", "ln_f"),
        ("ln_f", "ln_2", "ln_f"),
        ("ln_1", "ln_1", "ln_f"),
        ("ln_1", "ln_f", "ln_f"),
        ("ln_2", "ln_1", "ln_f"),
        ("ln_1", "ln_2", "ln_2"),
    ]
    if oracle_name in LAYER0:
        wrong = [w for w in wrong if w[0] != "ln_1"]
    paths = [("", "all")] if oracle_name == "logits" else [("", "all"), (" on the decode steps only", "decode")]
    for norms in wrong:
        slots = ", ".join(
            f"{used}'s parameters in {slot}" for slot, used in zip(("ln_1", "ln_2", "ln_f"), norms) if slot != used
        )
        for where, path in paths:
            text = f"the wrong layer norm: {slots}{where}"

            def make(inputs, norms=norms, path=path) -> Variant:
                return (
                    Variant(norms_decode=norms) if path == "decode" else Variant(norms_block=norms, norms_decode=norms)
                )

            yield Candidate("layer-norm-params", text, make)


def mask_candidates(model: Model, oracle_name: str) -> Iterator[Candidate]:
    options: list[tuple[int | None, int, str]] = [
        (-1, 0, "the causal mask's diagonal offset -1 (np.triu(..., k=0) masks the diagonal): no token sees itself"),
        (1, 0, "the causal mask's diagonal offset +1 (np.triu(..., k=2)): each position also sees the next one"),
        (None, 0, "no causal mask on the block: every position sees the whole sequence"),
    ]
    if oracle_name != "logits":
        options.append((-1, -1, "a causal mask off by one in the block and the decode steps: no token sees itself"))
    for block, decode, text in options:
        yield Candidate("mask-diagonal", text, _fixed(Variant(mask_block=block, mask_decode=decode)))
        if block == -1:  # row 0 sees no key: with the mask added in float64, it sees every key unmasked
            yield Candidate(
                "mask-diagonal",
                f"{text}, and row 0, left no key, attending to every key unmasked (the mask added in float64)",
                _fixed(Variant(mask_block=block, mask_decode=decode, empty_rows="unmasked")),
            )


def qkv_candidates(model: Model, oracle_name: str) -> Iterator[Candidate]:
    names = "qkv"
    for interleaved in (False, True):
        for order in ((0, 1, 2), (1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1)):
            if order == (0, 1, 2) and not interleaved:
                continue
            split = "".join(names[order.index(i)] for i in range(3))
            layout = (
                "per head ([n, n_head, 3, head_dim]) instead of in thirds ([n, 3, n_head, head_dim])"
                if interleaved
                else "in thirds"
            )
            text = f"c_attn's output split as {split} (q, k, v = parts {order}) {layout}"
            yield Candidate("qkv-split", text, _fixed(Variant(qkv_order=order, qkv_interleaved=interleaved)))


def head_candidates(model: Model, oracle_name: str) -> Iterator[Candidate]:
    c = model.config
    head_dim = c.n_embd // c.n_head
    for n in dict.fromkeys((1, 2 * c.n_head, c.n_head // 2, head_dim, c.n_embd // 64)):
        if n < 1 or n == c.n_head or c.n_embd % n:
            continue
        text = f"{n} attention heads instead of n_head = {c.n_head} (head_dim {c.n_embd // n} instead of {head_dim})"
        yield Candidate("head-count", text, _fixed(Variant(n_head=n)))


FAMILIES = (
    scale_candidates,
    position_candidates,
    stuck_candidates,
    norm_candidates,
    mask_candidates,
    qkv_candidates,
    head_candidates,
)


def candidates(model: Model, oracle_name: str) -> list[Candidate]:
    """Every family's candidates for this oracle (none for an oracle the families cannot compute)."""
    if oracle_name not in SUPPORTED:
        return []
    return [cand for family in FAMILIES for cand in family(model, oracle_name)]
