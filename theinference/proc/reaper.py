"""The monitor of a student process: a child subreaper that kills every descendant it leaves.

A process the student starts with `start_new_session=True` escapes a process-group kill. On
Linux the monitor marks itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so such
orphans are re-parented to it instead of to init; once the student's process has exited it
kills them all, whatever session or group they moved to, and only then reports the exit
status. The grader accepts results and writes output only after that report.

Run as `python -P -m theinference.proc.reaper STATUS_FD [--cgroup FILE]... -- COMMAND...` (the fresh-interpreter
and sandbox launchers): forks COMMAND in a new session, writes {"pid": P} and then
{"status": S} (a Popen-style returncode) to the socket STATUS_FD, one JSON object a line.
"""

import ctypes
from collections.abc import Sequence
import json
import os
import signal
import socket
import sys

from theinference.proc import protocol
from theinference.proc.accounting import join

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux); False where unsupported."""
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _children(parent: int) -> list[int]:
    """The pids whose parent is `parent` (/proc scan: /proc/PID/task/*/children is optional in kernels)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields resume after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry))
    return found


def _any_children() -> bool:
    """Whether this process has a child (reaping one that has exited): a cheap test before a /proc scan."""
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return False
    return True


def kill_descendants() -> None:
    """SIGKILL and reap every descendant of this (subreaper) process, layer by layer."""
    if sys.platform != "linux":
        return
    me = os.getpid()
    while _any_children():
        kids = _children(me)
        if not kids:
            return  # the only one was a zombie, reaped just now
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in kids:  # their children re-parent to us as they die: the next round finds them
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _send(conn: socket.socket, **message) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the grader is gone; the descendants are killed all the same


def monitor(status_fd: int, command: list[str], cgroup: Sequence[str] = ()) -> None:
    """Run command in its own session under this subreaper; report its pid and, once all is dead, its status.

    cgroup: the run's cgroup.procs files, joined before the fork so the kernel counts the whole tree.
    """
    conn = socket.socket(fileno=status_fd)
    become_subreaper()
    join(cgroup)
    protocol_fd = os.environ.get(protocol.PROTOCOL_FD_ENV)
    pid = os.fork()
    if pid == 0:
        conn.close()
        os.setsid()  # its own group: a timeout's killpg reaches it but not this monitor
        try:
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    if protocol_fd:
        os.close(int(protocol_fd))  # the grader sees end-of-stream when the student's side closes it
    _send(conn, pid=pid)
    _, status = os.waitpid(pid, 0)
    kill_descendants()
    _send(conn, status=os.waitstatus_to_exitcode(status))


def _arguments(argv: list[str]) -> tuple[int, list[str], list[str]]:
    """STATUS_FD [--cgroup FILE]... -- COMMAND... -> (status fd, cgroup.procs files, command)."""
    split = argv.index("--")
    options = argv[2:split]
    return (
        int(argv[1]),
        [options[i + 1] for i in range(0, len(options), 2) if options[i] == "--cgroup"],
        argv[split + 1 :],
    )


if __name__ == "__main__":
    fd, groups, command = _arguments(sys.argv)
    monitor(fd, command, groups)
