"""The persistent oracle cache: oracle outputs kept on disk across runs, keyed by what determines them.

An output is stored under a digest of: the weights file's content (its sha256, model.weights.weights_digest,
remembered per path, device, inode, size, mtime and ctime, so a run does not re-read 500 MB),
the weights' config, the oracle's name and version (the source of the built-in oracle modules;
for an instructor's oracle file also its content), the versions of theinference and numpy, and
the case's inputs. Each entry is written whole (a temporary file renamed over it) with a
checksum: a missing, truncated or corrupt entry is computed again, never trusted. The directory
is capped (`$THEINFERENCE_CACHE_MAX_MB`, default 2048; 0 turns the store off); the least recently
used entries are evicted under a kernel lock (theinference.locks), so concurrent runs can share it.

Only trusted runs read it (theinference.grading.drive.session): without a sandbox, student code runs as the
same user and could write a wrong answer into it.
"""

import functools
import hashlib
import io
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from theinference import __version__, locks
from theinference.files import write_atomic
from theinference.model.weights_choice import user_cache_dir
from theinference.model.weights import Model, file_stamp, weights_digest

MAX_MB_ENV = "THEINFERENCE_CACHE_MAX_MB"
DEFAULT_MAX_MB = 2048
_MAGIC = b"theinference-oracle-1\n"
_CHECKSUM = 32  # bytes of the BLAKE2b checksum after the magic
_LOW_WATER = 0.8  # eviction frees down to this fraction of the cap, so it does not run on every write
_STALE_TEMP = 3600  # seconds after which a temporary file is a crashed writer's leftover
# Relative to the package: the modules whose code decides an oracle output (a change in any invalidates the
# store): the built-in oracles and bug oracles, what is kept of their outputs, and how tensors are read (dtypes).
_ORACLE_MODULES = (
    "model/gpt2.py",
    "model/defective.py",
    "model/variant.py",
    "model/weights.py",
    "grading/oracle/registry.py",
    "grading/oracle/bugs.py",
    "grading/judge/compare.py",
    "grading/judge/verification.py",
    "grading/judge/scaling.py",
    "grading/judge/costcase.py",
    "grading/judge/costverdict.py",
    "grading/judge/oraclecost.py",
)


def _blake(data: bytes = b"") -> "hashlib.blake2b":
    return hashlib.blake2b(data, digest_size=_CHECKSUM)


@functools.cache
def builtin_version() -> str:
    """A digest of the built-in oracles' source and of the versions of theinference and numpy."""
    digest = _blake(f"{__version__}\0{np.__version__}".encode())
    package = Path(__file__).parents[2]  # theinference/
    for name in _ORACLE_MODULES:
        digest.update((package / name).read_bytes())
    return digest.hexdigest()


@functools.cache
def _file_content(stamp: tuple) -> str:
    return _blake(Path(stamp[0]).read_bytes()).hexdigest()


def oracle_version(stamp: tuple) -> str:
    """The version of an oracle: the built-in one's (stamp ()), or that plus an instructor file's content.

    stamp is OracleSpec.stamp / Bug.stamp: (file, mtime_ns, size) of an instructor's oracle file.
    """
    return builtin_version() if not stamp else f"{builtin_version()}:{_file_content(tuple(stamp))}"


def _canonical(parts) -> bytes:
    def plain(value):
        if isinstance(value, np.generic):
            return value.item()
        raise TypeError(f"cannot key an oracle output by {type(value).__name__}")

    return json.dumps(parts, sort_keys=True, separators=(",", ":"), default=plain).encode()


def default_max_bytes(environ=os.environ) -> int:
    """The store's cap in bytes, from $THEINFERENCE_CACHE_MAX_MB (default 2048 MB; 0: no store)."""
    try:
        return max(0, int(environ.get(MAX_MB_ENV, DEFAULT_MAX_MB))) << 20
    except ValueError:
        return DEFAULT_MAX_MB << 20


class OracleStore:
    """Oracle outputs on disk under root, at most max_bytes of them."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_MB << 20):
        self.root, self.max_bytes = Path(root), max_bytes
        self.outputs = self.root / "outputs"
        self._weights: dict[tuple, str | None] = {}  # weights digests found in this process, by file stat
        self._used: int | None = None  # bytes in outputs/, as last counted plus what this process wrote

    def output(self, model: Model, parts: tuple, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """The stored output for these weights and parts, else compute() (then stored)."""
        weights = self.weights_digest(model)
        if weights is None:  # the file changed since it was loaded: its content is not what was graded
            return compute()
        try:
            name = _blake(_canonical([weights, model.config.as_dict(), *parts])).hexdigest()
        except TypeError:
            return compute()
        path = self.outputs / f"{name}.npy"
        found = self.read_entry(path)
        if found is not None:
            return found
        value = np.asarray(compute())
        self.write_entry(path, value)
        return value

    def weights_digest(self, model: Model) -> str | None:
        """The weights file's content digest (remembered per file stat), or None if it changed since loaded."""
        try:
            stamp = file_stamp(model.path)
        except OSError:
            return None
        if stamp != model.stamp:
            return None
        identity = (str(model.path.resolve()), *stamp)
        if identity not in self._weights:
            self._weights[identity] = self._remembered_digest(model.path, identity)
        return self._weights[identity]

    def _remembered_digest(self, path: Path, identity: tuple) -> str | None:
        # Remembered across processes too: a run need not re-read 500 MB of weights it has read before.
        memo = self.root / "weights-sha256" / f"{_blake(_canonical(list(identity))).hexdigest()}.txt"
        try:
            text = memo.read_text().strip()
            if len(text) == 64 and all(c in "0123456789abcdef" for c in text):  # a sha256, hex
                return text
        except (OSError, UnicodeDecodeError):
            pass
        try:
            digest = weights_digest(path)
            if file_stamp(path) != identity[1:]:  # written to while it was read
                return None
            self._write(memo, digest.encode())
        except OSError:
            return None
        return digest

    def read_entry(self, path: Path) -> np.ndarray | None:
        """The array an entry file holds, or None if it is missing, truncated or corrupt."""
        try:
            with path.open("rb") as f:
                data = f.read()
            os.utime(path)  # its mtime is its last use: eviction removes the least recently used first
        except OSError:  # not there, or removed by another run's eviction meanwhile
            return None
        head, payload = data[: len(_MAGIC) + _CHECKSUM], data[len(_MAGIC) + _CHECKSUM :]
        if head != _MAGIC + _blake(payload).digest():  # truncated, corrupt or not ours: compute it again
            return None
        try:
            return np.load(io.BytesIO(payload), allow_pickle=False)
        except (OSError, ValueError, EOFError):
            return None

    def write_entry(self, path: Path, value: np.ndarray) -> None:
        """Store value at path (whole, with its checksum), then evict if the store is over its cap."""
        if self.max_bytes <= 0 or value.dtype.hasobject:
            return
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        payload = buffer.getvalue()
        try:
            self._write(path, _MAGIC + _blake(payload).digest() + payload)
        except OSError:  # a full or read-only disk costs a recompute next time, nothing else
            return
        if self._used is None:
            self._used = self._count()
        self._used += len(payload) + len(_MAGIC) + _CHECKSUM
        if self._used > self.max_bytes:
            self.evict()

    def _write(self, path: Path, data: bytes) -> None:
        """Write a file whole or not at all: concurrent readers see the old file, the new one, or none."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)

    def _entries(self) -> list[tuple[float, int, Path]]:
        """(last use, size, path) of every entry; crashed writers' old temporary files are removed on the way."""
        found: list[tuple[float, int, Path]] = []
        try:
            scan = list(os.scandir(self.outputs))
        except OSError:
            return found
        for entry in scan:
            try:
                stat = entry.stat()
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):  # theinference.files
                    if time.time() - stat.st_mtime > _STALE_TEMP:
                        os.unlink(entry.path)
                    continue
            except OSError:  # removed by another run meanwhile
                continue
            found.append((stat.st_mtime, stat.st_size, Path(entry.path)))
        return found

    def _count(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def evict(self) -> None:
        """Remove the least recently used entries until the store holds at most its low-water mark."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.root / "lock", "a") as lock:
                try:
                    locks.lock(lock.fileno())  # one evicting run at a time; readers and writers need no lock
                except locks.NoKernelLock:  # two evicting at once free more than needed, never a wrong entry
                    pass
                entries = sorted(self._entries())
                used = sum(size for _, size, _ in entries)
                for _, size, path in entries:
                    if used <= self.max_bytes * _LOW_WATER:
                        break
                    path.unlink(missing_ok=True)
                    used -= size
                self._used = used
        except OSError:
            self._used = None  # count again next time


def default_store(environ=os.environ) -> OracleStore | None:
    """The store in the user cache directory ($THEINFERENCE_CACHE/oracle), or None when its cap is 0."""
    max_bytes = default_max_bytes(environ)
    return OracleStore(user_cache_dir(environ) / "oracle", max_bytes) if max_bytes else None
