"""Render a RunResult for people: header, one line per stage, what each failing case shows (report/cases.py; one
table across a stage of one-row cases), a summary line and what to do next."""

import re
import textwrap

from rich.cells import cell_len
from rich.console import Console, Group
from rich.markup import escape
from rich.text import Text

from theinference.headline import headline_lines
from theinference.untrusted import for_terminal
from theinference.report.cases import case_body, diagnosis_lines, labelled, scaling_lines
from theinference.report.statuses import presentation
from theinference.report.tables import cases_table, scaling_table, tie_note
from theinference.terminals import plain_console
from theinference.grading.spec.checks import ScalingCheck
from theinference.grading.judge.results import (
    NO_ANSWER,
    CaseResult,
    Diagnosis,
    RunResult,
    StageResult,
    Status,
)


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


def _part(shared: Diagnosis | None, one_hint: bool) -> str:
    """What a case's body says of its diagnosis when the stage says its finding once: "" all of it, "shape" the shape
    (the hint is the stage's too), "shape+hint" its shape and own hint."""
    return "" if shared is None else ("shape" if one_hint else "shape+hint")


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
            body = case_body(case, vocab, plain_console(console), console.width, shared=_part(shared, one_hint))
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
        console.print(labelled("note", "bold yellow", Text(float64_note(stage))))
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
