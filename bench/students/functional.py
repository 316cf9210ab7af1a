# Style "functional": one module of pure functions, einsum for attention, the cache a list of (k, v) per layer.
import json
from pathlib import Path

import numpy as np
import theinference


def load():
    path = theinference.weights_path()
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    w = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        w[name.removeprefix("transformer.")] = np.frombuffer(raw[8 + n + a : 8 + n + b], dtype=np.float32).reshape(
            info["shape"]
        )
    cfg = json.loads((Path(path).parent / "config.json").read_text())
    return w, cfg


W, CFG = load()
N_LAYER, N_EMBD = CFG["n_layer"], CFG["n_embd"]
N_HEAD = {{N_HEAD}}
HD = N_EMBD // N_HEAD
CACHE_STORE = []


def ln(x, p):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + {{EPS}}) * W[p + ".weight"] + W[p + ".bias"]


def gelu(x):
    return {{GELU}}


def heads(t):
    return t.reshape(t.shape[0], N_HEAD, HD).transpose(1, 0, 2)


def qkv(x, i):
    y = x @ W[f"h.{i}.attn.c_attn.weight"] + W[f"h.{i}.attn.c_attn.bias"]
    {{SPLIT}}
    return heads(q), heads(k), heads(v)


def attend(q, k, v, mask):
    s = np.einsum("hqd,hkd->hqk", q, k) * {{SCALE}}
    s = s + mask
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(-1, keepdims=True)
    o = np.einsum("hqk,hkd->hqd", p, v)
    return o.transpose(1, 0, 2).reshape(q.shape[1], N_EMBD)


def proj(o, i):
    return o @ W[f"h.{i}.attn.c_proj.weight"] + W[f"h.{i}.attn.c_proj.bias"]


def mlp(x, i):
    h = gelu(x @ W[f"h.{i}.mlp.c_fc.weight"] + W[f"h.{i}.mlp.c_fc.bias"])
    return h @ W[f"h.{i}.mlp.c_proj.weight"] + W[f"h.{i}.mlp.c_proj.bias"]


def causal(n):
    return {{MASK}}


def positions(ids):
    return W["wpe.weight"][{{FWD_POS}}]


def run_forward(seq_ids):
    x = W["wte.weight"][seq_ids] + positions(seq_ids)
    for i in range(N_LAYER):
        q, k, v = qkv(ln(x, f"h.{i}.{{FWD_LN_ATTN}}"), i)
        x = x + proj(attend(q, k, v, causal(len(seq_ids))), i)
        x = x + mlp(ln(x, f"h.{i}.ln_2"), i)
    return ln(x, "ln_f") @ W["wte.weight"].T


def new_cache():
    {{NEW_CACHE}}


def step(cache, ids, start):
    """Consume ids at positions start.. with the cache; returns the final hidden rows (before ln_f)."""
    n = len(ids)
    x = W["wte.weight"][ids] + W["wpe.weight"][{{STEP_POS}}]
    for i in range(N_LAYER):
        q, k, v = qkv(ln(x, f"h.{i}.ln_1"), i)
        {{APPEND}}
        total = cache[i][0].shape[1]
        mask = np.where(np.arange(total)[None, :] <= np.arange(n)[:, None] + total - n, 0.0, -1e10)
        x = x + proj(attend(q, K, V, mask), i)
        x = x + mlp(ln(x, f"h.{i}.{{CACHED_LN_MLP}}"), i)
    return x


def logits(x):
    return ln(x, "ln_f") @ W["wte.weight"].T


def run_single_step(seq_ids):
    cache = new_cache()
    if len(seq_ids) > 1:
        step(cache, seq_ids[:-1], 0)
    x = W["wte.weight"][seq_ids[-1:]] + W["wpe.weight"][[len(seq_ids) - 1]]
    q, k, v = qkv(ln(x, "h.0.ln_1"), 0)
    K = np.concatenate([cache[0][0], k], 1) if len(seq_ids) > 1 else k
    V = np.concatenate([cache[0][1], v], 1) if len(seq_ids) > 1 else v
    return (x + proj(attend(q, K, V, 0.0), 0))[0]


def run_layer_equiv(seq_ids):
    K = V = None
    out = []
    for pos, t in enumerate(seq_ids):
        x = W["wte.weight"][[t]] + W["wpe.weight"][[pos]]
        q, k, v = qkv(ln(x, "h.0.ln_1"), 0)
        K = k if K is None else np.concatenate([K, k], 1)
        V = v if V is None else np.concatenate([V, v], 1)
        out.append((x + proj(attend(q, K, V, 0.0), 0))[0])
    return np.stack(out)


def run_decode_step(prompt_ids, next_id):
    cache = new_cache()
    step(cache, prompt_ids, 0)
    return logits(step(cache, [next_id], {{DECODE_POS}}))[0]


def run_per_step_logits(prompt_ids, cont_ids):
    cache = new_cache()
    rows = [logits(step(cache, prompt_ids, 0))[-1]]
    for j, t in enumerate(cont_ids[:-1]):
        rows.append(logits(step(cache, [t], len(prompt_ids) + {{PER_STEP_J}}))[0])
    return np.stack(rows)


def run_greedy(prompt_ids, n_new):
    cache = new_cache()
    nxt = int(np.argmax(logits(step(cache, prompt_ids, 0))[-1]))
    out = [nxt]
    while len(out) < {{N_OUT}}:
        row = logits(step(cache, [{{FED}}], {{GREEDY_POS}}))[0]
        out.append(int({{CHOICE}}))
    return out
