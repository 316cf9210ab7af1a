"""The one rule for a stage's seconds per adapter call (made by the run's plan, read by the judge's job)."""

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
    def chosen_by_course(self) -> bool:
        """The course's file set every stage's timeout (what a report says the course chose)."""
        return self.command_line is None and self.course is not None
