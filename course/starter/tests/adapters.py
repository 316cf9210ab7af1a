"""The seam between your code and the grader: one function per stage.

The grader calls these in a separate process, with the course root on sys.path and
THEINFERENCE_WEIGHTS set to the weights file (theinference.weights_path() returns it).
Return numpy arrays or nested lists; until a function is written it raises NotImplementedError,
and the grader reports that stage as "not started".
"""

import functools

import numpy as np

import theinference
from src.gpt2 import forward, load_weights
from src.kvcache import decode_step, generate_cached, layer_attn_incremental, prefill, single_step_attention


@functools.cache
def _model():
    return load_weights(theinference.weights_path())


def run_forward(seq_ids):
    """Stage forward. seq_ids: [n] -> [n, n_vocab].

    The slow path: one causal forward pass over the whole sequence (src/gpt2.py's forward),
    the logits at every position.
    """
    params, n_head = _model()
    return forward(params, seq_ids, n_head)


def run_single_step(seq_ids):
    """Stage single-step-attention. seq_ids: [n] -> [n_embd].

    Layer 0's attention-sublayer output for the *last* position, computed from the cache of
    the earlier positions.
    """
    params, n_head = _model()
    return single_step_attention(params, seq_ids, n_head)


def run_layer_equiv(seq_ids):
    """Stage prove-one-layer. seq_ids: [n] -> [n, n_embd].

    For every position, layer 0's attention-sublayer output x + attn(ln_1(x)), with
    x = wte[ids] + wpe[positions], computed incrementally from one fresh cache.
    """
    params, n_head = _model()
    return layer_attn_incremental(params, seq_ids, n_head)


def run_decode_step(prompt_ids, next_id):
    """Stage decode-step. -> [n_vocab].

    Prefill prompt_ids, then one decode_step of next_id at position len(prompt_ids); return its logits.
    """
    params, n_head = _model()
    logits, cache = prefill(params, prompt_ids, n_head)
    return decode_step(params, cache, next_id, len(prompt_ids), n_head)


def run_per_step_logits(prompt_ids, cont_ids):
    """Stage per-step-identity. -> [len(cont_ids), n_vocab].

    Row k is the logits recorded *before* consuming cont_ids[k]: row 0 is prefill's last row,
    row k (k >= 1) comes from decoding cont_ids[k - 1] at position len(prompt_ids) + k - 1.
    """
    params, n_head = _model()
    logits, cache = prefill(params, prompt_ids, n_head)
    rows = [logits[-1]]
    for k, token in enumerate(cont_ids[:-1]):
        rows.append(decode_step(params, cache, token, len(prompt_ids) + k, n_head))
    return np.stack(rows)


def run_greedy(prompt_ids, n_new):
    """Stage greedy. -> n_new token ids, greedy (argmax) with the cache; no stop at <|endoftext|>."""
    params, n_head = _model()
    return generate_cached(params, prompt_ids, n_new, n_head)
