"""A submission's section of the class report (report/html.py): its copies with the matching passages side by side,
each stage's table of cases, an error-by-position plot per failing case, the diagnosis, the cache proof's figures;
and the cells the class overview shows too (a status, a number from the JSON document, seconds). Every text from a
submission is escaped.
"""

import math
from html import escape

from theinference.report.text import guarantee_text, timed_calls
from theinference.grading.tools.classview import anchor, stage_results


def number(value) -> float:
    """A JSON number, or the strings "inf"/"nan" the results document writes for non-finite ones."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def status_cell(status: str) -> str:
    return f'<span class="{escape(status)}">{escape(status)}</span>'


def seconds_text(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def _copy_section(sub: dict) -> str:
    entries = [e for e in sub.get("copy_of") or [] if isinstance(e, dict)]
    if not entries:
        return ""
    out = [f'<section class="copies" id="{anchor(sub["id"], "copies")}">']
    for entry in entries:
        share = entry.get("similarity")
        figure = f" (similarity {number(share):.0%})" if isinstance(share, (int, float)) else ""
        out.append(f"<div class=copy><b>much of this code is also {escape(str(entry.get('of', '')))}'s{figure}</b>")
        for region in entry.get("regions") or []:
            if isinstance(region, dict):
                out.append(_region(region, str(entry.get("of", ""))))
        out.append("</div>")
    return "".join(out) + "</section>"


def _lines(value) -> str:
    return "–".join(str(int(number(n))) for n in value) if isinstance(value, list) and len(value) == 2 else "?"


def _region(region: dict, of: str) -> str:
    mine = f"{escape(str(region.get('file', '')))}:{_lines(region.get('lines'))}"
    theirs = f"{escape(of)} {escape(str(region.get('other_file', '')))}:{_lines(region.get('other_lines'))}"
    text, other = str(region.get("text", "")), str(region.get("other_text", ""))
    if not text and not other:  # a pair `grade merge` found across shards: their files carry fingerprints, not code
        return (
            f'<div class="region"><div class=meta>{mine} ↔ {theirs}</div><p class=meta>the passages\' text is not in '
            "the shard files (they carry fingerprints, not code): open the two files at these lines</p></div>"
        )
    return (
        f'<div class="region"><div class=meta>{mine} ↔ {theirs}</div><div class="sidebyside">'
        f"<pre>{escape(text)}</pre><pre>{escape(other)}</pre></div></div>"
    )


def _error_plot(rows: list[dict], label: str) -> str:
    """max |Δ| by position on a log scale; rows outside tolerance in red, non-finite ones at the top."""
    points = [(int(r.get("position", i)), number(r.get("max_abs")), bool(r.get("ok"))) for i, r in enumerate(rows)]
    if not points:
        return ""
    finite = [v for _, v, _ in points if math.isfinite(v) and v > 0]
    low = math.floor(math.log10(min(finite))) if finite else -8
    high = math.ceil(math.log10(max(finite))) if finite else 0
    high = max(high, low + 1)
    xs = [p for p, _, _ in points]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    w, h, left, top = 420, 120, 48, 8

    def x(p: int) -> float:
        return left + (p - x0) / (x1 - x0) * w

    def y(v: float) -> float:
        if not math.isfinite(v):
            return top
        level = math.log10(v) if v > 0 else low
        return top + h - (level - low) / (high - low) * h

    line = " ".join(f"{x(p):.1f},{y(v):.1f}" for p, v, _ in points)
    dots = "".join(
        f'<circle cx="{x(p):.1f}" cy="{y(v):.1f}" r="3" fill="{"#3a8f4f" if ok else "#b00020"}">'
        f"<title>position {p}: max |Δ| {v:.3g}</title></circle>"
        for p, v, ok in points
    )
    return (
        f'<svg class="error-plot" width="{w + left + 10}" height="{h + top + 30}" role="img" '
        f'aria-label="{escape(label)}"><line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#999"/>'
        f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#999"/>'
        f'<text x="{left - 4}" y="{top + 10}" text-anchor="end">1e{high}</text>'
        f'<text x="{left - 4}" y="{top + h}" text-anchor="end">1e{low}</text>'
        f'<text x="{left}" y="{top + h + 14}">{x0}</text>'
        f'<text x="{left + w}" y="{top + h + 14}" text-anchor="end">{x1}</text>'
        f'<text x="{left + w / 2}" y="{top + h + 26}" text-anchor="middle">position → (max |Δ| per row, log)</text>'
        f'<polyline points="{line}" fill="none" stroke="#888"/>{dots}</svg>'
    )


def _diagnosis(d: dict | None, where: str) -> str:
    if not d:
        return ""
    parts = [f"<div class=diag><b>{escape(where)}</b>"]
    if d.get("shape"):
        parts.append(f"<div>shape: <code>{escape(d['shape'])}</code> — {escape(d.get('summary', ''))}</div>")
    if d.get("bug"):
        parts.append(
            f"<div class=finding>finding: <code>{escape(d['bug'])}</code>: {escape(d.get('evidence', ''))}</div>"
        )
    elif d.get("evidence"):
        parts.append(f"<div>known bugs: {escape(d['evidence'])}</div>")
    if d.get("hint"):
        parts.append(f"<div>hint: {escape(d['hint'])}</div>")
    return "".join(parts) + "</div>"


def _timed_calls(calls: list) -> str:
    diagnostic = sum(1 for c in calls if isinstance(c, dict) and c.get("diagnostic") is True)
    return timed_calls(len(calls), diagnostic)


def _ms(value) -> str:
    v = number(value)
    return "" if math.isnan(v) else f"{v:.3g}"


def _figures(t: dict) -> list[str]:
    """(a) and (b), each only once its calls ran (the document's ratio and fraction are null until then)."""
    least = "at least " if t.get("stopped_at") == t["lengths"][-1] else ""  # the longest call was stopped
    ratio, fraction, lines = number(t.get("ratio")), number(t.get("fraction_of_recompute")), []
    if not math.isnan(ratio):
        lines.append(
            f"(a) per-token cost {least}×{ratio:.2f} from {t['lengths'][0]} to {t['lengths'][-1]} tokens "
            f"(at most ×{number(t.get('max_ratio')):g} passes)"
        )
    if not math.isnan(fraction):
        lines.append(
            f"(b) {t['lengths'][-1]} tokens cost {least}{fraction:.0%} of the oracle's full recompute here "
            f"(at most {number(t.get('max_fraction')):.0%} passes)"
        )
    return lines


def _scaling(case: dict) -> str:
    """cache-scaling's numbers as the terminal shows them: CPU ms per token by length, both tests, the accounting."""
    t = case.get("scaling")
    if not isinstance(t, dict) or not t.get("lengths"):
        return ""
    rows = []
    for n, per, marginal in zip(t["lengths"], t.get("ms_per_token") or [], t.get("marginal_ms_per_token") or []):
        if per is None:  # the case ended before a call of this length ran
            continue
        stopped = n == t.get("stopped_at")
        rows.append(
            f'<tr class="scaling-row" data-tokens="{escape(str(n))}" data-stopped="{str(stopped).lower()}">'
            f"<td>{escape(str(n))}</td><td>{'&gt; ' if stopped else ''}{_ms(per)}{' (stopped)' if stopped else ''}</td>"
            f"<td>{'' if stopped or marginal is None else _ms(marginal)}</td></tr>"
        )
    head = "<tr><th>tokens</th><th>CPU ms/token</th><th>marginal ms/token</th></tr>"
    lines = [
        f"counted by the grader ({escape(str(t.get('accounting', '')))}): CPU of the whole process tree in "
        f"{_timed_calls(t.get('calls') or [])}, the cheapest call of each length counting",
        *_figures(t),
    ]
    if t.get("weights_note"):
        lines.insert(0, escape(str(t["weights_note"])))
    guarantee = guarantee_text(str(t.get("guarantee", "")), str(t.get("accounting", "")))
    if guarantee:
        lines.append(f'<span class="guarantee">{escape(guarantee)}</span>')
    speedup = number(t.get("speedup"))
    if case.get("status") == "pass" and math.isfinite(speedup):
        lines.append(
            f"the cache: {t['lengths'][-1]} tokens in {number((t.get('cpu_seconds') or [math.nan])[-1]):.2f} s of "
            f"CPU; a full recompute: {number(t.get('oracle_cpu_seconds')):.2f} s; {speedup:.1f}× faster"
        )
    figures = "".join(f"<div>{line}</div>" for line in lines)
    return f'<div class="scaling"><table>{head}{"".join(rows)}</table><div class=meta>{figures}</div></div>'


def _case_rows(case: dict) -> str:
    first_bad = case.get("first_bad_row")
    rows = case.get("rows") or []
    worst = max((number(r.get("max_abs")) for r in rows), default=math.nan)
    return (
        f"<tr><td>{escape(str(case.get('name', '')))}</td><td>{status_cell(str(case.get('status', '')))}</td>"
        f"<td>{'' if first_bad is None else escape(str(first_bad))}</td><td>{len(rows) or ''}</td>"
        f"<td>{'' if math.isnan(worst) else f'{worst:.3g}'}</td>"
        f"<td>{escape(str(case.get('message', '')))}</td></tr>"
    )


def _stage_section(sub_id: str, stage: dict) -> str:
    cases = [c for c in stage.get("cases", []) if isinstance(c, dict)]
    head = "<tr><th>case</th><th>status</th><th>first bad row</th><th>rows</th><th>max |Δ|</th><th>message</th></tr>"
    out = [
        f'<section class="stage" id="{anchor(sub_id, str(stage.get("id", "")))}" data-status="{escape(str(stage.get("status")))}">'
        f"<h3><code>{escape(str(stage.get('id')))}</code> {status_cell(str(stage.get('status', '')))} · "
        f"{stage.get('passed_cases', 0)}/{stage.get('total_cases', len(cases))} cases · "
        f"{number(stage.get('points')):g}/{number(stage.get('max_points')):g} points</h3>",
        f"<table>{head}{''.join(_case_rows(c) for c in cases)}</table>",
        *(_scaling(c) for c in cases),
    ]
    if stage.get("status") == "pass":
        return "".join(out) + "</section>"
    if stage.get("cross_case"):
        rows = sorted((r for c in cases for r in c.get("rows") or []), key=lambda r: number(r.get("position")))
        out.append(_diagnosis(stage.get("diagnosis"), f"across {len(cases)} cases"))
        out.append(_error_plot(rows, f"{stage.get('id')}: error by position across cases"))
    else:
        for case in cases:
            if case.get("status") == "pass":
                continue
            out.append(_diagnosis(case.get("diagnosis"), f"case {case.get('name')}"))
            if case.get("rows"):
                out.append(_error_plot(case["rows"], f"{stage.get('id')} {case.get('name')}: error by position"))
            if case.get("traceback"):
                out.append(f"<pre>{escape(str(case['traceback']))}</pre>")
    return "".join(out) + "</section>"


def submission_section(sub: dict) -> str:
    sub_id = sub["id"]
    out = [
        f'<section class="submission" id="{anchor(sub_id)}" data-status="{escape(str(sub.get("status")))}">',
        f"<h2>{escape(sub_id)} {status_cell(str(sub.get('status', '')))} · "
        f"{number(sub.get('points')):g}/{number(sub.get('max_points')):g} points"
        + (f" · {seconds_text(number(sub['seconds']))}" if isinstance(sub.get("seconds"), (int, float)) else "")
        + "</h2>",
    ]
    if sub.get("error"):
        out.append(f"<pre>{escape(str(sub['error']))}</pre>")
    out.append(_copy_section(sub))
    out += [_stage_section(sub_id, stage) for stage in stage_results(sub)]
    return "".join(out) + '<p><a href="#top">back to the class</a></p></section>'
