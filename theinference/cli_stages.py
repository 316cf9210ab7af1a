"""`theinference stages`: list the stages a course has."""

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from theinference.cli_common import config_error, console_for
from theinference.course import CourseError, find_course_root
from theinference.stages import StageError, load_stages, stage_dirs

stages_app = typer.Typer(help="List and check stages.", no_args_is_help=True)


@stages_app.command("list")
def list_stages(
    course: Annotated[Optional[Path], typer.Option("--course", help="Course directory (default: found from here).")] = None,
    stages_dir: Annotated[Optional[list[Path]], typer.Option("--stages-dir", help="Another directory of stage files.")] = None,
) -> None:
    """List every stage in course order: id, title, cases, points, where it is defined."""
    root = course.resolve() if course else find_course_root(Path.cwd())
    try:
        stages = load_stages(stage_dirs(root, stages_dir or []))
    except (StageError, CourseError) as e:
        raise config_error(e)
    table = Table(show_edge=False)
    for column in ("stage", "title", "adapter", "cases", "points", "defined in"):
        table.add_column(column)
    for s in stages:
        table.add_row(s.id, s.title, s.adapter, str(len(s.cases)), f"{s.points:g}", s.source.name)
    console_for(sys.stdout).print(table)
