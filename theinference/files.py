"""Every file the grader writes (results, grades, progress, store entries, made weights): whole, and never through a link.

A results file's directory may be one a student can write into (a course directory, a shared
/tmp), and the grader may run as root: a name it writes to could meanwhile be a symlink to any
file on the machine, and a file written there under a guessable name could be changed before it
is in place. So each file is first written in a fresh directory of the grader's own (mkdtemp: a random
name, mode 0700, beside the target so that a rename reaches it), opened with O_CREAT|O_EXCL|O_NOFOLLOW,
then renamed over the target: a rename replaces a link (or a FIFO) at the target, it never writes through it,
and a reader sees the old file or the new one, never half of one. A directory planted at the target cannot be
renamed over: that is OutputBlocked (exit 2), and the file is kept where it was written, named in the message.
"""

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from theinference.errors import ConfigError

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_FLAGS |= getattr(os, "O_BINARY", 0)  # Windows: else a text-mode file, every "\n" written as "\r\n"


class OutputBlocked(ConfigError):
    """Something other than a file (a directory) is where the grader is to write one (exit 2)."""


def check_target(path: Path) -> None:
    """Refuse, before any work, a target the file written at the end could not replace: a directory, or one in a
    directory that is not there."""
    path = Path(path)
    if _is_directory(path):
        raise OutputBlocked(f"{path} is a directory, not a file: name a file to write, or remove the directory")
    if not path.parent.is_dir():
        raise OutputBlocked(f"{path}: no directory {path.parent} to write it in")


def _is_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)  # lstat: a link is replaced, never followed
    except OSError:
        return False


@contextmanager
def atomic_file(path: Path, binary: bool = False, mode: int = 0o644, **open_args) -> Iterator[IO]:
    """A new file object whose content replaces path when the block ends without an exception."""
    path = Path(path)
    private = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp = private / path.name
    kept = False
    try:
        fd = os.open(tmp, _FLAGS, 0o600)
        if hasattr(os, "fchmod"):  # Windows before Python 3.13 has none (and no mode bits but read-only)
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb" if binary else "w", **open_args) as f:
            yield f
        try:
            os.replace(tmp, path)
        except (IsADirectoryError, NotADirectoryError) as e:  # planted meanwhile: never exit 3, never lost
            kept = True
            raise OutputBlocked(
                f"{path} is a directory, not a file (something put it there while the grader worked): "
                f"what was to be written there is kept in {tmp}"
            ) from e
    finally:
        if not kept:
            shutil.rmtree(private, ignore_errors=True)


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write path whole or not at all (text as UTF-8), never following a link found at its name."""
    if isinstance(data, bytes):
        with atomic_file(path, binary=True, mode=mode) as f:
            f.write(data)
    else:
        with atomic_file(path, mode=mode, encoding="utf-8") as f:
            f.write(data)
