"""The class report's top, what a TA acts on, from a batch document written by hand (no grading: fast)."""

from test_class_report import Elements
from theinference.grading.tools.classview import class_view, point_stats
from theinference.report.html import render_class_html

STAGES = ["forward", "greedy"]


def stage(stage_id: str, status: str, points: float, *cases: dict) -> dict:
    return {
        "id": stage_id,
        "title": stage_id,
        "status": status,
        "points": points,
        "max_points": 5,
        "cases": list(cases),
    }


def sub(sub_id: str, stages: list[dict] | None, seconds: float = 3.0, copy_of: list | None = None) -> dict:
    earned = sum(s["points"] for s in stages or [])
    return {
        "id": sub_id,
        "status": "error" if stages is None else ("pass" if all(s["status"] == "pass" for s in stages) else "fail"),
        "points": earned,
        "max_points": 10,
        "seconds": seconds,
        "error": "" if stages is not None else "tests/adapters.py: adapters file not found",
        "copy_of": copy_of or [],
        "results": None if stages is None else {"stages": stages},
    }


REGION = {
    "file": "src/kvcache.py",
    "lines": [3, 9],
    "other_file": "src/kvcache.py",
    "other_lines": [4, 10],
    "text": "def prefill(<script>)",
    "other_text": "def prefill(params)",
}

DOC = {
    "schema": "theinference.batch",
    "stages": STAGES,
    "graded_with": {},
    "submissions": [
        sub("alice", [stage("forward", "pass", 5), stage("greedy", "pass", 5)], seconds=12.5),
        sub("bob", [stage("forward", "pass", 5), stage("greedy", "timeout", 0, {"name": "long", "status": "timeout"})]),
        sub("carol", [stage("forward", "crash", 0, {"name": "two", "status": "crash"}), stage("greedy", "fail", 0)]),
        sub(
            "dave",
            [
                stage("forward", "pass", 5),
                stage("greedy", "timeout", 0, {"name": "long", "status": "timeout", "detail": "machine-busy"}),
            ],
            copy_of=[{"of": "alice", "files": ["src/kvcache.py"], "similarity": 0.91, "regions": [REGION]}],
        ),
        sub("erin", None),
    ],
}


def page() -> Elements:
    return Elements(render_class_html(DOC, class_view(DOC), "grades.json"))


def test_who_timed_out_crashed_ended_machine_busy_or_was_not_graded_is_named_at_the_top():
    shown = page()
    kinds = {a["data-kind"]: a["data-students"] for a in shown.with_class("trouble-kind")}
    assert kinds == {"timeout": "1", "crash": "1", "machine-busy": "1", "could not be graded": "1"}
    busy = next(a for a in shown.with_class("trouble-kind") if a["data-kind"] == "timeout")
    assert busy["data-students"] == "1"  # bob; dave's machine-busy timeout is the machine's, named as that alone
    text = "".join(shown.text)
    assert text.index("timed out") < text.index("Students × stages") < text.index("Stages")
    for name, where in (("bob", "#s-bob--greedy"), ("carol", "#s-carol--forward"), ("dave", "#s-dave--greedy")):
        assert where in shown.hrefs(), name
    assert "#s-erin" in shown.hrefs()


def test_the_grid_has_a_coloured_cell_per_student_and_stage_and_each_run_time():
    shown = page()
    cells = shown.with_class("cell")
    assert [(c["data-stage"], c["data-status"]) for c in cells][:4] == [
        ("forward", "pass"),
        ("greedy", "pass"),
        ("forward", "pass"),
        ("greedy", "timeout"),
    ]
    assert "c-timeout" in cells[3]["class"].split() and "c-not-graded" in cells[-1]["class"].split()
    rows = {r["data-submission"]: r["data-seconds"] for r in shown.with_class("grid-row")}
    assert rows["alice"] == "12.50" and rows["erin"] == "3.00"
    assert "12 s" in "".join(shown.text)


def test_points_show_median_and_spread_besides_the_mean():
    stats = point_stats([10, 5, 5, 0, 0])
    assert (stats.mean, stats.median, stats.low, stats.high) == (4, 5, 0, 10)
    assert round(stats.stdev, 3) == 3.742 and stats.quartiles == (0, 5)
    text = " ".join("".join(page().text).split())
    assert "mean 4 · median 5 · standard deviation 3.74 · middle half 0–5 · range 0–10" in text


def test_a_flagged_copy_is_listed_with_its_similarity_and_its_passages_escaped():
    html = render_class_html(DOC, class_view(DOC), "grades.json")
    shown = Elements(html)
    rows = shown.with_class("copy-row")
    assert [(r["data-submission"], r["data-of"], r["data-similarity"]) for r in rows] == [("dave", "alice", "0.91")]
    assert "#s-alice" in shown.hrefs() and "#s-dave--copies" in shown.hrefs()
    assert "src/kvcache.py:3–9 ↔ alice src/kvcache.py:4–10" in "".join(shown.text)
    assert "<script>" not in html and "def prefill(&lt;script&gt;)" in html


def test_a_document_from_before_similarities_still_renders():
    old = {**DOC, "submissions": [{**DOC["submissions"][3], "copy_of": [{"of": "alice", "files": ["src/a.py"]}]}]}
    shown = Elements(render_class_html(old, class_view(old), "old.json"))
    assert [r["data-similarity"] for r in shown.with_class("copy-row")] == [""]
