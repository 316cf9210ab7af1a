"""Process trees through psutil: found, remembered and killed where /proc cannot be read (macOS, Windows).

The /proc scan (theinference.proc.reaper.kill_trees) is Linux's; this is the same stop-then-kill over psutil's view
of the process table. Where no child subreaper keeps orphans in the tree (macOS, Windows), a process whose parent
exits re-parents away from its monitor: a `Watch` looks at the monitor's tree while the worker runs and remembers
every descendant it has seen by (pid, create time), so such an orphan is still killed at the end, and a pid reused
meanwhile by someone else's process is not.

On Linux psutil reads /proc too; THEINFERENCE_PSUTIL_PROCFS (trusted: the instructor's, for tests) points it at
another mount of the same procfs, so the portable path can be proven with /proc itself hidden.
"""

import os
import signal
import threading
import time
from collections.abc import Iterable

import psutil  # type: ignore[import-untyped]

from theinference.proc.reaper import MARK_ENV  # what a watched tree carries in its environment (Watch)

PSUTIL_PROCFS_ENV = "THEINFERENCE_PSUTIL_PROCFS"
WATCH_POLL = 0.05  # seconds between two looks at a watched tree: an orphan made and re-parented faster escapes it

if os.environ.get(PSUTIL_PROCFS_ENV) and hasattr(psutil, "PROCFS_PATH"):
    psutil.PROCFS_PATH = os.environ[PSUTIL_PROCFS_ENV]

_Key = tuple[int, float]  # (pid, create time): one process, never another that reused its pid


def _key(process: psutil.Process) -> _Key | None:
    try:
        return process.pid, process.create_time()
    except psutil.Error:
        return None


def _below(roots: Iterable[psutil.Process]) -> dict[_Key, psutil.Process]:
    """The roots still running and every descendant they have now, by key (zombies included: killing them is
    harmless, and they are for their parent to reap)."""
    found: dict[_Key, psutil.Process] = {}
    for root in roots:
        try:
            if not root.is_running():  # psutil's own check: same pid and same create time
                continue
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for process in members:
            key = _key(process)
            if key is not None:
                found.setdefault(key, process)
    return found


def _each(processes: Iterable[psutil.Process], action: str) -> None:
    for process in processes:
        try:
            getattr(process, action)()  # psutil checks first that the pid was not reused
        except psutil.Error:
            pass


def _processes(pids: Iterable[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            pass  # gone already
    return found


def children(pid: int) -> list[int]:
    """The pids of pid's children now (none if pid is gone)."""
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def kill(roots: Iterable[int], known: Iterable[psutil.Process] = ()) -> int:
    """SIGKILL the processes roots (pids) and known (remembered), and every descendant they have; how many.

    As in reaper.kill_trees, a fork bomb must not refill the tree while it is killed: where SIGSTOP exists the
    whole tree is stopped first, looked at again until a look finds nothing new, and only then killed at once."""
    start = [*_processes(roots), *known]
    stop = hasattr(signal, "SIGSTOP")
    killed: set[_Key] = set()
    for _ in range(1000):  # each round ends with all it found killed: only a resumed process forks on
        stopped: dict[_Key, psutil.Process] = {}
        while True:
            done = stopped.keys() | killed
            new = {key: p for key, p in _below([*start, *stopped.values()]).items() if key not in done}
            if not new:
                break
            if stop:
                _each(new.values(), "suspend")
            stopped.update(new)
            if not stop:
                break
        if not stopped:
            break
        _each(stopped.values(), "kill")
        killed |= stopped.keys()
    return len(killed)


class Watch:
    """Every descendant of root seen while it runs, looked at every WATCH_POLL seconds on a thread until stop().

    A process made and re-parented between two looks (a double fork) is missed by them; so root's tree also
    carries a mark in its environment (MARK_ENV, set by root before it starts its worker), and stop() adds every
    process of this user started since the watch began that carries it. Student code can remove the mark from
    its environment: where no subreaper exists, a process that wants to escape its monitor can."""

    def __init__(self, root: int, mark: str):
        self.root = psutil.Process(root)
        self.mark, self.since = mark, time.time()
        self.seen: dict[_Key, psutil.Process] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def look(self) -> None:
        """Remember the descendants root has now."""
        for key, process in _below([self.root]).items():
            if process.pid != self.root.pid:
                self.seen.setdefault(key, process)

    def _run(self) -> None:
        while not self._stopped.wait(WATCH_POLL):
            self.look()

    def stop(self) -> list[psutil.Process]:
        """Stop looking (after one last look); every process seen, and every one that carries the mark."""
        self._stopped.set()
        self._thread.join()
        self.look()
        # The mark is this watch's alone: `since` only spares reading old processes' environments, and create times
        # (boot time plus clock ticks) may be off by a second or more.
        for process in _marked(self.mark, self.since - 10):
            key = _key(process)
            if key is not None and process.pid != self.root.pid:
                self.seen.setdefault(key, process)
        return list(self.seen.values())


def kill_marked(mark: str, since: float) -> int:
    """SIGKILL every process started since `since` whose environment carries mark, and its descendants; how many.

    The grader's sweep after student code killed a monitor that had no subreaper: the monitor's watch died with it,
    and the processes it would have killed (a daemon in a session of its own) hang from nothing the grader knows."""
    return kill([], _marked(mark, since))


def _marked(mark: str, since: float) -> list[psutil.Process]:
    """The processes started since `since` whose environment has MARK_ENV=mark (any user's this process may read:
    a root grader's students run as another; the mark is random and this tree's alone)."""
    found = []
    for process in psutil.process_iter(["create_time"]):
        try:
            if (process.info["create_time"] or 0) < since:
                continue
            if process.environ().get(MARK_ENV) == mark:
                found.append(process)
        except psutil.Error:
            continue  # gone, or not ours to read
    return found
