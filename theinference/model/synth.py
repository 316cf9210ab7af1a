"""Deterministic synthetic GPT-2-layout checkpoints (real weights cannot be fetched everywhere)."""

import hashlib
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save, save_file

from theinference.model.copycircuit import install_copy_circuit
from theinference.files import write_atomic
from theinference.model.weights import GPT2Config, expected_shapes, weights_digest

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
# sha256 of model.safetensors as write_synthetic makes it, by (preset, seed, SYNTH_VERSION), on the machines the
# project is tested on: the fast path of preset_problem. The bytes rest on float arithmetic (BLAS, numpy's SIMD
# loops), so another CPU or numpy may make others: a file that differs is then checked against the digest this
# machine makes (made_digest). tests/test_integrity_levels.py fails if tiny's is stale here.
PRESET_DIGESTS = {
    ("tiny", 0, 2): "39bc4bcb657c06b492d9e668ba9f47f0043bf63b3a400378a7cef6f9dd17fa59",
    ("gpt2", 0, 2): "18bd8834fcca6ff56d0c10ae3d6002a75e07dae86129d88542a0073da842f34c",
    ("proof", 0, 2): "a2ad54d763578eb3d218e78bc0228e437a70b4867e1ce2825ec21f5bfae874fb",
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


def preset_problem(path: Path, preset: str, seed: int) -> str | None:
    """What differs between a made preset's files and what write_synthetic makes for it; None if nothing.

    The model's sha256 is compared with the digest the preset is known to have (PRESET_DIGESTS:
    made deterministically, so known in advance) and, where it differs, with the digest this machine makes
    (made_digest: the tensors drawn again in memory, never read from the cache); config.json with the text
    it is written with.
    """
    known = PRESET_DIGESTS.get((preset, seed, SYNTH_VERSION))
    try:
        if path.is_symlink() or (path.parent / "config.json").is_symlink():
            return "it is a symbolic link, not the file the preset made"
        digest = weights_digest(path)
        config = (path.parent / "config.json").read_text()
    except (OSError, UnicodeDecodeError) as e:
        return f"cannot be read ({e})"
    expected = known if digest == known else made_digest(preset, seed)
    if digest != expected:
        return f"its sha256 {digest[:16]}… is not the {preset} preset's ({expected[:16]}…): the file was changed"
    if config != _config_text(PRESETS[preset], preset, seed):
        return "its config.json is not the one the preset writes: it was changed"
    return None


def _config_text(config: GPT2Config, preset: str, seed: int) -> str:
    return json.dumps(hf_config(config, preset, seed), indent=2) + "\n"


# What making a preset does after drawing its tensors, each a step of its progress (seconds each on the gpt2
# shape: the screen shows which is running rather than a finished bar): the item names the step now running.
AFTER_TENSORS = ("installing the copy circuit", "writing model.safetensors", "hashing it", "checking it")

Progress = Callable[..., None]  # (steps done, steps in all, the step now running)


def _tensors(config: GPT2Config, seed: int, progress: Progress | None = None) -> dict:
    shapes = expected_shapes(config)
    steps = len(shapes) + len(AFTER_TENSORS)
    tensors = {}
    for i, (name, shape) in enumerate(shapes.items()):
        if progress:
            progress(i, steps, f"drawing {name}")
        tensors[name] = synth_tensor(name, shape, seed)
    if progress:
        progress(len(shapes), steps, AFTER_TENSORS[0])
    install_copy_circuit(tensors, config, seed)
    return tensors


# One metadata key only: safetensors writes metadata in hash order, and two keys would make
# the bytes differ from run to run. The synthetic marker lives in config.json.
_METADATA = {"format": "pt"}


_MADE: dict[tuple[str, int], str] = {}  # digests this process made or drew, by (preset, seed)


def made_digest(preset: str, seed: int) -> str:
    """sha256 of model.safetensors as write_synthetic makes it on this machine (drawn in memory; once a process)."""
    if (preset, seed) not in _MADE:
        _MADE[preset, seed] = hashlib.sha256(save(_tensors(PRESETS[preset], seed), metadata=_METADATA)).hexdigest()
    return _MADE[preset, seed]


def write_synthetic(out_dir: str | Path, preset: str = "tiny", seed: int = 0, progress: Progress | None = None) -> Path:
    """Write model.safetensors + config.json into out_dir; same preset and seed give identical bytes.

    The file is read back once in place and checked against what this code makes (preset_problem): a
    difference is a grader bug (RuntimeError, exit 3)."""
    config = PRESETS[preset]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = _tensors(config, seed, progress)
    steps = len(tensors) + len(AFTER_TENSORS)
    step = (lambda k: progress(steps - len(AFTER_TENSORS) + k, steps, AFTER_TENSORS[k])) if progress else None
    write_atomic(out_dir / "config.json", _config_text(config, preset, seed))
    # Write beside the target, then rename: a reader never sees a half-written checkpoint.
    # safetensors writes by name: in a private directory (0700, made fresh) nothing can stand in for that name.
    private = tempfile.mkdtemp(dir=out_dir, prefix=".model.", suffix=".tmp")
    try:
        tmp = os.path.join(private, "model.safetensors")
        step and step(1)
        save_file(tensors, tmp, metadata=_METADATA)
        step and step(2)
        _MADE[preset, seed] = weights_digest(Path(tmp))  # in a directory of ours alone: the one this machine makes
        os.chmod(tmp, 0o644)
        os.replace(tmp, out_dir / "model.safetensors")
    finally:
        shutil.rmtree(private, ignore_errors=True)
    step and step(3)
    problem = preset_problem(out_dir / "model.safetensors", preset, seed)
    if problem is not None:  # just made by this very code, and checked against what it makes: a grader bug, exit 3
        raise RuntimeError(f"{out_dir / 'model.safetensors'}: freshly made, yet {problem}")
    if progress:
        progress(steps, steps, "made")
    return out_dir / "model.safetensors"
