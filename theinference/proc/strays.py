"""The grader as the last subreaper: what a killed monitor leaves behind comes back to the grader and dies.

At the `subreaper` level student code runs with the grader's rights and can SIGKILL its own
monitor; the worker's descendants would then re-parent to init and outlive the grader (a daemon
rewriting the results file later). The grading process therefore marks itself a child subreaper
too: such orphans re-parent to it instead, and `kill_strays` kills every child of the grader that
no launcher registered (a zygote, a monitor being waited for). The runner calls it whenever a
monitor died, before anything of that run is accepted.
"""

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from theinference.proc.reaper import children_of, become_subreaper, kill_trees, plan

_lock = threading.RLock()
_ours: set[int] = set()  # the grader's own children: zygotes and monitors
_adopting: list[int] = []  # the pid that became a subreaper (a forked copy of the grader is not one)


def adopt_orphans() -> None:
    """Make this (grading) process the subreaper of whatever a killed monitor leaves (Linux; idempotent)."""
    with _lock:
        if os.getpid() not in _adopting and become_subreaper():
            _adopting.append(os.getpid())


@contextmanager
def starting() -> Iterator[None]:
    """Hold while starting and registering one of the grader's own children: a sweep never takes it for a stray."""
    with _lock:
        yield


def register(pid: int) -> None:
    with _lock:
        _ours.add(pid)


def forget(pid: int) -> None:
    with _lock:
        _ours.discard(pid)


def kill_strays() -> int:
    """SIGKILL and reap every child of this process that no launcher registered, until none is left; how many."""
    with _lock:
        me = os.getpid()
        if plan().kill == "psutil":  # no /proc to scan
            from theinference.proc import trees

            def left() -> list[int]:
                return [pid for pid in trees.children(me) if pid not in _ours]

            killed = trees.kill(left())
            _reap(left)
            return killed
        # Stopped and killed whole first (a fork bomb outruns killing it a generation at a time), then reaped.
        killed = kill_trees(lambda table: [pid for pid, (ppid, _) in table.items() if ppid == me and pid not in _ours])
        for _ in range(10_000):  # a process that keeps forking loses the race: each round takes its parents
            strays = [pid for pid in children_of(os.getpid()) if pid not in _ours]
            if not strays:
                break
            for pid in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for pid in strays:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
    return killed


def _reap(left: Callable[[], list[int]]) -> None:
    """Kill and reap the strays left (psutil's view) until none is: a process that keeps forking loses the race."""
    for _ in range(10_000):
        found = left()
        if not found:
            return
        from theinference.proc import trees

        trees.kill(found)
        for pid in found:
            try:
                os.waitpid(pid, 0)
            except (ChildProcessError, OSError):
                pass
