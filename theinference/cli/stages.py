"""`theinference stages`: list, show, check and scaffold the stages a course has."""

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markdown import Markdown
from rich.text import Text

from theinference.grading.tools.check import check_course, proposals
from theinference.grading.tools.mutants import Proposal, write_proposals
from theinference.cli.common import EXIT_CONFIG, EXIT_FAIL, ItemProgress, synth_progress
from theinference.cli.consoles import console_for
from theinference.grading.drive.progress import describe_entry, load_progress, next_stage
from theinference.report.check import render_check
from theinference.report.stages import StageLine, stage_lines
from theinference.untrusted import for_terminal
from theinference.bundled import data_dir
from theinference.grading.tools.scaffold import adapter_snippets, scaffold_stage
from theinference.grading.drive.session import select_stages
from theinference.grading.drive.plan import CourseNeed, RunPlan, plan_run
from theinference.grading.spec.stages import StageError, StageSpec
from theinference.cli.options import CourseOpt, DEFAULT_JOBS, JobsOpt, StagesDirOpt, TimeoutOpt, WeightsOpt
from theinference.grading.drive.grader import Grader
from theinference.proc.node import NODE_SUFFIXES

stages_app = typer.Typer(help="List, show, check and scaffold stages.", no_args_is_help=True)


@stages_app.command("list")
def list_stages(
    course: CourseOpt = None,
    stages_dir: StagesDirOpt = None,
) -> None:
    """List every stage in course order: id, title, cases, points, where it is defined."""
    plan = plan_run(course, need=CourseNeed.OPTIONAL, stages_dirs=stages_dir or [])
    stages = plan.stages()
    found = plan.course if plan.trusted else None  # untrusted grading neither reads nor writes a course's progress
    progress = load_progress(found.root) if found else {}
    upcoming = next_stage(stages, progress) if found else None
    rows = []
    for s in stages:
        status = describe_entry(progress[s.id]) if s.id in progress else "not graded"
        marker = " ◀ next" if upcoming is not None and s.id == upcoming.id else ""
        # progress.json is the course's file: its text is shown as text, never as markup or escape sequences
        rows.append(
            StageLine(
                id=s.id,
                status=for_terminal(status) + marker,
                title=s.title,
                adapter=_adapter_name(plan, s),
                cases=len(s.cases),
                points=s.points,
                defined_in="" if plan.stage_origin(s) == "built-in" else str(s.source.name),
            )
        )
    console = console_for(sys.stdout)
    for line in stage_lines(rows, console.width):
        console.print(Text(line), soft_wrap=True)


@stages_app.command("show")
def show(
    stage_id: Annotated[str, typer.Argument(metavar="ID", help="The stage whose lesson to show.")],
    course: CourseOpt = None,
    stages_dir: StagesDirOpt = None,
) -> None:
    """Show a stage's lesson, with its adapter, tolerance and cases."""
    plan = plan_run(course, need=CourseNeed.OPTIONAL, stages_dirs=stages_dir or [])
    try:
        [stage] = select_stages(plan.stages(), [stage_id])
        lesson = stage.lesson.read_text(encoding="utf-8")
    except OSError as e:
        raise StageError(f"{stage.source}: cannot read lesson {stage.lesson}: {e.strerror}") from None
    console = console_for(sys.stdout)
    console.print(Markdown(lesson))
    tolerance = " ".join(f"{name.replace('_', ' ')} {value:g}" for name, value in stage.tolerance.items())
    console.print(
        f"\nadapter {_adapter_name(plan, stage)}() · {tolerance} · "
        f"{len(stage.cases)} cases · {stage.points:g} points · timeout {_timeout(plan, stage)}",
        style="dim",
    )


def _adapter_name(plan: RunPlan, stage: StageSpec) -> str:
    """The adapter's name as the course writes it: the camelCase alias in the TypeScript edition's adapters."""
    course = plan.course
    if course is not None and course.adapters.suffix in NODE_SUFFIXES and stage.aliases:
        return stage.aliases[0]
    return stage.adapter


def _timeout(plan: RunPlan, stage: StageSpec) -> str:
    """The seconds per call `test` would give this stage here, and who chose them when it is not the stage."""
    seconds = plan.timeouts.for_stage(stage)
    return f"{seconds:g} s" + (" (the course's theinference.toml)" if plan.timeouts.chosen_by_course else "")


@stages_app.command("check")
def check(
    source: Annotated[
        Optional[Path],
        typer.Option(
            "--source",
            metavar="DIR",
            help="Course source holding solution/, starter/, mutants/ (default: the bundled course).",
        ),
    ] = None,
    stage: Annotated[
        Optional[list[str]], typer.Option("--stage", metavar="ID", help="Check only this stage (repeatable).")
    ] = None,
    stages_dir: StagesDirOpt = None,
    weights: WeightsOpt = None,
    timeout: TimeoutOpt = None,
    jobs: JobsOpt = DEFAULT_JOBS,
    mutant: Annotated[
        Optional[list[str]],
        typer.Option(
            "--mutant",
            metavar="NAME",
            help="Check only this mutant (repeatable; the solution and starter are skipped).",
        ),
    ] = None,
    propose: Annotated[
        bool,
        typer.Option(
            "--propose",
            help="Write into each mutant's manifest what a stage it says nothing about showed (a new stage's "
            "expectations), marked for review.",
        ),
    ] = False,
    no_reuse: Annotated[
        bool,
        typer.Option(
            "--no-reuse",
            help="Grade every subject × stage, even a mutant's stage whose calls reach only the solution's code "
            "(by default that cell takes the solution's verdict, marked =).",
        ),
    ] = False,
) -> None:
    """Prove the stages: the solution passes all, the starter is 'not started', every mutant fails
    exactly the stages its manifest names, with the named diagnosis.

    A manifest silent about a stage expects it to pass; when a mutant fails such a stage (a stage added after the manifest) that the solution passes, the expectation lines that describe it are printed, and written with --propose. Exit 1 on any mismatch; 2 when a manifest is broken (it does not load, or names a stage or a bug that does not exist), after checking every other mutant."""
    source = (source or data_dir("course")).resolve()
    extra = [*(stages_dir or []), *([source / "stages"] if (source / "stages").is_dir() else [])]
    # The instructor's own subjects, graded with every tie named (first_exact off: the manifests list them all).
    plan = plan_run(need=CourseNeed.NONE, weights=weights, stages_dirs=extra, timeout=timeout, first_exact=False)
    all_stages = plan.stages()
    selected = select_stages(all_stages, stage or [])
    # The instructor's own subjects: the persistent oracle store may serve them (see grading.oracle.store).
    with Grader.open(plan, synth_progress()) as grader:
        console = console_for(sys.stdout)
        console.print(f"checking {source} against {grader.weights.path} ({grader.weights.why})", soft_wrap=True)
        progress = ItemProgress("checking", "cells")
        try:
            result = check_course(
                source,
                all_stages,
                selected,
                grader,
                jobs=jobs,
                progress=progress,
                only_mutants=mutant,
                reuse=not no_reuse,
            )
        finally:
            progress.close()
    render_check(console, result)
    _show_proposals(console, proposals(result, source), propose)
    raise typer.Exit(EXIT_CONFIG if result.broken else 0 if result.ok else EXIT_FAIL)


def _show_proposals(console, found: list[Proposal], write: bool) -> None:
    """The expectation lines for stages the manifests are silent about; written into them with --propose."""
    if not found:
        return
    console.print("\nmanifests silent about a stage their mutant fails (a new stage?): proposed lines", markup=False)
    for p in found:
        lines = " and ".join(f"[{table}] {line}" for table, line in p.lines())
        console.print(f"  {p.mutant.source}: {lines}", markup=False, highlight=False, soft_wrap=True)
    if not write:
        console.print("write them with --propose, review them (git diff), then run stages check again", markup=False)
        return
    written = write_proposals(found)
    console.print(
        f"wrote {len(found)} proposal(s) into {len(written)} manifest(s), each line marked: review them "
        "(git diff), then run stages check again",
        markup=False,
    )


@stages_app.command("new")
def new(
    stage_id: Annotated[str, typer.Argument(metavar="ID", help="The new stage's id: lowercase words joined by '-'.")],
    stages_dir: Annotated[
        Optional[Path],
        typer.Option("--stages-dir", metavar="DIR", help="Directory to write the stage into (default: ./stages)."),
    ] = None,
) -> None:
    """Scaffold a new stage: stage file, oracle file and lesson stub that load as they are, and
    print the adapter to add to the solution's and the starter's tests/adapters.py."""
    directory = stages_dir or Path("stages")
    existing = plan_run(need=CourseNeed.NONE, stages_dirs=[directory] if directory.is_dir() else []).stages()
    written = scaffold_stage(directory, stage_id, existing)
    solution, starter = adapter_snippets(stage_id)
    console = console_for(sys.stdout)
    console.print("wrote\n" + "".join(f"  {p}\n" for p in written), markup=False, soft_wrap=True)
    console.print(
        f"Add to the solution's tests/adapters.py (what the oracle's template computes):\n\n{solution}\n"
        f"and to the starter's tests/adapters.py:\n\n{starter}\n"
        f"Then: theinference stages show {stage_id} --stages-dir {shlex.quote(str(directory))}\n"
        f"      {_check_command(directory, stage_id)}\n"
        "(docs/authoring.md walks through each step)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _check_command(directory: Path, stage_id: str) -> str:
    """The `stages check` that proves the new stage, as it runs: on the course source the directory is in, if any."""
    source = directory.resolve().parent
    if (source / "solution").is_dir() and directory.resolve() == (source / "stages").resolve():
        return f"theinference stages check --source {shlex.quote(str(source))} --stage {stage_id}"
    # No course source around it: the bundled course's solution and mutants, until the instructor has their own.
    return (
        f"theinference stages check --stages-dir {shlex.quote(str(directory))} --stage {stage_id}"
        "   (against the bundled course; with your own solution/, starter/ and mutants/: --source DIR)"
    )
