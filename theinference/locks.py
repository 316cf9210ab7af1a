"""Exclusive kernel locks on an open file, portable: flock on POSIX, LockFileEx on Windows (filelock's primitive).

A kernel lock is released however its holder ends (exit, crash, SIGKILL, the OOM killer), and only then: what a
lock that says "its process is alive" needs, and what a lock a killed process must never leave held needs. A lock
made of a file's existence (filelock's SoftFileLock) outlives a killed holder, so it is never used here: where the
machine offers no kernel lock, lock() raises NoKernelLock and each caller does without the lock in a way that stays
safe. filelock is imported on the first lock (it costs a tenth of a second; most commands never lock).
"""

import errno
import functools


class NoKernelLock(OSError):
    """This machine offers no kernel file lock (neither flock nor LockFileEx)."""


@functools.cache
def _lock_descriptor():
    import warnings

    with warnings.catch_warnings():
        # filelock warns on import where fcntl is missing that only its soft lock is left: none is used here.
        warnings.simplefilter("ignore")
        from filelock import lock_descriptor
    return lock_descriptor


def lock(fd: int, blocking: bool = True) -> bool:
    """Take the exclusive kernel lock on fd's file, held until every descriptor of it is closed (by this process or
    a forked copy) or the holder dies; whether it was taken (blocking: wait until it is). NoKernelLock where none
    exists."""
    try:
        return _lock_descriptor()(fd, blocking=blocking)
    except OSError as e:
        if e.errno == errno.ENOSYS:  # filelock's answer where the platform has no such lock
            raise NoKernelLock(errno.ENOSYS, "this machine offers no kernel file lock") from e
        raise
