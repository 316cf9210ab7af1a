"""Interactive runs: the grader hands the worker each call's arguments when it starts it, and counts
each call's CPU from outside the worker's process tree (cache-scaling).

One worker serves every call (weights loaded once). A call's cost is the difference of two readings of
the kernel's count for the whole tree (theinference.proc.accounting), taken by the grader just before it
sends the arguments and just after the result arrives; the worker measures and reports nothing. A call
that passes its CPU budget is stopped there (its cost is then known to be over it); a wall-clock
backstop several times larger stops a call that sleeps or a machine too busy to finish, and says so.
"""

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from theinference.proc import accounting, protocol
from theinference.proc.runner import (
    AdapterJob,
    CallOutcome,
    ProtocolError,
    _Child,
    _exit_message,
    _offsets,
    _outcome_from_done,
    _text,
    _defined_at,
)

_POLL = 0.05  # seconds between readings of the tree's CPU while a call runs


@dataclass(frozen=True)
class Budget:
    """What one call may use: CPU seconds of the whole tree, and a wall-clock backstop."""

    cpu: float
    wall: float


class CallSession:
    """One worker, started on entry, serving calls one at a time; killed with everything it started on exit."""

    def __init__(self, job: AdapterJob, load_budget: Budget):
        self.job = job
        self._dir = tempfile.TemporaryDirectory(prefix="theinference-run-")
        self.work = Path(self._dir.name)
        self.child = _Child(job, 0, self.work, interactive=True)
        self.meter: accounting.Cgroup | accounting.ProcTree | None = None
        self.failure: CallOutcome | None = None  # once set, the worker is gone and every later call gets it
        self.defined_at: tuple[str, int] | None = None
        self.accounting = ""
        self._stopped = False
        self._load(load_budget)

    def __enter__(self) -> "CallSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.child is not None:
            self.child.finish(graceful=self.failure is None)
            self.child = None  # type: ignore[assignment]
        self._dir.cleanup()

    def output(self) -> CallOutcome:
        """Everything the worker wrote to stdout and stderr so far (capped), on an outcome-shaped record."""
        whole = CallOutcome(status=protocol.OK)
        if self.child is not None:
            self.child.attach_output(whole, [0, 0], None)
        return whole

    def _load(self, budget: Budget) -> None:
        """Wait for the worker to import the adapters (or fail to); find what counts its CPU."""
        try:
            self.meter = self.child.meter()
            self.accounting = self.meter.name
        except accounting.MonitorGone:
            self._fail(CallOutcome(status=protocol.CRASH, message="the adapter's process ended before it started"))
            return
        deadline = time.monotonic() + budget.wall
        while self.failure is None:
            try:
                message = self.child.next_message(deadline)
            except TimeoutError:
                self._fail(
                    CallOutcome(
                        status=protocol.TIMEOUT,
                        message=f"timed out after {budget.wall:g} s while importing the adapters",
                        limit="wall",
                    )
                )
                return
            except ProtocolError as e:
                self._fail(_broken(e))
                return
            if message is None:
                self._fail(CallOutcome(status=protocol.CRASH, message=_exit_message(self._returncode())))
            elif message["event"] == protocol.LOAD_ERROR:
                self._fail(
                    CallOutcome(
                        status=protocol.ERROR, message=_text(message, "message"), traceback=_text(message, "traceback")
                    )
                )
            elif message["event"] == protocol.LOADED:
                self.defined_at = _defined_at(message)
                return
            else:
                self._fail(_broken(ProtocolError(f"an unexpected {message['event']!r} message before 'loaded'")))

    def _returncode(self) -> int:
        try:
            return self.child.proc.wait(timeout=2)
        except Exception:  # noqa: BLE001 - still running or unknown: reported as killed
            return -9

    def _fail(self, outcome: CallOutcome) -> None:
        self.failure = outcome
        self.child.attach_output(outcome, [0, 0], None)

    def call(self, index: int, args: list, output_cap: int, budget: Budget) -> CallOutcome:
        """Run one call; its outcome carries the CPU the whole tree used for it (cpu_seconds)."""
        if self.failure is not None:
            return self.failure
        assert self.meter is not None, "a loaded session has a meter"
        try:
            before = self.meter.cpu_seconds()
            self.child.send_call(index, args)
        except (accounting.MonitorGone, OSError) as e:
            self._fail(_gone(e))
            return self.failure  # type: ignore[return-value]
        self._stopped = False
        outcome = self._await(index, output_cap, budget, before)
        if self._stopped:  # killed, crashed or out of protocol: no later call can run
            self.child.finish(graceful=False)
            self.failure = CallOutcome(
                status=outcome.status, message="not run: the adapter's process was stopped in an earlier call"
            )
        return outcome

    def _await(self, index: int, cap: int, budget: Budget, before: float) -> CallOutcome:
        started, output = time.monotonic(), [0, 0]
        wall_deadline = started + budget.wall
        begun = False
        while True:
            try:
                used = self.meter.cpu_seconds() - before  # type: ignore[union-attr]
            except accounting.MonitorGone as e:
                return self._ended(_gone(e), output)
            if used > budget.cpu:
                return self._ended(
                    CallOutcome(
                        status=protocol.TIMEOUT,
                        message=f"stopped after {used:.3g} s of CPU, its budget",
                        cpu_seconds=used,
                        limit="cpu",
                    ),
                    output,
                )
            if time.monotonic() > wall_deadline:
                return self._ended(
                    CallOutcome(
                        status=protocol.TIMEOUT,
                        message=f"stopped after {budget.wall:g} s of wall-clock time having used {used:.3g} s of CPU",
                        cpu_seconds=used,
                        limit="wall",
                    ),
                    output,
                )
            try:
                message = self.child.next_message(min(wall_deadline, time.monotonic() + _POLL))
            except TimeoutError:
                continue
            except ProtocolError as e:
                return self._ended(_broken(e), output)
            if message is None:
                return self._ended(
                    CallOutcome(status=protocol.CRASH, message=_exit_message(self._returncode())), output
                )
            is_ours = type(message.get("case")) is int and message["case"] == index
            try:
                if message["event"] == protocol.START and is_ours and not begun:
                    begun, output = True, _offsets(message)
                    continue
                if message["event"] == protocol.DONE and is_ours and begun:
                    used = self.meter.cpu_seconds() - before  # type: ignore[union-attr]
                    outcome = _outcome_from_done(
                        message, index, self.work, cap if message.get("status") == protocol.OK else None
                    )
                    outcome.cpu_seconds = used
                    outcome.seconds = time.monotonic() - started
                    outcome.defined_at = self.defined_at
                    self.child.attach_output(outcome, output, _offsets(message))
                    return outcome
                raise ProtocolError(f"an unexpected {str(message['event'])[:40]!r} message (call {index} was due)")
            except ProtocolError as e:
                return self._ended(_broken(e), output)
            except accounting.MonitorGone as e:
                return self._ended(_gone(e), output)

    def _ended(self, outcome: CallOutcome, output: list[int]) -> CallOutcome:
        """A call that ended without a result: the worker is stopped (by the caller) and its output attached."""
        self._stopped = True
        self.child.attach_output(outcome, output, None)
        return outcome


def _broken(error: ProtocolError) -> CallOutcome:
    return CallOutcome(status=protocol.ERROR, message=f"the adapter's process broke the result protocol: {error}")


def _gone(error: Exception) -> CallOutcome:
    return CallOutcome(
        status=protocol.CRASH,
        message=f"the adapter's process tree can no longer be measured ({error}): its monitor or its pipe is gone",
    )
