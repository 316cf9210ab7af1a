"""Render a RunResult for people: the header, one line per stage, what each failing case shows (its table:
report/tables.py; its diagnosis and output), a summary line and what to do next (header and footer: report/frame.py)."""

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from theinference.model import tokenizer
from theinference.untrusted import for_terminal
from theinference.report.frame import render_footer, render_header
from theinference.report.statuses import presentation
from theinference.report.tables import (
    cases_table,
    rows_table,
    scaling_table,
    sparkline,
    tie_note,
    token_window,
    tokens_table,
)
from theinference.report.text import both_figures, guarantee_text, timed_calls
from theinference.terminals import plain_console
from theinference.grading.judge.results import (
    NO_ANSWER,
    CaseResult,
    Diagnosis,
    RunResult,
    StageResult,
    Status,
)


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
    status, message = presentation(case.status), for_terminal(case.message)
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
    lo, hi = token_window(case)
    more = "…" if hi < min(len(case.expected_tokens), len(case.got_tokens)) else ""
    steps = f"steps {lo + 1}–{hi}:" if lo > 0 or more else ""
    lines = [Text(f"  {'prompt:':<9} {prompt!r}")]
    if steps:
        lines.append(Text(f"  {steps}", style="dim"))
    for label, tokens in (("expected:", case.expected_tokens), ("got:", case.got_tokens)):
        lines.append(Text(f"  {label:<9} {tokenizer.decode(tokens[lo:hi])!r}{more}"))
    return lines


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
    status = presentation(stage.status)
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
            notes = "; ".join(f"step {s.step + 1}: {tie_note(s)}" for s in _near_ties(case))
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
    return f"  {which}: {presentation(cases[0].status).words} — same error as {before}"


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
