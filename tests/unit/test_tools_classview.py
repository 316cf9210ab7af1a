"""grading/tools/classview.py: the class counted from a batch document, as the HTML report shows it."""

from theinference.grading.tools.classview import class_view, shown_status
from theinference.report.html import render_class_html


def _sub(sid: str, status: str, shape: str | None = None) -> dict:
    stage = {"id": "cache-scaling", "title": "The cache", "status": status, "points": 10 if status == "pass" else 0}
    stage |= {"max_points": 10, "cases": [], "diagnosis": {"shape": shape, "bugs": []} if shape else None}
    run = {"schema": "theinference.results", "status": status, "stages": [stage]}
    return {
        "id": sid,
        "path": f"/s/{sid}",
        "status": status,
        "points": stage["points"],
        "max_points": 10,
        "seconds": 1.0,
        "copy_of": [],
        "results": run,
    }


def test_a_too_slow_cache_is_counted_and_shown_apart_from_a_fail():
    subs = [_sub("slow", "fail", "too-slow"), _sub("missing", "fail", "no-cache"), _sub("ok", "pass")]
    assert [shown_status(s["results"]["stages"][0]) for s in subs] == ["too-slow", "fail", "pass"]
    doc = {"schema": "theinference.batch", "submissions": subs, "stages": ["cache-scaling"]}
    view = class_view(doc)
    assert view.stages[0].statuses == {"too-slow": 1, "fail": 1, "pass": 1}
    cells = {row.submission: row.cells[0].status for row in view.grid}
    assert cells == {"slow": "too-slow", "missing": "fail", "ok": "pass"}
    page = render_class_html(doc, view, "grades.json")
    assert 'data-status="too-slow"' in page and "1 too-slow" in page
