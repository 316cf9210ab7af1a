import math

import numpy as np


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def softmax(x):
    top = x.max(axis=-1)[..., None]
    ex = np.exp(x - top)
    return ex / ex.sum(axis=-1)[..., None]


def layer_norm(x, weight, bias, eps=1e-5):
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        dev = x[r] - x[r].sum() / x[r].size
        out[r] = dev / math.sqrt(float((dev * dev).mean()) + eps) * weight + bias
    return out


def embed(params, ids, start=0):
    rows = [params["wte"]["weight"][t] + params["wpe"]["weight"][start + i] for i, t in enumerate(ids)]
    return np.stack(rows)


def dense(x, w):
    return x @ w["weight"] + w["bias"]


def attend_one(q, keys, values, n_head):  # one query [E] over keys, values [n, E] -> [E]
    d = q.shape[0] // n_head
    out = []
    for h in range(n_head):
        s = slice(h * d, (h + 1) * d)
        w = softmax(keys[:, s] @ q[s] / math.sqrt(d))
        out.append(w @ values[:, s])
    return np.concatenate(out)


def mha(x, c_attn, c_proj, n_head):
    e = x.shape[1]
    qkv = dense(x, c_attn)
    rows = [attend_one(qkv[i, :e], qkv[: i + 1, e : 2 * e], qkv[: i + 1, 2 * e :], n_head) for i in range(x.shape[0])]
    return dense(np.stack(rows), c_proj)


def ffn(x, c_fc, c_proj):
    return dense(gelu(dense(x, c_fc)), c_proj)


def block(x, ln_1, attn, ln_2, mlp, n_head):
    x = x + mha(layer_norm(x, ln_1["weight"], ln_1["bias"]), attn["c_attn"], attn["c_proj"], n_head)
    return x + ffn(layer_norm(x, ln_2["weight"], ln_2["bias"]), mlp["c_fc"], mlp["c_proj"])


def forward(params, ids, n_head):
    x = embed(params, ids)
    for lyr in params["h"]:
        x = block(x, lyr["ln_1"], lyr["attn"], lyr["ln_2"], lyr["mlp"], n_head)
    return layer_norm(x, params["ln_f"]["weight"], params["ln_f"]["bias"]) @ params["wte"]["weight"].T


def generate(params, ids, n_new, n_head):
    ctx = list(ids)
    new = []
    for _ in range(n_new):
        logits = forward(params, ctx + new, n_head)
        new.append(int(np.argmax(logits[-1])))
    return new
