"""GPT-2 in numpy float32, exactly Hugging Face semantics: the grader's source of truth.

Conv1D weights are stored [in, out]; GELU is the tanh approximation; layer-norm eps is 1e-5;
the LM head is tied to wte. picoGPT-style pure functions over params named like the checkpoint.
GPT-2 with a student's bug is model/defective.py, built on these functions.
"""

import numpy as np

LN_EPS = np.float32(1e-5)
_GELU_C = np.float32(np.sqrt(2.0 / np.pi))


def gelu(x):  # [..., n] -> [..., n]
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed in place to spare temporaries.
    inner = x * x
    inner *= np.float32(0.044715) * x
    inner += x
    inner *= _GELU_C
    np.tanh(inner, out=inner)
    inner += np.float32(1.0)
    inner *= np.float32(0.5) * x
    return inner


def layer_norm(x, weight, bias, eps=LN_EPS):  # [n_seq, n_embd] -> [n_seq, n_embd]
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    variance = np.mean(centered * centered, axis=-1, keepdims=True)
    centered /= np.sqrt(variance + eps)
    return centered * weight + bias


def linear(x, weight, bias):  # [n_seq, n_in] -> [n_seq, n_out]; Conv1D stores weight [in, out]
    out = x @ weight
    out += bias
    return out


def softmax(x):  # [..., n] -> [..., n]; x is left as it was (instructors' oracles build on these functions)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


def mha(x, c_attn, c_proj, n_head):  # [n_seq, n_embd] -> [n_seq, n_embd], causal
    n_seq, n_embd = x.shape
    qkv = linear(x, **c_attn).reshape(n_seq, 3, n_head, n_embd // n_head).transpose(1, 2, 0, 3)
    q, k, v = qkv  # [n_head, n_seq, head_dim] each
    scores = q @ k.transpose(0, 2, 1)  # [n_head, n_seq, n_seq]
    scores *= np.float32(1.0 / np.sqrt(n_embd // n_head))
    scores[:, ~np.tri(n_seq, dtype=bool)] = -np.inf
    heads = softmax(scores) @ v  # [n_head, n_seq, head_dim]
    return linear(heads.transpose(1, 0, 2).reshape(n_seq, n_embd), **c_proj)


def ffn(x, c_fc, c_proj):  # [n_seq, n_embd] -> [n_seq, n_embd]
    return linear(gelu(linear(x, **c_fc)), **c_proj)


def transformer_block(x, ln_1, attn, ln_2, mlp, n_head):  # [n_seq, n_embd] -> [n_seq, n_embd]
    x = x + mha(layer_norm(x, **ln_1), **attn, n_head=n_head)
    return x + ffn(layer_norm(x, **ln_2), **mlp)


def embed(params, ids):  # [n_seq] -> [n_seq, n_embd]
    ids = np.asarray(ids, dtype=np.int64)
    return params["wte"]["weight"][ids] + params["wpe"]["weight"][: len(ids)]


def layer0_attn_sublayer(params, ids, n_head):  # [n_seq] -> [n_seq, n_embd]
    """The residual stream after layer 0's attention sublayer: x + attn(ln_1(x))."""
    x = embed(params, ids)
    block = params["h"][0]
    return x + mha(layer_norm(x, **block["ln_1"]), **block["attn"], n_head=n_head)


def hidden_states(params, ids, n_head):  # [n_seq] -> [n_seq, n_embd], after ln_f
    x = embed(params, ids)
    for block in params["h"]:
        x = transformer_block(x, **block, n_head=n_head)
    return layer_norm(x, **params["ln_f"])


def lm_head(params, h):  # [n_rows, n_embd] -> [n_rows, n_vocab], tied to wte
    return h @ params["wte"]["weight"].T


def logits(params, ids, n_head, rows=None):  # [n_seq] -> [n_seq or len(rows), n_vocab]
    """Logits at every position (or only at `rows`, sparing the LM head for the others)."""
    h = hidden_states(params, ids, n_head)
    return lm_head(params, h if rows is None else h[rows])


def per_step_logits(params, prompt_ids, cont_ids, n_head):  # -> [len(cont_ids), n_vocab]
    """Row k: the logits seen before consuming cont[k]; one causal forward over prompt + cont[:-1]."""
    ids = list(prompt_ids) + list(cont_ids)[:-1]
    start = len(prompt_ids) - 1
    return logits(params, ids, n_head, rows=slice(start, start + len(cont_ids)))


def greedy(params, prompt_ids, n_new, n_head):  # -> [n_new] token ids
    """Greedy continuation by full recompute at every step (no cache: the reference path)."""
    ids = list(prompt_ids)
    for _ in range(n_new):
        ids.append(int(np.argmax(logits(params, ids, n_head, rows=slice(len(ids) - 1, len(ids)))[0])))
    return ids[len(prompt_ids) :]
