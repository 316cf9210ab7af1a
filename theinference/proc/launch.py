"""How a student process is started: a fresh interpreter, or a fork of a pre-warmed zygote.

Both give a Popen-like handle (pid, returncode, wait(timeout)); the process is the leader of
its own process group, has stdin closed, and writes stdout/stderr to the given files. Both run
it under a monitor (theinference.proc.reaper): wait() returns only once every process the student
started that the monitor can find is dead (mechanisms() says how it finds and kills them). Each
launcher's `isolation` says how confined student processes are (theinference.proc.sandbox); the
fresh-interpreter launcher can sandbox them.
"""

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from theinference.proc import protocol, strays, tempdirs
from theinference.proc.interrupt import SIGKILL, kill_group
from theinference.proc.node import HARNESS, worker_for_job
from theinference.proc.reaper import PASSED_ON, SWITCHES, Plan, bad_switches, own_group, plan
from theinference.proc.rundir import TMPFS_SLACK
from theinference.proc.sandbox import (
    Isolation,
    Sandbox,
    basic_isolation,
    reachable_by_others,
    strongest_isolation,
    lease_uid,
    files_of,
    remove_files_of,
    kill_processes_of,
)

from theinference.trust import allowed_env
from theinference.errors import ConfigError


class StudentProcess(Protocol):
    """A started student process, as the runner sees it."""

    pid: int
    monitor_pid: int  # the subreaper the student's processes hang from (theinference.proc.reaper)
    returncode: int | None
    tmpfs_size: int | None  # a sandbox's run directory is a tmpfs of this size (pid is bwrap's); else None

    def wait(self, timeout: float | None = None) -> int: ...


class Launcher(Protocol):
    """How student processes start (SubprocessLauncher, ZygoteLauncher): one per grading run, closed at its end."""

    isolation: Isolation

    def start(
        self,
        args: list[str],
        cwd: str,
        env: dict,
        stdout,
        stderr,
        proto_fd: int,
        *,
        calls_fd: int | None = None,
        cgroup: Sequence[str] = (),
        quota: int | None = None,
    ) -> StudentProcess:
        """Start `theinference.proc.child ARGS` in cwd with env, its output to stdout/stderr, events to proto_fd.

        calls_fd: an interactive job's call requests (protocol.CALLS_FD_ENV). cgroup: the cgroup.procs files
        the monitor joins before it starts the worker (theinference.proc.accounting). quota: the bytes the run's
        directory (the job file's) may hold, which a sandbox makes a tmpfs of (theinference.proc.rundir).
        """
        ...

    def hide(self, path: Path) -> None:
        """Keep path (a results file) unreadable by student processes."""
        ...

    def warm(self) -> None:
        """Start ahead whatever later runs need (a zygote importing numpy), without waiting for it."""
        ...

    def finished(self, cwd: str) -> None:
        """A run of the course at cwd has ended and its processes are dead: clean up after its user, if it has one."""
        ...

    def close(self) -> None:
        """Stop whatever the launcher keeps running (a zygote, a sandbox's stub)."""
        ...


class ConfinementError(ConfigError):
    """Student processes cannot run confined as chosen (files unreadable by their user): a setup error."""


class ZygoteProcess:
    """A student process under a monitor; its pid, then its exit status, arrive over the connection."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.buffer = b""
        self.returncode: int | None = None
        self.tmpfs_size: int | None = None
        self.monitor_lost = False  # the monitor died without a status: nothing of this run counts
        self.started_at = time.time()
        started = self._read(time.monotonic() + 30)
        self.pid, self.monitor_pid = started["pid"], started.get("monitor", started["pid"])
        # Said before the worker runs student code, so trusted: what its tree carries where no subreaper keeps it.
        self.mark: str | None = started.get("mark") if isinstance(started.get("mark"), str) else None

    def _read(self, deadline: float) -> dict:
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.conn], [], [], remaining)[0]:
                raise subprocess.TimeoutExpired("zygote worker", remaining)
            chunk = self.conn.recv(4096)
            if not chunk:
                raise ConnectionResetError("the student process's monitor went away without a status")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
            try:
                status = self._read(deadline)["status"]
                if type(status) is not int:
                    raise ValueError(status)
                self.returncode = status
            except (ConnectionResetError, ValueError, KeyError, TypeError):
                # Student code killed its monitor (or forged its words): its group dies, the orphans it left
                # came back to the grader (theinference.proc.strays), and the run is an error.
                kill_group(self.pid)
                if self.mark is not None:  # no subreaper: what re-parented away came back to nobody (the monitor's
                    _sweep(self.mark, self.started_at)  # watch died with it); it carries the mark
                self.returncode, self.monitor_lost = -SIGKILL, True
            self.conn.close()
        return self.returncode


def _sweep(mark: str, started_at: float) -> None:
    """Kill what a lost monitor's tree left, by the mark it carries (psutil: only where there is no subreaper)."""
    from theinference.proc import trees

    # Create times (boot time plus clock ticks) may be off by a second or more, as in trees.Watch.
    trees.kill_marked(mark, started_at - 10)


class MonitoredProcess(ZygoteProcess):
    """A fresh process under `python -m theinference.proc.reaper`, which is reaped with it."""

    def __init__(self, conn: socket.socket, monitor: subprocess.Popen, tmpfs_size: int | None = None):
        self.monitor = monitor
        try:
            super().__init__(conn)
            self.monitor_pid, self.tmpfs_size = monitor.pid, tmpfs_size
        except BaseException:
            monitor.kill()
            monitor.wait()
            raise

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self.monitor.wait()
        strays.forget(self.monitor.pid)
        return code


class SubprocessLauncher:
    """A fresh `python -m theinference.proc.child` per run: slower to start, nothing shared; optionally sandboxed.

    The runner writes the job file into the run's own directory: that directory is the only
    one a sandboxed student process may write.
    """

    def __init__(self, isolation: Isolation | None = None):
        self.isolation = isolation or basic_isolation()
        self._sandbox = Sandbox(self.isolation) if self.isolation.bwrap else None
        self._uids: dict[str, int] = {}
        self._owned_before: dict[int, frozenset] = {}  # uid -> what it owned in the shared temp dirs at its lease
        self._leases: list[int] = []  # lock files that hold self._uids against other graders (sandbox.lease_uid)
        self._lock = threading.Lock()

    def _command(self, args: list[str], cwd: str, env: dict, quota: int | None) -> list[str]:
        node = worker_for_job(args[0])  # the TypeScript edition's adapters run on Node (theinference.proc.node)
        if self._sandbox is None:
            if node is not None:
                return [*self.isolation.unshare, *node.prefix, str(HARNESS), *args]
            # -P: the course directory (which the child puts on sys.path itself) cannot shadow the grader's modules.
            return [*self.isolation.unshare, sys.executable, "-P", "-m", "theinference.proc.child", *args]
        weights = env["THEINFERENCE_WEIGHTS"]
        if node is not None:
            inner = [*node.prefix, self._sandbox.node_harness, *args]
            return self._sandbox.command(inner, cwd, args[0], weights, node.readable, quota=quota)
        inner = [sys.executable, "-P", "-B", self._sandbox.child_script, *args]
        return self._sandbox.command(inner, cwd, args[0], weights, quota=quota)

    def _student_env(self, args: list[str], cwd: str, env: dict, proto_fd: int, calls_fd: int | None) -> dict:
        env = {**env, protocol.PROTOCOL_FD_ENV: protocol.token(proto_fd), "PYTHONDONTWRITEBYTECODE": "1"}
        if calls_fd is not None:
            env[protocol.CALLS_FD_ENV] = protocol.token(calls_fd)
        if self.isolation.run_as is None:
            return env
        uid = self._uid_for(cwd)
        if self._sandbox is None:
            _check_readable(cwd, env["THEINFERENCE_WEIGHTS"])
        os.chown(os.path.dirname(args[0]), uid, uid)  # its run directory (0700) is its own, and nobody else's
        return {**env, "THEINFERENCE_RUN_AS": str(uid)}

    def _uid_for(self, course_root: str) -> int:
        """The uid a submission's processes run as: nobody for the first, then an unused one below it for each other
        (a batch), each leased against every other grading on this machine (sandbox.lease_uid): one submission cannot
        signal another's processes or write into its run directory."""
        with self._lock:
            if course_root not in self._uids:
                uid, lease = lease_uid(set(self._uids.values()))
                self._uids[course_root] = uid
                self._owned_before[uid] = files_of(uid)
                self._leases.append(lease)
            return self._uids[course_root]

    def start(
        self,
        args: list[str],
        cwd: str,
        env: dict,
        stdout,
        stderr,
        proto_fd: int,
        *,
        calls_fd: int | None = None,
        cgroup: Sequence[str] = (),
        quota: int | None = None,
    ) -> MonitoredProcess:
        env = self._student_env(args, cwd, env, proto_fd, calls_fd)
        joins = [arg for path in cgroup for arg in ("--cgroup", path)]
        ours, theirs = socket.socketpair()
        strays.adopt_orphans()
        with theirs, strays.starting():
            # -P: the monitor is grader code and must not import anything from the course directory.
            monitor = subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    "-m",
                    "theinference.proc.reaper",
                    str(theirs.fileno()),
                    *joins,
                    "--",
                    *self._command(args, cwd, env, quota),
                ],
                cwd=cwd,
                env={**env, **_passed_on()},
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                **protocol.handed_on([proto_fd, *([calls_fd] if calls_fd is not None else [])], [theirs.fileno()]),
                **own_group(),
            )
            strays.register(monitor.pid)
        tmpfs = quota is not None and self._sandbox is not None and self._sandbox.tmpfs
        return MonitoredProcess(ours, monitor, quota + TMPFS_SLACK if tmpfs and quota is not None else None)

    def finished(self, cwd: str) -> None:
        """A run of the course at cwd has ended: every process of its uid is killed (in the sandbox too, where its PID
        namespace should have ended them: nothing of a submission serves the next), and outside the sandbox what it
        left in /tmp, /var/tmp and /dev/shm is removed (the places besides its run directory where it may write)."""
        with self._lock:
            uid = self._uids.get(cwd)
        if uid is None:
            return
        if self._sandbox is None:
            remove_files_of(uid, self._owned_before[uid])  # its processes killed first
        else:
            kill_processes_of(uid)

    def warm(self) -> None:
        """Nothing to start ahead: every run starts its own interpreter."""

    def hide(self, path: Path) -> None:
        """Keep a results file out of the sandbox's view (it may lie inside the course directory)."""
        if self._sandbox is not None:
            self._sandbox.hidden.append(str(path.resolve()))

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
        with self._lock:
            for lease in self._leases:
                os.close(lease)
            self._leases.clear()
            self._uids.clear()


def _check_readable(course_root: str, weights: str) -> None:
    for path in (Path(course_root), Path(weights)):
        if not reachable_by_others(path):
            raise ConfinementError(
                f"{path} is not readable by user nobody, whom student code runs as "
                "(make it and its parent directories world-readable, or install bubblewrap)"
            )


class ZygoteLauncher:
    """Forks student processes from a zygote that has numpy imported (where fork, Unix sockets and fd passing exist).

    `env` is applied to the zygote itself: settings read once when numpy loads (the BLAS
    thread count) must be in place before the fork. The zygote starts from the allow-listed
    environment only: every worker inherits its /proc/<pid>/environ, whatever env it is given.
    """

    def __init__(self, env: dict | None = None):
        self.isolation = basic_isolation()
        self._env = env or {}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._dir: str | None = None
        self._ready = False
        self._fresh: SubprocessLauncher | None = None  # for Node workers, which cannot fork from a Python zygote

    def warm(self) -> None:
        """Start the zygote now, without waiting: it imports numpy while the grader loads stages and weights."""
        with self._lock:
            if self._proc is None:
                self._spawn()

    def _spawn(self) -> None:
        self._dir = tempdirs.mkdtemp("zygote")
        path = os.path.join(self._dir, "zygote.sock")
        strays.adopt_orphans()
        with strays.starting():
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "theinference.proc.zygote", path],
                env={
                    **allowed_env(os.environ),
                    **self._env,
                    **_passed_on(),
                    "THEINFERENCE_GRADER_PID": str(os.getpid()),
                },
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            strays.register(self._proc.pid)
        self._ready = False
        atexit.register(self.close)

    def _ensure_started(self) -> str:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                if self._proc is not None:
                    strays.forget(self._proc.pid)
                self._spawn()
            assert self._proc is not None and self._dir is not None
            if not self._ready:
                if self._proc.stdout is None or self._proc.stdout.readline().strip() != b"ready":
                    raise RuntimeError("the zygote process did not start")
                self._ready = True
            return os.path.join(self._dir, "zygote.sock")

    def hide(self, path: Path) -> None:
        """Nothing to hide from: zygote workers are not sandboxed."""

    def finished(self, cwd: str) -> None:
        """Nothing to clean: zygote workers run as the grader's own user (their $TMPDIR is their run directory)."""

    def start(
        self,
        args: list[str],
        cwd: str,
        env: dict,
        stdout,
        stderr,
        proto_fd: int,
        *,
        calls_fd: int | None = None,
        cgroup: Sequence[str] = (),
        quota: int | None = None,
    ) -> ZygoteProcess:
        if worker_for_job(args[0]) is not None:  # the TypeScript edition: a fresh Node process under its monitor
            self._fresh = self._fresh or SubprocessLauncher()
            return self._fresh.start(
                args, cwd, {**env, **self._env}, stdout, stderr, proto_fd, calls_fd=calls_fd, cgroup=cgroup, quota=quota
            )
        path = self._ensure_started()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, dir_fd = tempdirs.unix_address(path)  # a deep $TMPDIR makes the path too long for AF_UNIX
        try:
            conn.connect(address)
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        request = json.dumps({"args": args, "cwd": cwd, "env": env, "cgroup": list(cgroup)}).encode() + b"\n"
        fds = [stdout.fileno(), stderr.fileno(), proto_fd, *([calls_fd] if calls_fd is not None else [])]
        socket.send_fds(conn, [request], fds)
        return ZygoteProcess(conn)

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                if not self._ready:  # it has forked no worker (it may still be importing numpy): nothing to wind down
                    self._proc.kill()
                elif self._proc.stdin is not None:
                    self._proc.stdin.close()  # the zygote exits when its stdin closes
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
                for pipe in (self._proc.stdin, self._proc.stdout):
                    if pipe is not None:
                        pipe.close()
                strays.forget(self._proc.pid)
                self._proc = None
            if self._dir:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None


def blas_env(threads: int) -> dict:
    """Environment that caps the BLAS/OpenMP threads of a student process."""
    return {name: str(threads) for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


class SwitchError(ConfigError):
    """A THEINFERENCE_ switch of the process mechanisms is set to a value it does not take: a setup error."""


def _passed_on() -> dict:
    """The trusted switches of the grader's environment that its monitors and zygote must see (reaper.PASSED_ON):
    the student's environment may be an allow-listed one without them."""
    return {name: os.environ[name] for name in PASSED_ON if name in os.environ}


def _check_switches() -> None:
    bad = bad_switches(os.environ)
    if bad:
        accepted = ", ".join(f"{name}={value}" for name, value in SWITCHES.items())
        raise SwitchError(f"{', '.join(bad)}: not a setting of the process mechanisms (each takes one: {accepted})")


def _can_fork_a_zygote() -> bool:
    """fork, Unix sockets and fd passing: what the zygote needs (and no switch saying there is no fork); and a child
    subreaper. Without one the monitor finds a re-parented orphan by the mark its run's processes carry in their
    environment (trees.Watch), which only a process started by exec shows (/proc/PID/environ, macOS's
    KERN_PROCARGS2): a worker forked from the zygote shows the zygote's, so a double fork from it would escape."""
    chosen = plan()
    unix = hasattr(socket, "AF_UNIX") and hasattr(socket, "send_fds")
    return chosen.spawn == "fork" and chosen.orphans == "subreaper" and unix


def _launcher_choice(untrusted: bool) -> str:
    if untrusted:
        return "subprocess"
    forced = os.environ.get("THEINFERENCE_LAUNCHER")
    if forced not in (None, "", "zygote", "subprocess"):
        raise SwitchError(f"THEINFERENCE_LAUNCHER={forced}: it takes zygote or subprocess")
    return forced or ("zygote" if _can_fork_a_zygote() else "subprocess")


def default_launcher(env: dict | None = None, untrusted: bool = False, allow_root: bool = False) -> Launcher:
    """For untrusted submissions, a fresh interpreter under the strongest isolation available;
    otherwise the zygote where the machine can fork one and keep its tree (fork, fd passing, a child subreaper), else
    a fresh interpreter per run.

    THEINFERENCE_LAUNCHER=subprocess (or zygote) overrides the choice for trusted runs only.
    """
    _check_switches()
    if untrusted:
        return SubprocessLauncher(strongest_isolation(allow_root))
    return ZygoteLauncher(env) if _launcher_choice(untrusted) == "zygote" else SubprocessLauncher()


def mechanisms(untrusted: bool = False) -> dict[str, str]:
    """Which mechanism this machine (and the trusted switches) picked for each job of the process model, named for
    the report's header: launcher, spawn, group, orphans, kill, grader-death, interrupt, limits, memory, hangs, pipes
    (how the grader waits on the events' pipe), node-channel (what the TypeScript worker reports on)."""
    from theinference.proc.trees import WATCH_POLL  # psutil: imported for the header, not for every run

    _check_switches()
    chosen = plan()
    zygote = _launcher_choice(untrusted) == "zygote"
    stop = "stopped, then killed" if hasattr(signal, "SIGSTOP") else "killed"
    limits = _worker_limits()
    return {
        "launcher": "zygote (forked from a pre-warmed interpreter)" if zygote else "a fresh interpreter per run",
        "spawn": "fork" if zygote or chosen.spawn == "fork" else "subprocess (no fork)",
        "group": "setsid" if chosen.group == "setsid" else "CREATE_NEW_PROCESS_GROUP",
        "orphans": _orphans(chosen, zygote, WATCH_POLL),
        "kill": f"/proc scan: {stop}" if chosen.kill == "proc" else f"psutil: {stop}",
        "grader-death": (
            "PR_SET_PDEATHSIG and end-of-file on the status socket"
            if chosen.grader_death == "pdeathsig"
            else "end-of-file on the status socket"
        ),
        "interrupt": "killpg" if hasattr(os, "killpg") else "psutil: the tree killed",
        "limits": "setrlimit: address space, file size" if limits else "none in the worker (no resource module)",
        # The run's cgroup holds the tree to its memory limit where the grader can make one with a memory controller
        # (accounting.Cgroup, decided per run); else the runner's watch does (accounting.TreeMemory).
        "memory": (
            "the worker's address-space limit, and the run's cgroup or else the grader's watch over the tree"
            if limits
            else "the run's cgroup or else the grader's watch over the tree"
        ),
        "hangs": "the grader's timeouts (the tree killed)",
        "pipes": "select" if chosen.pipes == "select" else "a reader thread per pipe (select takes sockets only)",
        "node-channel": (
            "the inherited pipe, by its fd number"
            if chosen.node_channel == "fd"
            else "a loopback socket (the pipe is inherited as a handle, not an fd number), where the worker shares "
            "the grader's network (else, in a network of its own, the pipe by its fd number)"
        ),
    }


def _orphans(chosen: Plan, zygote: bool, poll: float) -> str:
    if chosen.orphans == "subreaper":
        return "PR_SET_CHILD_SUBREAPER"
    watch = f"the monitor's watch over its tree (psutil, every {poll:g} s)"
    if zygote:  # forked workers show the zygote's environment, not their run's mark (_can_fork_a_zygote)
        return f"{watch}, and the run's mark in the environment of the processes it executes"
    return f"{watch}, and the run's mark in its processes' environment"


def _worker_limits() -> bool:
    """Whether the worker (this same Python) can set its own limits (the resource module)."""
    try:
        import resource  # noqa: F401
    except ImportError:
        return False
    return True
