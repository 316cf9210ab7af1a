"""The course's progress, like rustlings': which stages have passed, kept in the course directory."""

import json
import time
from pathlib import Path

from theinference.results import RunResult
from theinference.stages import StageSpec

PROGRESS_FILE = Path(".theinference") / "progress.json"


def load_progress(root: Path) -> dict[str, dict]:
    """stage id -> {"status", "at"} for every stage graded in this course; {} if none (or unreadable)."""
    try:
        data = json.loads((root / PROGRESS_FILE).read_text())
        return data.get("stages", {}) if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def record_progress(root: Path, run: RunResult) -> None:
    """Remember each graded stage's status (a read-only course just keeps no progress)."""
    stages = load_progress(root)
    for stage in run.stages:
        stages[stage.id] = {"status": stage.status, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        (root / PROGRESS_FILE).parent.mkdir(exist_ok=True)
        (root / PROGRESS_FILE).write_text(json.dumps({"format_version": 1, "stages": stages}, indent=2) + "\n")
    except OSError:
        pass


def next_stage(stages: list[StageSpec], progress: dict[str, dict]) -> StageSpec | None:
    """The first stage, in course order, that has not passed; None when all have."""
    return next((s for s in stages if progress.get(s.id, {}).get("status") != "pass"), None)
