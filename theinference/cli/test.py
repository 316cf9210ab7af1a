"""`theinference test`: grade a course's stages (or watch it), render the report, exit 0/1."""

import io
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from theinference import __version__
from theinference.cli.common import (
    EXIT_FAIL,
    synth_progress,
    write_atomic,
)
from theinference.cli.consoles import console_for, err_console, write_document
from theinference.cli.options import (
    CourseOpt,
    AllowRootOpt,
    MemoryLimitOpt,
    NoDiagnosisOpt,
    RequireIsolationOpt,
    StagesDirOpt,
    TimeoutOpt,
    WeightsOpt,
)
from theinference.cli.live import RunProgress, StreamedReport
from theinference.errors import UsageError
from theinference.grading.drive.plan import plan_run
from theinference.grading.judge.events import Event, Listener, RunDone, tee
from theinference.grading.drive.session import choose_stages, open_session
from theinference.proc.runner import DEFAULT_MEMORY_MB
from theinference.files import check_target
from theinference.report.terminal import render_run


class Format(str, Enum):
    rich = "rich"
    json = "json"
    junit = "junit"
    gradescope = "gradescope"
    github = "github"


def _made_weights(model) -> str:
    """The weights just made, named as what they are: the preset, and its size where it is not GPT-2's."""
    c = model.config
    shape = f"{c.n_layer} layers, n_embd {c.n_embd}, n_ctx {c.n_ctx}"
    preset = model.synthetic.preset if model.synthetic else "synthetic"
    if preset == "gpt2":
        return f"synthetic GPT-2-shape weights ({shape})"
    return f"the synthetic {preset} weights ({shape}, smaller than GPT-2)"


def _weights_notice(session) -> None:
    if session.made_weights:
        model = session.model
        err_console().print(
            f"[yellow]note:[/yellow] made {_made_weights(model)} at {model.path} "
            "(every identity holds for them; generated text is gibberish). For real GPT-2: "
            "`hf download openai-community/gpt2 model.safetensors config.json`, or pass --weights PATH.",
            soft_wrap=True,
        )


def _emit(run, fmt: Format, output: Optional[Path]) -> None:
    # The other formats' renderers are imported only for them: a plain `test` never pays for them.
    from theinference.report import TEXT_FORMATS
    from theinference.report.github import render_summary

    if fmt is Format.github and os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(render_summary(run, __version__))
    if fmt.value in TEXT_FORMATS:
        text = TEXT_FORMATS[fmt.value](run, __version__)
        if output:
            write_atomic(output, text)
        else:
            write_document(sys.stdout, text)
        return
    if output:
        buffer = io.StringIO()
        render_run(Console(file=buffer, width=120, no_color=True, highlight=False), run, __version__)
        write_atomic(output, buffer.getvalue())
    else:
        render_run(console_for(sys.stdout), run, __version__)


def _watch(session, wanted: list[str] | None, poll: bool) -> int:
    """Watch mode: a live line per case on stderr while a grade runs, the screen redrawn after each."""
    # Imported for watch mode only (watchdog's observers are a tenth of a plain `test`'s imports).
    from theinference.cli.watch import render_regrade, run_watch
    from theinference.grading.drive.watch import Watch

    live = RunProgress()

    def show(regrade) -> None:
        live.pause()
        render_regrade(regrade, session.course.root)

    finding = show if session.plan.options.diagnosis else None
    watch = Watch(session, wanted, show, poll=poll, on_fingerprint=finding, listen=live)
    try:
        return run_watch(watch)
    finally:
        live.close()


def test_command(
    stage: Annotated[
        Optional[list[str]], typer.Option("--stage", metavar="ID", help="Stage id to grade (repeatable).")
    ] = None,
    all_stages: Annotated[
        bool, typer.Option("--all", help="Grade every stage (default: the first stage not yet passed).")
    ] = False,
    course: CourseOpt = None,
    weights: WeightsOpt = None,
    timeout: TimeoutOpt = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.rich,
    output: Annotated[
        Optional[Path],
        typer.Option("--output", metavar="FILE", help="Write the report to this file instead of stdout."),
    ] = None,
    stages_dir: StagesDirOpt = None,
    seed: Annotated[
        Optional[str],
        typer.Option(
            "--seed", metavar="SEED", help="Add random cases: an integer seed, or 'random' (recorded in the results)."
        ),
    ] = None,
    memory_limit: MemoryLimitOpt = DEFAULT_MEMORY_MB,
    watch: Annotated[
        bool, typer.Option("--watch", help="Re-grade whenever a .py or .toml file in the course changes.")
    ] = False,
    poll: Annotated[
        bool, typer.Option("--poll", help="With --watch: poll for changes (WSL2 Windows mounts, network filesystems).")
    ] = False,
    untrusted: Annotated[
        bool,
        typer.Option(
            "--untrusted",
            help="Grade as `grade` does: ignore the course's stages, weights and timeout; allow-listed environment (implied by CI=true and --format gradescope).",
        ),
    ] = False,
    all_cases: Annotated[
        bool,
        typer.Option(
            "--all-cases", help="Run a stage's remaining cases after one times out (default: report them as skipped)."
        ),
    ] = False,
    no_diagnosis: NoDiagnosisOpt = False,
    allow_root: AllowRootOpt = False,
    require_isolation: RequireIsolationOpt = None,
) -> None:
    """Grade the course's adapters against the numpy GPT-2 oracle.

    Exit codes: 0 every selected stage passed; 1 some stage failed (including errors, timeouts, crashes and stages not started); 2 usage or configuration error (unknown stage, no adapters file, unreadable weights, invalid stage file); 3 internal error: a bug in the grader, please report it.
    """
    if output:  # refused now, not once graded: a planted directory there would lose the results
        check_target(output)
    # Results that count as grades come from the instructor's inputs only (see the README's threat model).
    plan = plan_run(
        course,
        weights=weights,
        stages_dirs=stages_dir or [],
        timeout=timeout,
        memory_limit_mb=memory_limit,
        seed=seed,
        untrusted=untrusted,
        gradescope=fmt is Format.gradescope,
        all_cases=all_cases,
        diagnosis=not no_diagnosis,
        allow_root=allow_root,
        require_isolation=require_isolation.value if require_isolation else None,
    )
    if plan.untrusted and watch:
        raise UsageError(
            "--watch trusts the course directory; it cannot be combined with untrusted grading "
            "(--untrusted, CI=true or --format gradescope)"
        )
    with open_session(plan, progress=synth_progress()) as session:
        # None: the next stage not yet passed, read from .theinference/ (which untrusted grading does not read)
        wanted = [] if all_stages else (stage or ([] if plan.untrusted else None))
        if output:
            session.hide(output)
        _weights_notice(session)
        if watch:
            raise typer.Exit(_watch(session, wanted, poll))
        selected = choose_stages(session, wanted)
        if wanted is None and len(selected) == 1:
            err_console().print(
                f"grading [bold]{selected[0].id}[/bold], the first stage not yet passed "
                "(--all grades every stage, --stage ID a given one)",
                soft_wrap=True,
            )
        # Rich on stdout streams: the header now, each verdict as it comes, findings once every verdict is out.
        streamed = fmt is Format.rich and output is None
        live = RunProgress()
        listeners: list[Listener] = [
            live,
            _notice,
        ]  # the notice of recording progress after the findings, before the footer
        if streamed:
            listeners.append(StreamedReport(console_for(sys.stdout), __version__, live, session.model.config.n_vocab))
        try:
            run = session.run(selected, tee(*listeners), verdicts_first=streamed)
        finally:
            live.close()
    if not streamed:
        _emit(run, fmt, output)
    raise typer.Exit(0 if run.passed else EXIT_FAIL)


def _notice(event: Event) -> None:
    """What recording the course's progress said (a corrupt file replaced, progress not kept), on stderr."""
    if isinstance(event, RunDone) and event.notice:
        err_console().print(event.notice, markup=False, soft_wrap=True)
