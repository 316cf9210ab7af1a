"""The stage whose verdict rests on cost (cache-scaling) runs alone: no other submission's processes run meanwhile.

The cache proof counts the CPU of the submission's own process tree. Work done for it elsewhere is not counted: a
neighbour in the same batch (or another grader's submission on this machine) that computes its calls and hands back
the tokens through any channel they share. Some channels no confinement here closes: flock() on a read-only file two
sandboxes both see (numpy's own .py files), a unix socket in a directory both may write where no sandbox runs. So
the cost stage takes this lock exclusively and every other stage takes it shared: within a batch (threads of one
grader) and across the graders of this user on this machine (a lock file in a private directory: proc.sandbox.lock_dir).
A waiting cost stage goes first (new shared holders wait behind it), so a busy batch cannot starve it.
"""

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LOCK_NAME = "cost-stage.lock"


class _MachineLock:
    """The cross-process half: flock shared or exclusive where fcntl exists; elsewhere filelock's exclusive lock for
    both (graders on one machine then take turns stage by stage; a batch's own stages still share)."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None
        self._portable: Any = None  # a filelock.FileLock, where fcntl is missing

    def acquire(self, exclusive: bool) -> None:
        try:
            import fcntl
        except ImportError:
            import filelock

            self._portable = filelock.FileLock(str(self.path))
            self._portable.acquire()
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._portable is not None:
            self._portable.release()
            self._portable = None
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor of its open file releases the flock
            self._fd = None


class CostLock:
    """A readers-writer lock over stages: `shared()` for a stage judged on outputs, `exclusive()` for the cost stage.

    With a machine path, each first shared holder and each exclusive one also hold that lock file (shared or
    exclusive) against every other grader using it."""

    def __init__(self, machine: Path | None = None):
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._machine = _MachineLock(machine) if machine is not None else None

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            if self._readers == 0 and self._machine is not None:
                self._machine.acquire(exclusive=False)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    if self._machine is not None:
                        self._machine.release()
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
                self._cond.notify_all()  # interrupted while waiting: the shared holders it held back go on
            self._writer = True
        try:
            if self._machine is not None:
                self._machine.acquire(exclusive=True)
            try:
                yield
            finally:
                if self._machine is not None:
                    self._machine.release()
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()
