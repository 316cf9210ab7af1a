"""GPT-2 with a student's mistake given by parameters: the families diagnosis fits (grading/judge/families.py).

`defective.Defects` names single bugs; a `Variant` holds one parameter per family of mistakes: the
attention scale of the prefill block and of the decode steps, the wpe row of every position, which
layer norm's parameters each slot uses (on the block's rows and on the decode rows separately),
the causal mask's diagonal, how c_attn's output is split into q, k, v, and the number of heads.
The default is GPT-2 itself.

As in gpt2.py, an incremental computation is one causal pass: the first `prefill` rows form one
block, every later row is a single-query decode step reading the cache of the rows before it
(attention is causal, so a row depends only on earlier rows, computed with the same mistake).
Several passes can run at once (`hidden_states_many`): their rows are stacked, so the weights are
read once for all of them, which is what makes screening dozens of candidates cheap.
"""

from dataclasses import dataclass, replace

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
    # The decode rows' mask built from the position counter (j <= the row's wpe position), not from the cache's
    # length: a stuck counter then also hides every key after the position it is stuck at.
    mask_counter: bool = False
    qkv_order: tuple[int, int, int] = (0, 1, 2)  # which part of c_attn's split output is q, k, v
    qkv_interleaved: bool = (
        False  # c_attn's output read as [n, n_head, 3, head_dim] instead of [n, 3, n_head, head_dim]
    )
    n_head: int | None = None  # the heads the student splits into; None: the model's
    # A row the mask leaves no key: "uniform" weights over the keys present (a -1e10 mask added in float32
    # swamps the scores), or "unmasked" scores over them (the same mask added in float64 keeps their differences).
    empty_rows: str = "uniform"


EXACT = Variant()


def _decode_rows(n_seq: int, variant: Variant) -> np.ndarray:  # [n_seq] bool
    return np.arange(n_seq) >= variant.prefill


def _visible(n_seq: int, variant: Variant):  # -> ([n_seq, n_seq] bool keys each row's query sees, [n_seq] empty rows)
    rows, cols = np.arange(n_seq)[:, None], np.arange(n_seq)[None, :]
    present = np.where(rows < variant.prefill, cols < variant.prefill, cols <= rows)  # what the cache holds
    block = present if variant.mask_block is None else present & (cols <= rows + variant.mask_block)
    decode = present & (cols <= rows + variant.mask_decode)
    if variant.mask_counter and variant.positions is not None:
        decode &= cols <= np.asarray(variant.positions)[:, None]
    keys = np.where(rows < variant.prefill, block, decode)
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
        variant, scale_decode=None, norms_decode=GPT2_NORMS, mask_decode=0, mask_counter=False, positions=block
    )
    return tuple(int(t) for t in ids[: variant.prefill]), decode_free


class _Runs:
    """Several (ids, variant) passes stacked row-wise, so each layer's weights are read once for all of them:
    screening many candidates costs one pass over the weights plus each one's attention, not one pass each. Runs
    whose block rows are the same (_block_key: candidates that differ only in the decode steps) share one copy of
    them; each run's rows are `rows[i]` of the stack, and only the first run of a block writes that block's rows."""

    def __init__(self, params, runs: list[tuple[list, Variant]], dtype):
        xs, self.rows, self.owns, n = [], [], [], 0
        blocks: dict[tuple, np.ndarray] = {}
        for ids, variant in runs:
            x, key = embed(params, ids, variant, dtype), _block_key(ids, variant)
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
        self.visible = [_visible(len(rows), variant) for rows, variant in zip(self.rows, self.variants)]  # every layer
        self.x = np.concatenate(xs)

    def norm(self, x, slot: int, block: dict, params):  # [rows, n_embd] -> same, each run with its own parameters
        mean = x.mean(axis=-1, keepdims=True)
        centered = x - mean
        normed = centered / np.sqrt(np.mean(centered * centered, axis=-1, keepdims=True) + LN_EPS)

        def affine(name: str, at):
            p = params["ln_f"] if name == "ln_f" else block[name]
            return x[at] if name == "none" else normed[at] * p["weight"] + p["bias"]

        out = affine(GPT2_NORMS[slot], slice(None))  # then the rows of runs that use other parameters
        for rows, own, variant, decode in zip(self.rows, self.owns, self.variants, self.decodes):
            for names, which in ((variant.norms_block, ~decode), (variant.norms_decode, decode)):
                if names[slot] != GPT2_NORMS[slot] and (which & own).any():
                    at = rows[which & own]
                    out[at] = affine(names[slot], at)
        return out

    def attention(self, x, attn: dict, n_head: int):  # [rows, n_embd] -> same
        qkv = linear(x, **attn["c_attn"])
        heads = np.empty((len(x), qkv.shape[1] // 3), qkv.dtype)
        for rows, own, variant, decode, visible in zip(self.rows, self.owns, self.variants, self.decodes, self.visible):
            heads[rows[own]] = _attend(qkv[rows], n_head, variant, decode, visible)[own]
        return linear(heads, **attn["c_proj"])

    def take(self, x) -> list:  # each run's rows of the stack
        return [x[rows] for rows in self.rows]


def _attend(
    qkv, n_head: int, variant: Variant, decode: np.ndarray, visible
) -> np.ndarray:  # [n, 3 n_embd] -> [n, n_embd]
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
    keys, empty = visible
    if variant.empty_rows == "uniform":
        scores[:, empty, :] = 0.0
    scores[:, ~keys] = -np.inf
    heads = softmax(scores) @ v
    return heads.transpose(1, 0, 2).reshape(n_seq, n_embd)


def embed(params, ids, variant: Variant = EXACT, dtype=np.float32):  # [n_seq] -> [n_seq, n_embd]
    """wte + wpe in dtype. float64 makes the whole pass float64: numpy widens every product with a float32 weight
    (as a student computing in float64 does), and only the rows used are cast, never a whole weight."""
    ids = np.asarray(ids, dtype=np.int64)
    wpe = params["wpe"]["weight"]
    pos = np.arange(len(ids)) if variant.positions is None else np.asarray(variant.positions) % len(wpe)
    return params["wte"]["weight"][ids].astype(dtype, copy=False) + wpe[pos].astype(dtype, copy=False)


def layer0_attn_sublayer_many(params, runs: list[tuple[list, Variant]], n_head: int, dtype=np.float32) -> list:
    """x + attn(ln_1(x)) of layer 0 for each (ids, variant): [n_seq] -> [n_seq, n_embd] each."""
    many = _Runs(params, runs, dtype)
    block = params["h"][0]
    x = many.x + many.attention(many.norm(many.x, 0, block, params), block["attn"], n_head)
    return many.take(x)


def hidden_states_many(params, runs: list[tuple[list, Variant]], n_head: int, dtype=np.float32) -> list:
    """After ln_f, for each (ids, variant): [n_seq] -> [n_seq, n_embd] each."""
    many = _Runs(params, runs, dtype)
    x = many.x
    for block in params["h"]:
        x = x + many.attention(many.norm(x, 0, block, params), block["attn"], n_head)
        x = x + linear(gelu(linear(many.norm(x, 1, block, params), **block["mlp"]["c_fc"])), **block["mlp"]["c_proj"])
    x = many.norm(x, 2, params["h"][-1], params)  # ln_1/ln_2 in slot ln_f: the last layer's
    return many.take(x)


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
