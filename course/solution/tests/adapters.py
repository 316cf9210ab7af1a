"""The seam between this course's code and the grader: one function per stage."""

import functools

import numpy as np

import theinference
from src.gpt2 import forward, load_weights
from src.kvcache import decode_step, generate_cached, layer_attn_incremental, prefill, single_step_attention


@functools.cache
def _model():
    return load_weights(theinference.weights_path())


def run_forward(seq_ids):
    """seq_ids: [n] -> [n, n_vocab]: the logits at every position, by one full forward pass."""
    params, n_head = _model()
    return forward(params, seq_ids, n_head)


def run_single_step(seq_ids):
    """seq_ids: [n] -> [n_embd]: layer 0's attention-sublayer output at the last position, from the cache."""
    params, n_head = _model()
    return single_step_attention(params, seq_ids, n_head)


def run_layer_equiv(seq_ids):
    """seq_ids: [n] -> [n, n_embd]: layer 0's attention-sublayer output, incrementally from one cache."""
    params, n_head = _model()
    return layer_attn_incremental(params, seq_ids, n_head)


def run_decode_step(prompt_ids, next_id):
    """-> [n_vocab]: prefill prompt_ids, then one decode step of next_id at position len(prompt_ids)."""
    params, n_head = _model()
    return decode_step(params, prefill(params, prompt_ids, n_head)[1], next_id, len(prompt_ids), n_head)


def run_per_step_logits(prompt_ids, cont_ids):
    """-> [len(cont_ids), n_vocab]: row k is the logits recorded before consuming cont_ids[k]."""
    params, n_head = _model()
    logits, cache = prefill(params, prompt_ids, n_head)
    rows = [logits[-1]]
    for k, token in enumerate(cont_ids[:-1]):
        rows.append(decode_step(params, cache, token, len(prompt_ids) + k, n_head))
    return np.stack(rows)


def run_greedy(prompt_ids, n_new):
    """-> n_new token ids, greedy (argmax) with the cache; no stop at <|endoftext|>."""
    params, n_head = _model()
    return generate_cached(params, prompt_ids, n_new, n_head)
