"""The class as a whole, read from a batch JSON document (`grade --format json`): what `theinference report` shows.

Everything here is counted from the document alone, so a report can be made long after the
batch, on another machine: the student × stage grid, who timed out, crashed or ended machine-busy,
per-stage pass counts, the distribution of points (mean, median, spread), which known bugs the
fingerprints named, for how many students, at which stages, and the copies `grade` flagged.
"""

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from theinference.errors import ConfigError
from theinference.grading.drive.batch import BATCH_SCHEMA
from theinference.grading.judge.grade import MACHINE_BUSY


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


@dataclass(frozen=True)
class Cell:
    """One submission's verdict on one stage ("not graded" when it has none)."""

    stage: str
    status: str
    points: float
    max_points: float
    anchor: str  # its section in the report ("" when not graded)


@dataclass(frozen=True)
class GridRow:
    submission: str
    status: str
    points: float
    max_points: float
    seconds: float | None  # the submission's grading time (None in a document without it)
    cells: tuple[Cell, ...]
    anchor: str


@dataclass(frozen=True)
class CopyFlag:
    """A copy `grade` flagged: much of submission's code is also `of`'s (the reference solution or a submission)."""

    submission: str
    of: str
    similarity: float | None  # share of the submission's code found in `of`'s (None: a document before it)
    files: tuple[str, ...]
    anchor: str  # the submission's copy section
    of_anchor: str  # `of`'s section when it is a submission of this batch, else ""


@dataclass(frozen=True)
class PointStats:
    mean: float
    median: float
    stdev: float  # population standard deviation
    low: float
    high: float
    quartiles: tuple[float, float]  # 25th and 75th percentiles


TROUBLE = ("timeout", "crash", MACHINE_BUSY, "could not be graded")  # what a TA must look at by name


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
    grid: list[GridRow] = field(default_factory=list)  # in submission order
    trouble: dict[str, list[Sighting]] = field(default_factory=dict)  # TROUBLE kind -> where, by name
    copies: list[CopyFlag] = field(default_factory=list)  # most similar first
    stats: PointStats | None = None  # None for an empty batch


def point_stats(points: list[float]) -> PointStats | None:
    """Mean, median, spread and range of the points (None for no submissions)."""
    if not points:
        return None
    low_q, _, high_q = statistics.quantiles(points, n=4, method="inclusive") if len(points) > 1 else points * 3
    return PointStats(
        mean=statistics.fmean(points),
        median=statistics.median(points),
        stdev=statistics.pstdev(points),
        low=min(points),
        high=max(points),
        quartiles=(low_q, high_q),
    )


def _float(value, default: float = 0.0) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return number if math.isfinite(number) else default


def shown_status(stage: dict) -> str:
    """A stage's status as the class report shows it: a fail whose diagnosis is `too-slow` (a cache with a flat cost,
    but dearer than the floor) apart from other fails, since it asks for another fix than a missing cache does."""
    status = str(stage.get("status", ""))
    diagnosis = stage.get("diagnosis")
    if status == "fail" and isinstance(diagnosis, dict) and diagnosis.get("shape") == "too-slow":
        return "too-slow"
    return status


def _grid_row(sub: dict, stage_ids: list[str]) -> GridRow:
    by_id = {s.get("id"): s for s in stage_results(sub)}
    cells = []
    for stage_id in stage_ids:
        stage = by_id.get(stage_id)
        if stage is None:
            cells.append(Cell(stage_id, "not graded", 0.0, 0.0, ""))
            continue
        status = shown_status(stage)
        points, most = _float(stage.get("points")), _float(stage.get("max_points"))
        cells.append(Cell(stage_id, status, points, most, anchor(sub["id"], stage_id)))
    seconds = sub.get("seconds")
    return GridRow(
        submission=sub["id"],
        status=str(sub.get("status", "")),
        points=_float(sub.get("points")),
        max_points=_float(sub.get("max_points")),
        seconds=_float(seconds) if isinstance(seconds, (int, float)) else None,
        cells=tuple(cells),
        anchor=anchor(sub["id"]),
    )


def _trouble(subs: list[dict]) -> dict[str, list[Sighting]]:
    """Who timed out, crashed or ended machine-busy at which stage, and who could not be graded at all."""
    found: dict[str, list[Sighting]] = {kind: [] for kind in TROUBLE}
    for sub in subs:
        if sub.get("results") is None:
            found["could not be graded"].append(Sighting(sub["id"], "", anchor(sub["id"])))
        for stage in stage_results(sub):
            cases = [c for c in stage.get("cases", []) if isinstance(c, dict)]
            stage_id = str(stage.get("id", ""))
            # A machine-busy case ends as a timeout, but the machine's, not the code's: named as that alone.
            busy = [c for c in cases if c.get("detail") == MACHINE_BUSY]
            kinds = {c.get("status") for c in cases if c not in busy} | ({MACHINE_BUSY} if busy else set())
            for kind in ("timeout", "crash", MACHINE_BUSY):
                if kind in kinds:
                    found[kind].append(Sighting(sub["id"], stage_id, anchor(sub["id"], stage_id)))
    return {kind: sightings for kind, sightings in found.items() if sightings}


def _copies(subs: list[dict]) -> list[CopyFlag]:
    ids = {s["id"] for s in subs}
    flags = []
    for sub in subs:
        entries = sub.get("copy_of")
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("of"), str):
                continue
            similarity = entry.get("similarity")
            listed = entry.get("files")
            files = listed if isinstance(listed, list) else []
            flags.append(
                CopyFlag(
                    submission=sub["id"],
                    of=entry["of"],
                    similarity=_float(similarity) if isinstance(similarity, (int, float)) else None,
                    files=tuple(str(f) for f in files),
                    anchor=anchor(sub["id"], "copies"),
                    of_anchor=anchor(entry["of"]) if entry["of"] in ids else "",
                )
            )
    return sorted(flags, key=lambda f: (-(f.similarity or 0.0), f.submission, f.of))


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
            statuses[stage_id][shown_status(stage)] += 1
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
        grid=[_grid_row(sub, stage_ids) for sub in subs],
        trouble=_trouble(subs),
        copies=_copies(subs),
        stats=point_stats([float(s.get("points") or 0) for s in subs]),
    )
