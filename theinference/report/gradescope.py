"""Gradescope's results.json: score, execution_time, tests[] with name, score, max_score, status, output, visibility."""

import json

from theinference.report.text import stage_summary
from theinference.results import RunResult


def render_gradescope(run: RunResult, version: str) -> str:
    earned, possible = run.points
    tests = [
        {
            "name": f"{stage.id}: {stage.title}",
            "score": round(stage.points, 4),
            "max_score": stage.max_points,
            "status": "passed" if stage.status == "pass" else "failed",
            "output": stage_summary(stage),
            "visibility": "visible",
        }
        for stage in run.stages
    ]
    seed = f", seed {run.seed}" if run.seed is not None else ""
    document = {
        "score": round(earned, 4),
        "max_score": possible,
        "execution_time": round(sum(s.seconds for s in run.stages), 3),
        "output": f"theinference {version}: {sum(s.status == 'pass' for s in run.stages)} of {len(run.stages)} "
                  f"stages passed, {earned:g}/{possible:g} points (weights: {run.weights_path}{seed}; "
                  f"isolation: {run.isolation}: {run.isolation_summary})",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }
    return json.dumps(document, indent=2) + "\n"
