"""`theinference report`: the class report, one HTML file, from a batch's JSON."""

from pathlib import Path
from typing import Annotated

import typer

from theinference.cli.common import write_atomic
from theinference.cli.consoles import err_console
from theinference.grading.drive.batch import BatchError
from theinference.grading.drive.gradesheet import check_output
from theinference.grading.tools.classview import class_view, load_batch
from theinference.report.html import render_class_html


def report_command(
    grades: Annotated[
        Path, typer.Argument(metavar="FILE", help="The batch JSON that `grade --format json` (or `grade merge`) wrote.")
    ],
    out: Annotated[Path, typer.Option("--out", metavar="FILE", help="Where to write the HTML report.")] = Path(
        "report.html"
    ),
) -> None:
    """Write the class report: one self-contained HTML file (no script, nothing fetched) to open in a browser.

    Per-stage pass rates, the distribution of points, the known bugs the grader named across the class (how many students, at which stages, with links), and a section per submission with its stage tables, an error-by-position plot per failing case, its finding and hint.

    Exit 0 when written, 2 when the file is not a batch JSON document.
    """
    if out.resolve() == grades.resolve():
        raise BatchError(f"--out {out}: that is the batch JSON itself")
    check_output(out)
    doc = load_batch(grades)
    view = class_view(doc)
    write_atomic(out, render_class_html(doc, view, grades.name))
    named = {student for f in view.findings for student in f.students}
    err_console().print(
        f"wrote {out}: {view.submissions} submissions, {len(view.findings)} known bug(s) named in {len(named)} of them",
        markup=False,
        soft_wrap=True,
    )
