"""How a student process is started: a fresh interpreter, or a fork of a pre-warmed zygote.

Both give a Popen-like handle (pid, returncode, wait(timeout)); the process is the leader of
its own process group, has stdin closed, and writes stdout/stderr to the given files.
"""

import atexit
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from theinference.trust import allowed_env

class SubprocessLauncher:
    """A fresh `python -m theinference.child` per run: slower to start, nothing shared."""

    def start(self, args: list[str], cwd: str, env: dict, stdout, stderr, proto_fd: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "theinference.child", *args], cwd=cwd,
            env={**env, "THEINFERENCE_PROTOCOL_FD": str(proto_fd), "PYTHONDONTWRITEBYTECODE": "1"},
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, pass_fds=(proto_fd,), start_new_session=True,
        )

    def close(self) -> None:
        pass


class ZygoteProcess:
    """A worker forked by the zygote; its exit status arrives over the connection."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.buffer = b""
        self.returncode = None
        self.pid = self._read(time.monotonic() + 30)["pid"]

    def _read(self, deadline: float) -> dict:
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.conn], [], [], remaining)[0]:
                raise subprocess.TimeoutExpired("zygote worker", remaining)
            chunk = self.conn.recv(4096)
            if not chunk:
                raise RuntimeError("the zygote's monitor went away without a status")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
            self.returncode = self._read(deadline)["status"]
            self.conn.close()
        return self.returncode


class ZygoteLauncher:
    """Forks student processes from a zygote that has numpy imported (Linux).

    `env` is applied to the zygote itself: settings read once when numpy loads (the BLAS
    thread count) must be in place before the fork. The zygote starts from the allow-listed
    environment only: every worker inherits its /proc/<pid>/environ, whatever env it is given.
    """

    def __init__(self, env: dict | None = None):
        self._env = env or {}
        self._lock = threading.Lock()
        self._proc = None
        self._dir = None

    def _ensure_started(self) -> str:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return os.path.join(self._dir, "zygote.sock")
            self._dir = tempfile.mkdtemp(prefix="theinference-zygote-")
            path = os.path.join(self._dir, "zygote.sock")
            self._proc = subprocess.Popen([sys.executable, "-m", "theinference.zygote", path], env={**allowed_env(os.environ), **self._env},
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
            if self._proc.stdout.readline().strip() != b"ready":
                raise RuntimeError("the zygote process did not start")
            atexit.register(self.close)
            return path

    def start(self, args: list[str], cwd: str, env: dict, stdout, stderr, proto_fd: int) -> ZygoteProcess:
        path = self._ensure_started()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        request = json.dumps({"args": args, "cwd": cwd, "env": env}).encode() + b"\n"
        socket.send_fds(conn, [request], [stdout.fileno(), stderr.fileno(), proto_fd])
        return ZygoteProcess(conn)

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._proc.stdin.close()  # the zygote exits when its stdin closes
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                self._proc = None
            if self._dir:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None


def blas_env(threads: int) -> dict:
    """Environment that caps the BLAS/OpenMP threads of a student process."""
    return {name: str(threads) for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def default_launcher(env: dict | None = None):
    """The zygote where fork is safe and cheap (Linux), else a fresh interpreter per run.

    THEINFERENCE_LAUNCHER=subprocess (or zygote) overrides the choice.
    """
    choice = os.environ.get("THEINFERENCE_LAUNCHER") or ("zygote" if sys.platform == "linux" else "subprocess")
    return ZygoteLauncher(env) if choice == "zygote" else SubprocessLauncher()
