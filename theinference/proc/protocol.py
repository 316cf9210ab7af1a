"""The grader ↔ student-process protocol, declared once for both ends of the pipe (runner.py, child.py).

Down: a job file (JSON, `Job`), its path the worker's one argument. Up: one JSON object a line on
the pipe whose fd is in PROTOCOL_FD_ENV, each with an "event": LOADED or LOAD_ERROR once, then
START and DONE for each case, in order. A DONE carries a status from DONE_STATUSES (the runner adds
too-large, timeout and crash itself) and, for OK, the .npy file the array was saved to.

Standard library only: the sandbox copies this file into the stub package students' code runs from.
"""

import os
from collections.abc import Sequence
from typing import Any, TypedDict

PROTOCOL_FD_ENV = "THEINFERENCE_PROTOCOL_FD"
# A worker started without fork (the monitor's spawn "popen"): the pipe it reads one byte from ("1") before it runs any
# student code, written once the monitor has reported its pid (theinference.proc.reaper); end-of-file instead: exit.
GO_FD_ENV = "THEINFERENCE_GO_FD"
# Interactive jobs: the fd the worker reads call requests from, one JSON object a line ({"case", "args"}).
CALLS_FD_ENV = "THEINFERENCE_CALLS_FD"

LOADED, LOAD_ERROR, START, DONE = "loaded", "load-error", "start", "done"
EVENTS = (LOADED, LOAD_ERROR, START, DONE)

OK, NOT_STARTED, ERROR, BAD_OUTPUT = "ok", "not-started", "error", "bad-output"
DONE_STATUSES = (OK, NOT_STARTED, ERROR, BAD_OUTPUT)
# What the runner concludes itself of a call the worker did not report on (an outcome, never on the pipe).
TOO_LARGE, TIMEOUT, CRASH = "too-large", "timeout", "crash"


# Handing a pipe to a child: POSIX inherits fds by number (subprocess's pass_fds); Windows has no pass_fds and
# inherits handles instead, each named in a STARTUPINFO handle list and reopened as an fd on the other side. This
# Windows path is written to the documentation and has not run: no Windows machine grades this project's tests.
_HANDLES = hasattr(os, "get_handle_inheritable")  # Windows' handle functions


def token(fd: int) -> str:
    """What names fd to a child that inherits it (handed_on), in its environment: the fd, or on Windows its handle."""
    if not _HANDLES:
        return str(fd)
    import msvcrt

    return str(msvcrt.get_osfhandle(fd))  # type: ignore[attr-defined,unused-ignore]


def inherited(name: str, flags: int) -> int:
    """The fd that a token (token) names in the process that inherited it; flags: os.O_RDONLY or os.O_WRONLY."""
    if not _HANDLES:
        return int(name)
    import msvcrt

    return msvcrt.open_osfhandle(int(name), flags)  # type: ignore[attr-defined,unused-ignore]


def handed_on(fds: Sequence[int], sockets: Sequence[int] = ()) -> dict:
    """subprocess.Popen's keyword arguments that let the child inherit fds and sockets (their fileno()), and no
    other fd or handle; the child finds each by its token."""
    if not _HANDLES:
        return {"pass_fds": (*fds, *sockets)}
    import msvcrt
    import subprocess

    handles = [msvcrt.get_osfhandle(fd) for fd in fds] + list(sockets)  # type: ignore[attr-defined,unused-ignore]
    for handle in handles:
        os.set_handle_inheritable(handle, True)  # type: ignore[attr-defined,unused-ignore]
    info = subprocess.STARTUPINFO(lpAttributeList={"handle_list": handles})  # type: ignore[attr-defined,unused-ignore]
    return {"startupinfo": info, "close_fds": True}


class Limits(TypedDict):
    """What the worker caps with setrlimit before any student code runs (None: no cap)."""

    memory_bytes: int | None
    file_bytes: int | None
    # The student's processes run as the grader's own user, with nothing else counting them (no uid of their own, no
    # namespace, no cgroup's pids.max): cap that user's tasks at what it runs now and child.MAX_PROCESSES more.
    shares_uid: bool
    # Seal the worker before the student's code runs (theinference.proc.seal): no process it starts can be reaped
    # unseen by the count of its tree's CPU.
    seal: bool


class Job(TypedDict):
    """The job file: what to import, which function, the arguments of each call, where to put arrays."""

    course_root: str
    adapters: str  # tests/adapters.py
    names: list[str]  # the function's name, then its accepted aliases
    calls: list[list[Any]]
    start: int  # the first call this process makes (a fresh process resumes after a crash or timeout)
    out_dir: str
    # Interactive (cache-scaling): `calls` is empty; each call's arguments arrive on the fd in CALLS_FD_ENV
    # only when the grader starts it, and the worker exits at the end of that stream. The grader times
    # each call itself, from outside the worker (theinference.proc.accounting).
    interactive: bool
    limits: Limits
