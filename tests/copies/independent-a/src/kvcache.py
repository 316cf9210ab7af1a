"""A cache of per-layer key and value blocks, joined when attention needs them."""

import numpy as np

from src.gpt2 import embed, ffn, heads_attention, layer_norm


class ModelCache:
    def __init__(self, n_layer):
        self.keys = [[] for _ in range(n_layer)]  # per layer, blocks of [n_new, n_embd]
        self.values = [[] for _ in range(n_layer)]
        self.length = 0

    def __len__(self):
        return self.length

    def extend(self, layer, k, v):
        self.keys[layer].append(k)
        self.values[layer].append(v)
        return np.concatenate(self.keys[layer], axis=0), np.concatenate(self.values[layer], axis=0)


def _attend(x, attn, n_head, cache, layer, start):
    width = x.shape[1]
    qkv = x @ attn["c_attn"]["weight"] + attn["c_attn"]["bias"]
    keys, values = cache.extend(layer, qkv[:, width : 2 * width], qkv[:, 2 * width :])
    out = heads_attention(qkv[:, :width], keys, values, n_head, start)
    return out @ attn["c_proj"]["weight"] + attn["c_proj"]["bias"]


def _run(params, ids, n_head, cache, start):
    h = embed(params, ids, start)
    for i, layer in enumerate(params["h"]):
        normed = layer_norm(h, layer["ln_1"]["weight"], layer["ln_1"]["bias"])
        h = h + _attend(normed, layer["attn"], n_head, cache, i, start)
        normed = layer_norm(h, layer["ln_2"]["weight"], layer["ln_2"]["bias"])
        h = h + ffn(normed, layer["mlp"]["c_fc"], layer["mlp"]["c_proj"])
    cache.length = start + len(ids)
    out = layer_norm(h, params["ln_f"]["weight"], params["ln_f"]["bias"])
    return out @ params["wte"]["weight"].T


def prefill(params, ids, n_head):
    cache = ModelCache(len(params["h"]))
    return _run(params, list(ids), n_head, cache, 0), cache


def decode_step(params, cache, token_id, pos, n_head):
    return _run(params, [token_id], n_head, cache, pos)[0]


def _first_layer(params, ids, n_head, cache, start):
    layer = params["h"][0]
    h = embed(params, ids, start)
    return h + _attend(
        layer_norm(h, layer["ln_1"]["weight"], layer["ln_1"]["bias"]), layer["attn"], n_head, cache, 0, start
    )


def single_step_attention(params, ids, n_head):
    cache = ModelCache(1)
    ids = list(ids)
    if len(ids) > 1:
        _first_layer(params, ids[:-1], n_head, cache, 0)
    return _first_layer(params, ids[-1:], n_head, cache, len(ids) - 1)[0]


def layer_attn_incremental(params, ids, n_head):
    cache = ModelCache(1)
    return np.concatenate([_first_layer(params, [t], n_head, cache, p) for p, t in enumerate(ids)], axis=0)


def generate_cached(params, ids, n_new, n_head):
    logits, cache = prefill(params, ids, n_head)
    nxt = int(logits[-1].argmax())
    result = [nxt]
    while len(result) < n_new:
        nxt = int(decode_step(params, cache, nxt, len(cache), n_head).argmax())
        result.append(nxt)
    return result
