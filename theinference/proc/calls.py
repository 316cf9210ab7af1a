"""Interactive runs: the grader hands the worker each call's arguments when it starts it, and counts
each call's CPU from outside the worker's process tree (cache-scaling).

One worker serves every call (weights loaded once). A call's cost is the difference of two readings of
the kernel's count for the whole tree (theinference.proc.accounting), taken by the grader just before it
sends the arguments and just after the result arrives; the worker measures and reports nothing. A call
that passes its CPU budget is stopped there (its cost is then known to be over it); a call that waits
past its timeout (time not spent waiting for a CPU: clock.StepClock) times out; the wall-clock backstop
ends a call that a starved machine cannot finish, and says so.
"""

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from theinference.proc import accounting, protocol, seal, strays, tempdirs
from theinference.proc.rundir import QuotaExceeded
from theinference.proc.clock import StepClock, starved_message
from theinference.proc.jobs import OVER_LIMIT, AdapterJob, CallOutcome, ProtocolError
from theinference.proc.runner import remove_run_dir
from theinference.proc.worker import Worker, defined_at, exit_message, message_text, outcome_from_done, output_offsets

_POLL = 0.05  # the least seconds between readings of the tree's CPU while a call runs
# The most: a reading walks /proc for the run-queue wait (clock.StepClock), CPU the grader takes from the student's
# cores, so a call far from its budget is read less often (_poll); its result wakes the grader at once whatever this is.
_SLOW_POLL = 0.5
DEADLINE = "deadline"  # CallOutcome.limit of a call stopped at the run's deadline (AdapterJob.deadline)


@dataclass(frozen=True)
class Budget:
    """What one call may use: CPU seconds of the whole tree, and time as clock.StepClock charges it
    (wall-clock time less waiting for a CPU); its wall-clock backstop is clock.BACKSTOP times that."""

    cpu: float
    timeout: float


class CallSession:
    """One worker, started on entry, serving calls one at a time; killed with everything it started on exit."""

    def __init__(self, job: AdapterJob, load_budget: Budget):
        self.work = Path(tempdirs.mkdtemp("run"))  # 0700; chowned to the submission's uid as root
        self.launcher, self.course_root = job.launcher, str(job.course_root)
        self.deadline, self.deadline_budget = job.deadline, job.deadline_budget  # the run's end (monotonic), if any
        self.monitor_lost = False  # the worker killed its monitor: none of the session's calls count
        self.child: Worker | None = Worker(job, 0, self.work, interactive=True)
        self.meter: accounting.Meter | None = None
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
            if getattr(self.child.proc, "monitor_lost", False):
                strays.kill_strays()
                self.monitor_lost = True
            self.child = None
        remove_run_dir(str(self.work))  # never raises: a leftover is reported by the grader
        self.launcher.finished(self.course_root)

    def output(self) -> CallOutcome:
        """Everything the worker wrote to stdout and stderr so far (capped), on an outcome-shaped record."""
        whole = CallOutcome(status=protocol.OK)
        return self.child.with_output(whole, [0, 0], None) if self.child is not None else whole

    def _load(self, budget: Budget) -> None:
        """Wait for the worker to import the adapters (or fail to); find what counts its CPU."""
        assert self.child is not None
        try:
            self.meter = self.child.meter()
            self.accounting = self.meter.name
        except accounting.MonitorGone:
            self._fail(CallOutcome(status=protocol.CRASH, message="the adapter's process ended before it started"))
            return
        except accounting.MeterUnavailable:  # nothing on this machine can count it: the worker goes, the error stands
            self.close()
            raise
        clock = StepClock(self.child, budget.timeout)
        while self.failure is None:
            try:
                message = self.child.next_message(min(clock.backstop, self._end(), time.monotonic() + _POLL))
            except TimeoutError:
                if self.past_deadline():
                    self._fail(self.deadline_outcome("while importing the adapters"))
                elif clock.charged() >= budget.timeout or time.monotonic() >= clock.backstop:
                    why = f"timed out after {budget.timeout:g} s while importing the adapters{clock.wall_note()}"
                    self._fail(CallOutcome(status=protocol.TIMEOUT, message=why, limit="time"))
                continue
            except ProtocolError as e:
                self._fail(_broken(e))
                continue
            except OVER_LIMIT as e:
                self._fail(CallOutcome(status=protocol.ERROR, message=str(e)))
                continue
            if message is not None and message["event"] == protocol.LOADED:
                self.defined_at = defined_at(message)
                self._read_seal()
                return
            self._fail(self._load_failure(message))

    def _read_seal(self) -> None:
        """A /proc count of a sealed tree misses nothing (theinference.proc.seal): read from outside, once the worker
        has loaded (it seals itself before it imports the adapters), never from what it says."""
        if isinstance(self.meter, accounting.ProcTree):
            try:
                if seal.tree_sealed(self.meter.descendants()):
                    self.meter.seal()
                    self.accounting = self.meter.name
            except accounting.MonitorGone:
                pass  # the next reading ends the session

    def _crashed(self) -> CallOutcome:
        """The outcome of a worker that ended without a word: the quota's, if its run directory is past it."""
        assert self.child is not None
        try:
            self.child.check_quota(now=True)
        except QuotaExceeded as e:
            return CallOutcome(status=protocol.ERROR, message=str(e))
        return CallOutcome(status=protocol.CRASH, message=exit_message(self._returncode()))

    def _load_failure(self, message: dict | None) -> CallOutcome:
        if message is None:
            return self._crashed()
        if message["event"] == protocol.LOAD_ERROR:
            return CallOutcome(
                status=protocol.ERROR,
                message=message_text(message, "message"),
                traceback=message_text(message, "traceback"),
            )
        return _broken(ProtocolError(f"an unexpected {message['event']!r} message before 'loaded'"))

    def _returncode(self) -> int:
        assert self.child is not None
        try:
            return self.child.proc.wait(timeout=2)
        except Exception:  # noqa: BLE001 - still running or unknown: reported as killed
            return -9

    def _end(self) -> float:
        return math.inf if self.deadline is None else self.deadline

    def past_deadline(self) -> bool:
        """Whether the run's deadline (the submission's budget, `grade --finish-by`) has passed."""
        return time.monotonic() >= self._end()

    def deadline_outcome(self, when: str, used: float | None = None) -> CallOutcome:
        """The outcome of a call (or the load) that the run's deadline ended: TIMEOUT, limit DEADLINE."""
        message = f"stopped {when}: the submission's time budget of {self.deadline_budget or 0:g} s ran out"
        return CallOutcome(status=protocol.TIMEOUT, message=message, cpu_seconds=used, limit=DEADLINE)

    def _fail(self, outcome: CallOutcome) -> CallOutcome:
        """The session's failure from now on, the worker's whole output on it."""
        self.failure = self.child.with_output(outcome, [0, 0], None) if self.child is not None else outcome
        return self.failure

    def call(self, index: int, args: list, output_cap: int, budget: Budget) -> CallOutcome:
        """Run one call; its outcome carries the CPU the whole tree used for it (cpu_seconds)."""
        if self.failure is not None:
            return self.failure
        assert self.meter is not None and self.child is not None, "a loaded session has a worker and a meter"
        if self.past_deadline():  # not started: the worker stays as it is, and every later call is told the same
            return self.deadline_outcome("before it started", 0.0)
        try:
            before = self.meter.cpu_seconds()
            self.child.send_call(index, args)
        except (accounting.MonitorGone, OSError) as e:
            return self._fail(_gone(e))
        self._stopped = False
        outcome = self._await(index, output_cap, budget, before)
        if self._stopped:  # killed, crashed or out of protocol: no later call can run
            self.child.finish(graceful=False)
            self.failure = CallOutcome(
                status=outcome.status, message="not run: the adapter's process was stopped in an earlier call"
            )
        return outcome

    def _await(self, index: int, cap: int, budget: Budget, before: float) -> CallOutcome:
        assert self.meter is not None and self.child is not None
        clock, output, begun = StepClock(self.child, budget.timeout), [0, 0], False
        while True:
            try:
                used = self.meter.cpu_seconds() - before
                over = _over_budget(clock, budget, used)
                if over is None and self.past_deadline():
                    over = self.deadline_outcome("while running", used)
                if over is not None:
                    return self._ended(dataclasses.replace(over, clock=clock.reading()), output)
                try:
                    wake = min(clock.backstop, self._end(), time.monotonic() + _poll(budget, used))
                    message = self.child.next_message(wake)
                except TimeoutError:
                    continue
                if message is None:
                    return self._ended(self._crashed(), output)
                if message["event"] == protocol.START and _is_call(message, index) and not begun:
                    begun, output = True, output_offsets(message)
                    continue
                if message["event"] == protocol.DONE and _is_call(message, index) and begun:
                    self.child.check_limits(now=True)
                    return self._done(message, index, cap, before, clock, output)
                raise ProtocolError(f"an unexpected {str(message['event'])[:40]!r} message (call {index} was due)")
            except ProtocolError as e:
                return self._ended(_broken(e), output)
            except accounting.MonitorGone as e:
                return self._ended(_gone(e), output)
            except OVER_LIMIT as e:
                return self._ended(CallOutcome(status=protocol.ERROR, message=str(e)), output)

    def _done(
        self, message: dict, index: int, cap: int, before: float, clock: StepClock, output: list[int]
    ) -> CallOutcome:
        """The call's outcome from its 'done' message, with the tree's CPU read now."""
        assert self.meter is not None and self.child is not None and self.child.run_dir is not None
        used = self.meter.cpu_seconds() - before
        checked = cap if message.get("status") == protocol.OK else None
        outcome = dataclasses.replace(
            outcome_from_done(message, index, self.child.run_dir, checked),
            cpu_seconds=used,
            clock=clock.reading(),
            seconds=time.monotonic() - clock.wall,
            defined_at=self.defined_at,
        )
        return self.child.with_output(outcome, output, output_offsets(message))

    def _ended(self, outcome: CallOutcome, output: list[int]) -> CallOutcome:
        """A call that ended without a result: the worker is stopped (by the caller) and its output attached."""
        self._stopped = True
        return self.child.with_output(outcome, output, None) if self.child is not None else outcome


def _poll(budget: Budget, used: float) -> float:
    """Seconds until the tree's CPU is read again: before it could pass the budget on every core, within bounds."""
    return min(_SLOW_POLL, max(_POLL, (budget.cpu - used) / (os.cpu_count() or 1)))


def _is_call(message: dict, index: int) -> bool:
    return type(message.get("case")) is int and message["case"] == index


def _over_budget(clock: StepClock, budget: Budget, used: float) -> CallOutcome | None:
    """The outcome of a call that has passed its CPU budget, its timeout or its wall-clock backstop; else None."""
    if used > budget.cpu:
        message = f"stopped after {used:.3g} s of CPU, its budget"
        return CallOutcome(status=protocol.TIMEOUT, message=message, cpu_seconds=used, limit="cpu")
    if time.monotonic() > clock.backstop:
        return CallOutcome(status=protocol.TIMEOUT, message=starved_message(clock), cpu_seconds=used, limit="wall")
    if clock.charged() > budget.timeout:  # time that was not spent waiting for a CPU: the code waited
        message = (
            f"timed out after {budget.timeout:g} s while running, having used {used:.2g} s of CPU{clock.wall_note()}"
        )
        return CallOutcome(status=protocol.TIMEOUT, message=message, cpu_seconds=used, limit="time")
    return None


def _broken(error: ProtocolError) -> CallOutcome:
    return CallOutcome(status=protocol.ERROR, message=f"the adapter's process broke the result protocol: {error}")


def _gone(error: Exception) -> CallOutcome:
    return CallOutcome(
        status=protocol.CRASH,
        message=f"the adapter's process tree can no longer be measured ({error}): its monitor or its pipe is gone",
    )
