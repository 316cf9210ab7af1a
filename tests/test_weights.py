"""Weights: loading checks, synthetic determinism, and where grading weights come from."""

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from theinference.model.weights_choice import find_hf_gpt2, resolve_weights
from theinference.model.synth import AFTER_TENSORS, PRESETS, write_synthetic
from theinference.model.weights import WeightsError, expected_shapes, load_model, weights_digest


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
    assert str(tiny_model.synthetic) == "tiny preset, seed 0" and tiny_model.synthetic.preset == "tiny"


@pytest.mark.slow
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
    path = _rewrite(
        tiny_dir, tmp_path / "w", lambda t: t.update({"h.1.mlp.c_fc.weight": np.zeros((128, 100), np.float32)})
    )
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

    assert (
        resolve_weights("/x/cli.safetensors", toml_weights, {**env, "THEINFERENCE_WEIGHTS": "/x/env"}).source
        == "--weights"
    )
    assert resolve_weights(None, toml_weights, {**env, "THEINFERENCE_WEIGHTS": "/x/env"}).path == Path("/x/env")
    assert resolve_weights(None, toml_weights, env).source == "theinference.toml"
    hf = resolve_weights(None, None, env)
    assert (hf.source, hf.path) == ("huggingface-cache", hf_file)
    synthetic = resolve_weights(
        None, None, {"HF_HOME": str(tmp_path / "empty"), "THEINFERENCE_CACHE": str(tmp_path / "cache")}
    )
    assert synthetic.source == "default-synthetic"
    assert synthetic.path.is_relative_to(tmp_path / "cache")


def test_hf_hub_cache_variable_and_old_repo_name(tmp_path, tiny_path):
    hub = tmp_path / "hubcache"
    hf_file = _fake_hf_cache(hub, "models--gpt2", tiny_path)
    assert find_hf_gpt2({"HF_HUB_CACHE": str(hub), "HF_HOME": str(tmp_path / "elsewhere")}) == hf_file


# Checkpoints as they exist in the wild: every defect is exit 2 naming the tensor or field.


def _edit_header(src: Path, dest_dir: Path, edit) -> Path:
    """Copy a checkpoint with `edit(header)` applied to its JSON header; the tensor bytes are kept."""
    data = src.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    edit(header)
    head = json.dumps(header).encode()
    dest_dir.mkdir(parents=True, exist_ok=True)
    (dest_dir / "model.safetensors").write_bytes(len(head).to_bytes(8, "little") + head + data[8 + header_len :])
    return dest_dir / "model.safetensors"


def _set(name, field, value):
    return lambda header: header[name].update({field: value})


def _shifted(name, by):
    return lambda header: header[name].update({"data_offsets": [n + by for n in header[name]["data_offsets"]]})


@pytest.mark.parametrize(
    "edit, words",
    [
        (
            lambda h: h.update({"h.0.ln_1.bias": "oops"}),
            "tensor 'h.0.ln_1.bias': header entry is str 'oops', not an object",
        ),
        (lambda h: h.update({"wte.weight": 3}), "tensor 'wte.weight': header entry is int 3"),
        (
            lambda h: h["h.1.ln_2.weight"].pop("data_offsets"),
            "tensor 'h.1.ln_2.weight': header entry has no 'data_offsets'",
        ),
        (lambda h: h["ln_f.bias"].pop("shape"), "tensor 'ln_f.bias': header entry has no 'shape'"),
        (_set("ln_f.bias", "data_offsets", ["0", "512"]), "tensor 'ln_f.bias': 'data_offsets' is ['0', '512']"),
        (_set("ln_f.bias", "data_offsets", [-512, 0]), "tensor 'ln_f.bias': 'data_offsets' is [-512, 0]"),
        (_set("ln_f.bias", "data_offsets", [512, 0]), "tensor 'ln_f.bias': 'data_offsets' is [512, 0]"),
        (_shifted("h.0.attn.c_proj.weight", 10**12), "tensor 'h.0.attn.c_proj.weight' lies outside the file's data"),
        (_set("ln_f.bias", "shape", ["128"]), "tensor 'ln_f.bias': 'shape' is ['128']"),
        (_set("ln_f.bias", "dtype", 32), "tensor 'ln_f.bias': 'dtype' is 32, not a string"),
        (
            _set("wte.weight", "shape", [50257 * 128]),
            "tensor 'wte.weight' has shape [6432896], expected [n_vocab, n_embd]",
        ),
        (
            _set("wte.weight", "shape", [1, 50257, 128]),
            "tensor 'wte.weight' has shape [1, 50257, 128], expected [n_vocab, n_embd]",
        ),
        (_set("wpe.weight", "shape", [0, 128]), "tensor 'wpe.weight' has shape [0, 128], expected [n_ctx, n_embd]"),
        (
            _set("wte.weight", "shape", [128, 50257]),
            "'wte.weight' has shape [128, 50257] but 'wpe.weight' has [256, 128]: "
            "expected wte [n_vocab, 128] (is it transposed?)",
        ),
    ],
)
def test_corrupt_header_values_exit_2_naming_the_tensor(cli, solution_course, tmp_path, tiny_path, edit, words):
    path = _edit_header(tiny_path, tmp_path / "w", edit)
    result = cli("test", "--course", solution_course, "--weights", path)
    assert result.exit_code == 2, result.output
    assert words in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize(
    "field, value",
    [
        ("activation_function", "relu"),
        ("layer_norm_epsilon", 1e-6),
        ("scale_attn_by_inverse_layer_idx", True),
        ("reorder_and_upcast_attn", True),
        ("scale_attn_weights", False),
        ("tie_word_embeddings", False),
        ("model_type", "gpt_neo"),
    ],
)
def test_config_fields_that_change_the_model_are_refused_by_name(
    cli, solution_course, tmp_path, tiny_dir, field, value
):
    path = _rewrite(tiny_dir, tmp_path / "w", lambda t: None)
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    (tmp_path / "w" / "config.json").write_text(json.dumps({**config, field: value}))
    result = cli("test", "--course", solution_course, "--weights", path)
    assert result.exit_code == 2, result.output
    assert f"config.json: field '{field}' is {json.dumps(value)}" in result.stderr


def test_gelu_pytorch_tanh_is_the_same_model(cli, tmp_path, tiny_dir):
    _rewrite(tiny_dir, tmp_path / "w", lambda t: None)
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    (tmp_path / "w" / "config.json").write_text(json.dumps({**config, "activation_function": "gelu_pytorch_tanh"}))
    assert cli("weights", "info", tmp_path / "w").exit_code == 0


def test_an_untied_head_is_refused_and_a_stored_copy_of_wte_is_not(cli, solution_course, tmp_path, tiny_dir):
    untied = _rewrite(tiny_dir, tmp_path / "untied", lambda t: t.update({"lm_head.weight": t["wte.weight"] * 2}))
    result = cli("test", "--course", solution_course, "--weights", untied)
    assert result.exit_code == 2
    assert "tensor 'lm_head.weight' differs from 'wte.weight': the LM head is not tied" in result.stderr
    tied = _rewrite(tiny_dir, tmp_path / "tied", lambda t: t.update({"lm_head.weight": t["wte.weight"].copy()}))
    result = cli("weights", "--weights", tied)
    assert result.exit_code == 0, result.output


def test_symlinked_hf_cache_snapshot_uses_the_config_beside_the_link(cli, solution_course, tmp_path, tiny_path):
    # The HF cache layout: snapshot files are symlinks into blobs/, named by content hash.
    repo = tmp_path / "hf-home" / "hub" / "models--openai-community--gpt2"
    (repo / "blobs").mkdir(parents=True)
    shutil.copy(tiny_path, repo / "blobs" / "a1b2")
    (repo / "blobs" / "c3d4").write_text(json.dumps({"model_type": "gpt2", "n_head": 4}))
    snapshot = repo / "snapshots" / "rev1"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(Path("..", "..", "blobs", "a1b2"))
    (snapshot / "config.json").symlink_to(Path("..", "..", "blobs", "c3d4"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev1")

    result = cli("test", "--stage", "prove-one-layer", "--course", solution_course, "--format", "json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 0, result.stdout
    assert doc["weights"]["source"] == "huggingface-cache" and doc["weights"]["path"] == str(
        snapshot / "model.safetensors"
    )
    assert doc["weights"]["config"]["n_head"] == 4


def test_sharded_checkpoint_is_refused_by_name(cli, solution_course, tmp_path, tiny_dir):
    tensors = load_file(str(tiny_dir / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(sharded / shard))
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for given in (sharded, sharded / "model.safetensors.index.json", sharded / "model-00001-of-00002.safetensors"):
        result = cli("test", "--course", solution_course, "--weights", given)
        assert result.exit_code == 2
        assert "model.safetensors.index.json: a sharded checkpoint" in result.stderr


def test_weights_command_accepts_a_directory(cli, tiny_dir):
    result = cli("weights", "--weights", tiny_dir)
    assert result.exit_code == 0, result.output
    assert "given with --weights" in result.stdout and "n_embd 128 · n_head 2" in result.stdout


@pytest.mark.slow
def test_a_bf16_checkpoint_passes_the_reference_solution(cli, solution_course, tmp_path, tiny_dir):
    path = _write_bf16(tiny_dir, tmp_path / "bf16")
    result = cli("test", "--stage", "per-step-identity", "--course", solution_course, "--weights", path)
    assert result.exit_code == 0, result.stdout
    assert "weights stored as BF16; converted to float32" in result.output


def test_synthesis_progress_moves_in_a_log(cli, tmp_path):
    result = cli("weights", "synth", "--preset", "tiny", "--out", tmp_path / "w")
    assert result.exit_code == 0
    total = len(expected_shapes(PRESETS["tiny"])) + len(AFTER_TENSORS)
    done = [int(m) for m in re.findall(r"making synthetic weights \[(\d+)/%d steps\]" % total, result.stderr)]
    # stderr is not a terminal here, as in CI: a few plain lines, from the first step to the last, each naming
    # the step then running (writing and hashing the file take seconds on the gpt2 shape, after every tensor).
    assert 2 <= len(done) <= 12 and done == sorted(done) and done[0] == 0 and done[-1] == total
    assert "]: drawing wte.weight\n" in result.stderr and f"[{total}/{total} steps]: made\n" in result.stderr
    assert "making synthetic weights" not in result.stdout


def test_weights_says_which_and_why_without_the_tensor_table(cli, tiny_dir):
    result = cli("weights", "--weights", tiny_dir)
    assert result.exit_code == 0
    assert "given with --weights" in result.stdout and "--weights > $THEINFERENCE_WEIGHTS" in result.stdout
    assert "h.0.attn.c_attn.weight" not in result.stdout
    assert f"theinference weights info {tiny_dir / 'model.safetensors'}" in result.stdout
    assert "h.0.attn.c_attn.weight" in cli("weights", "info", tiny_dir).stdout


def test_tensors_are_read_on_first_use_and_never_from_a_changed_file(tmp_path):
    path = write_synthetic(tmp_path / "w", preset="tiny", seed=0)
    model = load_model(path)
    write_synthetic(tmp_path / "w", preset="tiny", seed=1)  # replaced after loading, before any tensor was read
    with pytest.raises(WeightsError, match="changed while it was in use"):
        model.params["wte"]
    assert load_model(path).params["wte"]["weight"].shape == (model.config.n_vocab, model.config.n_embd)


def test_a_preset_name_works_with_the_flag_and_the_environment_alike(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file named "tiny" here
    env = {"THEINFERENCE_CACHE": str(tmp_path / "cache")}
    by_flag = resolve_weights("tiny", None, env)
    by_env = resolve_weights(None, None, {**env, "THEINFERENCE_WEIGHTS": "tiny"})
    assert by_flag.preset == by_env.preset == "tiny" and by_flag.path == by_env.path
    assert by_env.path.is_relative_to(tmp_path / "cache") and "$THEINFERENCE_WEIGHTS tiny" in by_env.why
    (tmp_path / "tiny").mkdir()  # a directory so named wins over the preset, as a path
    assert resolve_weights(None, None, {**env, "THEINFERENCE_WEIGHTS": "tiny"}).path == tmp_path / "tiny"


@pytest.mark.parametrize("given", [(), ("--weights", "tiny")])
def test_weights_says_a_synthetic_choice_is_not_made_yet(cli, tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)  # no course, no file named "tiny": the default (or the tiny preset), not yet made
    result = cli("weights", *given)
    assert result.exit_code == 0 and "not made yet" in result.stdout
    assert not any((tmp_path / "user-cache").rglob("model.safetensors"))  # saying so makes nothing


def test_the_weights_digest_is_the_files_sha256_and_follows_a_rewrite_made_to_look_untouched(tmp_path, tiny_path):
    path = tmp_path / "model.safetensors"
    shutil.copyfile(tiny_path, path)
    assert weights_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    before, stat = weights_digest(path), path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # the same size, its times set back: only the change time tells
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights_digest(path) != before
    assert weights_digest(path) == hashlib.sha256(bytes(data)).hexdigest()
