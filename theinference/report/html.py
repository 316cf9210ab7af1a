"""The class report: one self-contained HTML file (inline CSS and SVG, no script, nothing fetched).

It renders a batch JSON document and the ClassView counted from it. At the top, what a TA acts
on: who timed out, crashed, ended machine-busy or could not be graded, by name; the student ×
stage grid (status colour and points, each cell a link to its section; run time per submission);
the copies `grade` flagged. Then per-stage pass rates, the distribution of points (mean, median,
spread), the known bugs found across the class with links to each sighting, and a section per
submission with its copies (the matching passages side by side), its stage tables, an
error-by-position plot per failing case, and the diagnosis (shape, finding, hint): report/htmlsubmission.py.
Every text from a submission is escaped.
"""

from html import escape

from theinference.report.statuses import presentation
from theinference.grading.judge.results import Status
from theinference.report.htmlsubmission import number, seconds_text, status_cell, submission_section
from theinference.grading.tools.classview import ClassView, Sighting, anchor

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;margin-top:2em}h3{margin-bottom:.3em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.2em .5em;text-align:left;
vertical-align:top}th{background:#f4f4f4}.pass{color:#17702b}.fail,.error,.timeout,.crash{color:#b00020}
.not-started{color:#8a6d00}pre{background:#f7f7f7;padding:.5em;overflow-x:auto;white-space:pre-wrap}
.meta{color:#666;font-size:.9em}section.submission{border-top:3px solid #eee;margin-top:2em}
.diag{background:#fff8e6;border-left:4px solid #e0a800;padding:.4em .8em;margin:.4em 0}
.finding{font-weight:600}svg text{font:11px sans-serif;fill:#444}
table.grid td{text-align:center;white-space:nowrap}table.grid td.name{text-align:left}
table.grid td a{display:block;color:inherit;text-decoration:none}
td.c-pass{background:#dff3e3}td.c-fail{background:#fbe0e3}td.c-too-slow{background:#fdf0d5}td.c-error,td.c-timeout,td.c-crash{background:#f4c7cc}
td.c-not-started,td.c-unproven{background:#fff1c2}td.c-not-graded{background:#eee;color:#888}
.trouble{background:#fdecee;border-left:4px solid #b00020;padding:.4em .8em}
.copy{background:#eef3fb;border-left:4px solid #4a78b5;padding:.4em .8em;margin:.4em 0}
.sidebyside{display:flex;gap:1em}.sidebyside pre{flex:1;margin:.2em 0;font-size:.85em}
"""

_STATUS_ORDER = ("pass", "fail", "too-slow", "unproven", "not-started", "error", "timeout", "crash", "not graded")


def _bar(fraction: float, width: int = 160) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return (
        f'<svg width="{width}" height="12" role="img" aria-label="{fraction:.0%}">'
        f'<rect width="{width}" height="12" fill="#eee"/><rect width="{filled}" height="12" fill="#3a8f4f"/></svg>'
    )


def _pass_rates(view: ClassView) -> str:
    rows = []
    for s in view.stages:
        others = ", ".join(f"{n} {escape(k)}" for k, n in sorted(s.statuses.items(), key=_order) if k != "pass")
        rows.append(
            f'<tr class="stage-rate" data-stage="{escape(s.id)}" data-passed="{s.passed}" data-total="{s.total}">'
            f"<td><code>{escape(s.id)}</code></td><td>{escape(s.title)}</td>"
            f"<td>{s.passed} of {s.total}</td><td>{_bar(s.rate)} {s.rate:.0%}</td><td>{others}</td></tr>"
        )
    head = "<tr><th>stage</th><th>title</th><th>passed</th><th>pass rate</th><th>the others</th></tr>"
    return f"<h2>Stages</h2><table>{head}{''.join(rows)}</table>"


def _order(item) -> int:
    return _STATUS_ORDER.index(item[0]) if item[0] in _STATUS_ORDER else len(_STATUS_ORDER)


def _histogram(points: list[float], max_points: float, bins: int = 10) -> list[tuple[float, float, int]]:
    """(low, high, count) per bin of [0, max_points]; the last bin includes max_points."""
    if max_points <= 0:
        return [(0.0, 0.0, len(points))]
    width = max_points / bins
    counts = [0] * bins
    for p in points:
        counts[min(bins - 1, max(0, int(p // width)))] += 1
    return [(i * width, (i + 1) * width, n) for i, n in enumerate(counts)]


def _points(view: ClassView) -> str:
    bins = _histogram(view.points, view.max_points)
    tallest = max((n for *_, n in bins), default=0) or 1
    bar_w, height = 44, 120
    bars = []
    for i, (low, high, n) in enumerate(bins):
        h = round(n / tallest * height)
        x = i * bar_w
        bars.append(
            f'<g class="bin" data-low="{low:g}" data-high="{high:g}" data-count="{n}">'
            f'<rect x="{x + 2}" y="{height - h + 14}" width="{bar_w - 4}" height="{h}" fill="#4a78b5"/>'
            f'<text x="{x + bar_w / 2}" y="{height - h + 10}" text-anchor="middle">{n}</text>'
            f'<text x="{x + bar_w / 2}" y="{height + 28}" text-anchor="middle">{low:g}–{high:g}</text></g>'
        )
    svg = (
        f'<svg width="{bar_w * len(bins)}" height="{height + 34}" role="img" '
        f'aria-label="points distribution">{"".join(bars)}</svg>'
    )
    stats = view.stats
    figures = (
        f'<p class="point-stats" data-mean="{stats.mean:g}" data-median="{stats.median:g}" '
        f'data-stdev="{stats.stdev:g}">{len(view.points)} submissions, of {view.max_points:g} points: '
        f"mean {stats.mean:.3g} · median {stats.median:.3g} · standard deviation {stats.stdev:.3g} · "
        f"middle half {stats.quartiles[0]:.3g}–{stats.quartiles[1]:.3g} · range {stats.low:g}–{stats.high:g}</p>"
        if stats is not None
        else "<p>No submissions.</p>"
    )
    return (
        f"<h2>Points</h2>{figures}<p>{view.statuses.get('pass', 0)} passed every stage, "
        f"{view.statuses.get('error', 0)} could not be graded</p>" + svg
    )


def _trouble(view: ClassView) -> str:
    """Who must be looked at, by name: a timeout, a crash, a machine-busy case (regrade it), no grade at all."""
    if not view.trouble:
        return "<p class=meta>No submission timed out, crashed, ended machine-busy or failed to be graded.</p>"
    why = {
        Status.TIMEOUT: presentation(Status.TIMEOUT).words,
        Status.CRASH: presentation(Status.CRASH).words,
        "machine-busy": "ended machine-busy (too little CPU to finish, even after retries: regrade on a quieter machine)",
        "could not be graded": "could not be graded at all",
    }
    items = []
    for kind, sightings in view.trouble.items():
        names = sorted({s.submission for s in sightings})
        items.append(
            f'<li class="trouble-kind" data-kind="{escape(kind)}" data-students="{len(names)}">'
            f"<b>{len(names)} {escape(why.get(kind, kind))}</b>: {_trouble_links(sightings)}</li>"
        )
    return f'<div class="trouble"><ul>{"".join(items)}</ul></div>'


def _trouble_links(sightings: list[Sighting]) -> str:
    """Each submission once, linked, with the stages it happened at."""
    by_sub: dict[str, list[Sighting]] = {}
    for s in sightings:
        by_sub.setdefault(s.submission, []).append(s)
    links = []
    for sub, found in sorted(by_sub.items()):
        stages = ", ".join(f'<a href="#{s.anchor}">{escape(s.stage)}</a>' for s in found if s.stage)
        links.append(f'<a href="#{anchor(sub)}">{escape(sub)}</a>' + (f" ({stages})" if stages else ""))
    return ", ".join(links)


def _grid(view: ClassView) -> str:
    """Student × stage: each cell its status colour and points, a link to the stage's section."""
    if not view.grid:
        return ""
    stage_ids = [c.stage for c in view.grid[0].cells]
    head = "<tr><th>submission</th><th>points</th>" + "".join(f"<th><code>{escape(s)}</code></th>" for s in stage_ids)
    rows = []
    for row in view.grid:
        cells = "".join(
            f'<td class="cell c-{escape(c.status.replace(" ", "-"))}" data-stage="{escape(c.stage)}" '
            f'data-status="{escape(c.status)}" title="{escape(c.stage)}: {escape(c.status)}">'
            + (
                f'<a href="#{c.anchor}">{escape(c.status)}<br>{c.points:g}/{c.max_points:g}</a>'
                if c.anchor
                else escape(c.status)
            )
            + "</td>"
            for c in row.cells
        )
        rows.append(
            f'<tr class="grid-row" data-submission="{escape(row.submission)}" data-seconds="{"" if row.seconds is None else f"{row.seconds:.2f}"}">'
            f'<td class="name"><a href="#{row.anchor}">{escape(row.submission)}</a></td>'
            f"<td>{row.points:g}/{row.max_points:g}</td>{cells}<td>{seconds_text(row.seconds)}</td></tr>"
        )
    return f'<h2>Students × stages</h2><table class="grid">{head}<th>run time</th></tr>{"".join(rows)}</table>'


def _copies(view: ClassView) -> str:
    head = "<tr><th>submission</th><th>much of its code is also</th><th>similarity</th><th>its files</th></tr>"
    rows = []
    for c in view.copies:
        of = f'<a href="#{c.of_anchor}">{escape(c.of)}</a>' if c.of_anchor else f"<b>{escape(c.of)}</b>"
        share = "" if c.similarity is None else f"{c.similarity:.0%}"
        rows.append(
            f'<tr class="copy-row" data-submission="{escape(c.submission)}" data-of="{escape(c.of)}" '
            f'data-similarity="{"" if c.similarity is None else f"{c.similarity:g}"}">'
            f'<td><a href="#{c.anchor}">{escape(c.submission)}</a></td><td>{of}</td><td>{share}</td>'
            f"<td>{' '.join(f'<code>{escape(f)}</code>' for f in c.files)}</td></tr>"
        )
    body = f"<table>{head}{''.join(rows)}</table>" if rows else "<p>No copy flagged.</p>"
    return (
        "<h2>Possible copies</h2><p class=meta>Similarity: the share of a submission's code (starter code left out; "
        "between two submissions, code not in the reference solution) also found in the other's, compared on tokens "
        "blind to renamed locals, reordering, comments and layout. A flag, never a grade: a person looks at the "
        "passages in the submission's section.</p>" + body
    )


def _links(sightings) -> str:
    return ", ".join(
        f'<a href="#{s.anchor}">{escape(s.submission)} · {escape(s.stage)}</a>'
        for s in sorted(sightings, key=lambda s: (s.submission, s.stage))
    )


def _findings(view: ClassView) -> str:
    head = "<tr><th>bug</th><th>students</th><th>stages</th><th>where</th></tr>"
    rows = [
        f'<tr class="finding-row" data-bug="{escape(f.bug)}" data-students="{len(f.students)}">'
        f"<td><code>{escape(f.bug)}</code></td><td>{len(f.students)} of {view.submissions}</td>"
        f"<td>{', '.join(f'<code>{escape(s)}</code>' for s in f.stages)}</td><td>{_links(f.sightings)}</td></tr>"
        for f in view.findings
    ]
    for f in view.unexplained:
        shape = f" (shape <code>{escape(f.shape)}</code>)" if f.shape else ""
        rows.append(
            f'<tr class="finding-row" data-bug="" data-shape="{escape(f.shape)}" data-students="{len(f.students)}">'
            f"<td>no known bug named{shape}</td><td>{len(f.students)} of {view.submissions}</td>"
            f"<td>{', '.join(f'<code>{escape(s)}</code>' for s in f.stages)}</td><td>{_links(f.sightings)}</td></tr>"
        )
    body = f"<table>{head}{''.join(rows)}</table>" if rows else "<p>No failing stage had a diagnosis.</p>"
    return (
        "<h2>Bugs found across the class</h2><p class=meta>A failing stage's output compared with GPT-2 computed "
        "with each known bug: a match names the bug, with its numbers in the submission's section. A failing stage "
        "that names none is counted by the shape of its failure (cache-scaling's <code>no-cache</code>, "
        "<code>too-slow</code>).</p>" + body
    )


def render_class_html(doc: dict, view: ClassView, source: str) -> str:
    """The whole report as one HTML document."""
    graded = doc.get("graded_with") or {}
    meta = " · ".join(f"{escape(k)} {escape(str(v))}" for k, v in graded.items() if v not in (None, ""))
    index = "".join(
        f'<li><a href="#{anchor(s["id"])}">{escape(s["id"])}</a> {status_cell(str(s.get("status", "")))} '
        f"{number(s.get('points')):g}/{number(s.get('max_points')):g}</li>"
        for s in doc["submissions"]
    )
    body = [
        f'<h1 id="top">theinference: the class ({view.submissions} submissions)</h1>',
        f"<p class=meta>from {escape(source)} · {meta}</p>",
        _trouble(view),
        _grid(view),
        _copies(view),
        _pass_rates(view),
        _points(view),
        _findings(view),
        f"<h2>Submissions</h2><ul>{index}</ul>",
        *(submission_section(s) for s in doc["submissions"]),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">"
        f"<title>theinference class report</title><style>{_CSS}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )
