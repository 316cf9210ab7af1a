"""Render a RunResult for people: header, one line per stage, a divergence table per failing case (one across a
stage of one-row cases), a summary line and what to do next."""

import math
import re
import textwrap
from typing import Literal

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from theinference.model import tokenizer
from theinference.headline import headline_lines
from theinference.untrusted import for_terminal
from theinference.report.statuses import shown
from theinference.report.text import both_figures, guarantee_text, timed_calls
from theinference.terminals import plain_console
from theinference.grading.spec.checks import ScalingCheck
from theinference.grading.judge.results import (
    NO_ANSWER,
    CaseResult,
    Diagnosis,
    RowStats,
    RunResult,
    StageResult,
    Status,
)

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


def _folded(console: Console, label: str, parts: list[str], style: str = "") -> None:
    """`label part · part · …`, folded between parts at the console's width, continuation lines under the first
    part; a part too long for a line of its own is wrapped between words onto further lines under it (a word
    longer than a line, a path, stays whole: a path cut in two cannot be copied)."""
    indent = " " * cell_len(label)
    lines, line = [], label
    for part in parts:
        joined = line + part if line in (label, indent) else f"{line} · {part}"
        if line not in (label, indent) and cell_len(joined) > console.width:
            lines.append(line)
            joined = indent + part
        line = joined
    lines.append(line)
    room = max(console.width - len(indent), 20)
    for text in lines:
        head, body = text[: len(indent)], text[len(indent) :]
        for k, piece in enumerate(textwrap.wrap(body, room, break_on_hyphens=False, break_long_words=False) or [""]):
            console.print(Text((head if k == 0 else indent) + piece, style=style), overflow="ignore", crop=False)


def _hanging(console: Console, label: str, text: str, label_style: str, style: str = "") -> None:
    """label and text wrapped between words at the console's width, the lines after the first indented two spaces;
    a word longer than a line, a path, stays whole on a line of its own (a path cut in two cannot be copied)."""
    lines = textwrap.wrap(
        label + text,
        max(console.width, 40),
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    for k, line in enumerate(lines):
        piece = Text.assemble((label, label_style), (line[len(label) :], style)) if k == 0 else Text(line, style=style)
        console.print(piece, overflow="ignore", crop=False)


# The mechanisms the header names, of those in RunResult.processes (the JSON document has them all).
HEADER_MECHANISMS = ("launcher", "orphans", "kill", "cpu")


def process_lines(processes: dict[str, str]) -> list[tuple[str, str]]:
    """(what, its mechanism) for the header: how the student's processes start, are kept, killed and counted."""
    return [(f"{key}:", processes[key]) for key in HEADER_MECHANISMS if key in processes]


def render_header(console: Console, run: RunResult, version: str, headline_shown: bool = False) -> None:
    """Who grades what: the course, the weights and why, the isolation, what the course chose itself.

    headline_shown: the first line is already on screen (theinference.cli.early printed it)."""
    if not headline_shown:
        for parts in headline_lines(version, run.course, console.width):
            console.print(Text.assemble(*parts), no_wrap=True, overflow="ignore", crop=False)
    synthetic = [f"synthetic ({run.synthetic})"] if run.synthetic else []
    _folded(console, "weights: ", [for_terminal(run.weights_path), *synthetic])
    config = [f"{k} {v}" for k, v in run.config.items()]
    _folded(console, " " * 9, [for_terminal(run.weights_why), *config], style="dim")
    if run.seed is not None:
        console.print(f"         random extra cases from seed {run.seed}", style="dim")
    if run.isolation:
        _folded(console, "isolation: ", [run.isolation, for_terminal(run.isolation_summary)])
    if run.processes:
        _folded(console, " " * 11, [f"{k} {v}" for k, v in process_lines(run.processes)], style="dim")
    if run.untrusted:
        console.print(
            "         untrusted grading: the submission's stages, weights and timeouts are not read", style="dim"
        )
    for line in run.course_supplied:
        _hanging(console, "not the instructor's: ", for_terminal(line), label_style="bold yellow")
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


TOKENS_BEFORE, TOKENS_AFTER = 3, 4  # steps shown around a generation's first mismatch


def _token_window(case: CaseResult) -> tuple[int, int]:
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
    lo, hi = _token_window(case)
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
            note = _tie_note(step)
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


def _timed_calls(t) -> str:
    return timed_calls(len(t.calls), sum(1 for c in t.calls if c.diagnostic))


def scaling_lines(case: CaseResult) -> list[Text]:
    """How the cost was counted, both tests' figures, and (on a pass) the speed-up over a recompute."""
    t = case.scaling
    assert t is not None, "called for cache-scaling cases only"
    lines = [
        Text(
            f"  counted by the grader ({t.accounting}): CPU of your whole process tree in {_timed_calls(t)}, "
            "each on a fresh random prompt (the cheapest call of each length counts)",
            style="dim",
        ),
    ]
    figures = both_figures(t)
    if figures:
        lines.append(Text(f"  {figures}", style="dim"))
    if t.weights_note:
        lines.insert(0, Text(f"  {t.weights_note}", style="dim"))
    guarantee = guarantee_text(t.guarantee, t.accounting)
    if guarantee:
        lines.append(Text(f"  {guarantee}", style="yellow"))
    if case.status == Status.PASS and t.speedup is not None:
        lines.append(
            Text(
                f"  your cache: {t.lengths[-1]} tokens in {t.seconds[-1]:.2f} s of CPU; "
                f"a full recompute: {t.oracle_seconds:.2f} s; {t.speedup:.1f}× faster",
                style="green",
            )
        )
    return lines


def _part(shared: Diagnosis | None, one_hint: bool) -> str:
    """What a case's body says of its diagnosis when the stage says its finding once: "" all of it, "shape" the shape
    (the hint is the stage's too), "shape+hint" its shape and own hint."""
    return "" if shared is None else ("shape" if one_hint else "shape+hint")


def _status_and_message(case: CaseResult) -> Text:
    """`timed out — message`; a message that begins with the status's word (every timeout's does: "timed out after
    60 s while running") goes on from the word, which is said once."""
    status, message = shown(case.status), for_terminal(case.message)
    if message.startswith(status.words):
        return Text.assemble((status.words, status.style), message[len(status.words) :])
    return Text.assemble((status.words, status.style), (f" — {message}" if message else "", ""))


def _case_body(case: CaseResult, vocab: bool, plain: bool, width: int, shared: str = "") -> list:
    parts: list[Text | Table] = [
        _labelled(
            f"case {for_terminal(case.name)}",
            "bold",
            _status_and_message(case),
        )
    ]
    if case.rows and case.status == Status.FAIL:
        parts.append(rows_table(case, vocab, plain, width))
        if len(case.rows) > 1:  # one character says nothing the table does not
            parts.append(Text(f"  error by position: {sparkline([r.max_abs for r in case.rows], plain)}"))
    if case.status == Status.FAIL and any(s.verdict == "mismatch" for s in case.steps):  # not for right tokens
        parts.append(tokens_table(case, plain))
        parts.extend(_greedy_text(case))
    if case.scaling:
        parts.append(scaling_table(case, plain))
        parts.extend(scaling_lines(case))
    if case.diagnosis and shared == "shape+hint":  # the finding is said once for the stage, after its cases
        d = case.diagnosis
        parts.extend(diagnosis_lines(Diagnosis(shape=d.shape, summary=d.summary, hint=d.hint)))
    elif case.diagnosis:
        parts.extend(diagnosis_lines(case.diagnosis, shape_only=shared == "shape"))
    if case.traceback:
        parts.append(Text(for_terminal(case.traceback.rstrip()), style="dim"))
    output = (case.stdout + case.stderr).strip()
    if output and case.status in NO_ANSWER:
        parts.append(Text("  output of your code:\n" + for_terminal(output[-2000:]), style="dim"))
    return parts


def _labelled(label: str, style: str, body: Text) -> Table:
    """`  label: text`, the text wrapping under itself rather than under the label."""
    grid = Table.grid()
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(Text(f"  {label}: ", style=style), body)
    return grid


def diagnosis_lines(
    d: Diagnosis, shape_only: bool = False, finding_only: bool = False, with_hint: bool = True
) -> list[Table]:
    """Shape, then the fingerprint's finding (or that no known bug matched), then the hint.

    shape_only: the shape alone (the stage states the rest once for all its cases); finding_only: the rest;
    with_hint False: not the hint (it is on screen already).
    """
    lines = []
    if d.shape and not finding_only:
        lines.append(_labelled("shape", "bold", Text.assemble((d.shape, "magenta"), f" — {d.summary}")))
    if shape_only:
        return lines
    if d.bug:
        lines.append(_labelled("finding", "bold green", Text.assemble((d.bug, "bold"), f" — {d.evidence}")))
    elif d.evidence:
        lines.append(_labelled("known bugs", "bold", Text(d.evidence)))
    if d.hint and with_hint:
        lines.append(_labelled("hint", "bold yellow", Text(d.hint)))
    return lines


_PROMPT_CHARS = 60  # the end of a long prompt is what the generation continues


def _greedy_text(case: CaseResult) -> list[Text]:
    """The prompt's end and both continuations as text over the steps the table shows (on synthetic weights,
    gibberish: the ids are what count)."""
    prompt = case.texts.get("prompt") or tokenizer.decode(case.inputs.get("prompt", []))
    if len(prompt) > _PROMPT_CHARS:
        prompt = "…" + prompt[-_PROMPT_CHARS:]
    lo, hi = _token_window(case)
    more = "…" if hi < min(len(case.expected_tokens), len(case.got_tokens)) else ""
    steps = f"steps {lo + 1}–{hi}:" if lo > 0 or more else ""
    lines = [Text(f"  {'prompt:':<9} {prompt!r}")]
    if steps:
        lines.append(Text(f"  {steps}", style="dim"))
    for label, tokens in (("expected:", case.expected_tokens), ("got:", case.got_tokens)):
        lines.append(Text(f"  {label:<9} {tokenizer.decode(tokens[lo:hi])!r}{more}"))
    return lines


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


def _error_key(case: CaseResult) -> tuple | None:
    """What makes two errors the same one (shown once per run); None for a case that is no such error."""
    if case.status not in NO_ANSWER and case.status != Status.NOT_STARTED:
        return None
    return (case.status, case.message, case.traceback)


def _shared_diagnosis(cases: list[CaseResult]) -> tuple[Diagnosis | None, bool]:
    """(the diagnosis whose finding every failing case with one shares, said once for the stage; whether their
    hints are one too, said once with it); (None, False) when the cases differ or only one is diagnosed."""
    diagnosed = [c.diagnosis for c in cases if c.diagnosis is not None and c.status == Status.FAIL]
    findings = {(d.bug, d.evidence) for d in diagnosed}
    if len(diagnosed) < 2 or len(findings) != 1:
        return None, False
    return diagnosed[0], len({d.hint for d in diagnosed}) == 1


def render_stage(console: Console, stage: StageResult, n_vocab: int, seen: dict | None = None) -> None:
    """One stage: its verdict line, then each failing case (an error already shown, in this stage or an
    earlier one of the run (`seen`), is named, not repeated)."""
    seen = {} if seen is None else seen
    status = shown(stage.status)
    verdict = (
        f"{status.words} · {stage.passed_cases}/{len(stage.cases)} cases · "
        f"{stage.points:g}/{stage.max_points:g} points · {stage.seconds:.1f} s"
    )
    line = Text.assemble(
        (f"{status.mark} {stage.id}", f"bold {status.style}"),
        f"  {stage.title}  ",
        (verdict, "dim"),
        (" · from the course directory" if stage.origin == "course" else "", "bold yellow"),
    )
    if line.cell_len > console.width:  # the id and the verdict on one line, the title under them
        line = Text.assemble(
            (f"{status.mark} {stage.id}", f"bold {status.style}"),
            "  ",
            (verdict, "dim"),
            (" · from the course directory" if stage.origin == "course" else "", "bold yellow"),
        )
        console.print(line)
        console.print(Text(f"  {stage.title}", style="dim"))
    else:
        console.print(line)
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
    shared, one_hint = _shared_diagnosis(stage.cases)
    if shared is not None and not (one_hint or shared.bug or shared.evidence):
        shared = None  # each case's own shape and hint, and no finding to say once
    repeats: dict[tuple, list[CaseResult]] = {}  # (stage, case) where an error was shown -> the cases repeating it
    for case in stage.cases:
        vocab = bool(case.rows) and case.rows[0].n == n_vocab
        key = _error_key(case)
        where = seen.get(key) if key is not None else None
        if where is not None:
            repeats.setdefault(where, []).append(case)
        elif case.status != Status.PASS and not (across and case.rows):
            body = _case_body(case, vocab, plain_console(console), console.width, shared=_part(shared, one_hint))
            console.print(Group(*body))
            if key is not None:
                seen[key] = (stage.id, case.name)
        elif _near_ties(case):
            notes = "; ".join(f"step {s.step + 1}: {_tie_note(s)}" for s in _near_ties(case))
            console.print(f"  case {case.name}: passed, {notes}", style="dim")
        if case.status == Status.PASS and case.scaling:
            console.print(Group(scaling_table(case, plain_console(console)), *scaling_lines(case)))
    for where, cases in repeats.items():
        console.print(_repeated_line(stage, where, cases), soft_wrap=True, markup=False)
    if shared is not None:
        for said in diagnosis_lines(shared, finding_only=True, with_hint=one_hint):
            console.print(said)
    if across:
        _print_cross_case(console, stage, n_vocab)
    if stage.float64_cases and FLOAT64 not in seen:  # said once in a run, under the first stage that shows it
        console.print(_labelled("note", "bold yellow", Text(float64_note(stage))))
        seen[FLOAT64] = stage.id
    console.print()


FLOAT64 = ("note", "float64")  # the key in render_stage's `seen` once the float64 note is said


def float64_note(stage: StageResult) -> str:
    """Why a float64 array matters though its numbers passed, and its usual cause (said once per run)."""
    names = stage.float64_cases
    which = f"all {len(names)} cases" if len(names) == len(stage.cases) and len(names) > 1 else ", ".join(names)
    return (
        f"{stage.adapter}() returned float64 arrays ({which}) where the oracle's are float32: not a failure, but "
        "float64 arithmetic does several times the work, and cache-scaling judges the cost. The usual cause is a "
        "NumPy float64 scalar such as `1.0 / np.sqrt(d)` or `np.float64(...)`, which promotes float32 arrays under "
        "NumPy 2; keep them float32 with `x.astype(np.float32)` or `np.float32(...)`."
    )


def _repeated_line(stage: StageResult, where: tuple[str, str], cases: list[CaseResult]) -> str:
    """One line for the cases of a stage that repeat an error already shown: `cases a, b: error — same error as …`."""
    names = [c.name for c in cases]
    if len(cases) == len(stage.cases) and len(cases) > 1:
        which = f"all {len(cases)} cases"
    elif len(names) <= 3:
        which = ("case " if len(names) == 1 else "cases ") + ", ".join(names)
    else:
        which = f"cases {', '.join(names[:2])} and {len(names) - 2} more"
    before = f"case {where[1]}" if where[0] == stage.id else f"{where[0]} (shown above)"
    return f"  {which}: {shown(cases[0].status).words} — same error as {before}"


def shown_hints(stage: StageResult | None) -> set[str]:
    """The hints render_stage printed for stage (under its cases and its cross-case table)."""
    if stage is None:
        return set()
    diagnoses = [stage.cross_case, *(c.diagnosis for c in stage.cases)]
    return {d.hint for d in diagnoses if d is not None and d.hint}


def render_finding(console: Console, stage: StageResult, shown: StageResult | None = None) -> None:
    """A stage's fingerprint, told after its verdict was printed: each finding (or that no known bug matched) once,
    and each hint once that is not on screen already (shown: the stage as render_stage printed it)."""
    diagnoses = [stage.cross_case] if stage.cross_case else [c.diagnosis for c in stage.cases if c.diagnosis]
    hints = shown_hints(shown)
    said: set[tuple] = set()
    for d in diagnoses:
        if d is None or (d.bug, d.evidence) in said or not (d.bug or d.evidence):
            continue
        said.add((d.bug, d.evidence))
        console.print(Text.assemble((f"{stage.id}: ", "bold"), "matched against known bugs"))
        for line in diagnosis_lines(d, finding_only=True, with_hint=d.hint not in hints):
            console.print(line)
        hints.add(d.hint)
    if said:
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
    console.print(cases_table(numeric, vocab, plain_console(console), console.width))
    for line in diagnosis_lines(stage.cross_case) if stage.cross_case else []:
        console.print(line)


def render_run(console: Console, run: RunResult, version: str, footer: bool = True) -> None:
    """The whole report: header, each stage, and (footer) a closing summary line."""
    render_header(console, run, version)
    seen: dict = {}
    for stage in run.stages:
        render_stage(console, stage, run.config.get("n_vocab", 0), seen)
    if footer:
        render_footer(console, run)


_WORDS_AND_COMMANDS = re.compile(r"`[^`]*`\S*|\S+")  # a `command` with what follows it up to a space is one word


def _unbroken_commands(text: str, width: int) -> list[str]:
    """text wrapped between words at width, a `command` never cut (it is copied and run as printed)."""
    lines: list[str] = []
    for word in _WORDS_AND_COMMANDS.findall(text):
        if lines and cell_len(lines[-1]) + 1 + cell_len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def render_footer(console: Console, run: RunResult) -> None:
    """The report's closing lines: what output stages cannot prove, the points, what to do next."""
    passed = sum(s.status == Status.PASS for s in run.stages)
    passing = [s for s in run.stages if s.status == Status.PASS]
    if any(s.cached_path for s in passing) and not any(isinstance(s.check, ScalingCheck) for s in passing):
        console.print(
            "Matching outputs prove the cached path equals a recompute, not that a cache exists "
            "(a recompute gives the same numbers): the cache-scaling stage proves the cache by its cost.",
            style="dim",
        )
    earned, possible = run.points
    style = "bold green" if run.passed else "bold red"
    console.print(f"{passed} of {len(run.stages)} stage(s) passed · {earned:g}/{possible:g} points", style=style)
    for line in run.advice:
        for k, piece in enumerate(_unbroken_commands(for_terminal(line), console.width - 2)):
            console.print(Text.assemble(("→ " if k == 0 else "  ", "bold cyan"), piece), overflow="ignore", crop=False)
    if run.course_supplied:
        text = for_terminal("; ".join(run.course_supplied))
        _hanging(console, "not the instructor's grading: ", text, label_style="bold yellow", style="bold yellow")
