"""Render a RunResult for people: header, one line per stage, a divergence table per failing case."""

import math
from typing import Literal

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from theinference.model import tokenizer
from theinference.report.untrusted import for_terminal
from theinference.grading.results import NO_ANSWER, CaseResult, Diagnosis, RowStats, RunResult, StageResult, Status

FOLD_BEFORE, FOLD_AFTER = 3, 8  # rows shown around the first divergence of a long case
FOLD_LIMIT = 16  # cases with more rows than this are folded
_SPARKS = "▁▂▃▄▅▆▇█"
_ASCII_SPARKS = "_.-:=+*#"
_MARK: dict[str, str] = {Status.PASS: "✔", Status.FAIL: "✘", Status.NOT_STARTED: "·", Status.ERROR: "✘", Status.TIMEOUT: "⏱",
         Status.CRASH: "✘"}
_STYLE: dict[str, str] = {Status.PASS: "green", Status.FAIL: "red", Status.NOT_STARTED: "yellow", Status.ERROR: "red",
          Status.TIMEOUT: "red", Status.CRASH: "red"}
_WORDS: dict[str, str] = {
    Status.PASS: "passed", Status.FAIL: "failed", Status.NOT_STARTED: "not started", Status.ERROR: "error",
    Status.TIMEOUT: "timed out", Status.CRASH: "crashed",
}


def token_label(token_id: int | None, width: int = 12) -> str:
    """`464 'The'`: an id with its text, shortened for a table cell."""
    if token_id is None:
        return ""
    text = repr(tokenizer.token_text(token_id))
    if len(text) > width:
        text = text[: width - 1] + "…"
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
        console.print("         untrusted grading: the submission's stages, weights and timeouts are not read", style="dim")
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


def rows_table(case: CaseResult, vocab: bool, plain: bool = False) -> Table:
    """The per-position divergence table of a failing case, first divergent row highlighted."""
    table = Table(box=_box(plain), show_edge=False, pad_edge=False)
    justify: Literal["left", "right"]
    for title, justify in (("row", "right"), ("pos", "right"), ("token", "left"), ("max |Δ|", "right"),
                           ("max rel Δ", "right"), ("out of tol", "right"), ("worst: expected vs got", "left"),
                           ("", "left")):
        table.add_column(title, justify=justify, no_wrap=True)
    shown, folded = _visible_rows(case)
    first = case.first_bad_row
    if shown and shown[0].row > 0:
        table.add_row("…", "", f"{shown[0].row} rows above", "", "", "", "", "")
    for row in shown:
        verdict = "ok" if row.ok else ("NaN/inf" if row.n_nonfinite else "off")
        style = "bold red" if row.row == first else ("red" if not row.ok else "")
        pct = 100.0 * row.n_bad / row.n
        table.add_row(str(row.row), str(row.position), token_label(row.token), _cell_float(row.max_abs),
                      _cell_float(row.max_rel), f"{row.n_bad} ({pct:.0f}%)", _worst_cell(row, vocab),
                      ("◀ first" if row.row == first else verdict), style=style)
    below = [r for r in folded if shown and r.row > shown[-1].row]
    if below:
        bad = sum(not r.ok for r in below)
        worst = max(r.max_abs for r in below)
        table.add_row("…", "", f"{len(below)} rows below", f"≤ {_cell_float(worst)}", "", f"{bad} rows off", "", "")
    return table


def tokens_table(case: CaseResult, plain: bool = False) -> Table:
    """Greedy: expected and generated tokens side by side, first mismatch marked."""
    table = Table(box=_box(plain), show_edge=False, pad_edge=False)
    for title in ("step", "expected", "generated", ""):
        table.add_column(title, no_wrap=True)
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
        table.add_row(str(n), f"{per:.2f}", "" if marginal is None else f"{marginal:.2f}")
    return table


def scaling_lines(case: CaseResult) -> list[Text]:
    """How the timing was taken, the ratio, and (on a pass) the speed-up over the oracle's recompute."""
    t = case.scaling
    assert t is not None, "called for cache-scaling cases only"
    threads = "one BLAS thread" if t.blas_threads == 1 else f"{t.blas_threads} BLAS threads (could not limit to one)"
    lines = [Text(f"  timed in your process: CPU time, {threads}, fastest of repeated calls · "
                  f"per-token cost ×{t.ratio:.2f} from {t.lengths[0]} to {t.lengths[-1]} tokens "
                  f"(at most ×{t.max_ratio:g} passes)", style="dim")]
    if case.status == "pass" and t.speedup is not None:
        lines.append(Text(f"  your cache: {t.lengths[-1]} tokens in {t.seconds[-1]:.2f} s; "
                          f"recompute (estimated): {t.oracle_seconds:.2f} s; {t.speedup:.1f}× faster", style="green"))
    return lines


def _case_body(case: CaseResult, vocab: bool, plain: bool) -> list:
    parts: list[Text | Table] = [Text.assemble((f"  case {case.name}: ", "bold"), (_WORDS[case.status], _STYLE[case.status]),
                           (f" — {for_terminal(case.message)}" if case.message else "", ""))]
    if case.rows and case.status == "fail":
        parts.append(rows_table(case, vocab, plain))
        parts.append(Text(f"  error by position: {sparkline([r.max_abs for r in case.rows], plain)}"))
    if case.steps and case.status == "fail":
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
    return [Text(f"  {label:<9} {text!r}") for label, text in (
        ("prompt:", prompt), ("expected:", tokenizer.decode(case.expected_tokens)), ("got:", tokenizer.decode(case.got_tokens)))]


def _same_failure(a: CaseResult, b: CaseResult) -> bool:
    """Errors that repeat case after case (an import error, the same exception) are shown once."""
    return (a.status in NO_ANSWER or a.status == Status.NOT_STARTED) and (a.status, a.message, a.traceback) == (
        b.status, b.message, b.traceback)


def _tie_note(step) -> str:
    return f"near-tie accepted (gap {step.gap:.3g} ≤ {step.allowed:.3g})"


def _near_ties(case: CaseResult) -> list:
    return [s for s in case.steps if s.verdict == "near-tie"]


def render_stage(console: Console, stage: StageResult, n_vocab: int) -> None:
    mark = _MARK[stage.status]
    console.print(Text.assemble(
        (f"{mark} {stage.id}", f"bold {_STYLE[stage.status]}"), f"  {stage.title}  ",
        (f"{_WORDS[stage.status]} · {stage.passed_cases}/{len(stage.cases)} cases · "
         f"{stage.points:g}/{stage.max_points:g} points · {stage.seconds:.1f} s", "dim"),
        (" · from the course directory" if stage.origin == "course" else "", "bold yellow"),
    ))
    if stage.status == "not-started":
        raised = stage.cases[0].message if stage.cases else "NotImplementedError"
        console.print(f"  not started: {stage.adapter}() in {escape(stage.adapters_file)} raises {escape(for_terminal(raised))}",
                      style="yellow", soft_wrap=True)
        return
    shown: list[CaseResult] = []
    for case in stage.cases:
        vocab = bool(case.rows) and case.rows[0].n == n_vocab
        twin = next((c for c in shown if _same_failure(c, case)), None)
        if twin is not None:
            console.print(f"  case {case.name}: {_WORDS[case.status]} — same error as case {twin.name}")
        elif case.status != "pass":
            console.print(Group(*_case_body(case, vocab, is_plain(console))))
            shown.append(case)
        elif _near_ties(case):
            notes = "; ".join(f"step {s.step}: {_tie_note(s)}" for s in _near_ties(case))
            console.print(f"  case {case.name}: passed, {notes}", style="dim")
        if case.status == "pass" and case.scaling:
            console.print(Group(scaling_table(case, is_plain(console)), *scaling_lines(case)))
    if stage.cross_case:
        _print_cross_case(console, stage)
    console.print()


def _print_cross_case(console: Console, stage: StageResult) -> None:
    rows = sorted((c.rows[0] for c in stage.cases if c.rows), key=lambda r: r.position)
    plain = is_plain(console)
    console.print(Text(f"  across cases (one row each, by position {rows[0].position}..{rows[-1].position}): "
                       f"{sparkline([r.max_abs for r in rows], plain)}"))
    for line in diagnosis_lines(stage.cross_case) if stage.cross_case else []:
        console.print(line)


def render_run(console: Console, run: RunResult, version: str) -> None:
    """The whole report: header, each stage, and a closing summary line."""
    render_header(console, run, version)
    for stage in run.stages:
        render_stage(console, stage, run.config.get("n_vocab", 0))
    passed = sum(s.status == "pass" for s in run.stages)
    if any(s.status == "pass" and s.compare != "scaling" for s in run.stages) and not any(
            s.status == "pass" and s.compare == "scaling" for s in run.stages):
        console.print("Matching outputs prove the cached path equals a recompute, not that a cache exists "
                      "(a recompute gives the same numbers): the cache-scaling stage proves the cache by its cost.",
                      style="dim")
    earned, possible = run.points
    style = "bold green" if run.passed else "bold red"
    console.print(f"{passed} of {len(run.stages)} stage(s) passed · {earned:g}/{possible:g} points", style=style)
    if run.course_supplied:
        console.print(f"not the instructor's grading: {for_terminal('; '.join(run.course_supplied))}", style="bold yellow",
                      soft_wrap=True, markup=False)
