"""Gradescope's results.json: score, execution_time, tests[] with name, score, max_score, status, output, visibility.

Only the keys of Gradescope's documented format are used (its autograder specification's "Output format"); the
submission's possible points, which that format has only per test, go in `extra_data` ("extra data to be stored").
"""

import dataclasses
import json

from theinference.report.text import run_summary, stage_summary
from theinference.grading.judge.results import RunResult, Status
from theinference.grading.spec.stages import StageSpec


def render_gradescope(run: RunResult, version: str) -> str:
    earned, possible = run.points
    tests = [
        {
            "name": f"{stage.id}: {stage.title}" + (" [from the course directory]" if stage.origin == "course" else ""),
            "score": round(stage.points, 4),
            "max_score": stage.max_points,
            "status": "passed" if stage.status == Status.PASS else "failed",
            "output": stage_summary(stage),
            "visibility": stage.visibility,
        }
        for stage in run.stages
    ]
    # The submission's line names only what the student may see now; a stage shown later is counted apart.
    shown = dataclasses.replace(run, stages=[s for s in run.stages if s.visibility == "visible"])
    later = len(run.stages) - len(shown.stages)
    withheld = f" ({later} more stage(s) shown after the due date or when grades are published)" if later else ""
    seed = f", seed {run.seed}" if run.seed is not None else ""
    document = {
        "score": round(earned, 4),
        "execution_time": round(sum(s.seconds for s in run.stages), 3),
        "output": f"theinference {version}: {run_summary(shown)}{withheld} (weights: {run.weights_path}{seed}; "
        f"isolation: {run.isolation}: {run.isolation_summary})"
        + "".join(f"\nnot the instructor's: {line}" for line in run.course_supplied),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "extra_data": {"max_score": possible},
    }
    return json.dumps(document, indent=2) + "\n"


def render_gradescope_ungraded(stages: list[StageSpec], error: str, version: str) -> str:
    """results.json for a submission that could not be graded at all: every stage 0 points, and why."""
    tests = [
        {
            "name": f"{s.id}: {s.title}",
            "score": 0,
            "max_score": s.points,
            "status": "failed",
            "output": f"not graded: {error}",
            "visibility": s.visibility,
        }
        for s in stages
    ]
    document = {
        "score": 0,
        "execution_time": 0,
        "output": f"theinference {version}: this submission could not be graded (0 points): {error}",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "extra_data": {"max_score": sum(s.points for s in stages)},
    }
    return json.dumps(document, indent=2) + "\n"
