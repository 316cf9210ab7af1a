"""Submissions with no KV cache that try to pass cache-scaling, and the honest ones to compare them with.

Each is the source of a `tests/adapters.py` over the reference solution's `src/` (whose `gpt2.py`
holds the recompute path). Used by bench/cache_scaling.py and tests/e2e/test_cache_proof.py. Every
trick prints one line of evidence to stdout that its mechanism ran in the student's process
(the clock it patched, the CPU its parent did not see, ...): the grader must fail them anyway.
"""

_HEAD = """\
import functools
import os
import sys
import time

import numpy as np

import theinference
from src.gpt2 import block, embed, layer_norm, load_weights
from src.kvcache import generate_cached


@functools.cache
def _model():
    return load_weights(theinference.weights_path())


def careful_recompute(prompt_ids, n_new):
    # No cache, written with care: every layer over the whole sequence, the LM head on the last row only.
    params, n_head = _model()
    ids = list(prompt_ids)
    for _ in range(n_new):
        x = embed(params, ids)
        for layer in params["h"]:
            x = block(x, **layer, n_head=n_head)
        ids.append(int(np.argmax(layer_norm(x[-1:], **params["ln_f"]) @ params["wte"]["weight"].T)))
    return ids[len(prompt_ids):]
"""

SOLUTION_CACHE = (
    _HEAD
    + """
def run_greedy(prompt_ids, n_new):
    params, n_head = _model()
    return generate_cached(params, prompt_ids, n_new, n_head)
"""
)

CAREFUL_RECOMPUTE = (
    _HEAD
    + """
def run_greedy(prompt_ids, n_new):
    return careful_recompute(prompt_ids, n_new)
"""
)

# The old design timed the calls with time.process_time() inside this process.
CLOCK = (
    _HEAD
    + """
time.process_time = lambda: 0.0
time.perf_counter = lambda: 0.0


def run_greedy(prompt_ids, n_new):
    print(f"clock patched: process_time() = {time.process_time()}", flush=True)
    return careful_recompute(prompt_ids, n_new)
"""
)

# The old design's timing function lived in the student's process; replace whatever times or reports.
TIMING_MODULE = (
    _HEAD
    + """
def _patch():
    patched = []
    for name, module in list(sys.modules.items()):
        if name.startswith("theinference") and ("timing" in name or name.endswith("child")):
            for attr in ("measure", "single_thread_cpu", "_run_case", "_send"):
                if hasattr(module, attr):
                    original = getattr(module, attr)
                    if attr == "_send":
                        def forged(stream, _original=original, **message):
                            if message.get("event") == "done":
                                message["seconds"] = 0.001
                                message["timing"] = {"seconds": [0.001, 0.002], "blas": []}
                                message["cpu_seconds"] = 0.001
                            _original(stream, **message)
                        setattr(module, attr, forged)
                    patched.append(f"{name}.{attr}")
    return patched


_PATCHED = _patch()


def run_greedy(prompt_ids, n_new):
    print(f"timing patched: {', '.join(_PATCHED) or 'nothing found'}", flush=True)
    return careful_recompute(prompt_ids, n_new)
"""
)

# process_time() counts this process only: a forked child's CPU is invisible to it.
FORK_OFFLOAD = (
    _HEAD
    + """
def run_greedy(prompt_ids, n_new):
    read, write = os.pipe()
    started, wall = time.process_time(), time.monotonic()
    if os.fork() == 0:
        os.close(read)
        out = careful_recompute(prompt_ids, n_new)
        os.write(write, ",".join(map(str, out)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read().decode()
    os.wait()
    print(f"fork offload: parent CPU {time.process_time() - started:.3f} s in {time.monotonic() - wall:.3f} s", flush=True)
    return [int(t) for t in data.split(",")]
"""
)

# The old design timed the same prompt repeatedly: the fastest repeat was a memo hit.
MEMO = (
    _HEAD
    + """
_MEMO = {}
HITS = [0]


def run_greedy(prompt_ids, n_new):
    key = (tuple(prompt_ids), n_new)
    if key in _MEMO:
        HITS[0] += 1
    else:
        _MEMO[key] = careful_recompute(prompt_ids, n_new)
    print(f"memo hits: {HITS[0]}", flush=True)
    return _MEMO[key]
"""
)

# The old design's untimed warm-up used the timed prompt: generate far ahead once, serve prefixes.
WARMUP_PREFIX = (
    _HEAD
    + """
_AHEAD = {}
SERVED = [0]


def run_greedy(prompt_ids, n_new):
    key = tuple(prompt_ids)
    if key not in _AHEAD:
        params, _ = _model()
        room = params["wpe"]["weight"].shape[0] - len(prompt_ids)
        _AHEAD[key] = careful_recompute(prompt_ids, min(room, max(n_new, 480)) if not _AHEAD else n_new)
    else:
        SERVED[0] += 1
    print(f"prefix served: {SERVED[0]}", flush=True)
    return _AHEAD[key][:n_new]
"""
)

# Reach into the harness's frame: write the result and a 'done' message with invented timings, then leave.
FORGERY = (
    _HEAD
    + """
def _harness():
    frame = sys._getframe(1)
    while frame is not None and not {"proto", "index", "out_dir"} <= set(frame.f_locals):
        frame = frame.f_back
    return frame


def run_greedy(prompt_ids, n_new):
    tokens = careful_recompute(prompt_ids, n_new)
    frame = _harness()
    if frame is None:
        print("forgery: no harness frame found", flush=True)
        return tokens
    local = frame.f_locals
    out = os.path.join(str(local["out_dir"]), f"case-{local['index']}.npy")
    np.save(out, np.asarray(tokens))
    stream = local["proto"]
    forged = {"event": "done", "case": local["index"], "status": "ok", "file": out, "seconds": 0.001,
              "output": [0, 0], "timing": {"seconds": [0.001, 0.03], "blas": [{"threads": 1}]}, "cpu_seconds": 0.001}
    import json
    stream.write(json.dumps(forged) + "\\n")
    stream.flush()
    print(f"forgery: done message for call {local['index']} sent", flush=True)
    sys.stdout.flush()
    os._exit(0)
"""
)

# No cache, with short calls padded by busy work so that the per-token cost is flat.
PADDING = (
    _HEAD
    + """
def run_greedy(prompt_ids, n_new):
    started = time.process_time()
    tokens = careful_recompute(prompt_ids, n_new)
    spent = time.process_time() - started
    # Pad to the per-token rate of a long recompute: (a) then sees a flat cost.
    params, _ = _model()
    rate = 12 * len(params["h"]) * params["wte"]["weight"].shape[1] ** 2 * 250 / 1e10  # s per token at ~250 rows
    while time.process_time() - started < rate * n_new:
        sum(i * i for i in range(1000))
    print(f"padded: {spent:.3f} s of work to {time.process_time() - started:.3f} s", flush=True)
    return tokens
"""
)

# An honest cache that burns 40 ms of CPU on every token: flat and slower than a recompute here, so it must
# fail as too-slow, never no-cache (its cost does not grow with position).
SLOW_CACHE = (
    _HEAD
    + """
def run_greedy(prompt_ids, n_new):
    params, n_head = _model()
    out = generate_cached(params, prompt_ids, n_new, n_head)
    started = time.process_time()
    while time.process_time() - started < 0.04 * n_new:
        sum(i * i for i in range(1000))
    return out
"""
)

# The newcomer's slip of issue 37: the attention scale a NumPy float64 (`1.0 / np.sqrt(d)` promotes float32 arrays
# under NumPy 2; here the cast is explicit, so the subject computes in float64 under NumPy 1 too). Every array after
# it is float64 and every matmul converts its float32 weights: a correct cache, flat in cost, computing in float64.
# Its decode step returns float64 logits (the precision cache-scaling reads), as the solution's would with the slip.
_FLOAT64 = """
import src.gpt2
import src.kvcache
from src.gpt2 import softmax
from src.kvcache import decode_step, prefill


def _attention(q, k, v, mask):  # the solution's, with its scale a NumPy float64
    scores = q.astype(np.float64) @ k.transpose(0, 2, 1) * (1.0 / np.sqrt(np.float64(q.shape[-1]))) + mask
    return softmax(scores) @ v


src.gpt2.attention = src.kvcache.attention = _attention


def run_decode_step(prompt_ids, next_id):
    params, n_head = _model()
    return decode_step(params, prefill(params, prompt_ids, n_head)[1], next_id, len(prompt_ids), n_head)
"""

FLOAT64_CACHE = (
    _HEAD
    + _FLOAT64
    + """

def run_greedy(prompt_ids, n_new):
    params, n_head = _model()
    return generate_cached(params, prompt_ids, n_new, n_head)
"""
)

# The careful recompute with the same slip: float64 throughout, and its decode step says so. It must fail (no-cache).
FLOAT64_RECOMPUTE = (
    _HEAD
    + _FLOAT64
    + """

def run_greedy(prompt_ids, n_new):
    return careful_recompute(prompt_ids, n_new)
"""
)

# A forgery of the precision: the careful recompute in float32 with every call padded to three times PADDING's rate
# (so its cost looks flat, the diagnostic calls' included) and its decode step casting its logits to float64, so
# that (b) would be set against the dearer float64 recompute. It must still fail: its tokens after the diagnostic
# prompt cost a recompute's, far over the oracle's float64 step (costcase._CLAIM).
FLOAT64_CLAIM = (
    _HEAD
    + """
from src.kvcache import decode_step, prefill


def run_decode_step(prompt_ids, next_id):
    params, n_head = _model()
    return decode_step(params, prefill(params, prompt_ids, n_head)[1], next_id, len(prompt_ids), n_head).astype(
        np.float64
    )


def run_greedy(prompt_ids, n_new):
    started = time.process_time()
    tokens = careful_recompute(prompt_ids, n_new)
    params, _ = _model()
    rate = 3 * 12 * len(params["h"]) * params["wte"]["weight"].shape[1] ** 2 * 250 / 1e10
    while time.process_time() - started < rate * n_new:
        sum(i * i for i in range(1000))
    return tokens
"""
)

TRICKS = {
    "clock": CLOCK,
    "timing-module": TIMING_MODULE,
    "fork-offload": FORK_OFFLOAD,
    "memo": MEMO,
    "warmup-prefix": WARMUP_PREFIX,
    "forgery": FORGERY,
}
