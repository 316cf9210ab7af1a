"""The terminal report's tables: a failing case's rows by position (folded around the first divergence, its
columns fitted to the width), one table across one-row cases, a generation's tokens around the first mismatch, the
cache proof's cost per length; and the cells they are made of (a token with its text, an error sparkline)."""

import math
from typing import Literal

from rich import box
from rich.cells import cell_len
from rich.table import Table

from theinference.model import tokenizer
from theinference.grading.judge.results import CaseResult, RowStats

FOLD_BEFORE, FOLD_AFTER = 3, 8  # rows shown around the first divergence of a long case
FOLD_LIMIT = 16  # cases with more rows than this are folded
_SPARKS = "▁▂▃▄▅▆▇█"
_ASCII_SPARKS = "_.-:=+*#"


def token_label(token_id: int | None, width: int = 12) -> str:
    """`464 'The'`: an id with its text, shortened for a table cell."""
    if token_id is None:
        return ""
    text = repr(tokenizer.token_text(token_id))
    if len(text) > width:  # the ellipsis goes inside the quotes, which stay: 'Temperat…'
        text = text[: width - 2] + "…" + text[-1]
    return f"{token_id} {text}"


def _box(plain: bool) -> box.Box:
    return box.ASCII if plain else box.SIMPLE


def sparkline(values: list[float], plain: bool = False) -> str:
    """Error by position on a log scale, one character per row (x for NaN/inf)."""
    sparks, bad = (_ASCII_SPARKS, "x") if plain else (_SPARKS, "✕")
    finite = [v for v in values if math.isfinite(v) and v > 0]
    if not finite:
        return "".join(bad if not math.isfinite(v) else sparks[0] for v in values)
    lo, hi = math.log10(min(finite)), math.log10(max(finite))
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append(bad)
        elif v <= 0:
            out.append(sparks[0])
        else:
            level = 0 if hi == lo else round((math.log10(v) - lo) / (hi - lo) * (len(sparks) - 1))
            out.append(sparks[level])
    return "".join(out)


def _cell_float(value: float) -> str:
    return f"{value:.3g}"


def _worst_cell(row: RowStats, vocab: bool) -> str:
    where = token_label(row.worst_index) if vocab else f"[{row.worst_index}]"
    return f"{where}: {_cell_float(row.expected)} vs {_cell_float(row.got)}"


def _visible_rows(case: CaseResult) -> tuple[list[RowStats], list[RowStats]]:
    """(rows shown, rows folded away) for a long case, centred on the first divergence."""
    if len(case.rows) <= FOLD_LIMIT:
        return case.rows, []
    first = case.first_bad_row or 0
    lo, hi = max(0, first - FOLD_BEFORE), min(len(case.rows), first + FOLD_AFTER)
    return case.rows[lo:hi], case.rows[:lo] + case.rows[hi:]


# Divergence-table columns in display order: (key, title, justify).
_COLUMNS: dict[str, tuple[str, Literal["left", "right"]]] = {
    "row": ("row", "right"),
    "pos": ("pos", "right"),
    "case": ("case", "left"),
    "token": ("token", "left"),
    "max_abs": ("max |Δ|", "right"),
    "max_rel": ("max rel Δ", "right"),
    "out": ("out of tol", "right"),
    "worst": ("worst: expected vs got", "left"),
    "verdict": ("", "left"),
}
# Column priority on a narrow terminal. Always shown: where the row is (row or case, position,
# token), how far off it is (max |Δ|) and its verdict: what a student reads to find the first bad
# row. Then, each only if it still fits: how many elements are off (all, or a few?), the worst
# element (which logit or channel, with both values), and last the relative error (huge wherever
# the expected value is near zero, so the least telling). At 80 columns a logits table keeps the count
# and drops the worst element (the narrow relative error then still fits); 120 columns show all.
_OPTIONAL = ("out", "worst", "max_rel")
_GAP = 3  # " | " between columns (no outer edge or padding)


def _row_cells(row: RowStats, vocab: bool, verdict: str) -> dict[str, str]:
    pct = 100.0 * row.n_bad / row.n
    return {
        "row": str(row.row),
        "pos": str(row.position),
        "token": token_label(row.token),
        "max_abs": _cell_float(row.max_abs),
        "max_rel": _cell_float(row.max_rel),
        "out": f"{row.n_bad} ({pct:.0f}%)",
        "worst": _worst_cell(row, vocab),
        "verdict": verdict,
    }


def _verdict(row: RowStats, first: int | None) -> str:
    if row.row == first:
        return "◀ first"
    return "ok" if row.ok else ("NaN/inf" if row.n_nonfinite else "off")


def _natural_widths(keys: list[str], lines: list[dict[str, str]]) -> dict[str, int]:
    return {k: max([cell_len(_COLUMNS[k][0]), *(cell_len(cells.get(k, "")) for cells in lines)]) for k in keys}


def fit_columns(keys: list[str], lines: list[dict[str, str]], width: int) -> list[str]:
    """The columns to show at this width: every essential one, then optional ones by priority while they fit."""
    natural = _natural_widths(keys, lines)
    chosen = [k for k in keys if k not in _OPTIONAL]
    used = sum(natural[k] for k in chosen) + _GAP * (len(chosen) - 1)
    for key in (k for k in _OPTIONAL if k in keys):
        if used + _GAP + natural[key] <= width:
            chosen.append(key)
            used += _GAP + natural[key]
    return [k for k in keys if k in chosen]


def divergence_table(keys: list[str], lines: list[tuple[dict[str, str], str]], width: int, plain: bool) -> Table:
    """A table of (cells, style) lines showing the columns of keys that fit in width (see _OPTIONAL)."""
    table = Table(box=_box(plain), show_edge=False, pad_edge=False)
    shown = fit_columns(keys, [cells for cells, _ in lines], width)
    natural = _natural_widths(shown, [cells for cells, _ in lines])
    for key in shown:
        title, justify = _COLUMNS[key]
        # Only text columns may wrap: a number or a verdict cut to "1.…" says nothing.
        wraps = key in ("token", "case", "worst")
        table.add_column(
            title, justify=justify, no_wrap=not wraps, overflow="fold", min_width=None if wraps else natural[key]
        )
    for cells, style in lines:
        table.add_row(*(cells.get(key, "") for key in shown), style=style)
    return table


def rows_table(case: CaseResult, vocab: bool, plain: bool = False, width: int = 120) -> Table:
    """The per-position divergence table of a failing case, first divergent row highlighted."""
    shown, folded = _visible_rows(case)
    first = case.first_bad_row
    lines: list[tuple[dict[str, str], str]] = []
    if shown and shown[0].row > 0:
        lines.append(({"row": "…", "token": f"{shown[0].row} rows above"}, ""))
    for row in shown:
        style = "bold red" if row.row == first else ("red" if not row.ok else "")
        lines.append((_row_cells(row, vocab, _verdict(row, first)), style))
    below = [r for r in folded if shown and r.row > shown[-1].row]
    if below:
        bad = sum(not r.ok for r in below)
        lines.append(
            (
                {
                    "row": "…",
                    "token": f"{len(below)} rows below",
                    "max_abs": f"≤ {_cell_float(max(r.max_abs for r in below))}",
                    "verdict": f"{bad} off",
                },
                "",
            )
        )
    keys = ["row", "pos", "token", "max_abs", "max_rel", "out", "worst", "verdict"]
    return divergence_table(keys, lines, width, plain)


def cases_table(cases: list[CaseResult], vocab: bool, plain: bool = False, width: int = 120) -> Table:
    """One table across the cases of a stage whose cases give one row each, ordered by position."""
    ordered = sorted((c for c in cases if c.rows), key=lambda c: c.rows[0].position)
    first = next((c.name for c in ordered if not c.rows[0].ok), None)
    lines = []
    for case in ordered:
        row = case.rows[0]
        verdict = "◀ first" if case.name == first else _verdict(row, None)
        style = "bold red" if case.name == first else ("red" if not row.ok else "")
        lines.append(({**_row_cells(row, vocab, verdict), "case": case.name}, style))
    keys = ["pos", "case", "token", "max_abs", "max_rel", "out", "worst", "verdict"]
    return divergence_table(keys, lines, width, plain)


TOKENS_BEFORE, TOKENS_AFTER = 3, 4  # steps shown around a generation's first mismatch


def token_window(case: CaseResult) -> tuple[int, int]:
    """The steps [lo, hi) shown of a failing generation: a few around its first mismatch."""
    n = min(len(case.expected_tokens), len(case.got_tokens))
    first = next((s.step for s in case.steps if s.verdict == "mismatch"), None)
    if first is None:
        return 0, min(n, TOKENS_BEFORE + TOKENS_AFTER)
    return max(0, first - TOKENS_BEFORE), min(n, first + TOKENS_AFTER)


def tokens_table(case: CaseResult, plain: bool = False) -> Table:
    """Greedy: expected and generated tokens side by side around the first mismatch, which is marked."""
    table = Table(box=_box(plain), show_edge=False, pad_edge=False)
    for title in ("step", "expected", "generated"):
        table.add_column(title, no_wrap=True)
    table.add_column("")  # the note wraps on a narrow terminal; the tokens do not
    verdicts = {s.step: s for s in case.steps}
    lo, hi = token_window(case)
    n = min(len(case.expected_tokens), len(case.got_tokens))
    if lo > 0:
        table.add_row("…", f"{lo} steps above", "", "", style="dim")
    for k in range(lo, hi):
        exp, got = case.expected_tokens[k], case.got_tokens[k]
        step = verdicts.get(k)
        note, style = "", ""
        if step and step.verdict == "mismatch":
            note, style = f"◀ first mismatch (logit gap {step.gap:.3g})", "bold red"
        elif step and step.verdict == "near-tie":
            note = tie_note(step)
        elif case.steps and k >= len(case.steps):
            style = "dim"
        table.add_row(str(k + 1), token_label(exp, 18), token_label(got, 18), note, style=style)
    if hi < n:
        table.add_row("…", f"{n - hi} steps below", "", "", style="dim")
    return table


def scaling_table(case: CaseResult, plain: bool = False) -> Table:
    """cache-scaling: CPU ms per token at each length, and what each extra token cost."""
    table = Table(box=_box(plain), show_edge=False, pad_edge=False)
    for title in ("tokens", "CPU ms/token", "marginal ms/token"):
        table.add_column(title, justify="right", no_wrap=True)
    t = case.scaling
    assert t is not None, "called for cache-scaling cases only"
    for n, per, marginal in zip(t.lengths, t.ms_per_token, t.marginal_ms):
        if per is None:  # the case ended before a call of this length ran
            continue
        if n == t.stopped_at:  # a lower bound: the call was stopped before it finished
            table.add_row(str(n), f"> {per:.2f} (stopped)", "")
        else:
            table.add_row(str(n), f"{per:.2f}", "" if marginal is None else f"{marginal:.2f}")
    return table


def tie_note(step) -> str:
    return f"near-tie accepted (gap {step.gap:.3g} ≤ {step.allowed:.3g})"
