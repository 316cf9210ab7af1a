"""A step's time as the student is charged for it (StepClock), and the wall-clock backstop that ends a step a
starved machine cannot finish."""

import os
import time

from theinference.proc import accounting, protocol
from theinference.proc.jobs import CallOutcome, CaseCpu, StepTime
from theinference.proc.worker import Worker

BACKSTOP = 4.0  # a step's wall-clock backstop: this many times its timeout, plus BACKSTOP_SLACK seconds
BACKSTOP_SLACK = 10.0

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
    cores (charge). Where the wait cannot be read (the psutil meter: no /proc), it is estimated from the load
    average (PsutilTree.sample; knows_wait is False), so a busy machine can still time a step out where the
    estimate falls short. A wall-clock backstop of BACKSTOP times the timeout still ends a step that a starved
    machine cannot finish, and says so."""

    def __init__(self, child: "Worker", timeout: float):
        self.timeout, self.before = timeout, 0.0  # before: the charged time of this child's earlier steps
        try:
            kind = getattr(child, "tree_kind", None)
            self.tree: accounting.ProcTree | accounting.PsutilTree | None = accounting.tree_meter(
                child.proc.monitor_pid, kind
            )
        except (accounting.MonitorGone, accounting.MeterUnavailable, AttributeError):
            self.tree = None  # no monitor (gone, or a launcher without one), or nothing reads it: wall-clock time
        # Where the tree's run-queue wait cannot be read (psutil), the wait is the load average's estimate.
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
        return (
            " (wall-clock time less the wait for a CPU estimated from the load average: the wait itself cannot be "
            "read here, so a busy machine may count too)"
        )


def starved_message(clock: StepClock) -> str:
    return (
        f"the machine was too busy: after {time.monotonic() - clock.wall:.0f} s of wall-clock time the adapter's "
        f"processes had had {clock.cpu():.2g} s of CPU in all; re-run when it is quieter (not a verdict on the code)"
    )


def backstop_outcome(clock: StepClock, budget: "CaseCpu | None" = None) -> CallOutcome:
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


def stage_backstop(timeout: float, steps: int) -> float:
    """Wall-clock seconds steps of this timeout may take together however busy the machine: a backstop each."""
    return (BACKSTOP * timeout + BACKSTOP_SLACK) * steps
