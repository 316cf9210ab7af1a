"""Deterministic synthetic GPT-2-layout checkpoints (real weights cannot be fetched everywhere)."""

import json
import os
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from theinference.model.copycircuit import install_copy_circuit
from theinference.model.weights import GPT2Config, expected_shapes

# Bump when the drawing changes: checkpoints made on first use are cached under this version.
SYNTH_VERSION = 2

PRESETS = {
    "gpt2": GPT2Config(n_vocab=50257, n_ctx=1024, n_embd=768, n_head=12, n_layer=12),
    "tiny": GPT2Config(n_vocab=50257, n_ctx=256, n_embd=128, n_head=2, n_layer=2),
    # The cache proof's own weights (stages/cache-scaling.toml): the layers are half of a token's work (on
    # tiny the LM head is 94% of it, which no cache saves), the context long enough for a recompute's
    # quadratic cost to show, and a cached token cheap (bench/cache_scaling.py measures the margins).
    "proof": GPT2Config(n_vocab=50257, n_ctx=512, n_embd=128, n_head=2, n_layer=16),
}


def _std(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(mean, std) of a tensor's draw.

    Token embeddings N(0, 0.1) (position embeddings: see _position_embeddings); biases N(0, 0.05); layer-norm gains 1 + N(0, 0.1). Conv1D matrices
    use std 1/sqrt(n_in) so every projection's output has unit-scale spread at any width: the
    attention scores then spread over a few units (neither uniform nor one-hot) and the logits
    over a few units, as in real GPT-2. Non-zero biases and non-unit gains make a swapped bias,
    a dropped gain or a transposed matrix visible in every output.
    """
    if name == "wte.weight":
        return 0.0, 0.1
    if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
        return 1.0, 0.1
    if name.endswith(".bias"):
        return 0.0, 0.05
    return 0.0, 1.0 / np.sqrt(shape[0])


def _position_embeddings(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """wpe like real GPT-2's: smooth in position (a sinusoid per dimension) plus a little noise.

    Smoothness is what gives position bugs their shape: a position counter stuck at 0 drifts
    further from the truth as the position grows, while an index base off by one is off by a
    similar amount everywhere.
    """
    n_ctx, n_embd = shape
    periods = np.exp(rng.uniform(np.log(64.0), np.log(4.0 * n_ctx), n_embd))
    phases = rng.uniform(0, 2 * np.pi, n_embd)
    positions = np.arange(n_ctx, dtype=np.float64)[:, None]
    smooth = 0.1 * np.sin(2 * np.pi * positions / periods + phases)
    noise = 0.005 * rng.standard_normal(shape)
    return (smooth + noise).astype(np.float32)


def synth_tensor(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Draw one tensor; each tensor has its own stream so the result does not depend on order."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name == "wpe.weight":
        return _position_embeddings(shape, rng)
    mean, std = _std(name, shape)
    out = rng.standard_normal(shape, dtype=np.float32)
    out *= np.float32(std)
    out += np.float32(mean)
    return out


def hf_config(config: GPT2Config, preset: str, seed: int) -> dict:
    """An HF-style config.json for the checkpoint."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.n_vocab,
        "n_positions": config.n_ctx,
        "n_ctx": config.n_ctx,
        "n_embd": config.n_embd,
        "n_head": config.n_head,
        "n_layer": config.n_layer,
        "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new",
        "tie_word_embeddings": True,
        "theinference_synthetic": {"preset": preset, "seed": seed, "version": SYNTH_VERSION},
    }


def write_synthetic(
    out_dir: str | Path, preset: str = "tiny", seed: int = 0, progress: Callable[[int, int], None] | None = None
) -> Path:
    """Write model.safetensors + config.json into out_dir; same preset and seed give identical bytes."""
    config = PRESETS[preset]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shapes = expected_shapes(config)
    tensors = {}
    for i, (name, shape) in enumerate(shapes.items()):
        tensors[name] = synth_tensor(name, shape, seed)
        if progress:
            progress(i + 1, len(shapes))
    install_copy_circuit(tensors, config, seed)
    # One metadata key only: safetensors writes metadata in hash order, and two keys would make
    # the bytes differ from run to run. The synthetic marker lives in config.json.
    metadata = {"format": "pt"}
    (out_dir / "config.json").write_text(json.dumps(hf_config(config, preset, seed), indent=2) + "\n")
    # Write beside the target, then rename: a reader never sees a half-written checkpoint.
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".model.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out_dir / "model.safetensors")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out_dir / "model.safetensors"
