"""One token at a time: every layer keeps a list of key and value vectors."""

import numpy as np

from src.gpt2 import attend_one, dense, ffn, layer_norm


class ModelCache:
    def __init__(self, n_layer):
        self.entries = {layer: {"k": [], "v": []} for layer in range(n_layer)}

    def __len__(self):
        return len(self.entries[0]["k"])


def _advance(params, cache, token_id, pos, n_head, full):
    """One token through every layer (full) or layer 0's attention only; its keys and values kept -> [E]."""
    x = params["wte"]["weight"][token_id] + params["wpe"]["weight"][pos]
    e = x.shape[0]
    for index in range(len(params["h"]) if full else 1):
        lyr, slot = params["h"][index], cache.entries[index]
        qkv = dense(layer_norm(x[None, :], lyr["ln_1"]["weight"], lyr["ln_1"]["bias"]), lyr["attn"]["c_attn"])[0]
        slot["k"].append(qkv[e : 2 * e])
        slot["v"].append(qkv[2 * e :])
        mixed = attend_one(qkv[:e], np.stack(slot["k"]), np.stack(slot["v"]), n_head)
        x = x + dense(mixed[None, :], lyr["attn"]["c_proj"])[0]
        if full:
            x = x + ffn(layer_norm(x[None, :], lyr["ln_2"]["weight"], lyr["ln_2"]["bias"]), **lyr["mlp"])[0]
    return x


def _logits(params, x):
    return layer_norm(x[None, :], params["ln_f"]["weight"], params["ln_f"]["bias"])[0] @ params["wte"]["weight"].T


def prefill(params, ids, n_head):
    cache = ModelCache(len(params["h"]))
    rows = [_logits(params, _advance(params, cache, t, p, n_head, True)) for p, t in enumerate(ids)]
    return np.stack(rows), cache


def decode_step(params, cache, token_id, pos, n_head):
    return _logits(params, _advance(params, cache, token_id, pos, n_head, True))


def layer_attn_incremental(params, ids, n_head):
    cache = ModelCache(1)
    return np.stack([_advance(params, cache, t, p, n_head, False) for p, t in enumerate(ids)])


def single_step_attention(params, ids, n_head):
    return layer_attn_incremental(params, ids, n_head)[-1]


def generate_cached(params, ids, n_new, n_head):
    logits, cache = prefill(params, ids, n_head)
    out = [int(np.argmax(logits[-1]))]
    while len(out) < n_new:
        out.append(int(np.argmax(decode_step(params, cache, out[-1], len(cache), n_head))))
    return out
