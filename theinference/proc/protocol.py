"""The grader ↔ student-process protocol, declared once for both ends of the pipe (runner.py, child.py).

Down: a job file (JSON, `Job`), its path the worker's one argument. Up: one JSON object a line on
the pipe whose fd is in PROTOCOL_FD_ENV, each with an "event": LOADED or LOAD_ERROR once, then
START and DONE for each case, in order. A DONE carries a status from DONE_STATUSES (the runner adds
too-large, timeout and crash itself) and, for OK, the .npy file the array was saved to.

Standard library only: the sandbox copies this file into the stub package students' code runs from.
"""

from typing import Any, TypedDict

PROTOCOL_FD_ENV = "THEINFERENCE_PROTOCOL_FD"
# Interactive jobs: the fd the worker reads call requests from, one JSON object a line ({"case", "args"}).
CALLS_FD_ENV = "THEINFERENCE_CALLS_FD"

LOADED, LOAD_ERROR, START, DONE = "loaded", "load-error", "start", "done"
EVENTS = (LOADED, LOAD_ERROR, START, DONE)

OK, NOT_STARTED, ERROR, BAD_OUTPUT = "ok", "not-started", "error", "bad-output"
DONE_STATUSES = (OK, NOT_STARTED, ERROR, BAD_OUTPUT)
# What the runner concludes itself of a call the worker did not report on (an outcome, never on the pipe).
TOO_LARGE, TIMEOUT, CRASH = "too-large", "timeout", "crash"


class Limits(TypedDict):
    """What the worker caps with setrlimit before any student code runs (None: no cap)."""

    memory_bytes: int | None
    file_bytes: int | None
    # The student's processes run as the grader's own user, with nothing else counting them (no uid of their own, no
    # namespace, no cgroup's pids.max): cap that user's tasks at what it runs now and child.MAX_PROCESSES more.
    shares_uid: bool


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
