"""A kernel lock is held while its process lives, is the same lock as fcntl.flock's, goes when its holder is
killed, and is refused plainly (NoKernelLock) where the machine has none."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from theinference import locks

NO_LOCK = "this machine offers no kernel file lock"
HOLDER = "import os, sys, time; from theinference import locks; fd = os.open(sys.argv[1], os.O_RDWR); locks.lock(fd); "
HOLDER += "print('held', flush=True); time.sleep(600)"


def test_a_lock_is_held_while_its_process_lives_and_goes_when_it_is_killed(tmp_path):
    fcntl = pytest.importorskip("fcntl", reason="it checks the lock is flock's (POSIX); Windows' is LockFileEx")
    path = tmp_path / "owner"
    path.touch()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert locks.lock(fd, blocking=False) is False
        with pytest.raises(BlockingIOError):  # flock's own lock: graders of before and after see each other's
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.kill()
        holder.wait()
        assert locks.lock(fd, blocking=False) is True  # released by the kernel: no file left to say otherwise
    finally:
        os.close(fd)
        holder.kill()
        holder.wait()


def test_where_no_kernel_lock_exists_taking_one_says_so(tmp_path):
    portable = Path(__file__).parent / "portable"  # a sitecustomize that removes fcntl, as on Windows
    code = "import os, sys; from theinference import locks\ntry:\n    locks.lock(os.open(sys.argv[1], os.O_RDWR))\n"
    code += "except locks.NoKernelLock as e:\n    print(e)"
    (tmp_path / "lock").touch()
    env = {**os.environ, "PYTHONPATH": str(portable)}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "lock")], env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"[Errno {errno.ENOSYS}] {NO_LOCK}\n", "")
