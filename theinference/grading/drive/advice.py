"""What the report's footer suggests next: the fast loop on tiny weights, and the stage to read next."""

from theinference.grading.drive.progress import next_stage
from theinference.grading.judge.results import RunResult, Status
from theinference.grading.spec.checks import ScalingCheck
from theinference.grading.spec.stages import StageSpec
from theinference.model.synth import PRESETS

# Above this much student compute per run the fast loop is worth offering (tiny weights take about 2 s
# for the whole course).
SLOW_SECONDS = 5.0


def student_seconds(run: RunResult) -> float:
    """The students' own compute time over every case of the run."""
    return sum(case.seconds for stage in run.stages for case in stage.cases)


def fast_loop_hint(run: RunResult) -> str:
    """On a slow run on weights larger than the tiny preset: that `--weights tiny` gives the same verdicts; else ""."""
    tiny = PRESETS["tiny"]
    larger = run.config.get("n_layer", 0) * run.config.get("n_embd", 0) > tiny.n_layer * tiny.n_embd
    seconds = student_seconds(run)
    if not larger or seconds <= SLOW_SECONDS:
        return ""
    return (
        f"your code took {seconds:.0f} s on these {run.config['n_layer']}-layer weights: `--weights tiny` gives the "
        "same verdicts in seconds (the identities hold for any weights); keep these for a final check"
    )


FULL_SIZE = "gpt2"  # progress's name for weights of GPT-2's own shape (the synthetic preset or real GPT-2)


def next_stage_line(stages: list[StageSpec], progress: dict[str, dict]) -> str:
    """After a pass: the first stage not yet passed and how to read its lesson, or that the course is complete
    (on which weights, and what is left to certify on the full-size ones)."""
    upcoming = next_stage(stages, progress)
    if upcoming is not None:
        return f"next stage: {upcoming.id} ({upcoming.title}) · its lesson: `theinference stages show {upcoming.id}`"
    n = len(stages)
    own = [s.id for s in stages if on_own_weights(s)]
    smaller = [
        s.id for s in stages if s.id not in own and progress.get(s.id, {}).get("weights", FULL_SIZE) != FULL_SIZE
    ]
    if not smaller:
        return f"every stage of the course has passed ({n} of {n}) on full-size weights: the course is complete"
    names = " and ".join(sorted({str(progress[i]["weights"]) for i in smaller}))
    mine = f"; {', '.join(own)} runs on its own weights whatever the graded ones" if own else ""
    which = (
        f"{len(smaller)} only on {names} weights ({', '.join(smaller)}{mine})"
        if own or len(smaller) < n
        else f"on {names} weights"
    )
    return f"all {n} stages have passed, {which}: certify on full-size: `theinference test --all --weights {FULL_SIZE}`"


def on_own_weights(stage: StageSpec) -> bool:
    """A stage graded on weights of its own whatever the graded ones (cache-scaling's `proof` preset): where it
    passed says nothing about the weights it was graded with."""
    return isinstance(stage.check, ScalingCheck) and stage.check.params.weights == "proof"


def advise(run: RunResult, stages: list[StageSpec], progress: dict[str, dict] | None) -> list[str]:
    """The footer's lines: the fast loop after a slow run; after a pass, the next stage given the progress with
    this run recorded (None: progress is not tracked)."""
    lines = [fast_loop_hint(run)]
    if progress is not None and any(s.status == Status.PASS for s in run.stages):
        lines.append(next_stage_line(stages, progress))
    return [line for line in lines if line]
