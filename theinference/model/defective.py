"""GPT-2 with a student's bug: model/gpt2.py's forward pass with named departures (`Defects`) from it.

The bug oracles of fingerprinting (theinference.grading.oracle.bugs names and documents each bug) are computed
here. With no defect set the result is bit-identical to gpt2.py (tests/test_defective.py proves it). Some
defects only exist in an incremental computation (a prefill block, then one row per decode step):
`Defects.prefill` says how many leading rows form the block; every later row is modelled as a
single-query decode step.
"""

import math
from dataclasses import dataclass

import numpy as np

from theinference.model.gpt2 import gelu, layer_norm, linear, lm_head, softmax


@dataclass(frozen=True)
class Defects:
    """Departures from GPT-2; all default to exact GPT-2."""

    prefill: int = 0  # rows computed as one block before the single-row decode steps
    scale_block: bool = True  # 1/sqrt(head_dim) applied to the prefill block's scores
    scale_decode: bool = True  # ... and to each decode step's single query
    decode_position: str = "advance"  # advance | plus-one | zero | stuck | reset (see DECODE_POSITIONS)
    # Keys a decode step's query sees: all | first (a re-applied causal mask) | earlier (k/v appended
    # after attention) | self (an empty cache) | decoded (a cache emptied after prefill)
    decode_keys: str = "all"
    mask_sees_self: bool = True  # False: the causal mask is off by one (no row sees itself)
    c_attn_transposed: bool = False  # each square q/k/v block of c_attn used transposed
    c_proj_transposed: bool = False  # the attention's square c_proj used transposed
    qkv_order: tuple = (0, 1, 2)  # which third of c_attn's output is used as q, k, v
    ln_eps: float = 1e-5
    gelu: str = "tanh"  # tanh | erf
    ln_f: bool = True
    attn_residual: bool = True  # False: x = attn(ln_1(x)), the residual x + dropped
    mlp_residual: bool = True  # False: x = mlp(ln_2(x))
    # "queries": the attention weights normalised over the query axis (softmax(scores, axis=-2)): in the block each
    # key's column sums to 1 over the queries that see it; a single-query decode step gives every key it sees weight 1.
    # "queries-sum": only the sum over the query axis, the max each query's own (e = exp(s - s.max(-1)); e / e.sum(-2)).
    softmax_axis: str = "keys"
    # Lengths of consecutive calls that share one cache never cleared: every row attends to every
    # earlier row, and positions restart at 0 with each call.
    segments: tuple = ()


EXACT = Defects()

# Position of decode step k (row prefill + k) for each kind of position counter.
DECODE_POSITIONS = {
    "advance": lambda prefill, k: prefill + k,
    "plus-one": lambda prefill, k: prefill + k + 1,
    "zero": lambda prefill, k: 0,
    "stuck": lambda prefill, k: prefill,
    "reset": lambda prefill, k: k,
}


def gelu_erf(x):  # [..., n] -> [..., n]: the exact GELU, x Phi(x), where GPT-2 uses the tanh form
    # numpy has no erf: Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7) in float64.
    z = np.abs(x.astype(np.float64)) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    return (0.5 * x * (1.0 + erf)).astype(np.float32)


def attention_keys(n_seq, defects):  # -> [n_seq, n_seq] bool: which keys each row's query sees
    """Keys each row attends to: causal, unless a defect changes it."""
    rows, cols = np.arange(n_seq)[:, None], np.arange(n_seq)[None, :]
    keys = cols <= rows if defects.mask_sees_self else cols < rows
    decode = (rows >= defects.prefill) & (rows > 0)
    if defects.decode_keys == "first":
        keys = np.where(decode, cols == 0, keys)
    elif defects.decode_keys == "earlier":
        keys = np.where(decode, cols < rows, keys)
    elif defects.decode_keys == "self":
        keys = np.where(decode, cols == rows, keys)
    elif defects.decode_keys == "decoded":
        keys = np.where(decode, (cols >= defects.prefill) & (cols <= rows), keys)
    return keys


def _mask(scores, defects):  # [n_head, n_seq, n_seq] scores, masked in place
    # A fully masked row under a large negative additive mask (-1e10 swamps every score in
    # float32) gets uniform weights over the keys present at its step: model exactly that.
    n_seq = scores.shape[-1]
    keys = attention_keys(n_seq, defects)
    empty = ~keys.any(axis=1)
    if empty.any():
        rows, cols = np.arange(n_seq)[:, None], np.arange(n_seq)[None, :]
        present = np.where(rows < defects.prefill, cols < defects.prefill, cols <= rows)
        scores[:, empty, :] = 0.0
        keys = np.where(empty[:, None], present, keys)
    scores[:, ~keys] = -np.inf


def _attn_weights(c_attn, c_proj, defects):  # the attention's weights as a transposing bug uses them
    if defects.c_attn_transposed:
        w = c_attn["weight"]
        c_attn = {**c_attn, "weight": np.concatenate([b.T for b in np.split(w, 3, axis=1)], axis=1)}
    if defects.c_proj_transposed:
        c_proj = {**c_proj, "weight": np.ascontiguousarray(c_proj["weight"].T)}
    return c_attn, c_proj


def _scale(n_seq, head_dim, defects):  # a scalar, or [n_seq, 1] factors when a defect drops it somewhere
    scale = np.float32(1.0 / np.sqrt(head_dim))
    if defects.scale_block and defects.scale_decode:
        return scale
    rows = np.arange(n_seq)[:, None]
    on = np.where(rows < defects.prefill, defects.scale_block, defects.scale_decode)
    return np.where(on, scale, np.float32(1.0)).astype(np.float32)


def mha(x, c_attn, c_proj, n_head, defects):  # [n_seq, n_embd] -> [n_seq, n_embd]
    c_attn, c_proj = _attn_weights(c_attn, c_proj, defects)
    return linear(_heads(linear(x, **c_attn), n_head, defects), **c_proj)


def _heads(qkv, n_head, defects):  # [n_seq, 3 n_embd] -> [n_seq, n_embd]: attention between c_attn and c_proj
    n_seq, n_embd = qkv.shape[0], qkv.shape[1] // 3
    head_dim = n_embd // n_head
    qkv = qkv.reshape(n_seq, 3, n_head, head_dim).transpose(1, 2, 0, 3)
    q, k, v = (qkv[i] for i in defects.qkv_order)  # [n_head, n_seq, head_dim]
    scores = q @ k.transpose(0, 2, 1)  # [n_head, n_seq, n_seq]
    scores *= _scale(n_seq, head_dim, defects)
    _mask(scores, defects)
    heads = _weights(scores, defects) @ v  # [n_head, n_seq, head_dim]
    return heads.transpose(1, 0, 2).reshape(n_seq, n_embd)


def _weights(scores, defects):  # [n_head, n_seq, n_seq] masked scores -> the attention weights
    if defects.softmax_axis == "keys":
        return softmax(scores)
    # Over the query axis, computed as the student's code computes it: the block's queries together, then each
    # decode step's single query alone (a softmax over one element is 1 for every key it sees).
    # (With only the sum over the queries, e / e.sum(-2) over one query is still e / e = 1.)
    block = min(defects.prefill, scores.shape[-1])
    weights = np.isfinite(scores).astype(scores.dtype)
    if block:
        part = scores[:, :block, :block]
        e = np.exp(part - part.max(axis=-1 if defects.softmax_axis == "queries-sum" else -2, keepdims=True))
        with np.errstate(invalid="ignore", divide="ignore"):  # a column whose every term underflows: NaN, as theirs
            weights[:, :block, :block] = e / e.sum(axis=-2, keepdims=True)
    return weights


def _residual(x, out, kept):  # the sublayer's output added to the residual stream, or (a dropped residual) alone
    return x + out if kept else out


def ffn(x, c_fc, c_proj, defects):  # [n_seq, n_embd] -> [n_seq, n_embd]
    activation = gelu_erf if defects.gelu == "erf" else gelu
    return linear(activation(linear(x, **c_fc)), **c_proj)


def transformer_block(x, ln_1, attn, ln_2, mlp, n_head, defects):  # [n_seq, n_embd] -> [n_seq, n_embd]
    eps = np.float32(defects.ln_eps)
    x = _residual(x, mha(layer_norm(x, **ln_1, eps=eps), **attn, n_head=n_head, defects=defects), defects.attn_residual)
    return _residual(x, ffn(layer_norm(x, **ln_2, eps=eps), **mlp, defects=defects), defects.mlp_residual)


def positions(n_seq, defects):  # -> [n_seq]: the wpe row each position is embedded with
    """0..n_seq-1; a decode position defect changes the rows after the prefill block."""
    if defects.segments:
        return np.concatenate([np.arange(n) for n in defects.segments])
    pos = np.arange(n_seq)
    position_of = DECODE_POSITIONS[defects.decode_position]
    for row in range(defects.prefill, n_seq):
        pos[row] = position_of(defects.prefill, row - defects.prefill)
    return pos


def embed(params, ids, defects):  # [n_seq] -> [n_seq, n_embd]
    ids = np.asarray(ids, dtype=np.int64)
    return params["wte"]["weight"][ids] + params["wpe"]["weight"][positions(len(ids), defects)]


def layer0_attn_sublayer(params, ids, n_head, defects):  # [n_seq] -> [n_seq, n_embd]
    """The residual stream after layer 0's attention sublayer, x + attn(ln_1(x)), with the defects."""
    x = embed(params, ids, defects)
    block = params["h"][0]
    ln_1 = layer_norm(x, **block["ln_1"], eps=np.float32(defects.ln_eps))
    return _residual(x, mha(ln_1, **block["attn"], n_head=n_head, defects=defects), defects.attn_residual)


def hidden_states(params, ids, n_head, defects):  # [n_seq] -> [n_seq, n_embd], after ln_f (unless a defect drops it)
    x = embed(params, ids, defects)
    for block in params["h"]:
        x = transformer_block(x, **block, n_head=n_head, defects=defects)
    return layer_norm(x, **params["ln_f"], eps=np.float32(defects.ln_eps)) if defects.ln_f else x


def hidden_states_many(params, runs: list[tuple[list, Defects]], n_head) -> list:
    """hidden_states for each (ids, defects), their rows stacked so that each weight is read once for all of them
    (screening a dozen bugs on one short row costs one pass over the weights, not a dozen): a product whose weight
    a defect changes (a transposed c_attn or c_proj) is taken once per version of that weight."""
    xs = [embed(params, ids, defects) for ids, defects in runs]
    spans = [slice(int(end) - len(x), int(end)) for x, end in zip(xs, np.cumsum([len(x) for x in xs]))]
    every = [d for _, d in runs]

    def each(x, f):  # f(rows of one run, its defects), run by run, stacked again
        return np.concatenate([f(x[span], d) for span, d in zip(spans, every)])

    def each2(x, y, f):  # f(rows of one run in x, the same rows in y, its defects)
        return np.concatenate([f(x[span], y[span], d) for span, d in zip(spans, every)])

    def shared(x, weights):  # linear per group of runs that use the same weights (weights(defects) -> its dict)
        out = None
        for key in dict.fromkeys(id(weights(d)["weight"]) for d in every):
            group = [i for i, d in enumerate(every) if id(weights(d)["weight"]) == key]
            rows = np.concatenate([np.arange(spans[i].start, spans[i].stop) for i in group])
            part = linear(x[rows], **weights(every[group[0]]))
            if out is None and len(group) == len(every):
                return part
            out = np.empty((len(x), part.shape[1]), part.dtype) if out is None else out
            out[rows] = part
        return out

    x = np.concatenate(xs)
    for block in params["h"]:
        eps = {d: np.float32(d.ln_eps) for d in every}
        versions = {d: _attn_weights(block["attn"]["c_attn"], block["attn"]["c_proj"], d) for d in every}
        normed = each(x, lambda rows, d: layer_norm(rows, **block["ln_1"], eps=eps[d]))
        qkv = shared(normed, lambda d: versions[d][0])
        attended = shared(each(qkv, lambda rows, d: _heads(rows, n_head, d)), lambda d: versions[d][1])
        x = each2(x, attended, lambda rows, out, d: _residual(rows, out, d.attn_residual))
        normed = each(x, lambda rows, d: layer_norm(rows, **block["ln_2"], eps=eps[d]))
        hidden = linear(normed, **block["mlp"]["c_fc"])
        activated = each(hidden, lambda rows, d: gelu_erf(rows) if d.gelu == "erf" else gelu(rows))
        x = each2(
            x, linear(activated, **block["mlp"]["c_proj"]), lambda rows, out, d: _residual(rows, out, d.mlp_residual)
        )
    return [
        layer_norm(x[span], **params["ln_f"], eps=np.float32(d.ln_eps)) if d.ln_f else x[span]
        for span, d in zip(spans, every)
    ]


def logits(params, ids, n_head, defects, rows=None):  # [n_seq] -> [n_seq or len(rows), n_vocab]
    """Logits at every position (or only at `rows`), with the defects."""
    h = hidden_states(params, ids, n_head, defects)
    return lm_head(params, h if rows is None else h[rows])


def per_step_logits(params, prompt_ids, cont_ids, n_head, defects):  # -> [len(cont_ids), n_vocab]
    """gpt2.per_step_logits with the defects: row k, the logits seen before consuming cont[k]."""
    ids = list(prompt_ids) + list(cont_ids)[:-1]
    start = len(prompt_ids) - 1
    return logits(params, ids, n_head, defects, rows=slice(start, start + len(cont_ids)))
