"""`theinference init` (start a course) and `theinference demo` (see a pass and a diagnosis)."""

import shutil
import sys
import tempfile
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from theinference import __version__
from theinference.cli.common import EXIT_FAIL, synth_progress
from theinference.cli.consoles import console_for
from theinference.cli.live import RunProgress, StreamedReport
from theinference.grading.tools.mutants import build_mutant, load_mutants
from theinference.bundled import data_dir
from theinference.grading.drive.plan import CourseNeed, RunPlan, plan_run
from theinference.grading.drive.session import Session, open_session, select_stages
from theinference.grading.judge.events import tee
from theinference.grading.judge.results import RunResult
from theinference.grading.spec.stages import StageSpec
from theinference.errors import ConfigError
from theinference.cli.options import WeightsOpt
from theinference.course import load_course

# A bug with one crisp shape on every synthetic weights (decode-position-stuck's per-step shape is
# a jump under the copy heads of synthetic weights v2; see the README).
DEMO_MUTANT = "position-stuck"
PROOF_STAGE = "cache-scaling"  # the slowest stage on tiny weights: the demo leaves it out and says so


class Edition(str, Enum):
    python = "python"
    ts = "ts"


def init_command(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Where to create the course.")],
    force: Annotated[
        bool, typer.Option("--force", help="Copy into DIR even if it is not empty (existing files are overwritten).")
    ] = False,
    edition: Annotated[
        Edition, typer.Option("--edition", help="python: numpy, tests/adapters.py; ts: TypeScript on Node.js.")
    ] = Edition.python,
) -> None:
    """Start the course: copy the starter (src/, tests/adapters.py or .ts, theinference.toml) into DIR."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory} exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()) and not force:
        raise ConfigError(f"{directory} is not empty; pass --force to copy the starter into it anyway")
    ts = edition == Edition.ts
    shutil.copytree(
        data_dir("course") / ("ts/starter" if ts else "starter"),
        directory,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("__pycache__", "node_modules"),
    )
    first = plan_run(need=CourseNeed.NONE).stages()[0]
    console = console_for(sys.stdout)
    files = "src/gpt2.ts, src/kvcache.ts, tests/adapters.ts" if ts else "src/gpt2.py, src/kvcache.py, tests/adapters.py"
    console.print(f"created the course in {directory}: {files}", soft_wrap=True)
    console.print(f"next:  cd {directory}" + (" && npm install" if ts else ""), soft_wrap=True)
    console.print(f"       theinference stages show {first.id}   # the first stage's lesson", soft_wrap=True)
    console.print(
        "       theinference test --watch   # grades on tiny weights (theinference.toml): seconds per run",
        soft_wrap=True,
    )


def _streamed(session: Session, stages: list[StageSpec], console: Console, plan: RunPlan | None = None) -> RunResult:
    """Grade stages of the session's course (or plan's) with the report streamed to console as `test` streams it
    and the live case line on stderr meanwhile; the demo's courses are copies: no progress, no advice."""
    live = RunProgress()
    report = StreamedReport(console, __version__, live, session.model.config.n_vocab)
    try:
        return session.run(stages, tee(live, report), plan=plan, follow_up=False)
    finally:
        live.close()


def demo_command(
    weights: WeightsOpt = None,
) -> None:
    """Grade the bundled reference solution (every stage passes but the cost proof), then a buggy copy of it (a
    diagnosed failure); on tiny weights unless --weights says otherwise, each verdict printed as it comes."""
    console = console_for(sys.stdout)
    with tempfile.TemporaryDirectory(prefix="theinference-demo-") as tmp:
        solution = Path(tmp) / "solution"
        shutil.copytree(data_dir("course") / "solution", solution)
        [mutant] = [m for m in load_mutants(data_dir("course") / "mutants") if m.name == DEMO_MUTANT]
        buggy = build_mutant(mutant, solution, Path(tmp) / "buggy")
        with open_session(
            plan_run(solution, weights=weights or "tiny", first_exact=False), synth_progress()
        ) as session:
            shown = [s for s in session.stages if s.id != PROOF_STAGE]
            console.rule("1. the reference solution")
            good = _streamed(session, shown, console)
            console.print(
                f"({PROOF_STAGE}, the proof of the cache by its CPU cost, is left out here: it times generations up to "
                "hundreds of tokens long on its own weights. "
                f"`theinference test --stage {PROOF_STAGE} --course {data_dir('course') / 'solution'}` runs it.)",
                soft_wrap=True,
            )
            console.rule(f"2. the same code with one bug: {mutant.description}")
            copy = session.plan.for_course(load_course(buggy))
            assert copy.course is not None
            stages = select_stages(session.stages, list(mutant.expect))
            bad = _streamed(session, stages, console, copy)
    diagnosed = all(s.diagnosis and s.diagnosis.shape in mutant.expect[s.id] for s in bad.stages)
    console.print("\nnext: `theinference init my-course` starts the course." if good.passed and diagnosed else "")
    raise typer.Exit(0 if good.passed and diagnosed else EXIT_FAIL)
