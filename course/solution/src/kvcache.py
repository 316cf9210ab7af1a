"""The KV cache: keep every layer's keys and values, so each new token costs one row."""

import numpy as np

from src.gpt2 import embed, ffn, layer_norm, linear, merge_heads, split_heads, attention, causal_mask


class LayerCache:
    """Keys and values of one layer, [n_head, length, head_dim], grown one block of rows at a time."""

    def __init__(self):
        self.k = None
        self.v = None

    def __len__(self):
        return 0 if self.k is None else self.k.shape[1]

    def append(self, k, v):  # k, v: [n_head, n_new, head_dim]
        self.k = k if self.k is None else np.concatenate([self.k, k], axis=1)
        self.v = v if self.v is None else np.concatenate([self.v, v], axis=1)
        return self.k, self.v


class ModelCache:
    def __init__(self, n_layer):
        self.layers = [LayerCache() for _ in range(n_layer)]

    def __len__(self):
        return len(self.layers[0])


def attn_cached(x, c_attn, c_proj, n_head, cache):  # new rows [n_new, n_embd] -> [n_new, n_embd]
    q, k, v = np.split(linear(x, **c_attn), 3, axis=-1)
    q, k, v = (split_heads(t, n_head) for t in (q, k, v))
    keys, values = cache.append(k, v)
    out = attention(q, keys, values, causal_mask(q.shape[1], keys.shape[1]))
    return linear(merge_heads(out), **c_proj)


def forward_cached(params, ids, n_head, cache, start):  # logits of the new rows at start..
    x = embed(params, ids, start)
    for layer, layer_cache in zip(params["h"], cache.layers):
        x = x + attn_cached(layer_norm(x, **layer["ln_1"]), **layer["attn"], n_head=n_head, cache=layer_cache)
        x = x + ffn(layer_norm(x, **layer["ln_2"]), **layer["mlp"])
    return layer_norm(x, **params["ln_f"]) @ params["wte"]["weight"].T


def prefill(params, ids, n_head):
    """Run the prompt once, filling a fresh cache -> (logits [n, n_vocab], cache)."""
    cache = ModelCache(len(params["h"]))
    return forward_cached(params, ids, n_head, cache, start=0), cache


def decode_step(params, cache, token_id, pos, n_head):
    """Consume one token at position pos (== len(cache)) -> logits [n_vocab]."""
    return forward_cached(params, [token_id], n_head, cache, start=pos)[0]


def single_step_attention(params, ids, n_head):
    """Layer 0's attention sublayer at the last position only, from a cache of the earlier ones -> [n_embd]."""
    layer, cache = params["h"][0], LayerCache()
    if len(ids) > 1:  # cache the keys and values of every earlier position in one pass
        earlier = embed(params, ids[:-1], 0)
        attn_cached(layer_norm(earlier, **layer["ln_1"]), **layer["attn"], n_head=n_head, cache=cache)
    x = embed(params, ids[-1:], len(ids) - 1)
    return (x + attn_cached(layer_norm(x, **layer["ln_1"]), **layer["attn"], n_head=n_head, cache=cache))[0]


def layer_attn_incremental(params, ids, n_head):
    """Layer 0's attention sublayer, one position at a time from one fresh cache -> [n, n_embd]."""
    layer, cache = params["h"][0], LayerCache()
    rows = []
    for pos, token in enumerate(ids):
        x = embed(params, [token], pos)
        rows.append((x + attn_cached(layer_norm(x, **layer["ln_1"]), **layer["attn"], n_head=n_head, cache=cache))[0])
    return np.stack(rows)


def generate_cached(params, ids, n_new, n_head):
    """Greedy decoding with the cache: one prefill, then one row per token."""
    logits, cache = prefill(params, ids, n_head)
    out = [int(np.argmax(logits[-1]))]
    for _ in range(n_new - 1):
        out.append(int(np.argmax(decode_step(params, cache, out[-1], len(cache), n_head))))
    return out
