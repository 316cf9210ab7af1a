"""One worker process of a student's adapter and the channel it reports on, read defensively.

Worker starts the process (through the job's launcher, in its own cgroup where the grader can make one) and reads
its protocol messages under the run's limits; the functions below turn a message into what it claims, checked for
form (everything the student's process sends is untrusted input: a message out of form is a ProtocolError).
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
from pathlib import Path

import numpy as np

from theinference.errors import ConfigError
from theinference.proc import accounting, channels, interrupt, protocol
from theinference.proc.jobs import AdapterJob, CallOutcome, ProtocolError
from theinference.proc.node import is_node_adapters
from theinference.proc.reaper import plan
from theinference.proc.rundir import QUOTA_POLL, QuotaExceeded, RunDir
from theinference.sizes import size_text
from theinference.trust import allowed_env

OUTPUT_CAP = 30_000  # bytes of the student's stdout/stderr kept per process
FILE_CAP = 1 << 30  # bytes any one file the student's process writes may reach (its output included; and the quota)
MESSAGE_CAP = 1 << 20  # bytes of one protocol message
# Seconds between two sums of the memory the tree holds (where no cgroup caps it): a look costs a pass over /proc.
MEMORY_POLL = 0.1


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BINARY = getattr(os, "O_BINARY", 0)  # Windows opens a file in text mode without it (CRLF, 0x1A as the end)


def _create(path: Path) -> tuple[int, tuple[int, int]]:
    """A new file at path -> (fd, its identity), never through a link the student's process left there.

    The run's directory is writable by the student's processes (under the sandbox it is the only
    writable place), so a name the grader reuses may meanwhile be a symlink to any file.
    """
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY, 0o644)
    info = os.fstat(fd)
    return fd, (info.st_dev, info.st_ino)


def _read_capped(path: Path, identity: tuple[int, int], start: int = 0, end: int | None = None) -> str:
    """The student's output between two offsets of a capture file, at most OUTPUT_CAP bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _BINARY)
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


def exit_message(returncode: int) -> str:
    xfsz = getattr(signal, "SIGXFSZ", None)  # Windows has none
    if xfsz is not None and returncode == -xfsz:
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


class Worker:
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
        try:
            self.cgroup = accounting.run_cgroup(job.limits.tree())
        except BaseException:  # a forced cgroup meter that cannot make one: the socket goes too
            if self.socket is not None:
                self.socket.close()
            raise
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
        return returncode if returncode is not None else -interrupt.SIGKILL

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

    def with_output(self, outcome: CallOutcome, start: list[int], end: list[int] | None) -> CallOutcome:
        """The outcome with the student's stdout/stderr written between two offset pairs (None: to the end)."""
        return dataclasses.replace(
            outcome,
            stdout=_read_capped(self.stdout_path, self.stdout_id, start[0], end[0] if end else None),
            stderr=_read_capped(self.stderr_path, self.stderr_id, start[1], end[1] if end else None),
        )


def message_text(message: dict, key: str) -> str:
    value = message.get(key, "")
    if not isinstance(value, str):
        raise ProtocolError(f"'{key}' of a {message['event']!r} message is not text")
    return value[:OUTPUT_CAP]


def output_offsets(message: dict) -> list[int]:
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


def outcome_from_done(message: dict, index: int, run_dir: RunDir, cap: int | None) -> CallOutcome:
    """What a 'done' message says of case index: its status and, for an answer, the array it saved."""
    status, seconds = message.get("status"), message.get("seconds", 0.0)
    if status not in protocol.DONE_STATUSES:
        raise ProtocolError(f"unknown status {str(status)[:80]!r} for case {index}")
    if type(seconds) not in (int, float) or not math.isfinite(seconds) or seconds < 0:
        raise ProtocolError(f"'seconds' of case {index} is not a duration")
    value = _load_output(message.get("file"), index, run_dir, cap) if status == protocol.OK else None
    if isinstance(value, CallOutcome):
        return dataclasses.replace(value, seconds=float(seconds))
    return CallOutcome(
        status=status,
        value=value,
        message=message_text(message, "message"),
        traceback=message_text(message, "traceback"),
        seconds=float(seconds),
    )


def defined_at(message: dict) -> tuple[str, int] | None:
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
