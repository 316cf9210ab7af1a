"""GPT-2 in numpy: the slow path, recomputing every position for every new token."""

import json
import math
from pathlib import Path

import numpy as np


def load_weights(path):
    """Load model.safetensors -> (params nested like the checkpoint keys, n_head)."""
    params = {"h": {}}
    for key, value in read_safetensors(path).items():
        key = key.removeprefix("transformer.")
        if key.endswith((".attn.bias", ".attn.masked_bias")) or key == "lm_head.weight":
            continue
        node = params
        parts = key.split(".")
        if parts[0] == "h":
            node = params["h"].setdefault(int(parts[1]), {})
            parts = parts[2:]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    params["h"] = [params["h"][i] for i in range(len(params["h"]))]
    n_embd = params["wte"]["weight"].shape[1]
    config_file = Path(path).parent / "config.json"
    n_head = json.loads(config_file.read_text())["n_head"] if config_file.exists() else n_embd // 64
    return params, n_head


_STORED = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}  # numpy has no bfloat16: read its bits


def read_safetensors(path):
    """Every tensor of a .safetensors file as float32, whether stored as F32, F16 or BF16."""
    # The format: 8 bytes of header length, a JSON header (name -> dtype, shape, byte offsets), then the data.
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    header.pop("__metadata__", None)
    tensors = {}
    for name, info in header.items():
        offset = 8 + header_len + info["data_offsets"][0]
        count = int(np.prod(info["shape"]))
        value = np.fromfile(path, dtype=_STORED[info["dtype"]], count=count, offset=offset)
        if info["dtype"] == "BF16":  # a bfloat16 is the upper half of a float32
            value = (value.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = value.astype(np.float32, copy=False).reshape(info["shape"])
    return tensors


# Plain Python floats as constants: a numpy float64 scalar would promote float32 arrays to float64.
def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    variance = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + eps) * weight + bias


def linear(x, weight, bias):  # Conv1D: weight is [in, out]
    return x @ weight + bias


def embed(params, ids, start=0):  # [n] -> [n, n_embd], positions start..start+n-1
    ids = np.asarray(ids)
    return params["wte"]["weight"][ids] + params["wpe"]["weight"][start : start + len(ids)]


def split_heads(x, n_head):  # [n, n_embd] -> [n_head, n, head_dim]
    return x.reshape(x.shape[0], n_head, -1).transpose(1, 0, 2)


def merge_heads(x):  # [n_head, n, head_dim] -> [n, n_embd]
    return x.transpose(1, 0, 2).reshape(x.shape[1], -1)


def attention(q, k, v, mask):  # [h, n_q, d], [h, n_k, d] -> [h, n_q, d]
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1]) + mask
    return softmax(scores) @ v


def causal_mask(n_q, n_k):  # query i sits at key position n_k - n_q + i
    offset = n_k - n_q
    return np.where(np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + offset, 0.0, -1e10).astype(np.float32)


def mha(x, c_attn, c_proj, n_head):  # [n, n_embd] -> [n, n_embd]
    q, k, v = np.split(linear(x, **c_attn), 3, axis=-1)
    q, k, v = (split_heads(t, n_head) for t in (q, k, v))
    out = attention(q, k, v, causal_mask(x.shape[0], x.shape[0]))
    return linear(merge_heads(out), **c_proj)


def ffn(x, c_fc, c_proj):
    return linear(gelu(linear(x, **c_fc)), **c_proj)


def block(x, ln_1, attn, ln_2, mlp, n_head):
    x = x + mha(layer_norm(x, **ln_1), **attn, n_head=n_head)
    return x + ffn(layer_norm(x, **ln_2), **mlp)


def forward(params, ids, n_head):  # [n] -> [n, n_vocab]
    x = embed(params, ids)
    for layer in params["h"]:
        x = block(x, **layer, n_head=n_head)
    return layer_norm(x, **params["ln_f"]) @ params["wte"]["weight"].T


def generate(params, ids, n_new, n_head):
    """Greedy decoding by recomputing everything at every step."""
    ids = list(ids)
    for _ in range(n_new):
        ids.append(int(np.argmax(forward(params, ids, n_head)[-1])))
    return ids[-n_new:]
