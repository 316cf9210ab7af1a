"""GPT-2 with a student's mistake given by parameters: the families diagnosis fits (grading/families.py).

`gpt2.Defects` names single bugs; a `Variant` holds one parameter per family of mistakes: the
attention scale of the prefill block and of the decode steps, the wpe row of every position, which
layer norm's parameters each slot uses (on the block's rows and on the decode rows separately),
the causal mask's diagonal, how c_attn's output is split into q, k, v, and the number of heads.
The default is GPT-2 itself.

As in gpt2.py, an incremental computation is one causal pass: the first `prefill` rows form one
block, every later row is a single-query decode step reading the cache of the rows before it
(attention is causal, so a row depends only on earlier rows, computed with the same mistake).
"""

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from theinference.model.gpt2 import LN_EPS, gelu, linear, softmax

LN_SLOTS = ("ln_1", "ln_2", "ln_f")  # the slots of a layer's two norms and the final one, in order
GPT2_NORMS = ("ln_1", "ln_2", "ln_f")  # which parameters fill them in GPT-2


@dataclass(frozen=True)
class Variant:
    """A parametric departure from GPT-2; every field defaults to GPT-2."""

    prefill: int = 0  # rows computed as one block before the single-query decode steps
    scale_block: float | None = None  # the block's score scale; None: 1/sqrt(head_dim)
    scale_decode: float | None = None  # ... and each decode step's
    positions: tuple[int, ...] | None = None  # the wpe row of every row (negative wraps as numpy indexes); None: 0..n-1
    norms_block: tuple[str, str, str] = GPT2_NORMS  # the parameters used in slots ln_1, ln_2, ln_f on the block's rows
    norms_decode: tuple[str, str, str] = GPT2_NORMS  # ... and on the decode rows ("none": no norm)
    mask_block: int | None = 0  # block row i sees block key j when j <= i + mask_block; None: no causal mask
    mask_decode: int = 0  # a decode row i sees key j when j <= i + mask_decode (<= 0)
    qkv_order: tuple[int, int, int] = (0, 1, 2)  # which part of c_attn's split output is q, k, v
    qkv_interleaved: bool = (
        False  # c_attn's output read as [n, n_head, 3, head_dim] instead of [n, 3, n_head, head_dim]
    )
    n_head: int | None = None  # the heads the student splits into; None: the model's
    # A row the mask leaves no key: "uniform" weights over the keys present (a -1e10 mask added in float32
    # swamps the scores), or "unmasked" scores over them (the same mask added in float64 keeps their differences).
    empty_rows: str = "uniform"


EXACT = Variant()


class Float64Params(Mapping):
    """The nested params read as float64, each tensor cast when it is used (never all at once: a student who
    computes in float64 is reproduced without holding a second, double-size copy of the weights)."""

    def __init__(self, params: Mapping):
        self._params = params

    def __getitem__(self, key):
        return _float64(self._params[key])

    def __iter__(self):
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)


def _float64(value):
    if isinstance(value, Mapping):
        return Float64Params(value)
    if isinstance(value, list):
        return [_float64(v) for v in value]
    return np.asarray(value, dtype=np.float64)


def _decode_rows(n_seq: int, variant: Variant) -> np.ndarray:  # [n_seq] bool
    return np.arange(n_seq) >= variant.prefill


def _visible(n_seq: int, variant: Variant):  # -> ([n_seq, n_seq] bool keys each row's query sees, [n_seq] empty rows)
    rows, cols = np.arange(n_seq)[:, None], np.arange(n_seq)[None, :]
    present = np.where(rows < variant.prefill, cols < variant.prefill, cols <= rows)  # what the cache holds
    block = present if variant.mask_block is None else present & (cols <= rows + variant.mask_block)
    keys = np.where(rows < variant.prefill, block, present & (cols <= rows + variant.mask_decode))
    # A fully masked row under a large negative additive mask gets uniform weights over the keys present.
    empty = ~np.any(keys, axis=1)
    return np.where(empty[:, None], present, keys), empty


def _norm(x, slot: int, block: dict, params, variant: Variant, decode: np.ndarray):  # [n, n_embd] -> same
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    normed = centered / np.sqrt(np.mean(centered * centered, axis=-1, keepdims=True) + LN_EPS)
    out = np.empty_like(x)
    for names, rows in ((variant.norms_block, ~decode), (variant.norms_decode, decode)):
        name = names[slot]
        if not rows.any():
            continue
        if name == "none":
            out[rows] = x[rows]
            continue
        p = params["ln_f"] if name == "ln_f" else block[name]
        out[rows] = normed[rows] * p["weight"] + p["bias"]
    return out


def _mha(x, c_attn, c_proj, n_head: int, variant: Variant, decode: np.ndarray):  # [n, n_embd] -> same
    n_seq, n_embd = x.shape
    n_head = variant.n_head or n_head
    head_dim = n_embd // n_head
    qkv = linear(x, **c_attn)
    if variant.qkv_interleaved:
        qkv = qkv.reshape(n_seq, n_head, 3, head_dim).transpose(2, 1, 0, 3)
    else:
        qkv = qkv.reshape(n_seq, 3, n_head, head_dim).transpose(1, 2, 0, 3)
    q, k, v = (qkv[i] for i in variant.qkv_order)  # [n_head, n_seq, head_dim]
    scores = q @ k.transpose(0, 2, 1)
    default = 1.0 / np.sqrt(head_dim)
    block = default if variant.scale_block is None else variant.scale_block
    step = default if variant.scale_decode is None else variant.scale_decode
    scores *= np.where(decode, step, block).astype(np.float32)[:, None]
    keys, empty = _visible(n_seq, variant)
    if variant.empty_rows == "uniform":
        scores[:, empty, :] = 0.0
    scores[:, ~keys] = -np.inf
    heads = softmax(scores) @ v
    return linear(heads.transpose(1, 0, 2).reshape(n_seq, n_embd), **c_proj)


def embed(params, ids, variant: Variant = EXACT):  # [n_seq] -> [n_seq, n_embd]
    ids = np.asarray(ids, dtype=np.int64)
    wpe = params["wpe"]["weight"]
    pos = np.arange(len(ids)) if variant.positions is None else np.asarray(variant.positions) % len(wpe)
    return params["wte"]["weight"][ids] + wpe[pos]


def layer0_attn_sublayer(params, ids, n_head: int, variant: Variant = EXACT):  # [n_seq] -> [n_seq, n_embd]
    """x + attn(ln_1(x)) of layer 0, with the variant's mistake."""
    x = embed(params, ids, variant)
    decode = _decode_rows(len(x), variant)
    block = params["h"][0]
    return x + _mha(
        _norm(x, 0, block, params, variant, decode), **block["attn"], n_head=n_head, variant=variant, decode=decode
    )


def hidden_states(params, ids, n_head: int, variant: Variant = EXACT):  # [n_seq] -> [n_seq, n_embd], after ln_f
    x = embed(params, ids, variant)
    decode = _decode_rows(len(x), variant)
    for block in params["h"]:
        x = x + _mha(
            _norm(x, 0, block, params, variant, decode), **block["attn"], n_head=n_head, variant=variant, decode=decode
        )
        h = linear(
            gelu(linear(_norm(x, 1, block, params, variant, decode), **block["mlp"]["c_fc"])), **block["mlp"]["c_proj"]
        )
        x = x + h
    return _norm(x, 2, params["h"][-1], params, variant, decode)  # ln_1/ln_2 in slot ln_f: the last layer's


def logits(params, ids, n_head: int, rows, variant: Variant = EXACT, columns=None):  # [n_seq] -> [rows, n_vocab]
    """The LM head (tied to wte) on the chosen rows (and only the chosen vocabulary columns, if given)."""
    wte = params["wte"]["weight"] if columns is None else params["wte"]["weight"][columns]
    return hidden_states(params, ids, n_head, variant)[rows] @ wte.T
