"""The course's progress, like rustlings': which stages have passed, kept in the course directory.

`.theinference/progress.json` holds {"format_version": 1, "stages": {stage id: entry}}; an entry is
{"status", "at"} plus, since weights and timeouts are recorded, "weights" (a short name of the weights
graded against: a synthetic preset such as "tiny", "gpt2" for the 124M shape, else the shape) and
"timeout" (the seconds given with --timeout, or null). Older entries without them still read.

The course bundled with theinference (its solution, starter and mutants, in a source checkout or in the
installed package) keeps no progress at all: nothing is read from or written into it, and each run says so.
A course that cannot be written keeps none either, and says why.
"""

import json
import time
from pathlib import Path

from theinference.bundled import bundled_course_dir
from theinference.grading.judge.results import RunResult, StageResult, Status
from theinference.files import write_atomic
from theinference.grading.spec.stages import StageSpec
from theinference.grading.judge.oraclecost import PROOF_PRESET
from theinference.grading.spec.checks import ScalingCheck
from theinference.model.synth import PRESETS

PROGRESS_FILE = Path(".theinference") / "progress.json"


def read_progress(root: Path) -> tuple[dict[str, dict], str]:
    """(stage id -> {"status", "at"}, why the file was ignored or ""); no file is no progress, not a problem."""
    if bundled_course_dir(root) is not None:
        return {}, ""  # whatever an older version left there is not this user's progress
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


def weights_name(run: RunResult) -> str:
    """A short name for the weights a run was graded against: "tiny", "gpt2", or the shape."""
    if run.synthetic:
        return run.synthetic.preset
    if run.config == PRESETS["gpt2"].as_dict():
        return "gpt2"
    return f"{run.config.get('n_layer')}-layer, {run.config.get('n_embd')}-wide"


def stage_weights_name(run: RunResult, stage: StageResult) -> str:
    """The weights a stage was graded on: cache-scaling's own preset where it runs on it (always, or as its note says
    where it may run on the graded weights), else the run's."""
    if isinstance(stage.check, ScalingCheck) and (
        stage.check.params.weights == PROOF_PRESET or any(c.scaling and c.scaling.weights_note for c in stage.cases)
    ):
        return PROOF_PRESET
    return weights_name(run)


def record_progress(root: Path, run: RunResult, timeout: float | None = None) -> tuple[dict[str, dict], str]:
    """Remember each graded stage's status, weights and --timeout; return the progress with this run in it (also
    when it could not be saved) and a notice if a corrupt file was replaced, else ""."""
    stages, problem = read_progress(root)
    for stage in run.stages:
        stages[stage.id] = {
            "status": stage.status,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "weights": stage_weights_name(run, stage),
            "timeout": timeout,
        }
    if bundled_course_dir(root) is not None:
        return stages, (
            f"progress not kept: {root} belongs to the course bundled with theinference, which grading never "
            "writes into (`theinference init DIR` makes a course of your own, which keeps its progress)"
        )
    try:
        (root / PROGRESS_FILE).parent.mkdir(exist_ok=True)
        write_atomic(root / PROGRESS_FILE, json.dumps({"format_version": 1, "stages": stages}, indent=2) + "\n")
    except OSError as e:
        return stages, f"progress not kept: cannot write {root / PROGRESS_FILE} ({e.strerror or e})"
    return stages, f"notice: ignored {PROGRESS_FILE} ({problem}) and wrote it anew" if problem else ""


def describe_entry(entry: dict) -> str:
    """'pass (tiny weights, --timeout 5)': a stage's recorded status and what it was graded with."""
    found = [f"{entry['weights']} weights"] if isinstance(entry.get("weights"), str) else []
    timeout = entry.get("timeout")
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):  # an int may be too large for a float
        found.append(
            f"--timeout {entry['timeout']:g}"
            if isinstance(entry["timeout"], float)
            else f"--timeout {entry['timeout']}"
        )
    return f"{entry['status']} ({', '.join(found)})" if found else entry["status"]


def next_stage(stages: list[StageSpec], progress: dict[str, dict]) -> StageSpec | None:
    """The first stage, in course order, that has not passed; None when all have."""
    return next((s for s in stages if progress.get(s.id, {}).get("status") != Status.PASS), None)
