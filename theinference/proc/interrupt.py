"""Ctrl-C and SIGTERM: every student process killed at once, cleanup run, the right exit code.

SIGTERM (a cancelled CI job, a TA's `kill`) is turned into `Terminated`, a KeyboardInterrupt,
so the same unwinding runs for both: temp directories removed, launchers closed, partial
batch results written. Grading threads cannot be interrupted by a signal, so every running
student process is registered here; `cancel()` kills them all and makes any later start fail
with `Cancelled`, which unwinds those threads too.
"""

import os
import signal
import threading


# The number a Popen-style returncode -9 names "killed" by; Windows' signal module has no SIGKILL.
SIGKILL = getattr(signal, "SIGKILL", 9)


class Terminated(KeyboardInterrupt):
    """The grader received SIGTERM."""


class Cancelled(Exception):
    """The run was interrupted: no student process may start any more."""


_lock = threading.Lock()
_running: set[int] = set()  # process-group ids of live student processes
_cancelled = threading.Event()
_received: list[int] = []  # the signal that interrupted this process, if one did


def exit_code() -> int | None:
    """128 + the number of the signal received, as shells report it (130 SIGINT, 143 SIGTERM); None if none was."""
    return 128 + _received[0] if _received else None


def _on_signal(signum, frame) -> None:
    # One interruption is enough: a second signal must not break the cleanup the first one started.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _received.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def install() -> None:
    """Turn SIGTERM and SIGINT into exceptions in the main thread (call once, from the CLI's entry point)."""
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; one already gone (or no longer ours) is nothing to do.

    Where there is no killpg (Windows), the process pgid and its descendants are killed instead (psutil), which
    finds what still hangs from it; its monitor kills the rest. (A Windows job object would hold the whole group
    without that; it is not used here.)"""
    if not hasattr(os, "killpg"):
        from theinference.proc import trees  # psutil: only where this path is taken

        trees.kill([pgid])
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def track(pgid: int) -> None:
    """Register a student's process group; kill it and raise Cancelled if the run is already interrupted."""
    with _lock:
        if not _cancelled.is_set():
            _running.add(pgid)
            return
    kill_group(pgid)
    raise Cancelled()


def untrack(pgid: int) -> None:
    """The process group is dead and reaped: forget it (its id may be reused)."""
    with _lock:
        _running.discard(pgid)


def cancelled() -> bool:
    """Whether the run has been interrupted (results finished since are incomplete)."""
    return _cancelled.is_set()


def kill_running() -> None:
    """Kill every registered student process group now (wherever the interrupt found the grader)."""
    with _lock:
        for pgid in _running:
            kill_group(pgid)


def cancel() -> None:
    """Kill every registered student process group; starting another raises Cancelled from now on."""
    _cancelled.set()
    kill_running()
