import math

import numpy as np


def gelu(x):
    c = math.sqrt(2 / math.pi)
    return x * 0.5 * (1 + np.tanh(c * (x + 0.044715 * x * x * x)))


def softmax(x):
    z = np.exp(x - np.amax(x, axis=-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def layer_norm(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * (1 / np.sqrt(var + eps)) * weight + bias


def embed(params, ids, start=0):
    ids = np.asarray(ids, dtype=np.int64)
    return params["wte"]["weight"][ids] + params["wpe"]["weight"][start + np.arange(ids.size)]


def project(x, layer):
    return np.matmul(x, layer["weight"]) + layer["bias"]


def heads(x, n_head):  # [n, E] -> [H, n, E / H]
    n, e = x.shape
    return np.transpose(np.reshape(x, (n, n_head, e // n_head)), (1, 0, 2))


def attend(q, k, v, first):  # q: [H, n_q, D] at absolute positions first.., k and v: [H, n_k, D]
    scale = np.float32(1 / math.sqrt(q.shape[-1]))
    logits = np.einsum("hqd,hkd->hqk", q, k) * scale
    allowed = np.arange(k.shape[1]) <= (first + np.arange(q.shape[1]))[:, None]
    logits = np.where(allowed, logits, np.float32(-np.inf))
    mixed = np.einsum("hqk,hkd->hqd", softmax(logits), v)
    n_h, n_q, d = mixed.shape
    return np.transpose(mixed, (1, 0, 2)).reshape(n_q, n_h * d)


def mha(x, c_attn, c_proj, n_head):
    q, k, v = (heads(part, n_head) for part in np.split(project(x, c_attn), 3, axis=1))
    return project(attend(q, k, v, 0), c_proj)


def ffn(x, c_fc, c_proj):
    return project(gelu(project(x, c_fc)), c_proj)


def block(x, ln_1, attn, ln_2, mlp, n_head):
    a = mha(layer_norm(x, **ln_1), attn["c_attn"], attn["c_proj"], n_head)
    x = x + a
    m = ffn(layer_norm(x, **ln_2), mlp["c_fc"], mlp["c_proj"])
    return x + m


def forward(params, ids, n_head):
    x = embed(params, ids)
    for p in params["h"]:
        x = block(x, n_head=n_head, **p)
    x = layer_norm(x, **params["ln_f"])
    return np.matmul(x, params["wte"]["weight"].T)


def generate(params, ids, n_new, n_head):
    seq = list(ids)
    for _step in range(n_new):
        seq.append(int(np.argmax(forward(params, seq, n_head)[-1])))
    return seq[len(seq) - n_new :]
