"""GPT-2 with a student's mistake: the one parametrised forward pass beside the exact one (gpt2.py).

A `Variant` holds one parameter per kind of mistake; its default is GPT-2 itself, to the bit. Every
mistake the grader models is an instance: a named bug of fingerprinting (model/defective.py describes
each as a `Defects` and turns it into a Variant), a candidate of a family whose parameter is fitted
(grading/judge/families.py: the attention scale, the wpe row of every position, which layer norm's
parameters each slot uses, the causal mask's diagonal, how c_attn's output is split into q, k, v, the
number of heads) and a greedy loop's position mistake (grading/judge/loops.py).

As in gpt2.py, an incremental computation is one causal pass: the first `prefill` rows form one
block, every later row is a single-query decode step reading the cache of the rows before it
(attention is causal, so a row depends only on earlier rows, computed with the same mistake).
Several passes can run at once (`hidden_states_many`): their rows are stacked, so the weights are
read once for all of them, which is what makes screening dozens of candidates cheap.
"""

import math
from dataclasses import dataclass, replace

import numpy as np

from theinference.model.gpt2 import LN_EPS, gelu, linear, softmax

LN_SLOTS = ("ln_1", "ln_2", "ln_f")  # the slots of a layer's two norms and the final one, in order
GPT2_NORMS = ("ln_1", "ln_2", "ln_f")  # which parameters fill them in GPT-2


@dataclass(frozen=True)
class Variant:
    """A departure from GPT-2; every field defaults to GPT-2."""

    prefill: int = 0  # rows computed as one block before the single-query decode steps
    scale_block: float | None = None  # the block's score scale; None: 1/sqrt(head_dim)
    scale_decode: float | None = None  # ... and each decode step's
    positions: tuple[int, ...] | None = None  # the wpe row of every row (negative wraps as numpy indexes); None: 0..n-1
    norms_block: tuple[str, str, str] = GPT2_NORMS  # the parameters used in slots ln_1, ln_2, ln_f on the block's rows
    norms_decode: tuple[str, str, str] = GPT2_NORMS  # ... and on the decode rows ("none": no norm)
    mask_block: int | None = 0  # block row i sees block key j when j <= i + mask_block; None: no causal mask
    mask_decode: int = 0  # a decode row i sees key j when j <= i + mask_decode (<= 0)
    # The decode rows' mask built from the position counter (j <= the row's wpe position), not from the cache's
    # length: a stuck counter then also hides every key after the position it is stuck at.
    mask_counter: bool = False
    # Keys a decode step's query sees (every decode row but row 0): all | first (a re-applied causal mask) | earlier
    # (k/v appended after attention) | self (an empty cache) | decoded (a cache emptied after prefill)
    decode_keys: str = "all"
    qkv_order: tuple[int, int, int] = (0, 1, 2)  # which part of c_attn's split output is q, k, v
    qkv_interleaved: bool = (
        False  # c_attn's output read as [n, n_head, 3, head_dim] instead of [n, 3, n_head, head_dim]
    )
    n_head: int | None = None  # the heads the student splits into; None: the model's
    # A row the mask leaves no key: "uniform" weights over the keys present (a -1e10 mask added in float32
    # swamps the scores), or "unmasked" scores over them (the same mask added in float64 keeps their differences).
    empty_rows: str = "uniform"
    # "queries": the attention weights normalised over the query axis (softmax(scores, axis=-2)): in the block each
    # key's column sums to 1 over the queries that see it; a single-query decode step gives every key it sees weight 1.
    # "queries-sum": only the sum over the query axis, the max each query's own (e = exp(s - s.max(-1)); e / e.sum(-2)).
    softmax_axis: str = "keys"
    c_attn_transposed: bool = False  # each square q/k/v block of c_attn used transposed
    c_proj_transposed: bool = False  # the attention's square c_proj used transposed
    ln_eps: float = 1e-5
    gelu: str = "tanh"  # tanh | erf
    attn_residual: bool = True  # False: x = attn(ln_1(x)), the residual x + dropped
    mlp_residual: bool = True  # False: x = mlp(ln_2(x))


EXACT = Variant()


def counted(base: str, slope: int, k: int, prefill: int, steps: int, n_layer: int = 0) -> list[int]:
    """The wpe rows of `steps` decode steps under a position counter that starts at the prompt's length (base
    "prompt"), at 0 ("zero") or at the number of layers ("layers": len() of the wrong object), advances by slope a
    step and is off by k: ("prompt", 1, 0) is GPT-2's. Every position mistake, named or fitted, is one of these."""
    start = {"prompt": prefill, "zero": 0, "layers": n_layer}[base]
    return [start + slope * i + k for i in range(steps)]


_DECODE_KEYS = {  # (rows, cols, prefill) -> the keys a decode_keys mistake leaves a decode step
    "first": lambda rows, cols, prefill: cols == 0,
    "earlier": lambda rows, cols, prefill: cols < rows,
    "self": lambda rows, cols, prefill: cols == rows,
    "decoded": lambda rows, cols, prefill: (cols >= prefill) & (cols <= rows),
}


def gelu_erf(x):  # [..., n] -> [..., n]: the exact GELU, x Phi(x), where GPT-2 uses the tanh form
    # numpy has no erf: Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7) in float64.
    z = np.abs(x.astype(np.float64)) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    return (0.5 * x * (1.0 + erf)).astype(np.float32)


def _decode_rows(n_seq: int, variant: Variant) -> np.ndarray:  # [n_seq] bool
    return np.arange(n_seq) >= variant.prefill


def visible(n_seq: int, variant: Variant):  # -> ([n_seq, n_seq] bool keys each row's query sees, [n_seq] empty rows)
    rows, cols = np.arange(n_seq)[:, None], np.arange(n_seq)[None, :]
    present = np.where(rows < variant.prefill, cols < variant.prefill, cols <= rows)  # what the cache holds
    block = present if variant.mask_block is None else present & (cols <= rows + variant.mask_block)
    decode = present & (cols <= rows + variant.mask_decode)
    if variant.mask_counter and variant.positions is not None:
        decode &= cols <= np.asarray(variant.positions)[:, None]
    keys = np.where(rows < variant.prefill, block, decode)
    if variant.decode_keys != "all":
        stepped = (rows >= variant.prefill) & (rows > 0)
        keys = np.where(stepped, _DECODE_KEYS[variant.decode_keys](rows, cols, variant.prefill), keys)
    # A fully masked row under a large negative additive mask gets uniform weights over the keys present.
    empty = ~np.any(keys, axis=1)
    return np.where(empty[:, None], present, keys), empty


def _block_key(ids, variant: Variant):  # what a run's block rows depend on (None: it has no block)
    """Attention is causal and a block row sees only block keys, so runs with the same block ids and every field
    but the decode steps' equal compute the same block rows: computed once for all of them."""
    if variant.prefill <= 0:
        return None
    positions = variant.positions if variant.positions is not None else range(variant.prefill)
    block = tuple(int(p) for p in positions[: variant.prefill])
    decode_free = replace(
        variant,
        scale_decode=None,
        norms_decode=GPT2_NORMS,
        mask_decode=0,
        mask_counter=False,
        decode_keys="all",
        positions=block,
    )
    return tuple(int(t) for t in ids[: variant.prefill]), decode_free


def _attn_weights(attn: dict, variant: Variant) -> tuple[dict, dict]:  # c_attn and c_proj as the variant uses them
    c_attn, c_proj = attn["c_attn"], attn["c_proj"]
    if variant.c_attn_transposed:
        w = c_attn["weight"]
        c_attn = {**c_attn, "weight": np.concatenate([b.T for b in np.split(w, 3, axis=1)], axis=1)}
    if variant.c_proj_transposed:
        c_proj = {**c_proj, "weight": np.ascontiguousarray(c_proj["weight"].T)}
    return c_attn, c_proj


class _Runs:
    """Several (ids, variant) passes stacked row-wise, so each layer's weights are read once for all of them:
    screening many candidates costs one pass over the weights plus each one's attention, not one pass each. Runs
    whose block rows are the same (_block_key: candidates that differ only in the decode steps) share one copy of
    them unless share_blocks is False; each run's rows are `rows[i]` of the stack, and only the first run of a
    block writes that block's rows."""

    def __init__(self, params, runs: list[tuple[list, Variant]], dtype, share_blocks: bool = True):
        xs, self.rows, self.owns, n = [], [], [], 0
        blocks: dict[tuple, np.ndarray] = {}
        for ids, variant in runs:
            x, key = embed(params, ids, variant, dtype), _block_key(ids, variant) if share_blocks else None
            if key is not None and key in blocks:  # the block's rows are there already: only the decode rows
                rows = np.concatenate([blocks[key], np.arange(n, n + len(x) - variant.prefill)])
                own = np.arange(len(x)) >= variant.prefill
                x = x[variant.prefill :]
            else:
                rows, own = np.arange(n, n + len(x)), np.ones(len(x), bool)
                if key is not None:
                    blocks[key] = rows[: variant.prefill]
            xs.append(x)
            self.rows.append(rows)
            self.owns.append(own)
            n += len(x)
        self.variants = [variant for _, variant in runs]
        self.decodes = [_decode_rows(len(rows), variant) for rows, variant in zip(self.rows, self.variants)]
        self.visible = [visible(len(rows), variant) for rows, variant in zip(self.rows, self.variants)]  # every layer
        self.x = np.concatenate(xs)

    def _owned(self, keep) -> list[np.ndarray]:  # the stack's rows of each run that keep(variant) holds for
        return [rows[own] for rows, own, variant in zip(self.rows, self.owns, self.variants) if keep(variant)]

    def norm(self, x, slot: int, block: dict, params):  # [rows, n_embd] -> same, each run with its own parameters
        mean = x.mean(axis=-1, keepdims=True)
        centered = x - mean
        variance = np.mean(centered * centered, axis=-1, keepdims=True)
        normed = centered / np.sqrt(variance + LN_EPS)
        for eps in dict.fromkeys(np.float32(v.ln_eps) for v in self.variants if np.float32(v.ln_eps) != LN_EPS):
            at = np.concatenate(self._owned(lambda v, eps=eps: np.float32(v.ln_eps) == eps))
            normed[at] = centered[at] / np.sqrt(variance[at] + eps)

        def affine(name: str, at):
            if name == "none":
                return x[at]
            p = params["ln_f"] if name == "ln_f" else block[name]
            return normed[at] * p["weight"] + p["bias"]

        out = affine(GPT2_NORMS[slot], slice(None))  # then the rows of runs that use other parameters
        for rows, own, variant, decode in zip(self.rows, self.owns, self.variants, self.decodes):
            for names, which in ((variant.norms_block, ~decode), (variant.norms_decode, decode)):
                if names[slot] != GPT2_NORMS[slot] and (which & own).any():
                    at = rows[which & own]
                    out[at] = affine(names[slot], at)
        return out

    def linear(self, x, weights):  # linear per group of runs that use the same weights (weights(variant) -> its dict)
        versions = [weights(v) for v in self.variants]
        keys = list(dict.fromkeys(id(w["weight"]) for w in versions))
        if len(keys) == 1:
            return linear(x, **versions[0])
        out = None
        for key in keys:
            group = [i for i, w in enumerate(versions) if id(w["weight"]) == key]
            at = np.concatenate([self.rows[i][self.owns[i]] for i in group])
            part = linear(x[at], **versions[group[0]])
            out = np.empty((len(x), part.shape[1]), part.dtype) if out is None else out
            out[at] = part
        return out

    def attention(self, x, attn: dict, n_head: int):  # [rows, n_embd] -> same
        versions = {v: _attn_weights(attn, v) for v in dict.fromkeys(self.variants)}
        qkv = self.linear(x, lambda v: versions[v][0])
        heads = np.empty((len(x), qkv.shape[1] // 3), qkv.dtype)
        for rows, own, variant, decode, seen in zip(self.rows, self.owns, self.variants, self.decodes, self.visible):
            heads[rows[own]] = _attend(qkv[rows], n_head, variant, decode, seen)[own]
        return self.linear(heads, lambda v: versions[v][1])

    def mlp(self, x, mlp: dict):  # [rows, n_embd] -> same
        hidden = linear(x, **mlp["c_fc"])
        activated = gelu(hidden)
        for at in self._owned(lambda v: v.gelu == "erf"):
            activated[at] = gelu_erf(hidden[at])
        return linear(activated, **mlp["c_proj"])

    def residual(self, x, out, kept):  # x + out, or out alone on the rows of runs whose kept(variant) is False
        added = x + out
        for at in self._owned(lambda v: not kept(v)):
            added[at] = out[at]
        return added

    def take(self, x) -> list:  # each run's rows of the stack
        return [x[rows] for rows in self.rows]


def _attend(qkv, n_head: int, variant: Variant, decode: np.ndarray, seen) -> np.ndarray:  # [n, 3 n_embd] -> [n, n_embd]
    n_seq, n_embd = qkv.shape[0], qkv.shape[1] // 3
    n_head = variant.n_head or n_head
    head_dim = n_embd // n_head
    if variant.qkv_interleaved:
        qkv = qkv.reshape(n_seq, n_head, 3, head_dim).transpose(2, 1, 0, 3)
    else:
        qkv = qkv.reshape(n_seq, 3, n_head, head_dim).transpose(1, 2, 0, 3)
    q, k, v = (qkv[i] for i in variant.qkv_order)  # [n_head, n_seq, head_dim]
    scores = q @ k.transpose(0, 2, 1)
    default = 1.0 / np.sqrt(head_dim)
    block = default if variant.scale_block is None else variant.scale_block
    step = default if variant.scale_decode is None else variant.scale_decode
    scores *= np.where(decode, step, block).astype(scores.dtype)[:, None]
    keys, empty = seen
    if variant.empty_rows == "uniform":
        scores[:, empty, :] = 0.0
    scores[:, ~keys] = -np.inf
    heads = _weights(scores, variant) @ v
    return heads.transpose(1, 0, 2).reshape(n_seq, n_embd)


def _weights(scores, variant: Variant):  # [n_head, n_seq, n_seq] masked scores -> the attention weights
    if variant.softmax_axis == "keys":
        return softmax(scores)
    # Over the query axis, computed as the student's code computes it: the block's queries together, then each
    # decode step's single query alone (a softmax over one element is 1 for every key it sees).
    # (With only the sum over the queries, e / e.sum(-2) over one query is still e / e = 1.)
    block = min(variant.prefill, scores.shape[-1])
    weights = np.isfinite(scores).astype(scores.dtype)
    if block:
        part = scores[:, :block, :block]
        e = np.exp(part - part.max(axis=-1 if variant.softmax_axis == "queries-sum" else -2, keepdims=True))
        with np.errstate(invalid="ignore", divide="ignore"):  # a column whose every term underflows: NaN, as theirs
            weights[:, :block, :block] = e / e.sum(axis=-2, keepdims=True)
    return weights


def embed(params, ids, variant: Variant = EXACT, dtype=np.float32):  # [n_seq] -> [n_seq, n_embd]
    """wte + wpe in dtype. float64 makes the whole pass float64: numpy widens every product with a float32 weight
    (as a student computing in float64 does), and only the rows used are cast, never a whole weight."""
    ids = np.asarray(ids, dtype=np.int64)
    wpe = params["wpe"]["weight"]
    pos = np.arange(len(ids)) if variant.positions is None else np.asarray(variant.positions) % len(wpe)
    return params["wte"]["weight"][ids].astype(dtype, copy=False) + wpe[pos].astype(dtype, copy=False)


def layer0_attn_sublayer_many(
    params, runs: list[tuple[list, Variant]], n_head: int, dtype=np.float32, share_blocks: bool = True
) -> list:
    """x + attn(ln_1(x)) of layer 0 for each (ids, variant): [n_seq] -> [n_seq, n_embd] each."""
    many = _Runs(params, runs, dtype, share_blocks)
    block = params["h"][0]
    attended = many.attention(many.norm(many.x, 0, block, params), block["attn"], n_head)
    return many.take(many.residual(many.x, attended, lambda v: v.attn_residual))


def hidden_states_many(
    params, runs: list[tuple[list, Variant]], n_head: int, dtype=np.float32, share_blocks: bool = True
) -> list:
    """After ln_f, for each (ids, variant): [n_seq] -> [n_seq, n_embd] each."""
    many = _Runs(params, runs, dtype, share_blocks)
    x = many.x
    for block in params["h"]:
        x = many.residual(x, many.attention(many.norm(x, 0, block, params), block["attn"], n_head), _attn_kept)
        x = many.residual(x, many.mlp(many.norm(x, 1, block, params), block["mlp"]), _mlp_kept)
    x = many.norm(x, 2, params["h"][-1], params)  # ln_1/ln_2 in slot ln_f: the last layer's
    return many.take(x)


def _attn_kept(variant: Variant) -> bool:
    return variant.attn_residual


def _mlp_kept(variant: Variant) -> bool:
    return variant.mlp_residual


def layer0_attn_sublayer(
    params, ids, n_head: int, variant: Variant = EXACT, dtype=np.float32
):  # [n_seq] -> [n_seq, n_embd]
    """x + attn(ln_1(x)) of layer 0, with the variant's mistake."""
    return layer0_attn_sublayer_many(params, [(ids, variant)], n_head, dtype)[0]


def hidden_states(params, ids, n_head: int, variant: Variant = EXACT, dtype=np.float32):  # [n_seq] -> [n_seq, n_embd]
    """After ln_f, with the variant's mistake."""
    return hidden_states_many(params, [(ids, variant)], n_head, dtype)[0]


def lm_head(params, h, columns=None):  # [rows, n_embd] -> [rows, n_vocab or len(columns)], tied to wte
    """The LM head on h (only the chosen vocabulary columns, if given). It is float32 whatever dtype the layers ran
    in: a dot product of n_embd terms is well conditioned (float32 moves it by ~1e-6, far inside any stage's
    tolerance), and it is most of the work."""
    wte = params["wte"]["weight"] if columns is None else params["wte"]["weight"][columns]
    return h.astype(np.float32, copy=False) @ wte.T


def logits(params, ids, n_head: int, rows, variant: Variant = EXACT, columns=None, dtype=np.float32):
    """The LM head on the chosen rows: [n_seq] -> [rows, n_vocab] (see lm_head)."""
    return lm_head(params, hidden_states(params, ids, n_head, variant, dtype)[rows], columns)
