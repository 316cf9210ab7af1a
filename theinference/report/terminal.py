"""Render a RunResult for people: header, one line per stage, a divergence table per failing case (one across a
stage of one-row cases), a summary line and what to do next."""

import math
from typing import Literal

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from theinference.model import tokenizer
from theinference.untrusted import for_terminal
from theinference.grading.results import NO_ANSWER, CaseResult, Diagnosis, RowStats, RunResult, StageResult, Status

FOLD_BEFORE, FOLD_AFTER = 3, 8  # rows shown around the first divergence of a long case
FOLD_LIMIT = 16  # cases with more rows than this are folded
_SPARKS = "▁▂▃▄▅▆▇█"
_ASCII_SPARKS = "_.-:=+*#"
_MARK: dict[str, str] = {
    Status.PASS: "✔",
    Status.FAIL: "✘",
    Status.NOT_STARTED: "·",
    Status.ERROR: "✘",
    Status.TIMEOUT: "⏱",
    Status.CRASH: "✘",
}
_STYLE: dict[str, str] = {
    Status.PASS: "green",
    Status.FAIL: "red",
    Status.NOT_STARTED: "yellow",
    Status.ERROR: "red",
    Status.TIMEOUT: "red",
    Status.CRASH: "red",
}
_WORDS: dict[str, str] = {
    Status.PASS: "passed",
    Status.FAIL: "failed",
    Status.NOT_STARTED: "not started",
    Status.ERROR: "error",
    Status.TIMEOUT: "timed out",
    Status.CRASH: "crashed",
}


def token_label(token_id: int | None, width: int = 12) -> str:
    """`464 'The'`: an id with its text, shortened for a table cell."""
    if token_id is None:
        return ""
    text = repr(tokenizer.token_text(token_id))
    if len(text) > width:  # the ellipsis goes inside the quotes, which stay: 'Temperat…'
        text = text[: width - 2] + "…" + text[-1]
    return f"{token_id} {text}"


def is_plain(console: Console) -> bool:
    """Plain output (no colour, ASCII tables and sparklines) off a terminal or with NO_COLOR."""
    return not console.is_terminal or console.no_color


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


def render_header(console: Console, run: RunResult, version: str) -> None:
    synthetic = f" · synthetic ({run.synthetic})" if run.synthetic else ""
    config = " · ".join(f"{k} {v}" for k, v in run.config.items())
    console.print(f"[bold]theinference {version}[/bold] grading [cyan]{escape(for_terminal(run.course))}[/cyan]")
    console.print(f"weights: {escape(run.weights_path)}{synthetic}")
    console.print(f"         {escape(run.weights_why)} · {config}", style="dim")
    if run.seed is not None:
        console.print(f"         random extra cases from seed {run.seed}", style="dim")
    if run.isolation:
        console.print(f"isolation: {run.isolation} · {escape(run.isolation_summary)}")
    if run.untrusted:
        console.print(
            "         untrusted grading: the submission's stages, weights and timeouts are not read", style="dim"
        )
    for line in run.course_supplied:
        console.print(f"[bold yellow]not the instructor's:[/bold yellow] {escape(for_terminal(line))}", soft_wrap=True)
    for notice in run.notices:
        console.print(f"[yellow]note:[/yellow] {escape(for_terminal(notice))}", soft_wrap=True)
    console.print()


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


def tokens_table(case: CaseResult, plain: bool = False) -> Table:
    """Greedy: expected and generated tokens side by side, first mismatch marked."""
    table = Table(box=_box(plain), show_edge=False, pad_edge=False)
    for title in ("step", "expected", "generated"):
        table.add_column(title, no_wrap=True)
    table.add_column("")  # the note wraps on a narrow terminal; the tokens do not
    verdicts = {s.step: s for s in case.steps}
    for k, (exp, got) in enumerate(zip(case.expected_tokens, case.got_tokens)):
        step = verdicts.get(k)
        note, style = "", ""
        if step and step.verdict == "mismatch":
            note, style = f"◀ first mismatch (logit gap {step.gap:.3g})", "bold red"
        elif step and step.verdict == "near-tie":
            note = _tie_note(step)
        elif case.steps and k >= len(case.steps):
            style = "dim"
        table.add_row(str(k), token_label(exp, 18), token_label(got, 18), note, style=style)
    return table


def scaling_table(case: CaseResult, plain: bool = False) -> Table:
    """cache-scaling: CPU ms per token at each length, and what each extra token cost."""
    table = Table(box=_box(plain), show_edge=False, pad_edge=False)
    for title in ("tokens", "CPU ms/token", "marginal ms/token"):
        table.add_column(title, justify="right", no_wrap=True)
    t = case.scaling
    assert t is not None, "called for cache-scaling cases only"
    for n, per, marginal in zip(t.lengths, t.ms_per_token, t.marginal_ms):
        if n == t.stopped_at:  # a lower bound: the call was stopped before it finished
            table.add_row(str(n), f"> {per:.2f} (stopped)", "")
        else:
            table.add_row(str(n), f"{per:.2f}", "" if marginal is None else f"{marginal:.2f}")
    return table


def scaling_lines(case: CaseResult) -> list[Text]:
    """How the cost was counted, both tests' figures, and (on a pass) the speed-up over a recompute."""
    t = case.scaling
    assert t is not None, "called for cache-scaling cases only"
    fraction = f"{t.fraction:.0%}" if t.fraction is not None else "?"
    lines = [
        Text(
            f"  counted by the grader ({t.accounting}): CPU of your whole process tree in {len(t.calls)} timed "
            "calls, each on a fresh random prompt (the cheapest call of each length counts)",
            style="dim",
        ),
        Text(
            f"  (a) per-token cost ×{t.ratio:.2f} from {t.lengths[0]} to {t.lengths[-1]} tokens "
            f"(at most ×{t.max_ratio:g} passes) · (b) {t.lengths[-1]} tokens cost {fraction} of the oracle's "
            f"full recompute here (at most {t.max_fraction:.0%} passes)",
            style="dim",
        ),
    ]
    if t.weights_note:
        lines.insert(0, Text(f"  {t.weights_note}", style="dim"))
    if case.status == Status.PASS and t.speedup is not None:
        lines.append(
            Text(
                f"  your cache: {t.lengths[-1]} tokens in {t.seconds[-1]:.2f} s of CPU; "
                f"a full recompute: {t.oracle_seconds:.2f} s; {t.speedup:.1f}× faster",
                style="green",
            )
        )
    return lines


def _case_body(case: CaseResult, vocab: bool, plain: bool, width: int) -> list:
    parts: list[Text | Table] = [
        Text.assemble(
            (f"  case {case.name}: ", "bold"),
            (_WORDS[case.status], _STYLE[case.status]),
            (f" — {for_terminal(case.message)}" if case.message else "", ""),
        )
    ]
    if case.rows and case.status == Status.FAIL:
        parts.append(rows_table(case, vocab, plain, width))
        if len(case.rows) > 1:  # one character says nothing the table does not
            parts.append(Text(f"  error by position: {sparkline([r.max_abs for r in case.rows], plain)}"))
    if case.steps and case.status == Status.FAIL:
        parts.append(tokens_table(case, plain))
        parts.extend(_greedy_text(case))
    if case.scaling:
        parts.append(scaling_table(case, plain))
        parts.extend(scaling_lines(case))
    if case.diagnosis:
        parts.extend(diagnosis_lines(case.diagnosis))
    if case.traceback:
        parts.append(Text(for_terminal(case.traceback.rstrip()), style="dim"))
    output = (case.stdout + case.stderr).strip()
    if output and case.status in NO_ANSWER:
        parts.append(Text("  output of your code:\n" + for_terminal(output[-2000:]), style="dim"))
    return parts


def diagnosis_lines(d: Diagnosis) -> list[Text]:
    """Shape, then the fingerprint's finding (or that no known bug matched), then the hint."""
    lines = [Text.assemble(("  shape: ", "bold"), (d.shape, "magenta"), (f" — {d.summary}", ""))] if d.shape else []
    if d.bug:
        lines.append(Text.assemble(("  finding: ", "bold green"), (d.bug, "bold"), f" — {d.evidence}"))
    elif d.evidence:
        lines.append(Text.assemble(("  known bugs: ", "bold"), d.evidence))
    if d.hint:
        lines.append(Text.assemble(("  hint: ", "bold yellow"), d.hint))
    return lines


def _greedy_text(case: CaseResult) -> list[Text]:
    """The prompt and both continuations as text (on synthetic weights, gibberish: the ids are what count)."""
    prompt = case.texts.get("prompt") or tokenizer.decode(case.inputs.get("prompt", []))
    return [
        Text(f"  {label:<9} {text!r}")
        for label, text in (
            ("prompt:", prompt),
            ("expected:", tokenizer.decode(case.expected_tokens)),
            ("got:", tokenizer.decode(case.got_tokens)),
        )
    ]


def _same_failure(a: CaseResult, b: CaseResult) -> bool:
    """Errors that repeat case after case (an import error, the same exception) are shown once."""
    return (a.status in NO_ANSWER or a.status == Status.NOT_STARTED) and (a.status, a.message, a.traceback) == (
        b.status,
        b.message,
        b.traceback,
    )


def _tie_note(step) -> str:
    return f"near-tie accepted (gap {step.gap:.3g} ≤ {step.allowed:.3g})"


def _near_ties(case: CaseResult) -> list:
    return [s for s in case.steps if s.verdict == "near-tie"]


def render_stage(console: Console, stage: StageResult, n_vocab: int) -> None:
    mark = _MARK[stage.status]
    console.print(
        Text.assemble(
            (f"{mark} {stage.id}", f"bold {_STYLE[stage.status]}"),
            f"  {stage.title}  ",
            (
                f"{_WORDS[stage.status]} · {stage.passed_cases}/{len(stage.cases)} cases · "
                f"{stage.points:g}/{stage.max_points:g} points · {stage.seconds:.1f} s",
                "dim",
            ),
            (" · from the course directory" if stage.origin == "course" else "", "bold yellow"),
        )
    )
    if stage.status == Status.NOT_STARTED:
        raised = stage.cases[0].message if stage.cases else "NotImplementedError"
        console.print(
            f"  not started: {stage.adapter}() in {escape(stage.adapters_file)} raises {escape(for_terminal(raised))}",
            style="yellow",
            soft_wrap=True,
        )
        return
    # A stage read across one-row cases shows their rows in one table, not one table per case.
    across = stage.cross_case is not None
    shown: list[CaseResult] = []
    for case in stage.cases:
        vocab = bool(case.rows) and case.rows[0].n == n_vocab
        twin = next((c for c in shown if _same_failure(c, case)), None)
        if twin is not None:
            console.print(f"  case {case.name}: {_WORDS[case.status]} — same error as case {twin.name}")
        elif case.status != Status.PASS and not (across and case.rows):
            console.print(Group(*_case_body(case, vocab, is_plain(console), console.width)))
            shown.append(case)
        elif _near_ties(case):
            notes = "; ".join(f"step {s.step}: {_tie_note(s)}" for s in _near_ties(case))
            console.print(f"  case {case.name}: passed, {notes}", style="dim")
        if case.status == Status.PASS and case.scaling:
            console.print(Group(scaling_table(case, is_plain(console)), *scaling_lines(case)))
    if across:
        _print_cross_case(console, stage, n_vocab)
    console.print()


def _print_cross_case(console: Console, stage: StageResult, n_vocab: int) -> None:
    numeric = [c for c in stage.cases if c.rows]
    failed = sum(c.status == Status.FAIL for c in numeric)
    vocab = numeric[0].rows[0].n == n_vocab
    console.print(
        Text(
            f"  {failed} of {len(numeric)} cases off; each gives one row, so they are read together, "
            "ordered by position:"
        )
    )
    console.print(cases_table(numeric, vocab, is_plain(console), console.width))
    for line in diagnosis_lines(stage.cross_case) if stage.cross_case else []:
        console.print(line)


def render_run(console: Console, run: RunResult, version: str) -> None:
    """The whole report: header, each stage, and a closing summary line."""
    render_header(console, run, version)
    for stage in run.stages:
        render_stage(console, stage, run.config.get("n_vocab", 0))
    passed = sum(s.status == Status.PASS for s in run.stages)
    if any(s.status == Status.PASS and s.compare != "scaling" for s in run.stages) and not any(
        s.status == Status.PASS and s.compare == "scaling" for s in run.stages
    ):
        console.print(
            "Matching outputs prove the cached path equals a recompute, not that a cache exists "
            "(a recompute gives the same numbers): the cache-scaling stage proves the cache by its cost.",
            style="dim",
        )
    earned, possible = run.points
    style = "bold green" if run.passed else "bold red"
    console.print(f"{passed} of {len(run.stages)} stage(s) passed · {earned:g}/{possible:g} points", style=style)
    for line in run.advice:
        console.print(Text.assemble(("→ ", "bold cyan"), for_terminal(line)))
    if run.course_supplied:
        console.print(
            f"not the instructor's grading: {for_terminal('; '.join(run.course_supplied))}",
            style="bold yellow",
            soft_wrap=True,
            markup=False,
        )
