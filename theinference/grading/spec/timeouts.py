"""The one rule for a stage's seconds per adapter call (made by the run's plan, read by the judge's job)."""

from collections.abc import Mapping
from dataclasses import dataclass

from theinference.grading.spec.stages import StageSpec


@dataclass(frozen=True)
class Timeouts:
    """The seconds per adapter call, by the one rule: --timeout, else the course's theinference.toml `timeout`
    (None for an untrusted course: it was not read), else the stage's own."""

    command_line: float | None = None
    course: float | None = None

    def for_stage(self, stage: StageSpec) -> float:
        return self.command_line or self.course or stage.timeout

    @property
    def cpu_budgeted(self) -> bool:
        """Each case also gets a CPU budget from its work (cpu_budget), unless the instructor's --timeout is given:
        that figure is trusted and wins alone."""
        return self.command_line is None

    @property
    def chosen_by_course(self) -> bool:
        """The course's file set every stage's timeout (what a report says the course chose)."""
        return self.command_line is None and self.course is not None


# A case's CPU budget (an inner bound, inside the stage's timeout): what it may use without answering before it is
# the student's timeout. It follows from the work: the reference's own CPU for that case, many times over (a
# student's numpy is rarely as lean as the oracle's, and the TypeScript edition's plain loops are far slower still),
# plus a floor that covers what any case costs whatever its size (loading the weights, numpy's first calls).
CPU_FLOOR = 5.0
CPU_FACTOR = 50.0
NODE_FACTOR = 10.0  # the TypeScript edition: plain-JS loops against numpy's BLAS


@dataclass(frozen=True)
class CpuBudget:
    """One case's CPU budget and what it was made from (for the timeout's message)."""

    seconds: float
    reference: float  # CPU seconds the oracle took for the case

    def message(self, used: float) -> str:
        return (
            f"timed out: used {used:.3g} s of CPU without answering, on a case the reference computes in "
            f"{self.reference:.2g} s (a case may use {self.seconds:.3g} s of CPU here)"
        )


def cpu_budget(reference: float, node: bool, inputs: Mapping | None = None) -> CpuBudget:
    """The rule: CPU_FLOOR plus CPU_FACTOR times the reference's CPU (NODE_FACTOR more for the TypeScript edition),
    times recompute_factor(inputs): an honest submission without a cache must pass every stage but the cost one."""
    factor = CPU_FACTOR * (NODE_FACTOR if node else 1.0) * recompute_factor(inputs or {})
    return CpuBudget(CPU_FLOOR + reference * factor, reference)


def recompute_factor(inputs: Mapping) -> float:
    """How many times the tokens the case consumes a recompute of every step runs the model over (at least 1).

    The oracle's work for a case follows the tokens consumed (P prompt tokens, then N steps); a submission without a
    cache runs step k over all P + k tokens so far, N*P + N*(N-1)/2 in all: for the 11-token prompt and 47 steps of
    per-step-identity's longest case, 27.6 times the oracle's 58. Its budget must cover that, or a correct
    recompute is called a hang (measured: 6.24 s of CPU against a budget of 6.22 without this factor, beside load)."""
    if "prompt" not in inputs:
        return 1.0
    prompt = len(inputs["prompt"])
    steps = len(inputs["cont"]) if "cont" in inputs else int(inputs.get("n_new", 1))
    recomputed = steps * prompt + steps * (steps - 1) / 2
    return max(1.0, recomputed / max(prompt + steps, 1))
