"""`theinference stages`: list the stages a course has."""

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markdown import Markdown
from rich.table import Table

from theinference.grading.check import check_course
from theinference.cli.common import EXIT_FAIL, console_for, synth_progress
from theinference.course import find_course_root
from theinference.proc.launch import default_launcher
from theinference.grading.progress import load_progress, next_stage
from theinference.report.check import render_check
from theinference.bundled import data_dir
from theinference.grading.session import select_stages
from theinference.model.weights_choice import obtain_weights
from theinference.grading.stages import StageError, load_stages, stage_dirs
from theinference.cli.options import CourseOpt, DEFAULT_JOBS, JobsOpt, StagesDirOpt, TimeoutOpt, WeightsOpt
from theinference.grading.grader import Grader

stages_app = typer.Typer(help="List and check stages.", no_args_is_help=True)


@stages_app.command("list")
def list_stages(
    course: CourseOpt = None,
    stages_dir: StagesDirOpt = None,
) -> None:
    """List every stage in course order: id, title, cases, points, where it is defined."""
    root = course.resolve() if course else find_course_root(Path.cwd())
    stages = load_stages(stage_dirs(root, stages_dir or []))
    progress = load_progress(root) if root else {}
    upcoming = next_stage(stages, progress) if root else None
    table = Table(show_edge=False)
    for column in ("stage", "status", "title", "adapter", "cases", "points", "defined in"):
        table.add_column(column)
    for s in stages:
        status = progress.get(s.id, {}).get("status", "not graded")
        marker = " ◀ next" if upcoming is not None and s.id == upcoming.id else ""
        table.add_row(s.id, status + marker, s.title, s.adapter, str(len(s.cases)), f"{s.points:g}", s.source.name)
    console_for(sys.stdout).print(table)


@stages_app.command("show")
def show(
    stage_id: Annotated[str, typer.Argument(metavar="ID", help="The stage whose lesson to show.")],
    course: CourseOpt = None,
    stages_dir: StagesDirOpt = None,
) -> None:
    """Show a stage's lesson, with its adapter, tolerance and cases."""
    root = course.resolve() if course else find_course_root(Path.cwd())
    try:
        [stage] = select_stages(load_stages(stage_dirs(root, stages_dir or [])), [stage_id])
        lesson = stage.lesson.read_text(encoding="utf-8")
    except OSError as e:
        raise StageError(f"{stage.source}: cannot read lesson {stage.lesson}: {e.strerror}") from None
    console = console_for(sys.stdout)
    console.print(Markdown(lesson))
    tolerance = f"tie rtol {stage.tie_rtol:g}" if stage.tie_rtol is not None else f"atol {stage.atol:g} rtol {stage.rtol:g}"
    console.print(f"\nadapter {stage.adapter}() · {tolerance} · "
                  f"{len(stage.cases)} cases · {stage.points:g} points · timeout {stage.timeout:g} s", style="dim")


@stages_app.command("check")
def check(
    source: Annotated[Optional[Path], typer.Option("--source", help="Course source holding solution/, starter/, mutants/ (default: the bundled course).")] = None,
    stage: Annotated[Optional[list[str]], typer.Option("--stage", help="Check only this stage (repeatable).")] = None,
    stages_dir: StagesDirOpt = None,
    weights: WeightsOpt = None,
    timeout: TimeoutOpt = None,
    jobs: JobsOpt = DEFAULT_JOBS,
) -> None:
    """Prove the stages: the solution passes all, the starter is 'not started', every mutant fails
    exactly the stages its manifest names, with the named diagnosis. Exit 1 on any mismatch."""
    source = (source or data_dir("course")).resolve()
    extra = [*(stages_dir or []), *([source / "stages"] if (source / "stages").is_dir() else [])]
    all_stages = load_stages(stage_dirs(None, extra))
    selected = select_stages(all_stages, stage or [])
    choice, model, _ = obtain_weights(weights, None, synth_progress())
    console = console_for(sys.stdout)
    console.print(f"checking {source} against {choice.path} ({choice.why})", soft_wrap=True)
    with Grader(weights=choice, model=model, launcher=default_launcher()) as grader:
        result = check_course(source, all_stages, selected, grader, timeout=timeout, jobs=jobs)
    render_check(console, result)
    raise typer.Exit(0 if result.ok else EXIT_FAIL)
