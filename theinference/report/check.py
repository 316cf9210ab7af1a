"""Render a `stages check` result: the matrix of subjects × stages, then the problems."""

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from theinference.grading.judge.results import CheckCell, CheckResult
from theinference.terminals import plain_console


def _bugs(bugs) -> str:
    return " + ".join(sorted(bugs)) or "no known bug"


def _cell(cell: CheckCell) -> str:
    named = f" [dim]· {_bugs(cell.got_bugs)}[/dim]" if cell.got_bugs or cell.expected_bugs else ""
    if cell.same_as:
        named += f" [dim]= {escape(cell.same_as)}[/dim]"
    if cell.ok:
        return f"[green]✔ {cell.got}[/green]{named}"
    if cell.got in cell.expected:
        return f"[red]✘ {cell.got} · {_bugs(cell.got_bugs)}[/red] [dim](want {_bugs(cell.expected_bugs)})[/dim]"
    return f"[red]✘ {cell.got}[/red] [dim](want {' or '.join(cell.expected)})[/dim]"


def _mismatch(cell: CheckCell) -> str:
    if cell.got in cell.expected:
        return f"fingerprint {_bugs(cell.expected_bugs)}, got {_bugs(cell.got_bugs)}"
    return f"{' or '.join(cell.expected)}, got {cell.got}"


def render_check(console: Console, result: CheckResult) -> None:
    table = Table(box=box.ASCII if plain_console(console) else box.SIMPLE, show_edge=False)
    table.add_column("subject", no_wrap=True, min_width=max(map(len, result.subjects), default=7))
    for stage in result.stages:
        table.add_column(stage)
    by_key = {(c.subject, c.stage): c for c in result.cells}
    for subject in result.subjects:
        row = [by_key.get((subject, s)) for s in result.stages]
        table.add_row(subject, *[_cell(c) if c else "" for c in row])
    console.print(table)
    for cell in result.cells:
        if not cell.ok:
            console.print(
                f"[red]mismatch:[/red] {cell.subject} × {cell.stage}: expected {escape(_mismatch(cell))}"
                f"{' — ' + escape(cell.message) if cell.message else ''}",
                soft_wrap=True,
            )
    for problem in result.problems:
        console.print(f"[red]problem:[/red] {escape(problem)}", soft_wrap=True)
    for mistake in result.broken:
        console.print(f"[red]error:[/red] {escape(mistake)}", soft_wrap=True)
    verdict = (
        "[bold green]stages check passed[/bold green]" if result.ok else "[bold red]stages check failed[/bold red]"
    )
    bad = sum(not c.ok for c in result.cells)
    broken = f", {len(result.broken)} broken manifest field(s)" if result.broken else ""
    console.print(f"{verdict} · {len(result.cells)} checks, {bad} mismatches, {len(result.problems)} problems{broken}")
    same = sum(bool(c.same_as) for c in result.cells)
    if same:
        console.print(
            f"[dim]{same} of the checks (marked =) took the solution's verdict: the stage's calls reach the same code "
            "there (the mutant's edit lies where that stage never goes)[/dim]",
            soft_wrap=True,
        )
