"""The copy circuit built into synthetic checkpoints, so that greedy continuations vary.

Random weights alone make greedy generation repeat one token: nothing ties the next token to the
earlier ones. Here the residual stream's last dims are split into channels that only the circuit
uses (no layer but the last writes into them):

  positional  32 dims: wpe holds 16 cos/sin pairs at fixed frequencies (small amplitude, beside
              wpe's smooth part), wte holds nothing
  token       32 dims: wte's entries there are what the copy heads read; wpe holds nothing
  output      64 dims: what the copy heads write and the tied LM head reads; every wte row has
              the same norm there, so no token wins argmaxes for its length alone

In the last layer, head 0 attends to its own position and head 1 to the position LAG back
(its query turns each positional pair back by LAG steps of its frequency; while there is no
such position it falls back to its own). Both carry the token channel through a random map
into the output channel, at a scale that dominates the stream, so the next token is a hash of
(this token, the token LAG back): any wrong token fed back or any position off by one changes
it. <|endoftext|>'s output-channel row is aligned with what head 1 makes of it, so it comes
back LAG + 1 tokens after it appears.
"""

import numpy as np

from theinference.model import gpt2 as oracle
from theinference.model.weights import GPT2Config, nest

EOT = 50256
LAG = 2
_N_PAIRS = 16
_TOKEN_DIMS = 32
_OUT_DIMS = 64
_POS_AMPLITUDE = 0.005  # small beside wpe's smooth part (0.1), so position bugs keep their smooth shapes
_WTE_STD = 0.1
# Fixed (not seeded) frequencies in radians per position, picked once among 400 draws: with them the
# heads' positional kernels peak at least 7.5 (of 16) above every side lobe out to 1024 positions.
_FREQUENCIES = np.random.default_rng(315).uniform(0.35, 3.0, _N_PAIRS)
_KERNEL_MARGIN = 7.5
_SCORE_MARGIN = 40.0  # wanted attention-score margin of the right key over the best other, after 1/sqrt(hd)
_DOMINANCE = 10.0  # the copy heads' output, as a multiple of the spread of the stream they write into


def channels(n_embd: int) -> dict[str, slice]:
    """The circuit's channels: the last 128 dims of the residual stream."""
    pos = slice(n_embd - 2 * _N_PAIRS, n_embd)
    tok = slice(pos.start - _TOKEN_DIMS, pos.start)
    return {"out": slice(tok.start - _OUT_DIMS, tok.start), "tok": tok, "pos": pos}


def _positional_pairs(n_ctx: int, seed: int) -> np.ndarray:  # -> [n_ctx, 2 * _N_PAIRS]
    phases = np.random.default_rng([seed, 315]).uniform(0, 2 * np.pi, _N_PAIRS)
    angles = np.arange(n_ctx)[:, None] * _FREQUENCIES + phases
    return _POS_AMPLITUDE * np.stack([np.cos(angles), np.sin(angles)], axis=-1).reshape(n_ctx, -1)


def _rotation(lag: int) -> np.ndarray:  # [2P, 2P]: a row of pairs times it is turned back by lag positions
    out = np.zeros((2 * _N_PAIRS, 2 * _N_PAIRS))
    for k, beta in enumerate(-_FREQUENCIES * lag):
        out[2 * k : 2 * k + 2, 2 * k : 2 * k + 2] = [[np.cos(beta), np.sin(beta)], [-np.sin(beta), np.cos(beta)]]
    return out


def _residual_spread(tensors: dict, config: GPT2Config) -> float:
    """The spread of the last layer's input over fixed random tokens, rounded so that bytes stay stable."""
    params = nest(dict(tensors), config.n_layer)
    x = oracle.embed(params, np.random.default_rng(0).integers(0, config.n_vocab, 64))
    for block in params["h"][:-1]:
        x = oracle.transformer_block(x, **block, n_head=config.n_head)
    return float(np.round(x.std(), 1))


def _isolate_channels(tensors: dict, config: GPT2Config, seed: int) -> None:
    """wte and wpe as the channels need them; no layer but the last writes into tok or pos."""
    ch = channels(config.n_embd)
    wte = tensors["wte.weight"]
    wte[:, ch["pos"]] = 0.0
    out = wte[:, ch["out"]]
    out *= np.float32(_WTE_STD * np.sqrt(_OUT_DIMS)) / np.linalg.norm(out, axis=1, keepdims=True)
    tensors["wpe.weight"][:, ch["pos"]] = _positional_pairs(config.n_ctx, seed)
    tensors["wpe.weight"][:, ch["tok"]] = 0.0  # the token channel carries the token alone
    for i in range(config.n_layer - 1):
        for name in ("attn.c_proj", "mlp.c_proj"):
            for dims in (ch["tok"], ch["pos"]):
                tensors[f"h.{i}.{name}.weight"][:, dims] = 0.0
                tensors[f"h.{i}.{name}.bias"][dims] = 0.0


def _copy_heads(tensors: dict, config: GPT2Config, seed: int) -> None:
    """Heads 0 (self) and 1 (LAG back) of the last layer: positional queries and keys, token values."""
    n, hd, last = config.n_embd, config.n_embd // config.n_head, f"h.{config.n_layer - 1}."
    ch, rng, sigma = channels(n), np.random.default_rng([seed, 10]), _residual_spread(tensors, config)
    # Scores are scale^2 * (amplitude / sigma)^2 / sqrt(hd) times the kernel.
    scale = np.sqrt(_SCORE_MARGIN * np.sqrt(hd) / _KERNEL_MARGIN) * sigma / _POS_AMPLITUDE
    # A value is ~wte's spread / sigma per dim over the token channel; the output channel's norm must
    # dominate the whole stream's (sigma * sqrt(n)), or the other dims' fixed parts make some tokens hubs.
    # Half the gain in the value projection, half in the output projection.
    gain = np.sqrt(_DOMINANCE * sigma * np.sqrt(n / _OUT_DIMS) / (np.sqrt(_TOKEN_DIMS) * _WTE_STD / sigma))
    w, b, proj = (tensors[last + k] for k in ("attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight"))
    eye = np.eye(2 * _N_PAIRS)
    # ln_1 subtracts the stream's mean, a different constant at every position: the centring matrix ignores it.
    centre = eye - 1.0 / (2 * _N_PAIRS)
    for head, blocks in {0: [eye], 1: [_rotation(LAG), 0.5 * eye]}.items():
        cols = np.arange(head * hd, (head + 1) * hd)
        w[:, np.concatenate([cols, n + cols, 2 * n + cols])] = 0.0
        b[np.concatenate([cols, n + cols, 2 * n + cols])] = 0.0
        for i, block in enumerate(blocks):
            dims = cols[i * 2 * _N_PAIRS : (i + 1) * 2 * _N_PAIRS]
            w[ch["pos"], dims[0] : dims[-1] + 1] = scale * centre @ block
            w[ch["pos"], n + dims[0] : n + dims[-1] + 1] = scale * centre
        w[ch["tok"], 2 * n + cols[0] : 2 * n + cols[0] + _TOKEN_DIMS] = gain * np.eye(_TOKEN_DIMS)
        proj[cols, :] = 0.0
        proj[cols[0] : cols[0] + _TOKEN_DIMS, ch["out"]] = gain * rng.standard_normal((_TOKEN_DIMS, _OUT_DIMS))
    ln_w, ln_b = tensors[last + "ln_1.weight"], tensors[last + "ln_1.bias"]
    for channel in (ch["tok"], ch["pos"]):
        ln_w[channel], ln_b[channel] = 1.0, 0.0


def _align_eot(tensors: dict, config: GPT2Config, seed: int) -> None:
    """<|endoftext|>'s rows: a stronger token-channel entry, an output-channel row leaning on it.

    Its output-channel row leans (cosine 0.8) towards what head 1 writes when it copies
    <|endoftext|>, orthogonally to what head 0 writes for it: <|endoftext|> then comes back
    LAG + 1 tokens after it appears, not at once (which would repeat it forever). The 1.5x
    token entry makes that copy win; the lean of 0.8 keeps tokens whose token-channel entries
    happen to resemble <|endoftext|>'s from bringing it too.
    """
    ch, hd = channels(config.n_embd), config.n_embd // config.n_head
    eot = tensors["wte.weight"][EOT]
    eot[ch["tok"]] *= 1.5
    proj = tensors[f"h.{config.n_layer - 1}.attn.c_proj.weight"]
    made, itself = (eot[ch["tok"]] @ proj[h * hd : h * hd + _TOKEN_DIMS, ch["out"]] for h in (1, 0))
    made = made - itself * (made @ itself) / (itself @ itself)
    other = np.random.default_rng([seed, EOT]).standard_normal(_OUT_DIMS)
    other -= made * (other @ made) / (made @ made)
    row = 0.8 * made / np.linalg.norm(made) + 0.6 * other / np.linalg.norm(other)
    eot[ch["out"]] = row * np.linalg.norm(eot[ch["out"]])


def install_copy_circuit(tensors: dict, config: GPT2Config, seed: int) -> None:
    """Build the copy circuit into freshly drawn tensors, in place (deterministic for a seed)."""
    _isolate_channels(tensors, config, seed)
    _copy_heads(tensors, config, seed)
    _align_eot(tensors, config, seed)
