"""`theinference grade`: batch-grade many submissions; `theinference grade merge`: combine shards."""

import dataclasses
import json
import os
import sys
import time
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from typer.core import TyperCommand

from theinference import __version__
from theinference.proc import interrupt
from theinference.grading.drive.batch import (
    BatchError,
    BatchInterrupted,
    mark_copies,
    ShardRecord,
    SubmissionResult,
    grade_batch,
    graded_with,
    parse_shard,
    shard,
    shard_record,
    submissions,
)
from theinference.grading.drive.gradesheet import CsvWriter, check_output, first_errors, regrade
from theinference.cli.common import synth_progress, write_atomic
from theinference.cli.consoles import err_console
from theinference.terminals import is_plain
from theinference.proc.launch import blas_env
from theinference.report.gradescope import render_gradescope, render_gradescope_ungraded
from theinference.untrusted import for_terminal
from theinference.proc.runner import DEFAULT_MEMORY_MB, LEFTOVERS
from theinference.grading.drive.session import select_stages
from theinference.grading.tools.shards import merge_shards
from theinference.grading.drive.grader import Grader
from theinference.grading.drive.plan import CourseNeed, RunPlan, plan_run
from theinference.grading.spec.stages import StageSpec
from theinference.cli.options import (
    DEFAULT_JOBS,
    AllowRootOpt,
    JobsOpt,
    MemoryLimitOpt,
    NoDiagnosisOpt,
    RequireIsolationOpt,
    StagesDirOpt,
    TimeoutOpt,
    WeightsOpt,
)
from theinference.report.jsonout import batch_document


SUBMISSION_TIMEOUT = 600.0  # seconds: a hung submission cannot hold up a batch for longer
LINE_ERROR_CHARS = 200  # of a submission's errors on its progress line (the CSV and JSON keep more)


class BatchFormat(str, Enum):
    csv = "csv"
    json = "json"
    gradescope = "gradescope"


DEFAULT_OUT = {BatchFormat.csv: "grades.csv", BatchFormat.json: "grades.json", BatchFormat.gradescope: "results.json"}


class BatchProgress:
    """`grade`'s progress on stderr: a rich bar on a terminal; else a line per warmed stage and per graded submission."""

    def __init__(self, total: int, stages: list):
        self.plain = is_plain(sys.stderr)
        self.stages, self.total, self.done, self.started = stages, total, 0, time.perf_counter()
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err_console(),
            disable=self.plain,
        )
        self.oracle_task: TaskID | None = None
        self.grade_task = self.bar.add_task("grading", total=total)

    def say(self, line: str) -> None:
        if self.plain:
            err_console().print(for_terminal(line), soft_wrap=True, markup=False, highlight=False)

    def oracle_case(self, stage_id: str, done: int, total: int) -> None:
        """One more case's oracle output computed (before any submission runs)."""
        if done == total:
            self.say(f"oracle outputs for {stage_id}: {total} cases ready ({time.perf_counter() - self.started:.1f} s)")
        if self.oracle_task is None:
            self.oracle_task = self.bar.add_task("oracle", total=total)
        self.bar.update(self.oracle_task, description=f"oracle {stage_id}", completed=done, total=total)

    def submission(self, result: SubmissionResult) -> None:
        """One more submission graded."""
        self.done += 1
        self.bar.update(self.grade_task, advance=1)
        points = "{:g}/{:g}".format(*result.points(self.stages))
        errors = first_errors(result)
        why = f" ({errors[:LINE_ERROR_CHARS]}{'…' if len(errors) > LINE_ERROR_CHARS else ''})" if errors else ""
        self.say(
            f"[{self.done}/{self.total}] {result.id}: {result.status} {points} points, {result.seconds:.1f} s{why}"
        )


def _grader(plan: RunPlan, stage: list[str]) -> tuple[Grader, list[StageSpec]]:
    stages = select_stages(plan.stages(), stage)
    # One grader for every submission: weights, oracle cache, launcher.
    return Grader.open(plan, synth_progress()), stages


def merge_command(
    parts: Annotated[
        list[Path], typer.Argument(metavar="SHARD...", help="The files `grade --shard I/N` wrote: all CSV or all JSON.")
    ],
    out: Annotated[
        Optional[Path],
        typer.Option(
            "--out",
            metavar="FILE",
            help="Where to write the merged grades (default: grades.csv, or grades.json for JSON shards).",
        ),
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="The first file is the class's grades; each later file's rows replace those of the same students (a regrade).",
        ),
    ] = False,
) -> None:
    """Combine the CSV or JSON files of `theinference grade --shard I/N` runs into one, sorted by id.

    Refuses an interrupted shard, a shard missing or given twice (each records I/N and the batch it slices), a submission in two shards, and shards graded differently (on other stages, or with another theinference version, weights, stage files or --seed: every shard records them), naming the difference.

    `grade merge --replace GRADES REGRADED... --out FILE` regrades students: their rows in GRADES are replaced by those in REGRADED (graded alike), each keeping its own record of the run that graded it.

    Copies are looked for again over every merged row, from the fingerprints each row carries (not its source): a pair of students graded in different shards is flagged as in one batch.

    Exit 0 when merged, 2 when refused.
    """
    missing = [p for p in parts if not p.is_file()]
    if missing:
        raise BatchError(f"grade merge needs shard files; not found: {', '.join(map(str, missing))}")
    if replace and len(parts) < 2:
        raise BatchError("grade merge --replace needs the class's grades and at least one file of regraded students")
    merged = merge_shards(parts, out, replace)
    what = (
        f"replaced {len(merged.replaced)} submission(s) ({', '.join(merged.replaced)})"
        if replace
        else f"merged {len(parts)} shard(s)"
    )
    err_console().print(f"{what}, {merged.count} submissions, into {merged.out}", markup=False, soft_wrap=True)
    if merged.unprinted:
        err_console().print(
            f"{len(merged.unprinted)} row(s) carry no fingerprints (written by a theinference before shards carried "
            f"them), so their copies are as their own shard found them, not looked for across shards: "
            f"{', '.join(for_terminal(i) for i in merged.unprinted[:10])}{' ...' if len(merged.unprinted) > 10 else ''}",
            markup=False,
            soft_wrap=True,
        )


_merge_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
_merge_app.command("merge")(merge_command)


class GradeCommand(TyperCommand):
    """`grade`, except that `grade merge ...` is the merge command, with its own arguments and --help."""

    def make_context(self, info_name, args, parent=None, **extra):
        if args and args[0] == "merge":
            merge = typer.main.get_command(_merge_app)
            return merge.make_context(f"{info_name} merge", args[1:], parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)


def grade_command(
    submission_dirs: Annotated[
        list[Path], typer.Argument(metavar="SUBMISSION_DIR...", help="Course directories to grade.")
    ],
    out: Annotated[
        Optional[Path],
        typer.Option(
            "--out",
            metavar="FILE",
            help="Where to write the grades (default: grades.csv; grades.json for json; results.json for gradescope).",
        ),
    ] = None,
    fmt: Annotated[
        BatchFormat,
        typer.Option(
            "--format",
            help="csv: one row per submission, written as each finishes; json: every run's full results; gradescope: one submission's results.json.",
        ),
    ] = BatchFormat.csv,
    jobs: JobsOpt = DEFAULT_JOBS,
    shard_spec: Annotated[
        Optional[str], typer.Option("--shard", metavar="I/N", help="Grade only the I-th of N deterministic slices.")
    ] = None,
    stage: Annotated[
        Optional[list[str]],
        typer.Option("--stage", metavar="ID", help="Grade only this stage (repeatable; default all)."),
    ] = None,
    stages_dir: StagesDirOpt = None,
    weights: WeightsOpt = None,
    timeout: TimeoutOpt = None,
    memory_limit: MemoryLimitOpt = DEFAULT_MEMORY_MB,
    seed: Annotated[
        Optional[str], typer.Option("--seed", metavar="SEED", help="Random extra cases (same for every submission).")
    ] = None,
    all_cases: Annotated[
        bool,
        typer.Option(
            "--all-cases", help="Run a stage's remaining cases after one times out (default: report them as skipped)."
        ),
    ] = False,
    submission_timeout: Annotated[
        float,
        typer.Option(
            "--submission-timeout",
            metavar="SECONDS",
            min=0,
            help="Wall seconds per submission, not counting its stages that timed out (a hang is bounded by its own "
            "stage's budget and leaves the later stages theirs); past them its remaining cases are reported as timed "
            "out and listed to regrade (0: none).",
        ),
    ] = SUBMISSION_TIMEOUT,
    finish_by: Annotated[
        Optional[str],
        typer.Option(
            "--finish-by",
            metavar="TIME",
            help="Stop by this time (Unix seconds, or ISO 8601 with its zone), however late grading started: "
            "cases still to run are reported as timed out, and known-bug matching stops.",
        ),
    ] = None,
    require_isolation: RequireIsolationOpt = None,
    json_out: Annotated[
        Optional[Path],
        typer.Option(
            "--json", metavar="FILE", help="With --format csv: also write the batch JSON (for `report`) here."
        ),
    ] = None,
    no_diagnosis: NoDiagnosisOpt = False,
    allow_root: AllowRootOpt = False,
) -> None:
    """Grade many submissions: the oracle once per case, students in parallel, each under its own limits.

    Submissions are untrusted: their stages/, and the weights, stages_dirs and timeout of their theinference.toml, are ignored; student processes get only an allow-listed environment.

    Progress goes to stderr: a bar on a terminal, else a line per finished submission.

    Exit 0 once every submission is graded, whatever their grades; 2 on a configuration error.

    `theinference grade merge SHARD... [--out FILE]` combines the CSV or JSON files of --shard runs (see `theinference grade merge --help`).
    """
    out = out or Path(DEFAULT_OUT[fmt])
    if json_out is not None and fmt is not BatchFormat.csv:
        raise BatchError(f"--json is the JSON beside a CSV: with --format {fmt.value}, leave it out")
    plan = plan_run(
        need=CourseNeed.NONE,
        weights=weights,
        stages_dirs=stages_dir or [],
        timeout=timeout,
        memory_limit_mb=memory_limit,
        seed=seed,
        untrusted=True,  # submissions choose nothing (theinference.trust)
        all_cases=all_cases,
        submission_timeout=submission_timeout,
        diagnosis=not no_diagnosis,
        allow_root=allow_root,
        finish_by=finish_by,
        require_isolation=require_isolation.value if require_isolation else None,
    )
    options = plan.options
    check_output(out)
    if json_out is not None:
        check_output(json_out)
    subs = submissions(submission_dirs)
    if fmt is BatchFormat.gradescope and len(subs) != 1:
        raise BatchError("--format gradescope grades exactly one submission (Gradescope runs one per submission)")
    index, count = parse_shard(shard_spec) if shard_spec else (1, 1)
    record = shard_record(subs, index, count)
    subs = shard(subs, index, count)
    grader, stages = _grader(plan, stage or [])
    isolation = grader.isolation
    if jobs > 1 and len(subs) > 1 and not isolation.separates_submissions:
        jobs = 1
        err_console().print(
            f"grading one submission at a time: at the {isolation.level} level submissions share a user, and one "
            "could kill another's processes or write into its run directory (bubblewrap, or grading as root, "
            "gives each its own)",
            soft_wrap=True,
            markup=False,
        )
    # Parallel students share the cores: each gets its share of BLAS threads, not all of them.
    if jobs > 1:
        student_env = MappingProxyType(blas_env(max(1, (os.cpu_count() or 1) // jobs)))
        options = dataclasses.replace(options, limits=dataclasses.replace(options.limits, env=student_env))
    with grader:
        for written in (out, json_out):
            if written is not None:
                grader.hide(written)
        results, stopped = _run(subs, grader, stages, options, jobs, out, fmt, record, json_out)
    if stopped:
        err_console().print(f"{stopped}; the {len(results)} graded are in {out}", soft_wrap=True, markup=False)
        raise typer.Exit(interrupt.exit_code() or 130)
    graded = sum(r.run is not None for r in results)
    err_console().print(
        f"graded {graded} of {len(results)} submissions into {out}"
        + (f" (seed {options.seed})" if options.seed is not None else "")
    )
    _say_regrades(results)


def _say_regrades(results: list[SubmissionResult]) -> None:
    """Name the rows whose points the wall clock decided, not the code (the CSV's `regrade` column)."""
    rows = [f"{for_terminal(r.id)} ({', '.join(stages)})" for r in results if (stages := regrade(r))]
    if rows:
        err_console().print(
            f"{len(rows)} submission(s) to regrade on a quieter machine or with more time: a case there ended "
            f"machine-busy or the time budget stopped it, which is not a verdict on the code: {'; '.join(rows)}",
            soft_wrap=True,
            markup=False,
        )


def _run(
    subs, grader, stages, options, jobs, out: Path, fmt: BatchFormat, record: ShardRecord, json_out: Path | None = None
) -> tuple[list[SubmissionResult], str]:
    """Grade and write the results; also how the batch was interrupted ("" if it was not)."""
    progress = BatchProgress(len(subs), stages)
    progress.say(f"grading {len(subs)} submission(s), {jobs} at a time, against {grader.model.path}")
    graded = graded_with(grader.model, stages, options.seed)
    writer = CsvWriter(out, stages, graded, record) if fmt is BatchFormat.csv else None

    def on_result(result: SubmissionResult) -> None:
        if writer:
            writer.add(result)
        progress.submission(result)

    stopped = ""
    with progress.bar:
        try:
            results = grade_batch(subs, grader, stages, options, jobs, on_result, progress.oracle_case)
        except BatchInterrupted as e:
            results, stopped = e.results, str(e)
    mark_copies(results)
    if LEFTOVERS:  # a student process kept writing into a run directory: reported, never the batch's failure
        progress.say(f"notice: {len(LEFTOVERS)} run directory(ies) could not be removed: {', '.join(LEFTOVERS[:5])}")
    if writer:
        writer.finish(results, stopped)
        if json_out is not None:
            write_atomic(
                json_out, json.dumps(batch_document(results, stages, graded, stopped, record), indent=2) + "\n"
            )
    elif fmt is BatchFormat.gradescope:
        if results:
            _write_gradescope(results[0], stages, out, options.seed)
        else:
            write_atomic(out, render_gradescope_ungraded(stages, f"grading was {stopped}", __version__))
    else:
        write_atomic(out, json.dumps(batch_document(results, stages, graded, stopped, record), indent=2) + "\n")
    return results, stopped


def _write_gradescope(result: SubmissionResult, stages, out: Path, seed: int | None) -> None:
    # The batch applies the seed to the stages itself; the report still names it, for `test --seed`.
    text = (
        render_gradescope(dataclasses.replace(result.run, seed=seed), __version__)
        if result.run
        else render_gradescope_ungraded(stages, result.error, __version__)
    )
    # Atomically: Gradescope must never read a half-written results.json.
    write_atomic(out, text)
