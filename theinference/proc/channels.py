"""The grader's end of a student process's event channel: read with a timeout, by what this machine offers.

Where select can wait on a pipe (POSIX), the pipe is read when select says so. Where it takes sockets only
(Windows), a reader thread reads the pipe and hands its chunks over a bounded queue (at most QUEUED chunks
wait: a flood of bytes fills the queue, not the grader's memory). Where a pipe cannot be inherited as an fd
number (Windows hands on handles, which Node cannot open), the Node harness connects to a loopback socket
instead (NodeSocket) and the pipe only tells that the worker is gone. The trusted switches THEINFERENCE_PIPES
and THEINFERENCE_NODE_CHANNEL (theinference.proc.reaper.SWITCHES) force the portable ones on Linux.

Everything read here comes from the student's processes: it is untrusted bytes, for the runner to parse.
"""

import os
import queue
import secrets
import select
import socket
import threading
import time
from typing import Protocol

from theinference.proc.reaper import plan

CHUNK = 65536  # bytes of one read
QUEUED = 16  # chunks a reader thread holds before it waits for the runner to take one
# Environment of a Node worker that reports over a socket: where to connect, and the line it says first there.
SOCKET_ENV = "THEINFERENCE_PROTOCOL_SOCKET"
TOKEN_ENV = "THEINFERENCE_PROTOCOL_TOKEN"
TOKEN_WAIT = 2.0  # seconds a connection may take to say the token before it is dropped (not the worker's)
_LOOK = 0.05  # seconds between two looks at whether the worker is gone, while it has not connected


class Channel(Protocol):
    def read(self, timeout: float) -> bytes | None:
        """Up to CHUNK bytes; None if none came within timeout seconds; b"" at the end of the stream."""
        ...

    def close(self) -> None: ...


class SelectPipe:
    """A pipe's read end, waited on with select (where select takes pipes)."""

    def __init__(self, fd: int):
        self.fd: int | None = fd

    def read(self, timeout: float) -> bytes | None:
        if self.fd is None:
            return b""  # closed: the end of the stream
        if not select.select([self.fd], [], [], max(timeout, 0))[0]:
            return None
        return os.read(self.fd, CHUNK)

    def close(self) -> None:
        """Close the fd once: a runner finishes a stopped worker, then its session closes it again, and a second
        os.close could close a file the grader opened meanwhile under the same number."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class ThreadPipe:
    """A pipe's read end, read by a thread of its own (where select takes sockets only).

    The thread owns the fd and closes it itself at end of stream: closed from another thread while a read waits
    on it, its number could be reused by a file the grader opens next, and the read would go on there. The runner
    kills the worker's tree right after close, which ends the stream."""

    def __init__(self, fd: int):
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=QUEUED)
        self._closed = threading.Event()
        self._ended = False
        threading.Thread(target=self._pump, args=(fd,), name="theinference-pipe-reader", daemon=True).start()

    def _pump(self, fd: int) -> None:
        try:
            while True:
                try:
                    chunk = os.read(fd, CHUNK)
                except OSError:
                    chunk = b""
                while not self._closed.is_set():
                    try:
                        self._queue.put(chunk, timeout=0.1)
                        break
                    except queue.Full:  # the runner has not taken the last ones yet
                        continue
                if not chunk:
                    return
        finally:
            os.close(fd)

    def read(self, timeout: float) -> bytes | None:
        if self._ended:
            return b""
        try:
            chunk = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None
        self._ended = not chunk
        return chunk

    def close(self) -> None:
        self._closed.set()  # the thread drops what it reads from now on, and ends at end of stream


def pipe_reader(fd: int) -> Channel:
    """The channel over a pipe's read end, as this machine (or THEINFERENCE_PIPES) says it is waited on."""
    return SelectPipe(fd) if plan().pipes == "select" else ThreadPipe(fd)


class NodeSocket:
    """A loopback socket the Node harness connects to and says TOKEN_ENV's token on, is told "go" on, then reports
    over (and reads an interactive job's calls from); `alive` (the protocol pipe, which the worker holds open without writing to it)
    ends the stream if the worker dies before it connects. Only the first connection that says the token is kept,
    and nothing connects after it (the listening socket is closed)."""

    def __init__(self) -> None:
        self._listener: socket.socket | None = socket.create_server(("127.0.0.1", 0))
        self.token = secrets.token_hex(16)
        self.env = {SOCKET_ENV: f"127.0.0.1:{self._listener.getsockname()[1]}", TOKEN_ENV: self.token}
        self._conn: socket.socket | None = None
        self._early = b""  # what came after the token, in its chunk
        self.alive: Channel | None = None

    def read(self, timeout: float) -> bytes | None:
        if self._conn is None:
            return self._await_connection(timeout)
        if not select.select([self._conn], [], [], max(timeout, 0))[0]:
            return None
        try:
            return self._conn.recv(CHUNK)
        except OSError:  # reset by the worker's death
            return b""

    def _await_connection(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + max(timeout, 0)
        while True:
            if self._accept(min(_LOOK, max(deadline - time.monotonic(), 0))):
                early, self._early = self._early, b""
                return early or None
            if self.alive is not None and self._gone():
                # It connected before it died, if at all: such a connection is waiting to be accepted by now.
                if self._accept(0):
                    return self._early or None
                return b""
            if time.monotonic() >= deadline:
                return None

    def _gone(self) -> bool:
        assert self.alive is not None
        while True:
            chunk = self.alive.read(0)
            if chunk == b"":
                return True
            if chunk is None:
                return False  # bytes the student's code wrote into the pipe mean nothing here: dropped

    def _accept(self, timeout: float) -> bool:
        """Whether a connection that said the token was accepted within timeout (others are dropped)."""
        assert self._listener is not None
        if not select.select([self._listener], [], [], timeout)[0]:
            return False
        conn, _ = self._listener.accept()
        conn.settimeout(TOKEN_WAIT)
        said = b""
        try:
            while b"\n" not in said and len(said) <= len(self.token) + 1:
                chunk = conn.recv(CHUNK)
                if not chunk:
                    break
                said += chunk
        except OSError:
            pass
        line, _, rest = said.partition(b"\n")
        if line != self.token.encode():
            conn.close()
            return False
        conn.settimeout(None)
        # The worker waits for this before it imports the student's code: the grader knows its pid by now (the
        # launcher's start returned it), as the monitor's hold gives where it forks (reaper.fork_held).
        conn.sendall(b"go\n")
        self._conn, self._early = conn, rest
        self._listener.close()
        self._listener = None
        return True

    def write(self, data: bytes) -> None:
        """Send the worker one call's arguments (an interactive job's: it has reported over this socket by then)."""
        assert self._conn is not None, "calls go only to a worker that has connected"
        self._conn.sendall(data)

    def close(self) -> None:
        for sock in (self._conn, self._listener):
            if sock is not None:
                sock.close()
        self._conn = self._listener = None
        if self.alive is not None:
            self.alive.close()
