"""GPT-2 in numpy, the slow path: recompute every position for every new token.

Hugging Face semantics: Conv1D weights are stored [in, out] (so a linear layer is x @ W + b),
GELU is the tanh approximation, layer-norm epsilon is 1e-5, and the LM head is tied to wte.
Keep everything float32 (use Python floats, not numpy float64 scalars, as constants).
"""

import json
from pathlib import Path

import numpy as np


def load_weights(path):
    """Load model.safetensors -> (params, n_head).

    params is nested like the checkpoint keys: params["wte"]["weight"], params["h"][i]["attn"]["c_attn"]["weight"], ...
    This plumbing is given; the course starts at the maths below.
    """
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


def gelu(x):
    """The tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    raise NotImplementedError("gelu")


def softmax(x):
    """Softmax over the last axis, stable (subtract the max first)."""
    raise NotImplementedError("softmax")


def layer_norm(x, weight, bias, eps=1e-5):
    """[n, n_embd] -> [n, n_embd]: normalise each row, then scale by weight and shift by bias."""
    raise NotImplementedError("layer_norm")


def embed(params, ids, start=0):
    """[n] token ids -> [n, n_embd]: wte[ids] + wpe[start : start + n]."""
    raise NotImplementedError("embed")


def mha(x, c_attn, c_proj, n_head):
    """[n, n_embd] -> [n, n_embd]: causal multi-head self-attention over the whole sequence."""
    raise NotImplementedError("mha")


def ffn(x, c_fc, c_proj):
    """[n, n_embd] -> [n, n_embd]: c_proj(gelu(c_fc(x)))."""
    raise NotImplementedError("ffn")


def block(x, ln_1, attn, ln_2, mlp, n_head):
    """One transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.))."""
    raise NotImplementedError("block")


def forward(params, ids, n_head):
    """[n] token ids -> [n, n_vocab] logits at every position (LM head tied to wte)."""
    raise NotImplementedError("forward")


def generate(params, ids, n_new, n_head):
    """Greedy decoding by recomputing everything at every step -> n_new token ids."""
    raise NotImplementedError("generate")
