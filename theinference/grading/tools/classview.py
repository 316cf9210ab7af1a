"""The class as a whole, read from a batch JSON document (`grade --format json`): what `theinference report` shows.

Everything here is counted from the document alone, so a report can be made long after the
batch, on another machine: per-stage pass counts, the distribution of points, and which known
bugs the fingerprints named, for how many students, at which stages.
"""

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from theinference.errors import ConfigError
from theinference.grading.drive.batch import BATCH_SCHEMA


class ClassViewError(ConfigError):
    """The file is not a batch JSON document that `grade --format json` wrote."""


@dataclass(frozen=True)
class StageCount:
    id: str
    title: str
    passed: int
    graded: int  # submissions with a result for this stage (an ungradable submission has none)
    total: int  # every submission in the batch
    statuses: dict  # status -> how many submissions

    @property
    def rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


@dataclass(frozen=True)
class Sighting:
    """One submission's stage whose fingerprint named a bug."""

    submission: str
    stage: str
    anchor: str  # the id of that stage's section in the report


@dataclass
class Finding:
    """A bug the fingerprints named (bug set), or a shape seen where no known bug was named (bug "")."""

    bug: str
    shape: str = ""
    sightings: list[Sighting] = field(default_factory=list)

    @property
    def students(self) -> list[str]:
        return sorted({s.submission for s in self.sightings})

    @property
    def stages(self) -> list[str]:
        return sorted({s.stage for s in self.sightings})


@dataclass
class ClassView:
    submissions: int
    graded: int  # submissions the grader could run at all
    statuses: dict  # pass | fail | error -> how many
    stages: list[StageCount]
    points: list[float]  # every submission's points, in submission order
    max_points: float
    findings: list[Finding]  # most students first
    # failing stages whose diagnosis named no known bug, by shape (cache-scaling's no-cache among them)
    unexplained: list[Finding]


def anchor(submission_id: str, stage_id: str = "") -> str:
    """The HTML id of a submission's section (or of one of its stages): only [A-Za-z0-9_-]."""
    safe = "".join(c if c.isalnum() or c in "-_" else f"_{ord(c):x}" for c in submission_id)
    return f"s-{safe}" + (f"--{stage_id}" if stage_id else "")


def load_batch(path: Path) -> dict:
    """The batch document in path; a clear error (exit 2) for anything else."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ClassViewError(f"{path}: cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ClassViewError(f"{path}: not a JSON document: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != BATCH_SCHEMA:
        raise ClassViewError(
            f"{path}: not the output of `theinference grade --format json` (field 'schema' is not {BATCH_SCHEMA!r})"
        )
    subs = doc.get("submissions")
    if not isinstance(subs, list) or not all(isinstance(s, dict) and isinstance(s.get("id"), str) for s in subs):
        raise ClassViewError(f"{path}: field 'submissions': not a list of submissions with an 'id'")
    if doc.get("interrupted"):
        raise ClassViewError(f"{path}: field 'interrupted': {doc['interrupted']}; grade the batch again")
    return doc


def stage_results(sub: dict) -> list[dict]:
    """A submission's stage documents ([] when it could not be graded)."""
    results = sub.get("results") or {}
    return [s for s in results.get("stages", []) if isinstance(s, dict)]


def _bugs(diagnosis: dict) -> list[str]:
    """The bugs a results document's diagnosis names: its `bugs` list (documents before it: `bug`, comma-separated)."""
    listed = diagnosis.get("bugs")
    if isinstance(listed, list):
        return [str(b) for b in listed if b]
    return [b for b in str(diagnosis.get("bug") or "").split(", ") if b]


def class_view(doc: dict) -> ClassView:
    """Count the class from a batch document (see load_batch)."""
    subs = doc["submissions"]
    stage_ids = [s for s in doc.get("stages", []) if isinstance(s, str)]
    titles: dict[str, str] = {}
    statuses: dict[str, Counter] = {s: Counter() for s in stage_ids}
    findings: dict[str, Finding] = {}
    unexplained: dict[str, Finding] = {}
    for sub in subs:
        by_id = {s.get("id"): s for s in stage_results(sub)}
        for stage_id in stage_ids:
            stage = by_id.get(stage_id)
            if stage is None:
                statuses[stage_id]["not graded"] += 1
                continue
            titles[stage_id] = stage.get("title", "")
            statuses[stage_id][stage.get("status", "")] += 1
            diagnosis = stage.get("diagnosis") or {}
            if stage.get("status") != "fail" or not diagnosis:
                continue
            sighting = Sighting(sub["id"], stage_id, anchor(sub["id"], stage_id))
            bugs = _bugs(diagnosis)
            for bug in bugs:
                findings.setdefault(bug, Finding(bug)).sightings.append(sighting)
            if not bugs:
                shape = str(diagnosis.get("shape") or "")
                unexplained.setdefault(shape, Finding("", shape)).sightings.append(sighting)
    counts = [
        StageCount(
            id=s,
            title=titles.get(s, ""),
            passed=statuses[s]["pass"],
            graded=sum(n for k, n in statuses[s].items() if k != "not graded"),
            total=len(subs),
            statuses=dict(statuses[s]),
        )
        for s in stage_ids
    ]
    max_points = max((float(s.get("max_points") or 0) for s in subs), default=0.0)
    return ClassView(
        submissions=len(subs),
        graded=sum(s.get("results") is not None for s in subs),
        statuses=dict(Counter(s.get("status", "") for s in subs)),
        stages=counts,
        points=[float(s.get("points") or 0) for s in subs],
        max_points=max_points,
        findings=sorted(findings.values(), key=lambda f: (-len(f.students), f.bug)),
        unexplained=sorted(unexplained.values(), key=lambda f: (-len(f.students), f.shape)),
    )
