"""The monitor of a student process: it kills every descendant the student's process leaves.

A process the student starts with `start_new_session=True` escapes a process-group kill. Where the
kernel has child subreapers (Linux: prctl PR_SET_CHILD_SUBREAPER) the monitor becomes one, so such
orphans are re-parented to it instead of to init; elsewhere (macOS, Windows) it watches its tree
while the worker runs and remembers every descendant it saw (theinference.proc.trees.Watch). Once the
student's process has exited it kills them all, whatever session or group they moved to (a /proc
scan, kill_trees, or psutil where /proc cannot be read), and only then reports the exit status. The
grader accepts results and writes output only after that report.

Run as `python -P -m theinference.proc.reaper STATUS_FD [--cgroup FILE]... -- COMMAND...` (the fresh-interpreter
and sandbox launchers): starts COMMAND in a new session (fork_held, or subprocess where there is no fork), writes
{"pid": P} and then {"status": S} (a Popen-style returncode) to the socket STATUS_FD, one JSON object a line.

The monitor dies with the grader, and takes the student's tree with it: its parent's death
sends it SIGTERM (PR_SET_PDEATHSIG where there is one, checked right after it is set, since the parent
may be gone already), and the grader's end of STATUS_FD closing (end-of-file) means the same. Either
way it kills every descendant before it exits.

Each mechanism is chosen by what the machine offers (plan); SWITCHES force the portable one on Linux.
"""

import ctypes
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
import json
import secrets
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from theinference.proc import protocol
from theinference.proc.accounting import join

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

# Trusted switches (the instructor's environment) that force the portable mechanism where the Linux one exists,
# so that the portable paths are proven on Linux. Each names the one value it accepts.
SWITCHES = {
    "THEINFERENCE_SPAWN": "popen",  # start the worker with subprocess, as where there is no fork
    "THEINFERENCE_ORPHANS": "watch",  # no child subreaper: the monitor watches its tree (theinference.proc.trees)
    "THEINFERENCE_KILL": "psutil",  # kill trees through psutil, as where /proc cannot be read
    "THEINFERENCE_GRADER_DEATH": "eof",  # no PR_SET_PDEATHSIG: end-of-file on the status socket only
    "THEINFERENCE_PIPES": "threads",  # the grader reads its pipes with threads, as where select takes sockets only
    # the Node harness reports over a loopback socket, as where a pipe is inherited as a handle, not an fd number
    "THEINFERENCE_NODE_CHANNEL": "socket",
}
PASSED_ON = (*SWITCHES, "THEINFERENCE_PSUTIL_PROCFS")  # what the monitors' environment carries from the grader's
MARK_ENV = "THEINFERENCE_TREE_MARK"  # what a watched tree carries in its environment (trees.Watch)


@dataclass(frozen=True)
class Plan:
    """How a monitor starts, keeps and kills its worker's tree: each chosen by what this machine offers."""

    spawn: str  # "fork": fork_held (the worker held until its pid is reported); "popen": subprocess (no fork)
    group: str  # "setsid" or "new-process-group" (Windows' CREATE_NEW_PROCESS_GROUP)
    orphans: str  # "subreaper": PR_SET_CHILD_SUBREAPER; "watch": the tree looked at while it runs (trees.Watch)
    kill: str  # "proc": the /proc scan (kill_trees); "psutil": trees.kill
    grader_death: str  # "pdeathsig": PR_SET_PDEATHSIG and end-of-file; "eof": end-of-file on the status socket only
    pipes: str  # "select": the grader waits on its pipes with select; "threads": a reader thread each (channels.py)
    node_channel: str  # "fd": the Node harness writes to the inherited pipe by its fd number; "socket": loopback


def plan(environ=None) -> Plan:
    """The mechanisms this process would use, given the switches in environ (os.environ by default)."""
    environ = os.environ if environ is None else environ

    def forced(name: str) -> bool:
        return environ.get(name) == SWITCHES[name]

    return Plan(
        spawn="popen" if forced("THEINFERENCE_SPAWN") or not hasattr(os, "fork") else "fork",
        group="setsid" if hasattr(os, "setsid") else "new-process-group",
        orphans="watch" if forced("THEINFERENCE_ORPHANS") or not _subreaper_supported() else "subreaper",
        kill="psutil" if forced("THEINFERENCE_KILL") or not _proc_readable() else "proc",
        grader_death="eof" if forced("THEINFERENCE_GRADER_DEATH") or _prctl() is None else "pdeathsig",
        pipes="threads" if forced("THEINFERENCE_PIPES") or not _select_takes_pipes() else "select",
        node_channel="socket" if forced("THEINFERENCE_NODE_CHANNEL") or _handles_only() else "fd",
    )


def bad_switches(environ) -> list[str]:
    """The switches set in environ to a value they do not accept, as `NAME=value`."""
    return [f"{name}={environ[name]}" for name, value in SWITCHES.items() if environ.get(name, value) != value]


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's prctl, where the C library has one (Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, TypeError):  # no such symbol (macOS); no C library by that name (Windows)
        return None


def _handles_only() -> bool:
    """Whether a child inherits pipes as handles to reopen, not as fd numbers (Windows: protocol.handed_on)."""
    return hasattr(os, "get_handle_inheritable")


@functools.cache
def _select_takes_pipes() -> bool:
    """Whether select can wait on a pipe (Windows' takes sockets only), tried on one."""
    import select

    read, write = os.pipe()
    try:
        select.select([read], [], [], 0)
        return True
    except (OSError, ValueError):
        return False
    finally:
        os.close(read)
        os.close(write)


@functools.cache
def _subreaper_supported() -> bool:
    """Whether this kernel has child subreapers (asked without becoming one)."""
    prctl, value = _prctl(), ctypes.c_int()
    return prctl is not None and prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) == 0


def _proc_readable() -> bool:
    """Whether /proc is Linux's procfs as the scan reads it (not hidden, not another system's)."""
    try:
        with open(f"/proc/{os.getpid()}/stat", "rb") as f:
            return f.read().startswith(str(os.getpid()).encode() + b" (")
    except OSError:
        return False


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process; False where unsupported (or forced off)."""
    prctl = _prctl()
    if prctl is None or plan().orphans != "subreaper":
        return False
    return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def die_with_parent(parent: int, signum: int | None = None) -> bool:
    """Receive signum (SIGKILL by default) when the parent (pid `parent`, read before) dies; False if it is already gone.

    Where there is no PR_SET_PDEATHSIG (or it is forced off) this is True: end-of-file on the status socket
    (guard) is then what tells the grader's death."""
    prctl = _prctl()
    if prctl is None or plan().grader_death != "pdeathsig":
        return True
    prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL if signum is None else signum), 0, 0, 0)
    return os.getppid() == parent  # it died before the prctl: no signal will come


def fork_held() -> tuple[int, Callable[[], None]]:
    """os.fork into a new session, with the child held until the parent calls the returned release.

    The monitor reports the worker's pid and only then lets it run: student code that kills its monitor
    at once must still find the grader knowing whose group to kill, and the group (the child's own session,
    made before the hold) exists by then. If the parent dies before the release, the held child exits
    without running anything.
    """
    held, hold = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(hold)
        os.setsid()  # its own group: a timeout's killpg reaches it but not its monitor
        go = os.read(held, 1)
        os.close(held)
        if go != b"1":
            os._exit(1)
        return 0, lambda: None
    os.close(held)
    return pid, functools.partial(_release, hold)


def _kill_all_and_exit(*_) -> None:
    """The grader is gone: kill every descendant, then exit, whatever the kill raised."""
    if not _killing.acquire(blocking=False):
        return  # a kill is under way (the worker's exit, or the other sign of the grader's death): its caller ends it
    try:
        _kill_descendants()
    finally:
        os._exit(1)


def guard(conn: socket.socket, parent: int) -> None:
    """Kill every descendant and exit when the grader goes: parent death (SIGTERM) or end-of-file on conn."""
    if plan().kill == "psutil":
        from theinference.proc import trees  # noqa: F401 - imported now, never inside a signal handler

    signal.signal(signal.SIGTERM, _kill_all_and_exit)
    if not die_with_parent(parent, signal.SIGTERM):
        _kill_all_and_exit()

    def watch() -> None:
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        _kill_all_and_exit()

    threading.Thread(target=watch, daemon=True).start()


def _table() -> dict[int, tuple[int, bytes]]:
    """Every process now: pid -> (its parent's pid, its state letter), from one pass over /proc."""
    table = {}
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
        if len(fields) > 1:
            table[int(entry)] = (int(fields[1]), fields[0])
    return table


def children_of(parent: int) -> list[int]:
    """The pids whose parent is `parent` (/proc scan: /proc/PID/task/*/children is optional in kernels)."""
    return [pid for pid, (ppid, _) in _table().items() if ppid == parent]


def _below(table: dict[int, tuple[int, bytes]], roots: Iterable[int]) -> set[int]:
    """The roots and all their descendants in table that have not exited (zombies are for their parent to reap)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, frontier = set(), [pid for pid in roots if pid in table]
    while frontier:
        pid = frontier.pop()
        if pid not in found:
            found.add(pid)
            frontier.extend(children.get(pid, ()))
    return {pid for pid in found if table[pid][1] not in (b"Z", b"X")}


def _signal(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def kill_trees(roots: Callable[[dict[int, tuple[int, bytes]]], Iterable[int]]) -> int:
    """SIGKILL the processes under roots(table) (roots included) and every descendant they have; how many.

    A fork bomb replaces each process killed one at a time (it forks faster than a /proc scan finds it, and a
    freed pid is one more it may take), and a tree killed layer by layer takes one scan per generation. So the
    whole tree is found in one pass, stopped (SIGSTOP: a stopped process forks no more and frees no pid), and
    looked at again until a pass finds no process of it that is not stopped yet; only then is all of it killed
    at once. A process of the tree that sent a stopped sibling SIGCONT meanwhile is found on the next round."""
    killed: set[int] = set()
    for _ in range(1000):  # each round ends with all it found killed: only a resumed process forks on
        stopped: set[int] = set()
        while True:
            table = _table()
            new = _below(table, roots(table)) - stopped - killed  # killed: dying or dead, never reused unreaped
            if not new:
                break
            _signal(new, signal.SIGSTOP)
            stopped |= new
        if not stopped:
            break
        _signal(stopped, signal.SIGKILL)
        killed |= stopped
    return len(killed)


def _any_children() -> bool:
    """Whether this process has a child (reaping one that has exited): a cheap test before a /proc scan."""
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return False
    return True


_watch: list = []  # this monitor's trees.Watch, where no subreaper keeps its orphans (watch_tree)


def watch_tree(mark: str) -> None:
    """Remember every descendant of this monitor while its worker runs (trees.Watch), and every process that carries
    mark (tree_mark): where no subreaper keeps orphans, one that re-parented away is still killed at the end.
    Started after the worker is forked: a forked worker must not inherit a thread's state."""
    from theinference.proc import trees  # psutil: only where this path is taken

    _watch.append(trees.Watch(os.getpid(), mark))


def tree_mark() -> str:
    """A mark for this monitor's worker to carry in its environment (MARK_ENV) where it watches its tree."""
    return f"{os.getpid()}-{secrets.token_hex(8)}"


# Taken by the first of the three callers of a monitor's kill, and never given back: the monitor exits after it. The
# worker's exit, the grader's death by signal and by end-of-file may each come, the signal's handler even in the middle
# of another kill on the same thread (re-entering it there once left a half-imported module and the tree alive).
_killing = threading.Lock()


def kill_descendants() -> None:
    """SIGKILL and reap every descendant of this monitor: its tree (kill_trees, or trees.kill where /proc cannot be
    read) and every process its watch saw (orphans that re-parented away where no subreaper keeps them). A kill under
    way on the guard's thread is waited for (it exits the monitor when done)."""
    _killing.acquire()
    _kill_descendants()


def _kill_descendants() -> None:
    seen = _watch[0].stop() if _watch else []
    if seen or plan().kill == "psutil":
        from theinference.proc import trees

        trees.kill(trees.children(os.getpid()), seen)
        if plan().kill == "psutil":
            _reap(lambda: trees.kill(trees.children(os.getpid())))
            return
    if not _any_children():
        return
    me = os.getpid()
    kill_trees(lambda table: [pid for pid, (ppid, _) in table.items() if ppid == me])
    while _any_children():  # reap them as they re-parent to us, killing any that slipped through
        kids = children_of(me)
        if not kids:
            return  # the only one was a zombie, reaped just now
        _signal(kids, signal.SIGKILL)
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _reap(kill_children: Callable[[], object]) -> None:
    """Reap every child, killing (kill_children) any still alive: orphans re-parent to a subreaper as they come."""
    if not hasattr(os, "WNOHANG"):
        return  # Windows: no zombies, and waitpid takes a process handle, not -1
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:  # none has exited yet: a live one came since the kill
            kill_children()
            time.sleep(0.001)


def own_group() -> dict:
    """Popen's keyword arguments that make the process the leader of its own group (a new session where there is
    setsid, else Windows' CREATE_NEW_PROCESS_GROUP)."""
    if hasattr(os, "setsid"):
        return {"start_new_session": True}
    return {"creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}


def popen_held(command: list[str]) -> tuple[subprocess.Popen, Callable[[], None]]:
    """Start command with subprocess (where there is no fork): its own group, the protocol's fds handed on, and the
    read end of a hold (protocol.GO_FD_ENV) that the worker waits on before it runs any student code, until the
    returned release. If this monitor dies first, the hold's end closes and the worker exits without running it."""
    fds = [
        protocol.inherited(os.environ[name], mode)
        for name, mode in ((protocol.PROTOCOL_FD_ENV, os.O_WRONLY), (protocol.CALLS_FD_ENV, os.O_RDONLY))
        if name in os.environ
    ]
    held, hold = os.pipe()
    try:
        env = {**os.environ, protocol.GO_FD_ENV: protocol.token(held)}
        worker = subprocess.Popen(command, env=env, **protocol.handed_on([*fds, held]), **own_group())
    finally:
        os.close(held)
    return worker, functools.partial(_release, hold)


def _release(hold: int) -> None:
    try:
        os.write(hold, b"1")
    except BrokenPipeError:
        pass  # the held worker is already dead (killed from outside): its status says so
    finally:
        os.close(hold)


def _spawn(command: list[str], conn: socket.socket) -> tuple[int, Callable[[], None], Callable[[], int]]:
    """Start the worker as plan().spawn says: (its pid, release it, wait for its Popen-style returncode).

    Either way the worker is held until release (its pid reported first): fork_held's child before it execs,
    popen_held's worker (theinference.proc.child, the Node harness) before it imports the student's code."""
    if plan().spawn == "popen":
        worker, release = popen_held(command)
        return worker.pid, release, worker.wait
    pid, release = fork_held()
    if pid == 0:
        conn.close()
        try:
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    return pid, release, lambda: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


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
    parent = os.getppid()
    subreaper = become_subreaper()
    guard(conn, parent)
    join(cgroup)
    protocol_fd = os.environ.get(protocol.PROTOCOL_FD_ENV)
    mark = tree_mark()
    if not subreaper:
        os.environ[MARK_ENV] = mark  # the worker's environment, and so its descendants'
    pid, release, wait = _spawn(command, conn)
    if not subreaper:
        watch_tree(mark)
    if protocol_fd:
        os.close(
            protocol.inherited(protocol_fd, os.O_WRONLY)
        )  # the grader sees end-of-stream when the student's side closes it
    # Before the release, so before any student code runs: the grader may trust it (the mark: what it sweeps for if
    # student code kills this monitor, where no subreaper brings the orphans back to the grader).
    _send(conn, pid=pid, **({} if subreaper else {"mark": mark}))
    release()
    status = wait()
    kill_descendants()
    _send(conn, status=status)


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
