"""Run a student's adapter in a separate process, one call per case, under a timeout.

Student code never runs in the grader's process: a hang, a crash, a `sys.exit` or a segfault
is recorded as that case's outcome and the next case runs in a fresh process. Everything the
student's process sends on the result pipe is untrusted input: a message out of protocol is
that submission's error, and only the grader's own clock sets deadlines.
"""

import dataclasses
import json
import math
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from theinference.proc import accounting, channels, interrupt, protocol, strays, tempdirs
from theinference.proc.launch import Launcher, SubprocessLauncher
from theinference.proc.node import is_node_adapters
from theinference.proc.reaper import plan
from theinference.proc.limits import DEFAULT_MEMORY_MB, Limits  # noqa: F401 - DEFAULT_MEMORY_MB: its old home
from theinference.proc.rundir import QUOTA_POLL, QuotaExceeded, RunDir
from theinference.errors import ConfigError
from theinference.sizes import size_text
from theinference.trust import allowed_env

OUTPUT_CAP = 30_000  # bytes of the student's stdout/stderr kept per process
FILE_CAP = 1 << 30  # bytes any one file the student's process writes may reach (its output included; and the quota)
MESSAGE_CAP = 1 << 20  # bytes of one protocol message
# Seconds between two sums of the memory the tree holds (where no cgroup caps it): a look costs a pass over /proc.
MEMORY_POLL = 0.1
# What ends a run as that submission's error, in its own words: its run directory's quota, its memory together.
OVER_LIMIT = (QuotaExceeded, accounting.MemoryExceeded)


class ProtocolError(Exception):
    """The student's process sent the grader something theinference.proc.child never sends: that submission's error."""


@dataclass(frozen=True)
class AdapterJob:
    course_root: Path
    adapters: Path
    names: tuple[str, ...]  # the function's name, then its accepted aliases
    calls: tuple[tuple, ...]  # the arguments of each call
    weights: Path
    timeout: float  # seconds per call (and for importing the adapters), by the run's rule (spec.timeouts)
    limits: Limits = field(default_factory=Limits)
    untrusted: bool = False  # the student's process gets only the allow-listed environment (theinference.trust)
    launcher: Launcher = field(default_factory=SubprocessLauncher)
    # The bytes call i's returned array may hold (larger: "too-large", not read), from its expected shape.
    output_caps: tuple[int, ...] = ()
    all_cases: bool = False  # run every case even after one timed out (default: skip the stage's rest)
    case_names: tuple[str, ...] = ()  # for messages; indices where empty
    deadline: float | None = None  # time.monotonic() past which nothing more runs (the submission's budget)
    deadline_budget: float | None = None  # the seconds that deadline allowed, for messages
    # Case i's CPU budget (an inner bound inside timeout, from the case's work: grading.spec.timeouts), asked for
    # only once a case has used cpu_floor seconds of CPU (it may compute the oracle's output to time it). None: the
    # timeout alone bounds a case (the instructor's --timeout).
    case_cpu: "Callable[[int], CaseCpu | None] | None" = None
    cpu_floor: float = math.inf


class CaseCpu(Protocol):
    """What AdapterJob.case_cpu gives (grading.spec.timeouts.CpuBudget): a case's CPU budget, and the timeout's
    message for a run that used it without answering."""

    @property
    def seconds(self) -> float: ...

    def message(self, used: float) -> str: ...


@dataclass(frozen=True)
class CaseStarted:
    """The student's process began case `index` (live progress: display only, never used to decide anything)."""

    index: int


@dataclass(frozen=True)
class CaseDone:
    """Case `index` ended with this outcome. Its array (outcome.value) is dropped once the consumer has taken the
    event, so a stage's outputs are never all in memory at once. A later CaseDone for the same index replaces it
    (a run whose process broke a limit afterwards, or killed its monitor: nothing of it counts)."""

    index: int
    outcome: "CallOutcome"


@dataclass(frozen=True)
class RunEnded:
    """Every case's final outcome, in order: the last event."""

    outcomes: list["CallOutcome"]


RunnerEvent = CaseStarted | CaseDone | RunEnded


@dataclass(frozen=True)
class StepTime:
    """One step (importing the adapters, or one case) as the grader measured it, from outside the student's
    processes: the time charged against its timeout, and what makes it up (wall-clock time less run-queue wait)."""

    charged: float  # wall less waited, at least cpu over the cores (StepClock.charge): checked against the timeout
    timeout: float
    cpu: float  # CPU seconds the whole process tree used (the kernel's count)
    waited: float  # seconds the tree's threads spent runnable, waiting for a CPU (the machine's load)
    wall: float


@dataclass
class CallOutcome:
    # protocol.DONE_STATUSES, or TOO_LARGE | TIMEOUT | CRASH (the runner's own conclusions)
    status: str
    value: np.ndarray | None = None
    message: str = ""
    traceback: str = ""
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    cpu_seconds: float | None = None  # interactive calls: the kernel's count for the whole process tree
    # A call cut short: "cpu" (its CPU budget), "wall" (the backstop: machine-busy), "time" (an interactive call's
    # timeout without the CPU for it: it waited)
    limit: str | None = None
    defined_at: tuple[str, int] | None = None  # the adapter function's file and first line, as the child found it
    clock: StepTime | None = None  # the case's step as the grader timed it (None: it never ran)
    loading: StepTime | None = None  # the import before it, on the first case its process ran


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _create(path: Path) -> tuple[int, tuple[int, int]]:
    """A new file at path -> (fd, its identity), never through a link the student's process left there.

    The run's directory is writable by the student's processes (under the sandbox it is the only
    writable place), so a name the grader reuses may meanwhile be a symlink to any file.
    """
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    info = os.fstat(fd)
    return fd, (info.st_dev, info.st_ino)


def _read_capped(path: Path, identity: tuple[int, int], start: int = 0, end: int | None = None) -> str:
    """The student's output between two offsets of a capture file, at most OUTPUT_CAP bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError:
        return "[output unavailable: the capture file was removed]"
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if (info.st_dev, info.st_ino) != identity:  # replaced by the student's process: not ours to read
            return "[output unavailable: the capture file was replaced]"
        f.seek(start)
        limit = OUTPUT_CAP + 1 if end is None else min(OUTPUT_CAP + 1, end - start)
        data = f.read(max(limit, 0))
    text = data[:OUTPUT_CAP].decode("utf-8", errors="replace")
    if len(data) > OUTPUT_CAP:
        text += f"\n[... output truncated after {OUTPUT_CAP // 1000} KB]"
    return text


def _kill_group(proc) -> None:
    interrupt.kill_group(proc.pid)
    proc.wait()


def _exit_message(returncode: int) -> str:
    if returncode == -signal.SIGXFSZ:
        return f"the adapter's process was killed for writing a file over {FILE_CAP >> 20} MB (SIGXFSZ)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the adapter's process was killed by {name}"
    return f"the adapter's process exited with code {returncode} before returning a result"


def _node_socket(job: AdapterJob) -> bool:
    """Whether this job's worker reports over a loopback socket: a Node worker where pipes are inherited as handles
    (or THEINFERENCE_NODE_CHANNEL=socket), started with the grader's own network (a sandbox's is its own: there the
    pipe's fd number is inherited, as on every Linux)."""
    isolation = job.launcher.isolation
    own_network = isolation.bwrap is not None or bool(isolation.unshare)
    return plan().node_channel == "socket" and is_node_adapters(job.adapters) and not own_network


def _open_socket() -> channels.NodeSocket:
    try:
        return channels.NodeSocket()
    except OSError as e:
        raise ConfigError(
            f"could not open a loopback socket (127.0.0.1) for the TypeScript worker to report over: {e}"
        ) from None


class _Child:
    """One child process and the pipe it reports on."""

    def __init__(self, job: AdapterJob, start: int, work: Path, interactive: bool = False):
        job_file = work / f"job-{start}.json"
        with os.fdopen(_create(job_file)[0], "w") as f:
            f.write(
                json.dumps(
                    protocol.Job(
                        course_root=str(job.course_root),
                        adapters=str(job.adapters),
                        names=list(job.names),
                        calls=[] if interactive else [list(c) for c in job.calls],
                        start=start,
                        out_dir=str(work),
                        interactive=interactive,
                        limits=job.limits.for_worker(FILE_CAP, job.launcher.isolation.shares_grader_uid),
                    )
                )
            )
        # Which meters count this run (MeterUnavailable for a forced one that cannot work, before anything starts).
        self.tree_kind = accounting.tree_kind(accounting.forced_meter())
        # A Node worker that cannot take the pipe by its fd number reports over a loopback socket (channels.NodeSocket):
        # opened before anything else, so that a socket that cannot be opened leaves nothing open behind it.
        self.socket = _open_socket() if _node_socket(job) else None
        self.cgroup = accounting.run_cgroup(job.limits.tree())
        read_fd, write_fd = os.pipe()
        base = allowed_env(os.environ) if job.untrusted else dict(os.environ)
        # Temporary files go to the run's directory, which the quota covers (and, sandboxed, the one writable place).
        env = {**base, **job.limits.env, "THEINFERENCE_WEIGHTS": str(job.weights), "TMPDIR": str(work)}
        if interactive:  # timed: one BLAS thread, as the oracle's cost is measured (theinference.grading.judge.scaling)
            env.update({name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")})
        self.stdout_path, self.stderr_path = work / f"stdout-{start}.txt", work / f"stderr-{start}.txt"
        (out_fd, self.stdout_id), (err_fd, self.stderr_id) = _create(self.stdout_path), _create(self.stderr_path)
        if self.socket is not None:
            env.update(self.socket.env)
        calls_read: int | None = None
        self.calls: int | None = None
        if interactive and self.socket is None:  # else the calls go over the socket
            calls_read, self.calls = os.pipe()
        self.run_dir: RunDir | None = None
        self.over_quota: str | None = None  # the final measurement's verdict, once finished
        try:
            with os.fdopen(out_fd, "wb") as out, os.fdopen(err_fd, "wb") as err:
                self.proc = job.launcher.start(
                    [str(job_file)],
                    str(job.course_root),
                    env,
                    out,
                    err,
                    write_fd,
                    calls_fd=calls_read,
                    cgroup=self.cgroup.procs_files if self.cgroup else (),
                    quota=job.limits.run_dir_bytes,
                )
        except BaseException:  # e.g. a setup error (no TypeScript runner): the event pipe's read end goes too
            os.close(read_fd)
            if self.socket is not None:
                self.socket.close()
            self._release()
            raise
        finally:
            os.close(write_fd)
            if calls_read is not None:
                os.close(calls_read)
        self.channel: channels.Channel = channels.pipe_reader(read_fd)
        if self.socket is not None:  # the pipe only says when the worker is gone
            self.socket.alive, self.channel = self.channel, self.socket
        self.buffer = b""
        tmpfs = getattr(self.proc, "tmpfs_size", None)
        self.run_dir = RunDir(work, job.limits.run_dir_bytes, (self.proc.pid, tmpfs) if tmpfs else None)
        self.memory = self._memory_watch(job.limits.tree().memory_bytes)
        self._memory_measured = 0.0
        try:
            interrupt.track(self.proc.pid)  # so that Ctrl-C or SIGTERM kills it from any thread
        except interrupt.Cancelled:
            self.finish(graceful=False)
            raise

    def _memory_watch(self, limit: int | None) -> "accounting.TreeMemory | None":
        """The grader's watch over what the tree holds together, where a limit is set and no cgroup enforces it."""
        if limit is None or (self.cgroup is not None and self.cgroup.caps_memory):
            return None
        try:
            return accounting.TreeMemory(self.proc.monitor_pid, limit, self.tree_kind)
        except (accounting.MonitorGone, accounting.MeterUnavailable, AttributeError):
            return None  # the monitor is gone already (the run ends without a result), or nothing reads the tree

    def next_message(self, deadline: float) -> dict | None:
        """The next message, None at end of stream; TimeoutError past the deadline, ProtocolError if malformed,
        QuotaExceeded once the run's directory holds more than its quota, MemoryExceeded once the tree holds more
        memory than its limit."""
        while b"\n" not in self.buffer:
            self.check_limits()
            if len(self.buffer) > MESSAGE_CAP:
                raise ProtocolError(f"a message longer than {MESSAGE_CAP >> 20} MB")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            chunk = self.channel.read(min(remaining, QUOTA_POLL))
            if chunk is None:
                continue  # the run's directory is measured again meanwhile
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise ProtocolError(f"a line that is not JSON: {line[:80]!r}") from None
        if not isinstance(message, dict) or message.get("event") not in protocol.EVENTS:
            raise ProtocolError(f"a message that is not one of the protocol's: {line[:80]!r}")
        return message

    def check_limits(self, now: bool = False) -> None:
        """check_quota, then MemoryExceeded if the tree holds more memory than its limit (where the grader watches
        it: measured at most every MEMORY_POLL seconds, unless now)."""
        self.check_quota(now)
        if self.memory is not None and (now or time.monotonic() - self._memory_measured >= MEMORY_POLL):
            self._memory_measured = time.monotonic()
            self.memory.check()

    def check_quota(self, now: bool = False) -> None:
        """QuotaExceeded if the run's directory holds more than its quota (measured at most so often, unless now)."""
        if self.run_dir is not None:
            self.run_dir.check(now)

    def finish(self, graceful: bool = True) -> int:
        """Kill what is left of the process group; return the child's exit code. The run's directory is measured
        once more (over_quota): what was written since the last look counts too.

        graceful: the child has reported everything and should exit by itself; give it a moment.
        """
        self.channel.close()
        try:
            self.proc.wait(timeout=2 if graceful else 0)
        except subprocess.TimeoutExpired:
            pass
        returncode = self.proc.returncode
        _kill_group(self.proc)  # also reaps grandchildren the student left running
        interrupt.untrack(self.proc.pid)
        try:
            self.check_quota(now=True)
        except QuotaExceeded as e:
            self.over_quota = str(e)
        self._release()
        return returncode if returncode is not None else -signal.SIGKILL

    def _release(self) -> None:
        """Close the calls pipe; kill what is left in the run's cgroup and remove it; let go of its run directory."""
        if self.run_dir is not None:
            self.run_dir.close()
        if self.calls is not None:
            try:
                os.close(self.calls)
            except OSError:
                pass
            self.calls = None
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None

    def meter(self) -> "accounting.Meter":
        """What counts this process tree's CPU from outside it: its cgroup, else its monitor's descendants through
        /proc where it shows processes, else through psutil (accounting.tree_kind)."""
        if self.cgroup is not None:
            return self.cgroup
        return accounting.tree_meter(self.proc.monitor_pid, self.tree_kind)

    def send_call(self, index: int, args: list) -> None:
        """Interactive jobs: hand the worker one call's arguments (it is waiting for them)."""
        line = json.dumps({"case": index, "args": args}).encode() + b"\n"
        if self.socket is not None:
            self.socket.write(line)
            return
        assert self.calls is not None, "only interactive children read calls"
        os.write(self.calls, line)

    def attach_output(self, outcome: CallOutcome, start: list[int], end: list[int] | None) -> None:
        """Give the outcome the student's stdout/stderr written between two offset pairs (None: to the end)."""
        outcome.stdout = _read_capped(self.stdout_path, self.stdout_id, start[0], end[0] if end else None)
        outcome.stderr = _read_capped(self.stderr_path, self.stderr_id, start[1], end[1] if end else None)


def _text(message: dict, key: str) -> str:
    value = message.get(key, "")
    if not isinstance(value, str):
        raise ProtocolError(f"'{key}' of a {message['event']!r} message is not text")
    return value[:OUTPUT_CAP]


def _offsets(message: dict) -> list[int]:
    """The stdout/stderr offsets a message carries, checked to lie within what a file can hold."""
    value = message.get("output")
    if not (isinstance(value, list) and len(value) == 2 and all(type(v) is int and 0 <= v <= FILE_CAP for v in value)):
        raise ProtocolError(f"'output' of a {message['event']!r} message is not a pair of file offsets")
    return value


def _read_header(f, name: str) -> tuple[tuple, np.dtype]:
    """Shape and dtype from a .npy header, without reading the data."""
    try:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}[version]
        shape, _, dtype = read(f)
    except (OSError, ValueError, EOFError, KeyError) as e:
        raise ProtocolError(f"{name} is not a .npy array ({type(e).__name__}: {e})") from None
    if dtype.kind not in "biuf":
        raise ProtocolError(f"{name} does not hold an array of numbers")
    return shape, dtype


def _load_output(file, index: int, run_dir: RunDir, cap: int | None) -> np.ndarray | CallOutcome:
    """The array the child saved for case `index` (only that file in the run's directory, a regular .npy
    file), read only if its header says it fits `cap` bytes: otherwise a "too-large" outcome. The file is
    removed once read."""
    expected = run_dir.path / f"case-{index}.npy"
    if file != str(expected):
        raise ProtocolError(f"the output file {str(file)[:200]!r} is not {expected.name} in the run's directory")
    try:
        fd = run_dir.open_output(expected.name)
    except OSError as e:
        raise ProtocolError(f"cannot open {expected.name}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > FILE_CAP:
                raise ProtocolError(f"{expected.name} is not a regular file of at most {FILE_CAP >> 20} MB")
            shape, dtype = _read_header(f, expected.name)
            nbytes = math.prod(shape) * dtype.itemsize
            if cap is not None and nbytes > cap:
                return CallOutcome(
                    status=protocol.TOO_LARGE, message=f"returned {size_text(nbytes)} (shape {list(shape)}, {dtype})"
                )
            if f.tell() + nbytes > info.st_size:
                raise ProtocolError(f"{expected.name} is shorter than its header says")
            f.seek(0)
            try:
                return np.load(f, allow_pickle=False)
            except (OSError, ValueError, EOFError) as e:
                raise ProtocolError(f"{expected.name} is not a .npy array ({type(e).__name__}: {e})") from None
    finally:
        run_dir.remove_output(expected.name)


def _outcome_from_done(message: dict, index: int, run_dir: RunDir, cap: int | None) -> CallOutcome:
    status, seconds = message.get("status"), message.get("seconds", 0.0)
    if status not in protocol.DONE_STATUSES:
        raise ProtocolError(f"unknown status {str(status)[:80]!r} for case {index}")
    if type(seconds) not in (int, float) or not math.isfinite(seconds) or seconds < 0:
        raise ProtocolError(f"'seconds' of case {index} is not a duration")
    outcome = CallOutcome(
        status=status,
        message=_text(message, "message"),
        traceback=_text(message, "traceback"),
        seconds=float(seconds),
    )
    if status == protocol.OK:
        value = _load_output(message.get("file"), index, run_dir, cap)
        if isinstance(value, CallOutcome):
            return dataclasses.replace(value, seconds=float(seconds))
        outcome.value = value
    return outcome


def _defined_at(message: dict) -> tuple[str, int] | None:
    """The file and line a 'loaded' message says the adapter function starts at, checked for form."""
    value = message.get("defined_at")
    if value is None:
        return None
    if not (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and len(value[0]) <= 4096
        and type(value[1]) is int
        and value[1] >= 0
    ):
        raise ProtocolError("'defined_at' of the 'loaded' message is not a file and a line")
    return value[0], value[1]


def _is_case(message: dict, index: int) -> bool:
    return type(message.get("case")) is int and message["case"] == index


def _unexpected(message: dict, current: int, n_calls: int) -> str:
    case = message.get("case")
    if "case" in message and not (type(case) is int and 0 <= case < n_calls):
        return f"a {message['event']!r} message for case {str(case)[:40]}, out of range (the stage has {n_calls} cases)"
    return (
        f"an unexpected {message['event']!r} message"
        + (f" for case {case}" if "case" in message else "")
        + f" (case {current} was due)"
    )


@dataclass
class _Progress:
    """Where one child stands in the protocol, as the grader has seen it."""

    current: int
    defined_at: tuple[str, int] | None = None
    loaded: bool = False
    loading: StepTime | None = None  # the import's time, until the first case's outcome carries it
    started: bool = False
    case_output: list[int] = field(default_factory=lambda: [0, 0])
    events: list[RunnerEvent] = field(default_factory=list)  # seen, not yet handed to the consumer


def _drain(events: list[RunnerEvent]) -> Iterator[RunnerEvent]:
    """Hand the consumer what was seen; a case's array is dropped once its event has been taken."""
    while events:
        event = events.pop(0)
        yield event
        if isinstance(event, CaseDone):
            event.outcome.value = None


def _handle(
    message: dict,
    state: _Progress,
    child: "_Child",
    job: AdapterJob,
    outcomes: dict[int, CallOutcome],
    clock: "StepClock",
) -> CallOutcome | None:
    """Apply one message in the order the protocol allows; return a load failure, raise ProtocolError otherwise."""
    event = message["event"]
    if event == protocol.LOAD_ERROR and not state.loaded:
        return CallOutcome(
            status=protocol.ERROR, message=_text(message, "message"), traceback=_text(message, "traceback")
        )
    if event == protocol.LOADED and not state.loaded:
        state.loaded, state.defined_at, state.loading = True, _defined_at(message), clock.reading()
    elif event == protocol.START and state.loaded and not state.started and _is_case(message, state.current):
        state.started, state.case_output = True, _offsets(message)
        state.events.append(CaseStarted(state.current))
    elif event == protocol.DONE and state.started and _is_case(message, state.current):
        child.check_limits(now=True)  # a case that ends past a limit (its writes refused, say) is the limit's
        assert child.run_dir is not None, "a started child has a run directory"
        cap = job.output_caps[state.current] if job.output_caps else None
        outcome = _outcome_from_done(message, state.current, child.run_dir, cap)
        child.attach_output(outcome, state.case_output, _offsets(message))
        outcome.defined_at, outcome.clock, outcome.loading = state.defined_at, clock.reading(), state.loading
        state.loading = None  # the import is shown once, on the first case after it
        outcomes[state.current] = outcome
        state.events.append(CaseDone(state.current, outcome))
        state.current, state.started = state.current + 1, False
    else:
        raise ProtocolError(_unexpected(message, state.current, len(job.calls)))
    return None


_POLL = 0.1  # seconds between looks at a step's clock while the student's code runs
BACKSTOP = 4.0  # a step's wall-clock backstop: this many times its timeout, plus BACKSTOP_SLACK seconds
BACKSTOP_SLACK = 10.0


class _Starved(Exception):
    """A step met its wall-clock backstop: the machine gave the student's processes too little CPU."""


class _OverCpu(Exception):
    """A case used its CPU budget without answering: the student's timeout (the message says by how much)."""


@dataclass
class _CpuWatch:
    """The running case's CPU against its budget (AdapterJob.case_cpu), each case's budget asked for once."""

    job: AdapterJob
    budgets: dict[int, "CaseCpu | None"] = field(default_factory=dict)

    def budget(self, index: int) -> "CaseCpu | None":
        if self.job.case_cpu is None:
            return None
        if index not in self.budgets:
            self.budgets[index] = self.job.case_cpu(index)
        return self.budgets[index]

    def check(self, state: "_Progress", used: float) -> None:
        """_OverCpu if the case running now has used (used: CPU seconds of its step) its CPU budget; the import
        step has only its timeout."""
        if self.job.case_cpu is None or not state.loaded or used < self.job.cpu_floor:
            return
        budget = self.budget(state.current)
        if budget is not None and used >= budget.seconds:
            raise _OverCpu(budget.message(used))


_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def charge(wall: float, waited: float, cpu: float) -> float:
    """A step's charged seconds: wall-clock time less the tree's run-queue wait, but never less than its CPU spread
    over every core. The wait is summed over threads, so runnable threads of the student's own (BLAS's, or spinners
    forked to wait for a CPU) would otherwise sum it past the wall clock and stretch a timeout to its backstop; the
    CPU they use is what the code would have taken on a quiet machine at the least."""
    return max(wall - waited, cpu / _CORES)


class StepClock:
    """A step's time as the student is charged for it: wall-clock time less the time the student's processes
    spent runnable but waiting for a CPU (the kernel's run-queue delay, theinference.proc.accounting), so a
    busy machine does not eat the budget while sleeping or blocking does; never less than the CPU used over the
    cores (charge). Where the wait cannot be read (the psutil meter: no /proc), the whole wall-clock time is
    charged (knows_wait is False), so a busy machine can time a step out. A wall-clock backstop of BACKSTOP
    times the timeout still ends a step that a starved machine cannot finish, and says so."""

    def __init__(self, child: "_Child", timeout: float):
        self.timeout, self.before = timeout, 0.0  # before: the charged time of this child's earlier steps
        try:
            kind = getattr(child, "tree_kind", None)
            self.tree: accounting.ProcTree | accounting.PsutilTree | None = accounting.tree_meter(
                child.proc.monitor_pid, kind
            )
        except (accounting.MonitorGone, accounting.MeterUnavailable, AttributeError):
            self.tree = None  # no monitor (gone, or a launcher without one), or nothing reads it: wall-clock time
        # Where the tree's run-queue wait cannot be read (psutil), a step is charged its wall-clock time.
        self.knows_wait = isinstance(self.tree, accounting.ProcTree)
        self._begin()

    def _sample(self) -> tuple[float, float]:
        """(CPU, run-queue wait) of the tree so far, from one look; the last good look once the tree is gone."""
        if self.tree is not None:
            try:
                self.last = self.tree.sample()
            except (accounting.MonitorGone, OSError):
                pass
        return self.last

    def _begin(self) -> None:
        """Start timing a step from now."""
        self.last = (0.0, 0.0)
        self.wall = time.monotonic()
        self.cpu_before, self.waited = self._sample()
        self.backstop = self.wall + BACKSTOP * self.timeout + BACKSTOP_SLACK

    def restart(self) -> None:
        """The next step: the one that ends now is added to the earlier steps' charged time."""
        self.before += self.charged()
        self._begin()

    def charged(self) -> float:
        return self.reading().charged

    def reading(self) -> StepTime:
        """The step so far, as the student is charged for it and what makes that up."""
        (cpu, waiting), wall = self._sample(), time.monotonic() - self.wall
        cpu, waited = cpu - self.cpu_before, waiting - self.waited
        return StepTime(charge(wall, waited, cpu), self.timeout, max(0.0, cpu), waited, wall)

    def total(self) -> float:
        """The charged time of every step of this child so far."""
        return self.before + self.charged()

    def cpu(self) -> float:
        """CPU seconds the tree has used (for the backstop's message)."""
        return self._sample()[0]

    def wall_note(self) -> str:
        """What a timeout's message adds where the charged time is the wall clock's (the wait is not known)."""
        if self.knows_wait or self.tree is None:
            return ""
        return " (wall-clock time: this machine's wait for a CPU cannot be read here, so a busy machine counts too)"


@dataclass
class _StageBudget:
    """The stage's budget, charged as its steps are (StepClock), so restarts after crashes cannot stretch it."""

    limit: float
    spent: float = 0.0  # charged time of the children that have ended

    def over(self, clock: StepClock | None = None) -> bool:
        return self.spent + (clock.total() if clock is not None else 0.0) >= self.limit


def starved_message(clock: StepClock) -> str:
    return (
        f"the machine was too busy: after {time.monotonic() - clock.wall:.0f} s of wall-clock time the adapter's "
        f"processes had had {clock.cpu():.2g} s of CPU in all; re-run when it is quieter (not a verdict on the code)"
    )


def _backstop_outcome(clock: StepClock, budget: "CaseCpu | None" = None) -> CallOutcome:
    """A step at its wall-clock backstop: too busy a machine, unless the step had used its timeout (or the case's
    CPU budget) in CPU.

    Run-queue wait is summed over the tree's threads, so several runnable threads (BLAS's, the student's) can
    hide a step's own time from its charged clock on a loaded machine; the CPU they used still says it is slow."""
    used = clock.reading().cpu
    if budget is not None and used >= budget.seconds:
        return CallOutcome(status=protocol.TIMEOUT, message=budget.message(used))
    if used >= clock.timeout:
        message = f"timed out after {clock.timeout:g} s while running (it had used {used:.3g} s of CPU)"
        return CallOutcome(status=protocol.TIMEOUT, message=message)
    return CallOutcome(status=protocol.TIMEOUT, message=starved_message(clock), limit="wall")


def _next_message(
    child: _Child, clock: StepClock, stage: tuple[float, _StageBudget], cpu: tuple[_CpuWatch, _Progress]
) -> dict | None:
    """The child's next message; TimeoutError once the step's charged time passes its timeout (or the stage's
    budget runs out, charged or at its wall-clock deadline), _OverCpu once the case has used its CPU budget,
    _Starved at the step's wall-clock backstop."""
    stage_deadline, budget = stage
    while True:
        try:
            return child.next_message(min(time.monotonic() + _POLL, stage_deadline, clock.backstop))
        except TimeoutError:
            reading = clock.reading()  # one look at the tree for both of the step's clocks
            cpu[0].check(cpu[1], reading.cpu)
            now = time.monotonic()
            if now >= stage_deadline or reading.charged >= clock.timeout or budget.over(clock):
                raise
            if now >= clock.backstop:
                raise _Starved from None


def _run_child(
    job: AdapterJob, start: int, work: Path, outcomes: dict[int, CallOutcome], stage: tuple[float, _StageBudget]
) -> Generator[RunnerEvent, None, int]:
    """Run one child from case `start`; fill outcomes, yield what happened; return the next case still to run.

    Deadlines are the grader's: the import and each case get job.timeout (charged as StepClock says) from
    when the grader saw the previous step end, and nothing the child sends moves the stage's deadline.
    """
    child = _Child(job, start, work)
    state, failure, kill_now = _Progress(current=start), None, False
    clock, watch = StepClock(child, job.timeout), _CpuWatch(job)
    try:
        while state.current < len(job.calls) and failure is None:
            message = _next_message(child, clock, stage, (watch, state))
            if message is None:
                break
            step = (state.loaded, state.current)
            failure = _handle(message, state, child, job, outcomes, clock)
            yield from _drain(state.events)  # judged before the next step's clock starts, as it always was
            if (state.loaded, state.current) != step:  # the import or a case finished: the next one gets its budget
                clock.restart()
    except TimeoutError:
        failure, kill_now = (
            CallOutcome(status=protocol.TIMEOUT, message=_timeout_message(job, state.loaded, stage, clock)),
            True,
        )
    except _OverCpu as e:
        failure, kill_now = CallOutcome(status=protocol.TIMEOUT, message=str(e), limit="cpu"), True
    except _Starved:
        failure, kill_now = _backstop_outcome(clock, watch.budget(state.current) if state.loaded else None), True
    except ProtocolError as e:
        failure, kill_now = (
            CallOutcome(status=protocol.ERROR, message=f"the adapter's process broke the result protocol: {e}"),
            True,
        )
    except OVER_LIMIT as e:
        failure, kill_now = CallOutcome(status=protocol.ERROR, message=str(e)), True
    except BaseException:  # Ctrl-C in watch mode, a grader bug: never leave the student's process running
        child.finish(graceful=False)
        raise
    ended = clock.reading()  # the step that was running when the child ended (read while its processes live)
    returncode = child.finish(graceful=not kill_now)
    stage[1].spent += clock.total()
    if getattr(child.proc, "monitor_lost", False):
        return (yield from _monitor_lost(job, start, outcomes))
    if failure is None and child.over_quota is not None:  # written past the quota since the last look
        failure, state.current = (
            CallOutcome(status=protocol.ERROR, message=child.over_quota),
            min(state.current, len(job.calls) - 1),
        )
        if state.current in outcomes:  # replaces what that case may have passed with
            yield CaseDone(state.current, failure)
    if state.current >= len(job.calls) and failure is None:
        return state.current
    if failure is None:
        failure = CallOutcome(status=protocol.CRASH, message=_exit_message(returncode))
    failure.clock, failure.loading = (ended, state.loading) if state.loaded else (None, ended)
    child.attach_output(failure, state.case_output, None)
    # A failure before any case started (import, load) would repeat for every case: record it for all.
    last = state.current + 1 if state.loaded else len(job.calls)
    for index in range(state.current, last):
        outcomes[index] = failure
    return last


MONITOR_LOST = "the adapter's process killed its monitor (the process that confines it): nothing of this run counts"


def _monitor_lost(job: AdapterJob, start: int, outcomes: dict[int, CallOutcome]) -> Generator[RunnerEvent, None, int]:
    """The student's process killed its monitor: kill what it left, and no case of this run counts."""
    strays.kill_strays()
    lost = CallOutcome(status=protocol.ERROR, message=MONITOR_LOST)
    for index in range(start, len(job.calls)):
        outcomes[index] = lost
        yield CaseDone(index, lost)  # replaces what an earlier case of this run may have passed with
    return len(job.calls)


def _spent_message(job: AdapterJob) -> str:
    if job.deadline is not None and time.monotonic() >= job.deadline:
        return f"timed out: the submission's time budget of {job.deadline_budget or 0:g} s ran out"
    return f"timed out: the stage's time budget of {_stage_budget(job):g} s ran out"


def _timeout_message(job: AdapterJob, loaded: bool, stage: tuple[float, _StageBudget], clock: StepClock) -> str:
    if time.monotonic() >= stage[0] or stage[1].over(clock):
        return _spent_message(job)
    return f"timed out after {job.timeout:g} s while {'running' if loaded else 'importing the adapters'}{clock.wall_note()}"


def _stage_budget(job: AdapterJob) -> float:
    """Seconds the whole stage may be charged (as StepClock charges a step): a timeout per case, one more for importing."""
    return job.timeout * (len(job.calls) + 1)


def _stage_backstop(job: AdapterJob) -> float:
    """Wall-clock seconds the whole stage may take however busy the machine: a step's backstop per step."""
    return (BACKSTOP * job.timeout + BACKSTOP_SLACK) * (len(job.calls) + 1)


LEFTOVERS: list[str] = []  # run directories that could not be removed, for the grader to report


def remove_run_dir(path: str) -> None:
    """Remove a run's directory; never raises: what cannot be removed is recorded in LEFTOVERS."""
    for _ in range(3):  # a process still writing into it (another submission's, at a weak level) may race us
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
    LEFTOVERS.append(path)


def run_adapter(job: AdapterJob) -> Iterator[RunnerEvent]:
    """Call the adapter once per entry of job.calls, each in a child process; never raises for student faults.

    Yields typed events as the grader sees them (CaseStarted, CaseDone), then RunEnded with every outcome; the
    runner calls nothing of its consumer's. run_all is the same, for a caller that wants the outcomes only.

    After a case times out, the stage's remaining cases are not run (unless job.all_cases): a hung
    submission costs about one timeout per stage, not one per case.
    """
    outcomes: dict[int, CallOutcome] = {}
    stage_deadline = min(time.monotonic() + _stage_backstop(job), job.deadline or math.inf)
    budget = _StageBudget(_stage_budget(job))
    start, retries = 0, MACHINE_RETRIES
    while start < len(job.calls) and time.monotonic() < stage_deadline and not budget.over():
        # A fresh run directory for each process: what one left there counts against no other's quota.
        work = tempdirs.mkdtemp("run")  # 0700; chowned to the submission's own uid as root
        began = start
        try:
            start = yield from _run_child(job, start, Path(work), outcomes, (stage_deadline, budget))
        except KeyboardInterrupt:  # it may have struck while a child was being reaped: kill it all the same
            interrupt.kill_running()
            raise
        finally:
            remove_run_dir(work)
            job.launcher.finished(str(job.course_root))
        over = time.monotonic() >= stage_deadline or budget.over()  # the rest are reported as over budget
        busy = _machine_busy(outcomes, began, start)
        if busy is not None and retries > 0 and not over:  # the machine's, not the code's: once more, afresh
            start, retries = busy, retries - 1
            continue
        if not (job.all_cases or over) and start < len(job.calls) and outcomes[start - 1].status == protocol.TIMEOUT:
            name = job.case_names[start - 1] if job.case_names else start - 1
            skipped = CallOutcome(
                status=protocol.TIMEOUT,
                message=f"skipped after a timeout in case {name} (--all-cases runs every case)",
            )
            outcomes.update((i, skipped) for i in range(start, len(job.calls)))
            start = len(job.calls)
    spent = CallOutcome(status=protocol.TIMEOUT, message=_spent_message(job))
    yield RunEnded([outcomes.get(i, spent) for i in range(len(job.calls))])


MACHINE_RETRIES = 2  # fresh children a stage may start again for cases that ended at the wall-clock backstop


def _machine_busy(outcomes: dict[int, CallOutcome], began: int, end: int) -> int | None:
    """The first case of a child's run (cases began..end) that ended machine-busy (the wall-clock backstop with
    little CPU used: CallOutcome.limit "wall"), or None."""
    return next((i for i in range(began, end) if outcomes[i].limit == "wall"), None)


def run_all(job: AdapterJob) -> list[CallOutcome]:
    """run_adapter's outcomes, its other events left unread (each returned array is dropped as its event passes:
    outcome.value is None; judge values from the CaseDone events instead)."""
    for event in run_adapter(job):
        if isinstance(event, RunEnded):
            return event.outcomes
    raise AssertionError("run_adapter always ends with RunEnded")
