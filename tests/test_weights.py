"""Weights: loading checks, synthetic determinism, and where grading weights come from."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from theinference.sources import find_hf_gpt2, resolve_weights
from theinference.synth import write_synthetic
from theinference.weights import WeightsError, load_model


def _rewrite(src_dir: Path, dest_dir: Path, edit) -> Path:
    """Copy a checkpoint, letting `edit(tensors)` change its tensor dict."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(src_dir / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dest_dir / "model.safetensors"))
    shutil.copy(src_dir / "config.json", dest_dir / "config.json")
    return dest_dir / "model.safetensors"


def test_tiny_preset_shape(tiny_model):
    c = tiny_model.config
    assert (c.n_vocab, c.n_embd, c.n_head, c.n_layer) == (50257, 128, 2, 2)
    assert c.n_embd // c.n_head == 64
    assert tiny_model.synthetic == "tiny preset, seed 0"


def test_synth_is_deterministic_per_seed(tmp_path, tiny_path):
    # Several writes: a hash-ordered header once made every other file differ.
    for i in range(4):
        again = write_synthetic(tmp_path / f"again{i}", preset="tiny", seed=0)
        assert again.read_bytes() == tiny_path.read_bytes()
    other = write_synthetic(tmp_path / "other", preset="tiny", seed=1)
    assert other.read_bytes() != tiny_path.read_bytes()


def test_synth_biases_and_gains_are_not_trivial(tiny_model):
    block = tiny_model.params["h"][0]
    assert np.abs(block["attn"]["c_attn"]["bias"]).mean() > 0.01
    assert np.abs(block["ln_1"]["weight"] - 1).mean() > 0.01


def test_wrong_shape_tensor_is_named(tmp_path, tiny_dir):
    path = _rewrite(tiny_dir, tmp_path / "w", lambda t: t.update({"h.1.mlp.c_fc.weight": np.zeros((128, 100), np.float32)}))
    with pytest.raises(WeightsError, match=r"'h\.1\.mlp\.c_fc\.weight' has shape \[128, 100\], expected \[128, 512\]"):
        load_model(path)


def test_missing_tensor_is_named(tmp_path, tiny_dir):
    path = _rewrite(tiny_dir, tmp_path / "w", lambda t: t.pop("h.0.ln_2.bias"))
    with pytest.raises(WeightsError, match=r"missing tensor 'h\.0\.ln_2\.bias'"):
        load_model(path)


def test_truncated_file_is_reported(tmp_path, tiny_path):
    cut = tmp_path / "model.safetensors"
    cut.write_bytes(tiny_path.read_bytes()[: tiny_path.stat().st_size // 2])
    with pytest.raises(WeightsError, match="truncated"):
        load_model(cut)


def test_not_a_safetensors_file(tmp_path):
    junk = tmp_path / "model.safetensors"
    junk.write_text("this is not a checkpoint")
    with pytest.raises(WeightsError, match="not a safetensors file"):
        load_model(junk)


def test_missing_file(tmp_path):
    with pytest.raises(WeightsError, match="no such weights file"):
        load_model(tmp_path / "nope.safetensors")


def test_transformer_prefix_and_mask_buffers_are_tolerated(tmp_path, tiny_dir, tiny_model):
    def hf_export(tensors):
        for key in list(tensors):
            tensors[f"transformer.{key}"] = tensors.pop(key)
        tensors["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, 4, 4), np.float32))
        tensors["transformer.h.0.attn.masked_bias"] = np.array(-1e4, np.float32)

    model = load_model(_rewrite(tiny_dir, tmp_path / "w", hf_export))
    assert model.config == tiny_model.config
    np.testing.assert_array_equal(model.params["wte"]["weight"], tiny_model.params["wte"]["weight"])


def test_n_head_from_config_json_else_n_embd_over_64(tmp_path, tiny_dir):
    path = _rewrite(tiny_dir, tmp_path / "w", lambda t: None)
    (tmp_path / "w" / "config.json").write_text(json.dumps({"n_head": 4}))
    assert load_model(path).config.n_head == 4
    (tmp_path / "w" / "config.json").unlink()
    assert load_model(path).config.n_head == 2


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_half_precision_is_converted_with_a_notice(tmp_path, tiny_dir, tiny_model, dtype):
    if dtype == "BF16":
        path = _write_bf16(tiny_dir, tmp_path / "w")
    else:
        path = _rewrite(tiny_dir, tmp_path / "w", lambda t: t.update({k: v.astype(np.float16) for k, v in t.items()}))
    model = load_model(path)
    assert model.params["wte"]["weight"].dtype == np.float32
    assert model.notices == [f"weights stored as {dtype}; converted to float32"]
    np.testing.assert_allclose(model.params["wte"]["weight"], tiny_model.params["wte"]["weight"], rtol=1e-2, atol=1e-3)


def _write_bf16(src_dir: Path, dest_dir: Path) -> Path:
    import struct

    # numpy has no bfloat16: keep the upper 16 bits of each float32 and write the file by hand.
    tensors = load_file(str(src_dir / "model.safetensors"))
    header, blobs, offset = {}, [], 0
    for key, value in tensors.items():
        raw = (value.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        header[key] = {"dtype": "BF16", "shape": list(value.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    dest_dir.mkdir(parents=True)
    path = dest_dir / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    shutil.copy(src_dir / "config.json", dest_dir / "config.json")
    return path


def _fake_hf_cache(hub: Path, repo: str, source: Path) -> Path:
    snapshot = hub / repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (hub / repo / "refs").mkdir()
    (hub / repo / "refs" / "main").write_text("abc123")
    shutil.copy(source, snapshot / "model.safetensors")
    return snapshot / "model.safetensors"


def test_resolution_order(tmp_path, tiny_path):
    hub = tmp_path / "hf" / "hub"
    hf_file = _fake_hf_cache(hub, "models--openai-community--gpt2", tiny_path)
    env = {"HF_HOME": str(tmp_path / "hf"), "THEINFERENCE_CACHE": str(tmp_path / "cache")}
    toml_weights = tmp_path / "course" / "w.safetensors"

    assert resolve_weights("/x/cli.safetensors", toml_weights, {**env, "THEINFERENCE_WEIGHTS": "/x/env"}).source == "--weights"
    assert resolve_weights(None, toml_weights, {**env, "THEINFERENCE_WEIGHTS": "/x/env"}).path == Path("/x/env")
    assert resolve_weights(None, toml_weights, env).source == "theinference.toml"
    hf = resolve_weights(None, None, env)
    assert (hf.source, hf.path) == ("huggingface-cache", hf_file)
    synthetic = resolve_weights(None, None, {"HF_HOME": str(tmp_path / "empty"), "THEINFERENCE_CACHE": str(tmp_path / "cache")})
    assert synthetic.source == "default-synthetic"
    assert synthetic.path.is_relative_to(tmp_path / "cache")


def test_hf_hub_cache_variable_and_old_repo_name(tmp_path, tiny_path):
    hub = tmp_path / "hubcache"
    hf_file = _fake_hf_cache(hub, "models--gpt2", tiny_path)
    assert find_hf_gpt2({"HF_HUB_CACHE": str(hub), "HF_HOME": str(tmp_path / "elsewhere")}) == hf_file
