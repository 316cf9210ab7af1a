"""The terminal report's frame: the header above the stages (who grades what: the course, the weights and why, the
isolation, what the course chose itself) and the footer below them (the points, what to do next)."""

import re
import textwrap

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from theinference.headline import headline_lines
from theinference.untrusted import for_terminal
from theinference.grading.spec.checks import ScalingCheck
from theinference.grading.judge.results import RunResult, Status


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
