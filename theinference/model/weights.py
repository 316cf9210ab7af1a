"""Load and check a Hugging Face-layout GPT-2 `model.safetensors`."""

import hashlib
import json
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from theinference.errors import ConfigError


class WeightsError(ConfigError):
    """The weights file cannot be used; the message names the file and the offending tensor."""


@dataclass(frozen=True)
class GPT2Config:
    n_vocab: int
    n_ctx: int
    n_embd: int
    n_head: int
    n_layer: int

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("n_vocab", "n_ctx", "n_embd", "n_head", "n_layer")}


@dataclass(frozen=True)
class Synthetic:
    """Weights `weights synth` made, as config.json's marker says: the preset and seed ("tiny preset, seed 0")."""

    preset: str
    seed: str

    def __str__(self) -> str:
        return f"{self.preset} preset, seed {self.seed}"


@dataclass
class Model:
    """Loaded weights: `params` is nested like the checkpoint keys (`h[i]["attn"]["c_attn"]["weight"]`)."""

    path: Path
    config: GPT2Config
    params: Mapping  # a dict, or LazyParams reading the file on first use
    synthetic: Synthetic | None = None  # for weights made by `weights synth`
    notices: list[str] = field(default_factory=list)
    stamp: tuple = ()  # file_stamp of the file when loaded: oracle outputs are cached per stamp

    def is_stale(self) -> bool:
        """True when the file on disk is no longer the one these weights were loaded from."""
        return file_stamp(self.path) != self.stamp


def file_stamp(path: Path) -> tuple:
    """What changes whenever a file's content does: its identity, size and times, the change time included.

    mtime alone is not enough where student code runs as the grader's user (the `subreaper` level): it can
    rewrite the weights in place and set mtime back with os.utime. The kernel sets ctime on every write and
    utime, and no one but root can set it."""
    info = path.stat()
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


_DIGESTS: dict[tuple, str] = {}  # weights_digest's results in this process, by resolved path and file_stamp


def weights_digest(path: Path) -> str:
    """The one digest of a weights file: the sha256 of its bytes, hex (the presets' known digests, a batch's
    records and the oracle store's keys all use it). Read once a process per version of the file (file_stamp);
    a file written to while it was read is not remembered. Raises OSError."""
    identity = (str(path.resolve()), *file_stamp(path))
    if identity not in _DIGESTS:
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if (str(path.resolve()), *file_stamp(path)) != identity:
            return digest
        _DIGESTS[identity] = digest
    return _DIGESTS[identity]


_BLOCK_TENSORS = {
    "ln_1.weight": lambda c: (c.n_embd,),
    "ln_1.bias": lambda c: (c.n_embd,),
    "attn.c_attn.weight": lambda c: (c.n_embd, 3 * c.n_embd),
    "attn.c_attn.bias": lambda c: (3 * c.n_embd,),
    "attn.c_proj.weight": lambda c: (c.n_embd, c.n_embd),
    "attn.c_proj.bias": lambda c: (c.n_embd,),
    "ln_2.weight": lambda c: (c.n_embd,),
    "ln_2.bias": lambda c: (c.n_embd,),
    "mlp.c_fc.weight": lambda c: (c.n_embd, 4 * c.n_embd),
    "mlp.c_fc.bias": lambda c: (4 * c.n_embd,),
    "mlp.c_proj.weight": lambda c: (4 * c.n_embd, c.n_embd),
    "mlp.c_proj.bias": lambda c: (c.n_embd,),
}
# Buffers some exports carry; they hold no weights and are skipped.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}


def expected_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every tensor a GPT-2 checkpoint of this config must hold, with its shape."""
    shapes = {
        "wte.weight": (config.n_vocab, config.n_embd),
        "wpe.weight": (config.n_ctx, config.n_embd),
        "ln_f.weight": (config.n_embd,),
        "ln_f.bias": (config.n_embd,),
    }
    for i in range(config.n_layer):
        for name, shape in _BLOCK_TENSORS.items():
            shapes[f"h.{i}.{name}"] = shape(config)
    return shapes


def read_header(path: Path) -> tuple[dict, int]:
    """Return (tensor entries keyed by name without `transformer.`, data start offset)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise WeightsError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > min(size - 8, 100_000_000):
                raise WeightsError(f"{path}: not a safetensors file (header length {header_len} exceeds the file)")
            header = json.loads(f.read(header_len))
    except OSError as e:
        raise WeightsError(f"{path}: cannot read weights file: {e.strerror or e}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{path}: not a safetensors file (header is not JSON: {e})") from e
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: not a safetensors file (header is not a JSON object)")
    header.pop("__metadata__", None)
    entries = {}
    for key, entry in header.items():
        name = key.removeprefix("transformer.")
        if not name.endswith(_IGNORED_SUFFIXES):
            entries[name] = _check_entry_fields(path, key, entry)
    return entries, 8 + header_len


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_entry_fields(path: Path, key: str, entry) -> dict:
    """The header entry if its dtype, shape and data_offsets are well-formed; else WeightsError naming the field."""
    if not isinstance(entry, dict):
        raise WeightsError(f"{path}: tensor '{key}': header entry is {type(entry).__name__} {entry!r}, not an object")
    for field_name in ("dtype", "shape", "data_offsets"):
        if field_name not in entry:
            raise WeightsError(f"{path}: tensor '{key}': header entry has no '{field_name}'")
    if not isinstance(entry["dtype"], str):
        raise WeightsError(f"{path}: tensor '{key}': 'dtype' is {entry['dtype']!r}, not a string")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        raise WeightsError(f"{path}: tensor '{key}': 'shape' is {shape!r}, not a list of non-negative integers")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(_is_count(n) for n in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise WeightsError(
            f"{path}: tensor '{key}': 'data_offsets' is {offsets!r}, not [start, end] with 0 <= start <= end"
        )
    return entry


def infer_config(path: Path, entries: dict) -> GPT2Config:
    """Read the model's dimensions from tensor shapes; `n_head` from config.json beside the file."""
    for required in ("wte.weight", "wpe.weight"):
        if required not in entries:
            raise WeightsError(f"{path}: missing tensor '{required}' (is this a GPT-2 checkpoint?)")
    n_vocab, n_embd, n_ctx = _embedding_dims(path, entries["wte.weight"]["shape"], entries["wpe.weight"]["shape"])
    n_layer = 0
    while f"h.{n_layer}.ln_1.weight" in entries:
        n_layer += 1
    config_json = read_config_json(path)
    check_supported(path.parent / "config.json", config_json)
    n_head = config_json.get("n_head", n_embd // 64)
    if n_layer == 0:
        raise WeightsError(f"{path}: no transformer blocks found (no tensor 'h.0.ln_1.weight')")
    if n_head <= 0 or n_embd % n_head:
        raise WeightsError(f"{path}: n_head={n_head} does not divide n_embd={n_embd}")
    return GPT2Config(n_vocab=n_vocab, n_ctx=n_ctx, n_embd=n_embd, n_head=n_head, n_layer=n_layer)


def _embedding_dims(path: Path, wte: list, wpe: list) -> tuple[int, int, int]:
    """(n_vocab, n_embd, n_ctx) from wte [n_vocab, n_embd] and wpe [n_ctx, n_embd], or WeightsError."""
    if len(wpe) != 2 or min(wpe) < 1:
        raise WeightsError(f"{path}: tensor 'wpe.weight' has shape {wpe}, expected [n_ctx, n_embd] with both >= 1")
    if len(wte) != 2 or min(wte) < 1:
        raise WeightsError(f"{path}: tensor 'wte.weight' has shape {wte}, expected [n_vocab, n_embd] with both >= 1")
    if wte[1] != wpe[1]:
        transposed = " (is it transposed?)" if wte[0] == wpe[1] else ""
        raise WeightsError(
            f"{path}: tensor 'wte.weight' has shape {wte} but 'wpe.weight' has {wpe}: "
            f"expected wte [n_vocab, {wpe[1]}]{transposed}"
        )
    return wte[0], wte[1], wpe[0]


# config.json fields that would change the model, and the values the oracle computes (the first is HF's default).
SUPPORTED_CONFIG = {
    "model_type": ("gpt2",),
    "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
    "layer_norm_epsilon": (1e-5,),
    "scale_attn_weights": (True,),
    "scale_attn_by_inverse_layer_idx": (False,),
    "reorder_and_upcast_attn": (False,),
    "tie_word_embeddings": (True,),
}


def check_supported(config_path: Path, config_json: dict) -> None:
    """Refuse, by field, a config.json that asks for a model other than the GPT-2 the oracle computes."""
    for name, accepted in SUPPORTED_CONFIG.items():
        value = config_json.get(name, accepted[0])
        if value not in accepted or type(value) is not type(accepted[0]):
            wanted = " or ".join(json.dumps(v) for v in accepted)
            raise WeightsError(
                f"{config_path}: field '{name}' is {json.dumps(value)}; theinference grades GPT-2 with "
                f"{name} {wanted} only, and will not grade a different model as if it were that one"
            )


def read_config_json(path: Path) -> dict:
    """The HF-style config.json beside a checkpoint, or {} if there is none."""
    config_path = path.parent / "config.json"
    if not config_path.is_file():
        return {}
    try:
        config = json.loads(config_path.read_text())
        if not isinstance(config, dict) or not isinstance(config.get("n_head", 1), int):
            raise ValueError("expected a JSON object with an integer n_head")
        return config
    except (OSError, ValueError) as e:
        raise WeightsError(f"{config_path}: cannot read: {e}") from e


def synthetic_description(path: Path) -> Synthetic | None:
    """The preset and seed if config.json says `weights synth` made the checkpoint, else None."""
    marker = read_config_json(path).get("theinference_synthetic")
    if not isinstance(marker, dict):
        return None
    return Synthetic(str(marker.get("preset", "?")), str(marker.get("seed", "?")))


def check_entries(path: Path, entries: dict, config: GPT2Config, data_len: int) -> None:
    """Raise WeightsError naming the first missing, misshapen, mistyped or out-of-file tensor."""
    for name, shape in expected_shapes(config).items():
        entry = entries.get(name)
        if entry is None:
            raise WeightsError(f"{path}: missing tensor '{name}' (expected shape {list(shape)})")
        if tuple(entry.get("shape", ())) != shape:
            raise WeightsError(f"{path}: tensor '{name}' has shape {entry.get('shape')}, expected {list(shape)}")
        if entry.get("dtype") not in _DTYPES:
            raise WeightsError(
                f"{path}: tensor '{name}' has dtype {entry.get('dtype')}; supported: F32, F16, BF16, F64"
            )
        start, end = entry["data_offsets"]
        itemsize = 2 if entry["dtype"] == "BF16" else np.dtype(_DTYPES[entry["dtype"]]).itemsize
        if end - start != itemsize * int(np.prod(shape)) or end > data_len:
            raise WeightsError(
                f"{path}: tensor '{name}' lies outside the file's data (the file is truncated or corrupt)"
            )


def _read_tensor(f, path: Path, name: str, entry: dict, data_start: int) -> np.ndarray:
    # Read straight into a fresh float array: no mmap, so peak memory stays ~ one copy.
    start, end = entry["data_offsets"]
    raw = np.empty(entry["shape"], dtype=_DTYPES[entry["dtype"]])
    f.seek(data_start + start)
    if f.readinto(memoryview(raw).cast("B")) != end - start:  # type: ignore[arg-type]  # ndarray is a buffer
        raise WeightsError(f"{path}: tensor '{name}' is cut short (the file is truncated)")
    if entry["dtype"] == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw if raw.dtype == np.float32 else raw.astype(np.float32)


def nest(flat: dict[str, np.ndarray], n_layer: int) -> dict:
    """Turn `h.0.attn.c_attn.weight` keys into params["h"][0]["attn"]["c_attn"]["weight"]."""
    params: dict = {"h": [{} for _ in range(n_layer)]}
    for key, value in flat.items():
        parts = key.split(".")
        node = params["h"][int(parts[1])] if parts[0] == "h" else params
        for part in parts[2:-1] if parts[0] == "h" else parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return params


def check_tied_head(path: Path, entries: dict, data_start: int) -> None:
    """Refuse a stored lm_head.weight that is not byte-for-byte wte.weight: the oracle's LM head is tied."""
    head, wte = entries.get("lm_head.weight"), entries["wte.weight"]
    if head is None:
        return
    same = (head["dtype"], head["shape"]) == (wte["dtype"], wte["shape"]) and _same_bytes(path, data_start, head, wte)
    if not same:
        raise WeightsError(
            f"{path}: tensor 'lm_head.weight' differs from 'wte.weight': the LM head is not tied, "
            "and theinference grades GPT-2 with its head tied to wte only"
        )


def _same_bytes(path: Path, data_start: int, a: dict, b: dict, chunk: int = 1 << 24) -> bool:
    (a_start, a_end), (b_start, _) = a["data_offsets"], b["data_offsets"]
    with path.open("rb") as f:
        for offset in range(0, a_end - a_start, chunk):
            size = min(chunk, a_end - a_start - offset)
            f.seek(data_start + a_start + offset)
            left = f.read(size)
            f.seek(data_start + b_start + offset)
            if f.read(size) != left:
                return False
    return True


INDEX_FILE = "model.safetensors.index.json"


def locate_checkpoint(path: str | Path) -> Path:
    """The model.safetensors a path names (the file, or the one in a directory); symlinks are kept, not resolved."""
    # Not resolve(): the HF cache links snapshots/<rev>/model.safetensors into blobs/, and config.json
    # must be read from beside the link, not from beside the blob.
    path = Path(path).expanduser().absolute()
    if path.is_dir():
        path = path / "model.safetensors"
    index = path.parent / INDEX_FILE
    if path.name == INDEX_FILE or (index.is_file() and not (path.name == "model.safetensors" and path.is_file())):
        raise WeightsError(
            f"{index}: a sharded checkpoint (an index and several .safetensors shards); theinference "
            "reads one model.safetensors: merge the shards into one file first"
        )
    if not path.is_file():
        raise WeightsError(f"{path}: no such weights file")
    return path


def inspect_checkpoint(path: Path) -> tuple[dict, GPT2Config, int]:
    """Check header, config.json and LM head without loading tensors: (entries, config, data start offset)."""
    entries, data_start = read_header(path)
    config = infer_config(path, entries)
    check_entries(path, entries, config, path.stat().st_size - data_start)
    check_tied_head(path, entries, data_start)
    return entries, config, data_start


def load_model(path: str | Path) -> Model:
    """Load and check a GPT-2 checkpoint; raise WeightsError with a clear message if unusable."""
    path = locate_checkpoint(path)
    stamp = file_stamp(path)
    entries, config, data_start = inspect_checkpoint(path)
    dtypes = {entries[name]["dtype"] for name in expected_shapes(config)}
    notices = [f"weights stored as {d}; converted to float32" for d in sorted(dtypes - {"F32"})]

    def read() -> dict:
        flat = {}
        with path.open("rb") as f:
            if file_stamp(path) != stamp:
                raise WeightsError(f"{path}: the weights file changed while it was in use; run again")
            for name in expected_shapes(config):
                flat[name] = _read_tensor(f, path, name, entries[name], data_start)
        if file_stamp(path) != stamp:  # written while read
            raise WeightsError(f"{path}: the weights file changed while it was in use; run again")
        return nest(flat, config.n_layer)

    return Model(
        path=path,
        config=config,
        params=LazyParams(read),
        synthetic=synthetic_description(path),
        notices=notices,
        stamp=stamp,
    )


class LazyParams(Mapping):
    """The nested params, read from the file on first use: a run whose oracle outputs are all cached
    never reads the tensors (500 MB on the gpt2 shape)."""

    def __init__(self, read: Callable[[], dict]):
        self._read, self._lock = read, threading.Lock()
        self._params: dict | None = None

    def _loaded(self) -> dict:
        with self._lock:
            if self._params is None:
                self._params = self._read()
        return self._params

    def __getitem__(self, key):
        return self._loaded()[key]

    def __iter__(self):
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())
