# Style "loops": explicit Python loops over heads and layers, the cache a dict of lists, weights via the course's loader.
import math

import numpy as np
import theinference
from src.gpt2 import load_weights

P, NH = load_weights(theinference.weights_path())
E = P["wte"]["weight"].shape[1]
D = E // NH


def layernorm(x, g, b):
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        row = x[r]
        mu = row.mean()
        sd = math.sqrt(((row - mu) ** 2).mean() + 1e-5)
        out[r] = (row - mu) / sd * g + b
    return out


def gelu(x):
    return {{GELU}}


def one_head(q, k, v, allowed):  # q [n_q, D], k/v [n_k, D], allowed [n_q, n_k] bool
    s = q @ k.T {{SCALE}}
    s = np.where(allowed, s, -np.inf)
    s = np.exp(s - s.max(axis={{SOFTMAX_AXIS}}, keepdims=True))
    return (s / s.sum(axis={{SOFTMAX_AXIS}}, keepdims=True)) @ v


def attn(x, blk, keys, vals, start):
    y = x @ blk["attn"]["c_attn"]["weight"] + blk["attn"]["c_attn"]["bias"]
    n = x.shape[0]
    {{SPLIT}}
    keys.extend(list(k))
    vals.extend(list(v))
    K, V = np.array(keys), np.array(vals)
    allowed = np.array([[j <= start + i {{MASK_EXTRA}} for j in range(len(keys))] for i in range(n)])
    heads = []
    for h in range(NH):
        sl = slice(h * D, (h + 1) * D)
        heads.append(one_head(q[:, sl], K[:, sl], V[:, sl], allowed))
    o = np.concatenate(heads, axis=1)
    return o @ blk["attn"]["c_proj"]["weight"] + blk["attn"]["c_proj"]["bias"]


def run_layers(ids, cache, start, n_layers=None):
    x = P["wte"]["weight"][ids] + P["wpe"]["weight"][[start + i for i in range(len(ids))]]
    for li, blk in enumerate(P["h"][:n_layers]):
        keys, vals = cache.setdefault(li, ([], []))
        x = x + attn(layernorm(x, blk["ln_1"]["weight"], blk["ln_1"]["bias"]), blk, keys, vals, start)
        if n_layers is None:
            h = layernorm(x, blk["ln_2"]["weight"], blk["ln_2"]["bias"])
            h = gelu(h @ blk["mlp"]["c_fc"]["weight"] + blk["mlp"]["c_fc"]["bias"])
            x = x + h @ blk["mlp"]["c_proj"]["weight"] + blk["mlp"]["c_proj"]["bias"]
    return x


def to_logits(x):
    return layernorm(x, P["ln_f"]["weight"], P["ln_f"]["bias"]) @ P["wte"]["weight"].T


def run_forward(seq_ids):
    return to_logits(run_layers(seq_ids, {}, 0))


def run_single_step(seq_ids):
    cache = {}
    if len(seq_ids) > 1:
        run_layers(seq_ids[:-1], cache, 0, n_layers=1)
    return run_layers(seq_ids[-1:], cache, len(seq_ids) - 1, n_layers=1)[0]


def run_layer_equiv(seq_ids):
    cache = {}
    return np.stack([run_layers([t], cache, i, n_layers=1)[0] for i, t in enumerate(seq_ids)])


def run_decode_step(prompt_ids, next_id):
    cache = {}
    run_layers(prompt_ids, cache, 0)
    return to_logits(run_layers([next_id], cache, {{DECODE_POS}}))[0]


def run_per_step_logits(prompt_ids, cont_ids):
    cache = {}
    rows = [to_logits(run_layers(prompt_ids, cache, 0))[-1]]
    for i, t in enumerate(cont_ids[:-1]):
        rows.append(to_logits(run_layers([t], cache, {{PER_STEP_POS}}))[0])
    return np.stack(rows)


def run_greedy(prompt_ids, n_new):
    cache = {}
    logits = to_logits(run_layers(prompt_ids, cache, 0))[-1]
    out = []
    for i in range(n_new):
        {{PICK}}
        out.append(tok)
        if i + 1 < n_new:
            logits = to_logits(run_layers([{{FED}}], cache, len(prompt_ids) + i))[0]
    return out
