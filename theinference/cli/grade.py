"""`theinference grade`: batch-grade many submissions; `theinference grade merge`: combine shards."""

import dataclasses
import json
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from theinference import __version__
from theinference.proc import interrupt
from theinference.grading.batch import (BatchError, BatchInterrupted, CsvWriter, SubmissionResult, grade_batch, merge_csv,
                                parse_shard, shard, submissions)
from theinference.cli.common import err_console, in_ci, run_options, synth_progress, write_atomic
from theinference.proc.launch import blas_env, default_launcher
from theinference.report.gradescope import render_gradescope, render_gradescope_ungraded
from theinference.report.jsonout import run_document
from theinference.report.untrusted import for_terminal
from theinference.proc.runner import DEFAULT_MEMORY_MB
from theinference.grading.session import select_stages
from theinference.model.weights_choice import obtain_weights
from theinference.grading.stages import load_stages, stage_dirs
from theinference.cli.options import DEFAULT_JOBS, JobsOpt, MemoryLimitOpt, StagesDirOpt, TimeoutOpt, WeightsOpt
from theinference.grading.grader import Grader


SUBMISSION_TIMEOUT = 600.0  # seconds: a hung submission cannot hold up a batch for longer


class BatchFormat(str, Enum):
    csv = "csv"
    json = "json"
    gradescope = "gradescope"


def _progress_line(done: int, total: int, result: SubmissionResult) -> str:
    points = "{:g}/{:g}".format(*result.run.points) if result.run else "-"
    why = f" ({result.error})" if result.error else ""
    return for_terminal(f"[{done}/{total}] {result.id}: {result.status} {points} points, {result.seconds:.1f} s{why}")


def _grader(weights: Optional[str], stages_dir: list[Path], stage: list[str], student_env: dict):
    stages = select_stages(load_stages(stage_dirs(None, stages_dir)), stage)
    choice, model, _ = obtain_weights(weights, None, synth_progress())
    # One grader for every submission: weights, oracle cache, launcher.
    return Grader(weights=choice, model=model, launcher=default_launcher(student_env, untrusted=True), untrusted=True,
                  extra_stage_dirs=list(stages_dir)), stages


def _merge(parts: list[Path], out: Path) -> None:
    missing = [p for p in parts if not p.is_file()]
    if not parts or missing:
        raise BatchError(f"grade merge needs shard CSV files; not found: {', '.join(map(str, missing)) or 'none given'}")
    count = merge_csv(out, parts)
    err_console().print(f"merged {len(parts)} shard(s), {count} submissions, into {out}")


def grade_command(
    submission_dirs: Annotated[list[Path], typer.Argument(metavar="SUBMISSION_DIR...", help="Course directories to grade (or: merge SHARD.csv...).")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the grades.")] = Path("grades.csv"),
    fmt: Annotated[BatchFormat, typer.Option("--format", help="csv: one row per submission, written as each finishes; json: every run's full results; gradescope: one submission's results.json.")] = BatchFormat.csv,
    jobs: JobsOpt = DEFAULT_JOBS,
    shard_spec: Annotated[Optional[str], typer.Option("--shard", metavar="I/N", help="Grade only the I-th of N deterministic slices.")] = None,
    stage: Annotated[Optional[list[str]], typer.Option("--stage", help="Grade only this stage (repeatable; default all).")] = None,
    stages_dir: StagesDirOpt = None,
    weights: WeightsOpt = None,
    timeout: TimeoutOpt = None,
    memory_limit: MemoryLimitOpt = DEFAULT_MEMORY_MB,
    seed: Annotated[Optional[str], typer.Option("--seed", help="Random extra cases (same for every submission).")] = None,
    all_cases: Annotated[bool, typer.Option("--all-cases", help="Run a stage's remaining cases after one times out (default: report them as skipped).")] = False,
    submission_timeout: Annotated[float, typer.Option("--submission-timeout", min=0, help="Wall seconds per submission, after which its remaining cases are reported as timed out (0: none).")] = SUBMISSION_TIMEOUT,
) -> None:
    """Grade many submissions: the oracle once per case, students in parallel, each under its own limits.

    Submissions are untrusted: their stages/, and the weights, stages_dirs and timeout of their
    theinference.toml, are ignored; student processes get only an allow-listed environment.
    Exit 0 once every submission is graded, whatever their grades; 2 on a configuration error.
    `theinference grade merge SHARD.csv... --out grades.csv` combines the CSVs of --shard runs.
    """
    if str(submission_dirs[0]) == "merge":
        return _merge(submission_dirs[1:], out)
    # Parallel students share the cores: each gets its share of BLAS threads, not all of them.
    student_env = blas_env(max(1, (os.cpu_count() or 1) // jobs)) if jobs > 1 else {}
    options = run_options(timeout, memory_limit, seed, untrusted=True, all_cases=all_cases,
                          submission_timeout=submission_timeout, env=student_env)
    subs = submissions(submission_dirs)
    if fmt is BatchFormat.gradescope and len(subs) != 1:
        raise BatchError("--format gradescope grades exactly one submission (Gradescope runs one per submission)")
    if shard_spec:
        subs = shard(subs, *parse_shard(shard_spec))
    grader, stages = _grader(weights, stages_dir or [], stage or [], student_env)
    with grader:
        grader.launcher.hide(out)
        results, stopped = _run(subs, grader, stages, options, jobs, out, fmt)
    if stopped:
        err_console().print(f"{stopped}; the {len(results)} graded are in {out}", soft_wrap=True, markup=False)
        raise typer.Exit(interrupt.exit_code() or 130)
    graded = sum(r.run is not None for r in results)
    err_console().print(f"graded {graded} of {len(results)} submissions into {out}"
                        + (f" (seed {options.seed})" if options.seed is not None else ""))


def _run(subs, grader, stages, options, jobs, out: Path, fmt: BatchFormat) -> tuple[list[SubmissionResult], str]:
    """Grade and write the results; also how the batch was interrupted ("" if it was not)."""
    stage_ids = [s.id for s in stages]
    writer = CsvWriter(out, stage_ids) if fmt is BatchFormat.csv else None
    plain = in_ci() or not sys.stderr.isatty()
    progress = Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err_console(), disable=plain)
    task = progress.add_task("grade", total=len(subs))
    done = []

    def on_result(result: SubmissionResult) -> None:
        done.append(result)
        if writer:
            writer.add(result)
        progress.update(task, advance=1)
        if plain:
            err_console().print(_progress_line(len(done), len(subs), result), soft_wrap=True, markup=False)

    stopped = ""
    with progress:
        try:
            results = grade_batch(subs, grader, stages, options, jobs, on_result)
        except BatchInterrupted as e:
            results, stopped = e.results, str(e)
    if writer:
        writer.finish(results, stopped)
    elif fmt is BatchFormat.gradescope:
        if results:
            _write_gradescope(results[0], stages, out, options.seed)
        else:
            write_atomic(out, render_gradescope_ungraded(stages, f"grading was {stopped}", __version__))
    else:
        docs = [{"id": r.id, "path": r.path, "status": r.status, "error": r.error, "seconds": r.seconds,
                 "results": run_document(r.run, __version__) if r.run else None} for r in results]
        write_atomic(out, json.dumps({"schema": "theinference.batch", "schema_version": 1, "seed": options.seed,
                                      "interrupted": stopped or None, "submissions": docs}, indent=2) + "\n")
    return results, stopped


def _write_gradescope(result: SubmissionResult, stages, out: Path, seed: int | None) -> None:
    # The batch applies the seed to the stages itself; the report still names it, for `test --seed`.
    text = (render_gradescope(dataclasses.replace(result.run, seed=seed), __version__) if result.run
            else render_gradescope_ungraded(stages, result.error, __version__))
    # Atomically: Gradescope must never read a half-written results.json.
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
