"""Run a student's adapter in a separate process, one call per case, under a timeout.

Student code never runs in the grader's process: a hang, a crash, a `sys.exit` or a segfault
is recorded as that case's outcome and the next case runs in a fresh process. Everything the
student's process sends on the result pipe is untrusted input: a message out of protocol is
that submission's error, and only the grader's own clock sets deadlines. What a job and its
outcomes are: jobs.py; the worker process and its messages: worker.py; the charged clock: clock.py.
"""

import dataclasses
import math
import os
import shutil
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from theinference.proc import interrupt, protocol, strays, tempdirs
from theinference.proc.clock import StepClock, backstop_outcome, stage_backstop
from theinference.proc.jobs import (
    OVER_LIMIT,
    AdapterJob,
    CallOutcome,
    CaseCpu,
    CaseDone,
    CaseStarted,
    ProtocolError,
    RunEnded,
    RunnerEvent,
    StepTime,
)
from theinference.proc.limits import DEFAULT_MEMORY_MB  # noqa: F401 - its old home
from theinference.proc.worker import Worker, defined_at, exit_message, message_text, outcome_from_done, output_offsets

__all__ = ["AdapterJob", "CallOutcome", "CaseDone", "CaseStarted", "RunEnded", "RunnerEvent", "StepTime"]

_POLL = 0.1  # seconds between looks at a step's clock while the student's code runs


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
    """Hand the consumer what was seen; a case's array goes with its event (the outcomes kept hold none)."""
    while events:
        yield events.pop(0)


def _handle(
    message: dict,
    state: _Progress,
    child: "Worker",
    job: AdapterJob,
    outcomes: dict[int, CallOutcome],
    clock: "StepClock",
) -> CallOutcome | None:
    """Apply one message in the order the protocol allows; return a load failure, raise ProtocolError otherwise."""
    event = message["event"]
    if event == protocol.LOAD_ERROR and not state.loaded:
        return CallOutcome(
            status=protocol.ERROR,
            message=message_text(message, "message"),
            traceback=message_text(message, "traceback"),
        )
    if event == protocol.LOADED and not state.loaded:
        state.loaded, state.defined_at, state.loading = True, defined_at(message), clock.reading()
    elif event == protocol.START and state.loaded and not state.started and _is_case(message, state.current):
        state.started, state.case_output = True, output_offsets(message)
        state.events.append(CaseStarted(state.current))
    elif event == protocol.DONE and state.started and _is_case(message, state.current):
        child.check_limits(now=True)  # a case that ends past a limit (its writes refused, say) is the limit's
        assert child.run_dir is not None, "a started child has a run directory"
        cap = job.output_caps[state.current] if job.output_caps else None
        outcome = dataclasses.replace(
            child.with_output(
                outcome_from_done(message, state.current, child.run_dir, cap),
                state.case_output,
                output_offsets(message),
            ),
            defined_at=state.defined_at,
            clock=clock.reading(),
            loading=state.loading,
        )
        state.loading = None  # the import is shown once, on the first case after it
        outcomes[state.current] = dataclasses.replace(outcome, value=None)  # the array goes with the event only
        state.events.append(CaseDone(state.current, outcome))
        state.current, state.started = state.current + 1, False
    else:
        raise ProtocolError(_unexpected(message, state.current, len(job.calls)))
    return None


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


@dataclass
class _StageBudget:
    """The stage's budget, charged as its steps are (StepClock), so restarts after crashes cannot stretch it."""

    limit: float
    spent: float = 0.0  # charged time of the children that have ended

    def over(self, clock: StepClock | None = None) -> bool:
        return self.spent + (clock.total() if clock is not None else 0.0) >= self.limit


def _next_message(
    child: Worker, clock: StepClock, stage: tuple[float, _StageBudget], cpu: tuple[_CpuWatch, _Progress]
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
    child = Worker(job, start, work)
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
        failure, kill_now = backstop_outcome(clock, watch.budget(state.current) if state.loaded else None), True
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
        failure = CallOutcome(status=protocol.CRASH, message=exit_message(returncode))
    clock_at, loading = (ended, state.loading) if state.loaded else (None, ended)
    failure = child.with_output(dataclasses.replace(failure, clock=clock_at, loading=loading), state.case_output, None)
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
    return stage_backstop(job.timeout, len(job.calls) + 1)


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
