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
# sha256 of model.safetensors as write_synthetic makes it, by (preset, seed, SYNTH_VERSION): the fast path of
# preset_problem. The bytes rest on float arithmetic, and OpenBLAS picks its kernels by CPU, so each preset has
# one digest per kernel family; these were made with OPENBLAS_CORETYPE forced to each (SkylakeX, also Cooperlake;
# Haswell, also Zen; Sandybridge; Nehalem, also Atom and Barcelona; Prescott). A machine whose bytes are none of
# these checks a file against the digest it makes itself (made_digest). tests/e2e/test_integrity_levels.py fails if
# this machine's tiny digest is not in the table.
PRESET_DIGESTS: dict[tuple[str, int, int], tuple[str, ...]] = {
    ("tiny", 0, 2): (
        "e2089e6b73eeaa40e81b0505fd5af11d0e4b26c62ca64fc6924eeb02f8fca94e",
        "39bc4bcb657c06b492d9e668ba9f47f0043bf63b3a400378a7cef6f9dd17fa59",
        "008ebdd504262c623ac58724be555773163fd7b2a0e17bb05cbcd04c86e6cc4c",
        "40bc2b0a57ae82270b6c4d3eba662a3508f6fb455561e7b02c14d1bda7c40a91",
        "d7db8f8b628c55496fdcfa25f7caa678fec5be0164b5561b94450626c499ec9b",
    ),
    ("gpt2", 0, 2): (
        "9f93d9ab49665564389c3a5edbc0621a7097c552746da1f2437ba893da2fc991",
        "18bd8834fcca6ff56d0c10ae3d6002a75e07dae86129d88542a0073da842f34c",
        "9d509a5bb81811ca60477141bc6d8e536094c38f2657780346f61fa4e1f40da6",
        "19000dc2f9648385946f266d6a4105ca5f10a39a0cae5b2c578dc7037818e475",
        "b1ea57ab07f25d1372b14ce7c9879635e5ade9df41d0fc036a7d7a6fcf89ee26",
    ),
    ("proof", 0, 2): (
        "693ffce3b37915315ba7abaf8d56f26a6c6e839cfae2d0fe15b697d450992027",
        "a2ad54d763578eb3d218e78bc0228e437a70b4867e1ce2825ec21f5bfae874fb",
        "5e6b4c4ab7182926eb75511710c4f68269757a1368e83a758aef115d29551f4d",
        "82cf99770d5c5e0f056185edbc4c378ced86d1fddfd6630aa885dca7808fd9f9",
        "83fa006e05d95d2c8255c36529a041de4b8013ea7b5c9b9a9ab83a04e1900a34",
    ),
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

    The model's sha256 is compared with the digests the preset is known to have (PRESET_DIGESTS:
    made deterministically, so known in advance) and, where it differs, with the digest this machine makes
    (made_digest: the tensors drawn again in memory, never read from the cache); config.json with the text
    it is written with.
    """
    known = PRESET_DIGESTS.get((preset, seed, SYNTH_VERSION), ())
    try:
        if path.is_symlink() or (path.parent / "config.json").is_symlink():
            return "it is a symbolic link, not the file the preset made"
        digest = weights_digest(path)
        config = (path.parent / "config.json").read_text()
    except (OSError, UnicodeDecodeError) as e:
        return f"cannot be read ({e})"
    expected = digest if digest in known else made_digest(preset, seed)
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
