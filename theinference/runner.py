"""Run a student's adapter in a separate process, one call per case, under a timeout.

Student code never runs in the grader's process: a hang, a crash, a `sys.exit` or a segfault
is recorded as that case's outcome and the next case runs in a fresh process.
"""

import json
import os
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from theinference.launch import SubprocessLauncher

OUTPUT_CAP = 30_000  # bytes of the student's stdout/stderr kept per process
DEFAULT_MEMORY_MB = 6144  # address space per student process: room for 124M weights, copies and BLAS
FILE_CAP = 1 << 30  # bytes any one file the student's process writes may reach (its output included)
_SECRET_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD")


def scrub_secrets(env: dict) -> dict:
    """The environment without variables whose names look like credentials."""
    return {k: v for k, v in env.items() if not any(word in k.upper() for word in _SECRET_WORDS)}


@dataclass(frozen=True)
class AdapterJob:
    course_root: Path
    adapters: Path
    names: tuple[str, ...]  # the function's name, then its accepted aliases
    calls: tuple[tuple, ...]  # the arguments of each call
    weights: Path
    timeout: float  # seconds per call (and for importing the adapters)
    env: dict = field(default_factory=dict)
    launcher: object = field(default_factory=SubprocessLauncher)
    memory_mb: int | None = DEFAULT_MEMORY_MB  # None: no cap
    scrub: bool = False  # drop secret-looking environment variables (CI mode)
    scaling: dict | None = None  # cache-scaling: {"lengths", "repeats"} to time each call at (theinference.timing)


@dataclass
class CallOutcome:
    # ok | not-started | error | bad-output | timeout | crash
    status: str
    value: np.ndarray | None = None
    message: str = ""
    traceback: str = ""
    seconds: float = 0.0
    stdout: str = ""
    stderr: str = ""
    timing: dict | None = None  # cache-scaling: {"seconds": per length, "blas": pools while timing}


def _read_capped(path: Path, start: int = 0, end: int | None = None) -> str:
    """The student's output between two offsets of a capture file, at most OUTPUT_CAP bytes."""
    with path.open("rb") as f:
        f.seek(start)
        limit = OUTPUT_CAP + 1 if end is None else min(OUTPUT_CAP + 1, end - start)
        data = f.read(max(limit, 0))
    text = data[:OUTPUT_CAP].decode("utf-8", errors="replace")
    if len(data) > OUTPUT_CAP:
        text += f"\n[... output truncated after {OUTPUT_CAP // 1000} KB]"
    return text


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
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


class _Child:
    """One child process and the pipe it reports on."""

    def __init__(self, job: AdapterJob, start: int, work: Path):
        job_file = work / f"job-{start}.json"
        job_file.write_text(json.dumps({
            "course_root": str(job.course_root), "adapters": str(job.adapters), "names": list(job.names),
            "calls": [list(c) for c in job.calls], "start": start, "out_dir": str(work), "scaling": job.scaling,
            "limits": {"memory_bytes": job.memory_mb * 2**20 if job.memory_mb else None, "file_bytes": FILE_CAP},
        }))
        read_fd, write_fd = os.pipe()
        base = scrub_secrets(dict(os.environ)) if job.scrub else dict(os.environ)
        env = {**base, **job.env, "THEINFERENCE_WEIGHTS": str(job.weights)}
        self.stdout_path, self.stderr_path = work / f"stdout-{start}.txt", work / f"stderr-{start}.txt"
        try:
            with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
                self.proc = job.launcher.start([str(job_file)], str(job.course_root), env, out, err, write_fd)
        finally:
            os.close(write_fd)
        self.pipe = os.fdopen(read_fd, "rb")
        self.buffer = b""

    def next_message(self, deadline: float) -> dict | None:
        """The next message, None at end of stream; raises TimeoutError past the deadline."""
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.pipe], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(self.pipe.fileno(), 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def finish(self, graceful: bool = True) -> int:
        """Kill what is left of the process group; return the child's exit code.

        graceful: the child has reported everything and should exit by itself; give it a moment.
        """
        self.pipe.close()
        try:
            self.proc.wait(timeout=2 if graceful else 0)
        except subprocess.TimeoutExpired:
            pass
        returncode = self.proc.returncode
        _kill_group(self.proc)  # also reaps grandchildren the student left running
        return returncode if returncode is not None else -signal.SIGKILL

    def attach_output(self, outcome: CallOutcome, start: list[int], end: list[int] | None) -> None:
        """Give the outcome the student's stdout/stderr written between two offset pairs (None: to the end)."""
        outcome.stdout = _read_capped(self.stdout_path, start[0], end[0] if end else None)
        outcome.stderr = _read_capped(self.stderr_path, start[1], end[1] if end else None)


def _outcome_from_done(message: dict) -> CallOutcome:
    value = np.load(message["file"], allow_pickle=False) if message["status"] == "ok" else None
    return CallOutcome(status=message["status"], value=value, message=message.get("message", ""),
                       traceback=message.get("traceback", ""), seconds=message.get("seconds", 0.0),
                       timing=message.get("timing"))


def _run_child(job: AdapterJob, start: int, work: Path, outcomes: dict[int, CallOutcome]) -> int:
    """Run one child from case `start`; fill outcomes; return the next case still to run."""
    child = _Child(job, start, work)
    current, failure, loaded, case_output = start, None, False, [0, 0]
    try:
        deadline = time.monotonic() + job.timeout
        while current < len(job.calls):
            message = child.next_message(deadline)
            if message is None:
                break
            if message["event"] == "load-error":
                failure = CallOutcome(status="error", message=message["message"], traceback=message.get("traceback", ""))
                break
            if message["event"] in ("loaded", "start"):
                loaded = True
                case_output = message.get("output", case_output)
                deadline = time.monotonic() + job.timeout
            elif message["event"] == "done":
                outcomes[message["case"]] = _outcome_from_done(message)
                child.attach_output(outcomes[message["case"]], case_output, message["output"])
                current = message["case"] + 1
    except TimeoutError:
        phase = "running" if loaded else "importing the adapters"
        failure = CallOutcome(status="timeout", message=f"timed out after {job.timeout:g} s while {phase}")
    except BaseException:  # Ctrl-C in watch mode, a grader bug: never leave the student's process running
        child.finish(graceful=False)
        raise
    returncode = child.finish(graceful=failure is None or failure.status != "timeout")
    if current >= len(job.calls) and failure is None:
        return current
    if failure is None:
        failure = CallOutcome(status="crash", message=_exit_message(returncode))
    child.attach_output(failure, case_output, None)
    # A failure before any case started (import, load) would repeat for every case: record it for all.
    last = current + 1 if loaded else len(job.calls)
    for index in range(current, last):
        outcomes[index] = failure
    return last


def run_adapter(job: AdapterJob) -> list[CallOutcome]:
    """Call the adapter once per entry of job.calls, each in a child process; never raises for student faults."""
    outcomes: dict[int, CallOutcome] = {}
    with tempfile.TemporaryDirectory(prefix="theinference-run-") as work:
        start = 0
        while start < len(job.calls):
            start = _run_child(job, start, Path(work), outcomes)
    return [outcomes[i] for i in range(len(job.calls))]
