"""The grader's end of the events' channel where select cannot wait on a pipe (Windows), proven on Linux by forcing it
(THEINFERENCE_PIPES=threads, THEINFERENCE_NODE_CHANNEL=socket). The runner's outcomes under the reader thread are
tests/e2e/test_runner.py's (its `threads` launcher); these are the channels' own promises."""

import os
import socket
import threading
import time

import pytest

from conftest import scaled
from theinference.proc import channels, launch, reaper


@pytest.mark.linux  # elsewhere select may take no pipe, and the header says so without a switch
def test_the_switch_picks_the_reader_thread_and_the_header_says_so(monkeypatch):
    for name in reaper.PASSED_ON:
        monkeypatch.delenv(name, raising=False)
    read, write = os.pipe()
    try:
        assert isinstance(channels.pipe_reader(read), channels.SelectPipe)
        assert launch.mechanisms()["pipes"] == "select"
        assert launch.mechanisms()["node-channel"] == "the inherited pipe, by its fd number"
        monkeypatch.setenv("THEINFERENCE_PIPES", "threads")
        monkeypatch.setenv("THEINFERENCE_NODE_CHANNEL", "socket")
        threaded = channels.pipe_reader(read)
        assert isinstance(threaded, channels.ThreadPipe)
        assert launch.mechanisms()["pipes"].startswith("a reader thread per pipe")
        assert launch.mechanisms()["node-channel"].startswith("a loopback socket")
        monkeypatch.setenv("THEINFERENCE_PIPES", "thread")
        with pytest.raises(launch.SwitchError, match="THEINFERENCE_PIPES=thread"):
            launch.mechanisms()
    finally:
        os.close(write)  # the thread reads the end of the stream and closes its fd itself


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.linux  # /proc/self/fd
def test_a_reader_thread_times_out_reads_and_ends_and_closes_its_fd():
    before = _open_fds()
    read, write = os.pipe()
    pipe = channels.ThreadPipe(read)
    assert pipe.read(0) is None and pipe.read(0.05) is None  # nothing written: each look times out
    os.write(write, b'{"event": "loaded"}\n')
    assert pipe.read(scaled(5)) == b'{"event": "loaded"}\n'
    os.close(write)
    assert pipe.read(scaled(5)) == b"" and pipe.read(0) == b""  # the end of the stream, and it stays ended
    pipe.close()
    # The pipe's own fds closed, and no other left open. (An fd open at `before` may close meanwhile: another test's
    # reader thread closing its pipe at the end of its stream, as this one does; listing /proc/self/fd takes one.)
    deadline = time.monotonic() + scaled(5)
    while (_is_open(read) or _open_fds() - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _is_open(read) and not _is_open(write) and not _open_fds() - before


@pytest.mark.slow
def test_a_flood_fills_the_queue_not_the_graders_memory():
    read, write = os.pipe()
    pipe = channels.ThreadPipe(read)
    written = 0

    def flood() -> None:
        nonlocal written
        block = b"x" * channels.CHUNK
        try:
            while written < 200 * channels.CHUNK:
                written += os.write(write, block)
        except OSError:
            pass  # the read end closed at last

    writer = threading.Thread(target=flood, daemon=True)
    writer.start()
    time.sleep(scaled(1))  # the writer has long filled what the reader takes, and waits for the runner
    # What the thread holds (the queue, the chunk it waits to put) and the pipe's own buffer, never more.
    assert channels.CHUNK <= written <= (channels.QUEUED + 2) * channels.CHUNK + (1 << 20)
    taken = 0
    while taken < written:
        chunk = pipe.read(scaled(5))
        assert chunk
        taken += len(chunk)
    pipe.close()
    os.close(write)
    writer.join(scaled(5))


def _harness(address: str, said: bytes, then: bytes = b"") -> socket.socket:
    host, port = address.rsplit(":", 1)
    conn = socket.create_connection((host, int(port)))
    conn.sendall(said + then)
    return conn


def test_a_socket_keeps_the_connection_that_says_the_token_and_drops_others():
    node = channels.NodeSocket()
    read, write = os.pipe()
    node.alive = channels.pipe_reader(read)
    try:
        address = node.env[channels.SOCKET_ENV]
        impostor = _harness(address, b"not the token\n", b'{"event": "loaded"}\n')
        assert node.read(0.2) is None  # dropped: what it sent is not read
        worker = _harness(address, node.token.encode() + b"\n", b'{"event": "loaded"}\n')
        assert node.read(scaled(5)) == b'{"event": "loaded"}\n'
        node.write(b'{"case": 0, "args": []}\n')  # an interactive job's calls go down the same connection
        said = b""
        while said.count(b"\n") < 2:
            said += worker.recv(100)
        assert said == b'go\n{"case": 0, "args": []}\n'  # "go" first: the worker waits for it before it loads
        with pytest.raises(OSError):  # nothing connects after it
            _harness(address, node.token.encode() + b"\n")
        worker.close()
        assert node.read(scaled(5)) == b""
        impostor.close()
    finally:
        node.close()
        os.close(write)


def test_a_worker_that_dies_before_it_connects_ends_the_stream():
    node = channels.NodeSocket()
    read, write = os.pipe()
    node.alive = channels.ThreadPipe(read)
    try:
        assert node.read(0.1) is None  # alive, not connected yet
        os.write(write, b"bytes the student's code wrote into the pipe\n")
        os.close(write)  # the worker's end: it is gone
        assert node.read(scaled(5)) == b""
    finally:
        node.close()
