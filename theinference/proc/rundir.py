"""A run's directory: where a student's processes write (their $TMPDIR), its disk quota, and the outputs in it.

The runner makes a fresh one for every student process. On the grader's disk it holds the job file and the
captured stdout and stderr; the worker saves each returned array there as case-<i>.npy. Without a sandbox the
student's processes write into that directory itself, and the grader measures it by walking it (every entry
costs at least a block, so a million empty files are not free). Under bubblewrap they see, at the same path, a
tmpfs the size of the quota (theinference.proc.sandbox) with the job file bound in read-only: the kernel
refuses writes past it, and the grader reaches that tmpfs through /proc/<the sandbox's first process>/root to
measure it and to read the outputs. Either way the captured output on the grader's disk counts too.

Whatever a student's process writes there is hostile: nothing is followed through a link, an entry the grader
cannot read makes the directory unmeasurable (that run's error), and the quota's verdict is the grader's own
measurement, never something the student's process reports.
"""

import errno
import os
import time
from pathlib import Path

from theinference.proc.reaper import children_of

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BINARY = getattr(os, "O_BINARY", 0)  # Windows opens a file in text mode without it (CRLF, 0x1A as the end)
_ENTRY = 4096  # bytes every directory entry costs at least: one block of a disk
# Seconds between two measurements while the student's process runs: what it writes meanwhile (a disk takes
# about 1 GB/s into its cache) is what the quota may be passed by where no tmpfs holds it.
QUOTA_POLL = 0.02
TMPFS_SLACK = 1 << 20  # the sandbox's tmpfs holds this much over the quota: a full one is seen to be over it


class QuotaExceeded(Exception):
    """The student's processes wrote more into the run's directory than the instructor allows (that run's error)."""


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MB"


def quota_message(quota: int) -> str:
    return (
        f"the adapter's processes wrote more than {_mb(quota)} to their run directory ($TMPDIR, which also holds "
        "their output and returned arrays): stopped there"
    )


def _walk(path: Path, budget: int) -> int:
    """Bytes the tree at path takes on disk (each entry at least _ENTRY), counting stops once past budget."""
    total, seen, pending = 0, set(), [str(path)]
    while pending and total <= budget:
        try:
            entries = list(os.scandir(pending.pop()))
        except FileNotFoundError:
            continue  # removed meanwhile
        except OSError as e:
            raise QuotaExceeded(
                f"the adapter's processes made part of their run directory unreadable ({e.strerror}), "
                "so its size cannot be checked: stopped there"
            ) from None
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if (info.st_dev, info.st_ino) in seen:  # hard links: one file
                continue
            seen.add((info.st_dev, info.st_ino))
            total += max(info.st_size, getattr(info, "st_blocks", 0) * 512, _ENTRY)  # Windows: no st_blocks
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
    return total


class RunDir:
    """One student process's run directory: its quota, measured from outside, and the outputs it holds."""

    def __init__(self, path: Path, quota: int, sandbox: tuple[int, int] | None = None):
        """sandbox: (the pid of bwrap, the tmpfs's size) when the student's processes see a tmpfs at path."""
        self.path, self.quota, self.sandbox = path, quota, sandbox
        self._tmpfs: int | None = None
        self._measured = 0.0

    def tmpfs(self) -> int | None:
        """A descriptor of the sandbox's tmpfs at path, once it is mounted (None until then, and without one)."""
        if self._tmpfs is not None or self.sandbox is None:
            return self._tmpfs
        bwrap, size = self.sandbox
        host = os.stat(self.path)
        for pid in children_of(bwrap):  # bwrap's one child: the first process of the sandbox's namespaces
            try:
                fd = os.open(f"/proc/{pid}/root{self.path}", os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue  # not yet set up, or gone
            vfs = os.fstatvfs(fd)
            # The tmpfs of exactly this size, not the directory on the grader's disk seen before the sandbox's mounts.
            if os.fstat(fd).st_dev != host.st_dev and vfs.f_blocks * vfs.f_frsize == size:
                self._tmpfs = fd
                return fd
            os.close(fd)
        return None

    def usage(self) -> int:
        """Bytes the student's processes hold in the run's directory now (counting stops past the quota)."""
        total = _walk(self.path, self.quota)
        outbox = self.tmpfs()
        if outbox is not None:
            vfs = os.fstatvfs(outbox)
            total += (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        return total

    def check(self, now: bool = False) -> None:
        """QuotaExceeded if the run's directory holds more than the quota; measured at most every QUOTA_POLL seconds
        unless now."""
        if not now and time.monotonic() - self._measured < QUOTA_POLL:
            return
        self._measured = time.monotonic()
        if self.usage() > self.quota:
            raise QuotaExceeded(quota_message(self.quota))

    def open_output(self, name: str) -> int:
        """A read-only descriptor of the output file `name`, never through a link, and never waiting: a FIFO the
        student left there opens at once (the caller then refuses what is not a regular file)."""
        flags = os.O_RDONLY | _NOFOLLOW | _BINARY | getattr(os, "O_NONBLOCK", 0)  # Windows: no FIFOs, no O_NONBLOCK
        if self.sandbox is None:
            return os.open(self.path / name, flags)
        outbox = self.tmpfs()
        if outbox is None:
            raise OSError(errno.ENOENT, "the sandbox's run directory cannot be reached")
        return os.open(name, flags, dir_fd=outbox)

    def remove_output(self, name: str) -> None:
        try:
            if self.sandbox is None:
                (self.path / name).unlink(missing_ok=True)
            elif self._tmpfs is not None:
                os.unlink(name, dir_fd=self._tmpfs)
        except OSError:
            pass  # the directory goes with the run

    def close(self) -> None:
        """Let go of the sandbox's tmpfs (the kernel frees it once the sandbox has ended too)."""
        if self._tmpfs is not None:
            os.close(self._tmpfs)
            self._tmpfs = None
