"""The course's progress, like rustlings': which stages have passed, kept in the course directory."""

import json
import time
from pathlib import Path

from theinference.grading.results import RunResult
from theinference.grading.stages import StageSpec

PROGRESS_FILE = Path(".theinference") / "progress.json"


def read_progress(root: Path) -> tuple[dict[str, dict], str]:
    """(stage id -> {"status", "at"}, why the file was ignored or ""); no file is no progress, not a problem."""
    try:
        data = json.loads((root / PROGRESS_FILE).read_text())
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError) as e:
        return {}, f"not readable JSON ({e})"
    stages = data.get("stages") if isinstance(data, dict) else None
    if not isinstance(stages, dict):
        return {}, "no 'stages' object in it"
    bad = next((k for k, v in stages.items() if not isinstance(v, dict) or not isinstance(v.get("status"), str)), None)
    if bad is not None:
        return {}, f"entry '{bad}' is not a {{\"status\": ...}} object"
    return stages, ""


def load_progress(root: Path) -> dict[str, dict]:
    """stage id -> {"status", "at"} for every stage graded in this course; {} if none (or unreadable)."""
    return read_progress(root)[0]


def record_progress(root: Path, run: RunResult) -> str:
    """Remember each graded stage's status; return a one-line notice if a corrupt file was replaced, else ""."""
    stages, problem = read_progress(root)
    for stage in run.stages:
        stages[stage.id] = {"status": stage.status, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        (root / PROGRESS_FILE).parent.mkdir(exist_ok=True)
        (root / PROGRESS_FILE).write_text(json.dumps({"format_version": 1, "stages": stages}, indent=2) + "\n")
    except OSError:
        return ""  # a read-only course just keeps no progress
    return f"notice: ignored {PROGRESS_FILE} ({problem}) and wrote it anew" if problem else ""


def next_stage(stages: list[StageSpec], progress: dict[str, dict]) -> StageSpec | None:
    """The first stage, in course order, that has not passed; None when all have."""
    return next((s for s in stages if progress.get(s.id, {}).get("status") != "pass"), None)
