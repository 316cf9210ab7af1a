"""Preallocated key/value buffers per layer, doubled when full."""

import numpy as np

from src.gpt2 import attend, embed, ffn, heads, layer_norm, project


class ModelCache:
    def __init__(self, n_layer):
        self.size = 0
        self.k = [None] * n_layer
        self.v = [None] * n_layer

    def __len__(self):
        return self.size

    def store(self, i, k, v, at):  # k, v: [H, n, D] at positions at..; -> the filled part of layer i
        end = at + k.shape[1]
        if self.k[i] is None or self.k[i].shape[1] < end:
            capacity = max(16, 2 * end)
            grown_k = np.zeros((k.shape[0], capacity, k.shape[2]), dtype=k.dtype)
            grown_v = np.zeros_like(grown_k)
            if self.k[i] is not None:
                grown_k[:, :at] = self.k[i][:, :at]
                grown_v[:, :at] = self.v[i][:, :at]
            self.k[i], self.v[i] = grown_k, grown_v
        self.k[i][:, at:end] = k
        self.v[i][:, at:end] = v
        return self.k[i][:, :end], self.v[i][:, :end]


def cached_mha(x, attn, n_head, cache, i, at):
    q, k, v = (heads(part, n_head) for part in np.split(project(x, attn["c_attn"]), 3, axis=1))
    keys, vals = cache.store(i, k, v, at)
    return project(attend(q, keys, vals, at), attn["c_proj"])


def step(params, ids, n_head, cache, at):
    x = embed(params, ids, at)
    for i, p in enumerate(params["h"]):
        x = x + cached_mha(layer_norm(x, **p["ln_1"]), p["attn"], n_head, cache, i, at)
        x = x + ffn(layer_norm(x, **p["ln_2"]), p["mlp"]["c_fc"], p["mlp"]["c_proj"])
    cache.size = at + len(ids)
    return np.matmul(layer_norm(x, **params["ln_f"]), params["wte"]["weight"].T)


def prefill(params, ids, n_head):
    cache = ModelCache(len(params["h"]))
    return step(params, ids, n_head, cache, 0), cache


def decode_step(params, cache, token_id, pos, n_head):
    return step(params, [token_id], n_head, cache, pos)[0]


def sublayer0(params, ids, n_head, cache, at):
    p = params["h"][0]
    x = embed(params, ids, at)
    return x + cached_mha(layer_norm(x, **p["ln_1"]), p["attn"], n_head, cache, 0, at)


def single_step_attention(params, ids, n_head):
    cache = ModelCache(1)
    n = len(ids)
    if n > 1:
        sublayer0(params, ids[: n - 1], n_head, cache, 0)
    return sublayer0(params, ids[n - 1 :], n_head, cache, n - 1)[0]


def layer_attn_incremental(params, ids, n_head):
    cache = ModelCache(1)
    out = np.empty((len(ids), params["wte"]["weight"].shape[1]), dtype=np.float32)
    for at in range(len(ids)):
        out[at] = sublayer0(params, ids[at : at + 1], n_head, cache, at)[0]
    return out


def generate_cached(params, ids, n_new, n_head):
    logits, cache = prefill(params, ids, n_head)
    token = int(np.argmax(logits[-1]))
    tokens = [token]
    for _ in range(1, n_new):
        token = int(np.argmax(decode_step(params, cache, token, len(cache), n_head)))
        tokens.append(token)
    return tokens
