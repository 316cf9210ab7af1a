# Style "classes": a GPT2 object with methods, a KVCache class, matmul with @, weights read with the safetensors header by hand.
import json
import math
import os

import numpy as np


class Weights:
    def __init__(self, path):
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
            data = f.read()
        header.pop("__metadata__", None)
        self.t = {}
        for name, info in header.items():
            a, b = info["data_offsets"]
            self.t[name.removeprefix("transformer.")] = np.frombuffer(data[a:b], dtype=np.float32).reshape(info["shape"])
        with open(os.path.join(os.path.dirname(path), "config.json")) as f:
            self.config = json.load(f)

    def __getitem__(self, name):
        return self.t[name]


class KVCache:
    def __init__(self, n_layer):
        self.layers = [[None, None] for _ in range(n_layer)]

    def __len__(self):
        return {{CACHE_LEN}}

    def add(self, layer, k, v):
        entry = self.layers[layer]
        entry[0] = k if entry[0] is None else np.concatenate([entry[0], k], axis=1)
        entry[1] = v if entry[1] is None else np.concatenate([entry[1], v], axis=1)
        return entry[0], entry[1]


_SHARED = {}


class GPT2:
    def __init__(self, path):
        self.w = Weights(path)
        self.n_layer = self.w.config["n_layer"]
        self.n_head = self.w.config["n_head"]
        self.n_embd = self.w.config["n_embd"]

    def norm(self, x, name):
        mu = np.mean(x, axis=-1, keepdims=True)
        var = {{VAR}}
        return self.w[name + ".weight"] * (x - mu) / np.sqrt(var + 1e-5) + self.w[name + ".bias"]

    def split(self, t):
        n = t.shape[0]
        return np.transpose(np.reshape(t, (n, self.n_head, self.n_embd // self.n_head)), (1, 0, 2))

    def attention(self, x, layer, cache=None, causal=True):
        p = f"h.{layer}.attn."
        fused = x @ self.w[p + "c_attn.weight"] + self.w[p + "c_attn.bias"]
        {{SPLIT}}
        q, k, v = self.split(q), self.split(k), self.split(v)
        if cache is not None:
            k, v = cache.add(layer, k, v)
        scores = q @ np.transpose(k, (0, 2, 1)) {{SCALE}}
        if causal:
            n_q, n_k = q.shape[1], k.shape[1]
            allowed = np.tril(np.ones((n_q, n_k), dtype=bool), k=n_k - n_q)
            scores = np.where(allowed, scores, -1e10)
        scores = np.exp(scores - np.max(scores, axis=-1, keepdims=True))
        weights = scores / np.sum(scores, axis=-1, keepdims=True)
        merged = np.transpose(weights @ v, (1, 0, 2)).reshape(q.shape[1], self.n_embd)
        return merged @ {{C_PROJ}} + self.w[p + "c_proj.bias"]

    def mlp(self, x, layer):
        p = f"h.{layer}.mlp."
        h = x @ self.w[p + "c_fc.weight"] + self.w[p + "c_fc.bias"]
        h = 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))
        return h @ self.w[p + "c_proj.weight"] + self.w[p + "c_proj.bias"]

    def embed(self, ids, start):
        return self.w["wte.weight"][ids] + self.w["wpe.weight"][start + np.arange(len(ids))]

    def forward(self, ids):
        x = self.embed(ids, {{FWD_START}})
        for layer in range(self.n_layer):
            x = x + self.attention(self.norm(x, f"h.{layer}.ln_1"), layer)
            x = x + self.mlp(self.norm(x, f"h.{layer}.ln_2"), layer)
        return self.head(x)

    def head(self, x):
        return {{HEAD}}

    def new_cache(self):
        {{NEW_CACHE}}

    def cached(self, ids, cache, start):
        x = self.embed(ids, start)
        for layer in range(self.n_layer):
            x = x + self.attention(self.norm(x, f"h.{layer}.ln_1"), layer, cache)
            x = x + self.mlp(self.norm(x, f"h.{layer}.{{CACHED_LN_MLP}}"), layer)
        return self.head(x)

    def prefill(self, ids):
        cache = self.new_cache()
        return self.cached(ids, cache, 0), cache

    def decode(self, cache, token, pos):
        return self.cached([token], cache, {{DECODE_POS}})[0]


_MODEL = None


def model():
    global _MODEL
    if _MODEL is None:
        import theinference

        _MODEL = GPT2(theinference.weights_path())
    return _MODEL


def run_forward(seq_ids):
    return model().forward(seq_ids)


def run_single_step(seq_ids):
    m = model()
    cache = m.new_cache()
    x_all = m.embed(seq_ids, 0)
    if len(seq_ids) > 1:
        m.attention(m.norm(x_all[:-1], "h.0.ln_1"), 0, cache)
    x = x_all[-1:]
    return (x + m.attention(m.norm(x, "h.0.ln_1"), 0, cache))[0]


def run_layer_equiv(seq_ids):
    m = model()
    cache = m.new_cache()
    rows = []
    for i in range(len(seq_ids)):
        x = m.embed(seq_ids[i : i + 1], i)
        rows.append((x + m.attention(m.norm(x, "h.0.ln_1"), 0, cache))[0])
    return np.array(rows)


def run_decode_step(prompt_ids, next_id):
    m = model()
    _, cache = m.prefill(prompt_ids)
    return m.decode(cache, next_id, len(prompt_ids))


def run_per_step_logits(prompt_ids, cont_ids):
    m = model()
    logits, cache = m.prefill(prompt_ids)
    out = [logits[-1]]
    for k in range(len(cont_ids) - 1):
        out.append(m.decode(cache, cont_ids[k], len(prompt_ids) + k))
    return np.array(out)


def run_greedy(prompt_ids, n_new):
    m = model()
    logits, cache = m.prefill(prompt_ids)
    tokens = [int(np.argmax(logits[-1]))]
    for _ in range(n_new - 1):
        {{GREEDY_BODY}}
    return tokens
