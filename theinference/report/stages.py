"""`theinference stages list` for people: a line per stage (id, status, cases, points, adapter), its title below.

Stage ids (what the student types) and statuses are never cut; the title has a line of its own and wraps
as words under itself. Where the first line would not fit the width, the adapter moves to the title's line.
"""

import textwrap
from dataclasses import dataclass

from rich.cells import cell_len

INDENT = "  "


@dataclass(frozen=True)
class StageLine:
    id: str
    status: str  # the recorded status, already made safe for a terminal, with " ◀ next" on the next stage
    title: str
    adapter: str
    cases: int
    points: float
    defined_in: str = ""  # the stage file's name, for a stage that is not built in


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - cell_len(text))


def stage_lines(rows: list[StageLine], width: int) -> list[str]:
    """The listing's lines at this width: a header, then each stage's line and its title's."""
    id_w = max(cell_len("stage"), *(cell_len(r.id) for r in rows))
    status_w = max(cell_len("status"), *(cell_len(r.status) for r in rows))

    def first(id_: str, status: str, cases: str, points: str, adapter: str) -> str:
        line = f"{_pad(id_, id_w)}  {_pad(status, status_w)}  {cases:>5}  {points:>6}"
        return f"{line}  {adapter}" if adapter else line

    with_adapter = max(cell_len(first(r.id, r.status, str(r.cases), f"{r.points:g}", r.adapter)) for r in rows)
    adapter_inline = with_adapter <= width
    lines = [first("stage", "status", "cases", "points", "adapter" if adapter_inline else "").rstrip()]
    for r in rows:
        lines.append(first(r.id, r.status, str(r.cases), f"{r.points:g}", r.adapter if adapter_inline else ""))
        extra = [] if adapter_inline else [f"{r.adapter}()"]
        extra += [f"from {r.defined_in}"] if r.defined_in else []
        about = " · ".join([r.title, *extra])
        lines.extend(
            textwrap.wrap(
                about, width=max(20, width), initial_indent=INDENT, subsequent_indent=INDENT, break_on_hyphens=False
            )
        )
    return lines
