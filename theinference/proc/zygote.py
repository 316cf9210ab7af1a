"""A pre-warmed process that forks student processes with numpy already imported.

Starting Python and importing numpy costs ~100 ms per student process; forking a process that
has done so once costs a few ms. The zygote never imports student code, so every forked
process imports the student's modules fresh.

Protocol, over a Unix socket connection per run: the grader sends one JSON request (argv for
theinference.proc.child, cwd, env) with three file descriptors (stdout, stderr, protocol pipe) and
receives {"pid": P} once the worker is forked, then {"status": S} (a Popen-style returncode)
when it has exited. Each run is served by a monitor process forked for it, which forks the
worker and waits for it, so the zygote itself only accepts connections. The monitor is a child
subreaper (theinference.proc.reaper): it reports the status only after killing every process the
worker left behind.
"""

import json
import os
import select
import signal
import socket
import sys
import tempfile

# What a student process will import anyway; importing it here is the whole point.
import numpy  # noqa: F401
import safetensors.numpy  # noqa: F401

import theinference.proc.child
from theinference.proc import protocol, tempdirs
from theinference.proc.accounting import join
from theinference.proc.reaper import (
    MARK_ENV,
    become_subreaper,
    die_with_parent,
    fork_held,
    guard,
    kill_descendants,
    tree_mark,
    watch_tree,
)

_MAX_REQUEST = 1 << 20
_GRADER_PID_ENV = "THEINFERENCE_GRADER_PID"  # the zygote's parent, as the grader saw itself before the fork


def _worker(request: dict, fds: list[int], mark: str | None) -> None:
    """In the forked worker (its own session already, fork_held): become the student's process and run the child protocol.

    mark: what its environment carries where its monitor watches its tree (reaper.watch_tree)."""
    stdout_fd, stderr_fd, proto_fd, *calls = fds
    devnull = os.open(os.devnull, os.O_RDONLY)
    for src, dst in ((devnull, 0), (stdout_fd, 1), (stderr_fd, 2)):
        os.dup2(src, dst)
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # found again from this run's TMPDIR (its run directory), not the zygote's
    os.environ[protocol.PROTOCOL_FD_ENV] = str(proto_fd)
    if mark is not None:
        os.environ[MARK_ENV] = mark
    if calls:
        os.environ[protocol.CALLS_FD_ENV] = str(calls[0])
    os.chdir(request["cwd"])
    sys.dont_write_bytecode = True
    sys.argv = ["theinference.proc.child", *request["args"]]
    sys.path[0] = request["cwd"]
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        theinference.proc.child.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - mirror an uncaught exception's exit status
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _monitor(conn: socket.socket, request: dict, fds: list[int], zygote: int) -> None:
    """In the monitor: fork the worker, report its pid, wait for it, kill what it left, report its exit status.

    If the zygote or the grader dies meanwhile (guard), the monitor kills the worker's whole tree first."""
    subreaper, mark = become_subreaper(), tree_mark()
    join(request.get("cgroup", []))  # before the fork: everything the worker starts is counted from its birth
    pid, release = fork_held()  # the worker runs only once its pid is reported
    if pid == 0:
        conn.close()
        _worker(request, fds, None if subreaper else mark)
    guard(conn, zygote)  # after the fork: the worker runs on in Python, and must not inherit a thread's state
    if not subreaper:
        watch_tree(mark)  # no subreaper keeps its orphans: remember what the tree holds while it runs
    for fd in fds:
        os.close(fd)
    # Sent before the release, so before any student code runs: the grader may trust it (the mark: what it sweeps for
    # if student code kills this monitor, where no subreaper brings the orphans back to the grader).
    started = {"pid": pid, "monitor": os.getpid(), **({} if subreaper else {"mark": mark})}
    conn.sendall(json.dumps(started).encode() + b"\n")
    release()
    _, status = os.waitpid(pid, 0)
    kill_descendants()
    try:
        conn.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    except OSError:
        pass  # the grader is gone: the tree is dead all the same
    os._exit(0)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    message, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, 4)
    while not message.endswith(b"\n"):
        chunk = conn.recv(_MAX_REQUEST)
        if not chunk:
            break
        message += chunk
    return json.loads(message), fds


def serve(path: str) -> None:
    """Accept runs on the Unix socket at path until the grader closes our stdin (or dies)."""
    # The grader's death kills the zygote, whose death makes every monitor kill its worker's tree.
    if not die_with_parent(int(os.environ.get(_GRADER_PID_ENV, os.getppid()))):
        return
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped automatically
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address, dir_fd = tempdirs.unix_address(path)
    server.bind(address)
    if dir_fd is not None:
        os.close(dir_fd)
    server.listen(16)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    zygote = os.getpid()
    while True:
        readable, _, _ = select.select([server, sys.stdin], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 4096):
            return  # the grader is gone
        if server not in readable:
            continue
        conn, _ = server.accept()
        request, fds = _receive(conn)
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _monitor(conn, request, fds, zygote)
        for fd in fds:
            os.close(fd)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
