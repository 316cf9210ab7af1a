"""Every file the grader writes (results, grades, progress, store entries, made weights): whole, and never through a link.

A results file's directory may be one a student can write into (a course directory, a shared
/tmp), and the grader may run as root: a name it writes to could meanwhile be a symlink to any
file on the machine. So each file is first created under a fresh, unguessable name with
O_CREAT|O_EXCL|O_NOFOLLOW (which fails rather than follow or reuse anything found there), written
whole, then renamed over the target: a rename replaces a link at the target, it never writes
through it, and a reader sees the old file or the new one, never half of one.
"""

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@contextmanager
def atomic_file(path: Path, binary: bool = False, mode: int = 0o644, **open_args) -> Iterator[IO]:
    """A new file object whose content replaces path when the block ends without an exception."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, _FLAGS, 0o600)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb" if binary else "w", **open_args) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write path whole or not at all (text as UTF-8), never following a link found at its name."""
    if isinstance(data, bytes):
        with atomic_file(path, binary=True, mode=mode) as f:
            f.write(data)
    else:
        with atomic_file(path, mode=mode, encoding="utf-8") as f:
            f.write(data)
