import math

import numpy as np

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu(x):
    inner = SQRT_2_OVER_PI * (x + 0.044715 * np.power(x, 3))
    return 0.5 * x * (1.0 + np.tanh(inner))


def softmax(x):
    shifted = x - np.max(x, axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / np.sum(weights, axis=-1, keepdims=True)


def layer_norm(x, weight, bias, eps=1e-5):
    centred = x - np.mean(x, axis=-1, keepdims=True)
    spread = np.mean(centred * centred, axis=-1, keepdims=True)
    return weight * centred / np.sqrt(spread + eps) + bias


def embed(params, ids, start=0):
    positions = np.arange(start, start + len(ids))
    return np.take(params["wte"]["weight"], ids, axis=0) + np.take(params["wpe"]["weight"], positions, axis=0)


def heads_attention(q, k, v, n_head, offset):
    """q: [n_q, n_embd] at positions offset.., k and v: [n_k, n_embd] -> [n_q, n_embd], head by head."""
    n_q, n_embd = q.shape
    size = n_embd // n_head
    future = np.arange(k.shape[0])[None, :] > (np.arange(n_q)[:, None] + offset)
    outputs = []
    for h in range(n_head):
        cols = slice(h * size, (h + 1) * size)
        scores = (q[:, cols] @ k[:, cols].T) / np.float32(math.sqrt(size))
        scores = np.where(future, np.float32(-1e10), scores)
        outputs.append(softmax(scores) @ v[:, cols])
    return np.concatenate(outputs, axis=1)


def mha(x, c_attn, c_proj, n_head):
    width = x.shape[1]
    qkv = x @ c_attn["weight"] + c_attn["bias"]
    out = heads_attention(qkv[:, :width], qkv[:, width : 2 * width], qkv[:, 2 * width :], n_head, 0)
    return out @ c_proj["weight"] + c_proj["bias"]


def ffn(x, c_fc, c_proj):
    hidden = gelu(x @ c_fc["weight"] + c_fc["bias"])
    return hidden @ c_proj["weight"] + c_proj["bias"]


def block(x, ln_1, attn, ln_2, mlp, n_head):
    h = x + mha(layer_norm(x, ln_1["weight"], ln_1["bias"]), attn["c_attn"], attn["c_proj"], n_head)
    return h + ffn(layer_norm(h, ln_2["weight"], ln_2["bias"]), mlp["c_fc"], mlp["c_proj"])


def forward(params, ids, n_head):
    h = embed(params, ids)
    for layer in params["h"]:
        h = block(h, layer["ln_1"], layer["attn"], layer["ln_2"], layer["mlp"], n_head)
    final = layer_norm(h, params["ln_f"]["weight"], params["ln_f"]["bias"])
    return final @ params["wte"]["weight"].T


def generate(params, ids, n_new, n_head):
    tokens = [int(t) for t in ids]
    produced = []
    while len(produced) < n_new:
        nxt = int(forward(params, tokens, n_head)[-1].argmax())
        tokens.append(nxt)
        produced.append(nxt)
    return produced
