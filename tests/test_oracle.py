"""The oracle is exactly GPT-2: checked against an independent float64 per-head loop."""

import numpy as np
import pytest

from theinference.model import gpt2 as oracle

IDS = [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 50256, 40]


def _ln(x, weight, bias):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * weight + bias


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _reference(params, ids, n_head):
    """Straightforward float64 GPT-2 with an explicit loop over heads and positions.

    Returns (layer-0 attention-sublayer output, logits at every position).
    """
    p = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    x = p(params["wte"]["weight"])[ids] + p(params["wpe"]["weight"])[: len(ids)]
    layer0 = None
    for i, block in enumerate(params["h"]):
        h = _ln(x, p(block["ln_1"]["weight"]), p(block["ln_1"]["bias"]))
        qkv = h @ p(block["attn"]["c_attn"]["weight"]) + p(block["attn"]["c_attn"]["bias"])
        n_embd = x.shape[1]
        head_dim = n_embd // n_head
        q, k, v = qkv[:, :n_embd], qkv[:, n_embd : 2 * n_embd], qkv[:, 2 * n_embd :]
        out = np.zeros_like(q)
        for head in range(n_head):
            cols = slice(head * head_dim, (head + 1) * head_dim)
            for t in range(len(ids)):
                scores = np.array([q[t, cols] @ k[s, cols] for s in range(t + 1)]) / np.sqrt(head_dim)
                weights = np.exp(scores - scores.max())
                out[t, cols] = (weights / weights.sum()) @ v[: t + 1, cols]
        x = x + out @ p(block["attn"]["c_proj"]["weight"]) + p(block["attn"]["c_proj"]["bias"])
        if i == 0:
            layer0 = x.copy()
        h = _ln(x, p(block["ln_2"]["weight"]), p(block["ln_2"]["bias"]))
        hidden = _gelu_tanh(h @ p(block["mlp"]["c_fc"]["weight"]) + p(block["mlp"]["c_fc"]["bias"]))
        x = x + hidden @ p(block["mlp"]["c_proj"]["weight"]) + p(block["mlp"]["c_proj"]["bias"])
    final = _ln(x, p(params["ln_f"]["weight"]), p(params["ln_f"]["bias"]))
    return layer0, final @ p(params["wte"]["weight"]).T


@pytest.fixture(scope="module")
def reference(tiny_model):
    return _reference(tiny_model.params, IDS, tiny_model.config.n_head)


def test_layer0_attn_sublayer_matches_float64_loop(tiny_model, reference):
    got = oracle.layer0_attn_sublayer(tiny_model.params, IDS, tiny_model.config.n_head)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference[0], atol=1e-5, rtol=1e-5)


def test_logits_match_float64_loop_at_every_position(tiny_model, reference):
    got = oracle.logits(tiny_model.params, IDS, tiny_model.config.n_head)
    assert got.shape == (len(IDS), 50257)
    np.testing.assert_allclose(got, reference[1], atol=1e-5, rtol=1e-5)


def test_logits_have_realistic_spread(reference):
    # Synthetic weights must make a wrong model visible: logits spread over units, not ~0.
    assert reference[1].std() > 0.5


def test_per_step_logits_are_rows_of_one_forward(tiny_model, reference):
    prompt, cont = IDS[:4], IDS[4:]
    got = oracle.per_step_logits(tiny_model.params, prompt, cont, tiny_model.config.n_head)
    assert got.shape == (len(cont), 50257)
    # Row k is the logits at position len(prompt)-1+k, seen before consuming cont[k].
    np.testing.assert_allclose(got, reference[1][3 : 3 + len(cont)], atol=1e-5, rtol=1e-5)


def test_greedy_is_argmax_of_recompute_at_each_step(tiny_model):
    n_head = tiny_model.config.n_head
    prompt = IDS[:3]
    tokens = oracle.greedy(tiny_model.params, prompt, 5, n_head)
    assert len(tokens) == 5
    for k, token in enumerate(tokens):
        ids = prompt + tokens[:k]
        expected = int(np.argmax(_reference(tiny_model.params, ids, n_head)[1][-1]))
        assert token == expected


def test_gelu_is_the_tanh_approximation():
    x = np.linspace(-6, 6, 101, dtype=np.float32)
    np.testing.assert_allclose(oracle.gelu(x.copy()), _gelu_tanh(x.astype(np.float64)), atol=1e-6)


def test_layer_norm_uses_eps_1e5():
    # With a tiny variance the epsilon dominates: eps 1e-5 vs 1e-12 differ visibly.
    x = np.array([[0.0, 0.002]], dtype=np.float32)
    got = oracle.layer_norm(x, np.ones(2, np.float32), np.zeros(2, np.float32))
    np.testing.assert_allclose(got, _ln(x.astype(np.float64), 1.0, 0.0), rtol=1e-5)
    assert abs(got[0, 1]) < 0.31  # with eps 1e-12 it would be 1.0


def test_softmax_leaves_its_argument_as_it_was():
    scores = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]], dtype=np.float32)
    before = scores.copy()
    probs = oracle.softmax(scores)
    assert np.array_equal(scores, before)
    assert np.allclose(probs.sum(axis=-1), 1.0) and probs.dtype == np.float32
