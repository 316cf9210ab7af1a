"""`theinference autograder`: bundles that grade a class where the course runs it (Gradescope, GitHub Actions)."""

import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from theinference.grading.tools.autograder import (
    strip_solution,
    AutograderError,
    GRADESCOPE_DEFAULT,
    Grading,
    Weights,
    needs,
    check_weights_file,
    copy_wheel,
    obtain_wheel,
    parse_deadline,
    render_workflow,
    repo_path,
    write_gradescope_bundle,
)
from theinference.cli.consoles import err_console
from theinference.cli.common import write_atomic
from theinference.cli.weights import Preset
from theinference.errors import UsageError
from theinference.grading.drive.session import select_stages
from theinference.grading.drive.plan import CourseNeed, plan_run
from theinference.grading.spec.stages import StageError
from theinference.model.weights import WeightsError

autograder_app = typer.Typer(help="Write what grades a class on Gradescope or GitHub Actions.", no_args_is_help=True)

WheelOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--wheel",
        metavar="FILE",
        help="theinference's wheel to carry (default: build this version's, from its source checkout or, "
        "installed with `pip install .`, from its installed files).",
    ),
]
WithoutSolutionOpt = Annotated[
    bool,
    typer.Option(
        "--without-solution",
        help="Carry a wheel without the reference solution (and the mutants, edits of it): "
        "students' code can read the grader's files outside a sandbox.",
    ),
]
WeightsOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--weights", metavar="FILE", help="A model.safetensors (its config.json comes along) instead of a preset."
    ),
]
PresetOpt = Annotated[
    Preset, typer.Option("--preset", help="Synthetic weights made where grading runs (ignored with --weights).")
]
GradescopePresetOpt = Annotated[
    Preset,
    typer.Option(
        "--preset",
        help="Synthetic weights made where grading runs (ignored with --weights); tiny fits Gradescope's default "
        "container, gpt2 needs a larger one (it says what to raise).",
    ),
]
SeedOpt = Annotated[
    int, typer.Option("--seed", metavar="SEED", help="The synthetic weights' seed (as for `weights synth`).")
]
StagesDirOpt = Annotated[
    Optional[list[Path]],
    typer.Option("--stages-dir", metavar="DIR", help="A directory of the course's own stage files (repeatable)."),
]
StageOpt = Annotated[
    Optional[list[str]], typer.Option("--stage", metavar="ID", help="Grade only this stage (repeatable; default all).")
]
TimeoutOpt = Annotated[
    Optional[float],
    typer.Option("--timeout", metavar="SECONDS", min=0.001, help="Seconds per adapter call (default: each stage's)."),
]
MemoryOpt = Annotated[
    Optional[int],
    typer.Option(
        "--memory-limit",
        metavar="MB",
        min=0,
        help="Memory cap, MB, per student process and for all of them together (default: grade's).",
    ),
]
CasesSeedOpt = Annotated[
    Optional[str],
    typer.Option(
        "--cases-seed",
        metavar="SEED",
        help="grade's --seed: random extra cases, an integer or 'random' (new ones every run).",
    ),
]


def _grading(stages_dir, stage, timeout, memory_limit, cases_seed) -> Grading:
    """The grading settings, checked now rather than at every submission (by the plan `grade` will make of them)."""
    try:
        plan = plan_run(need=CourseNeed.NONE, stages_dirs=stages_dir or [], seed=cases_seed, untrusted=True)
    except UsageError as e:
        raise UsageError(str(e).replace("--seed", "--cases-seed", 1)) from None
    select_stages(plan.stages(), stage or [])
    return Grading(
        stages_dirs=[Path(d) for d in stages_dir or []],
        stage_ids=stage or [],
        timeout=timeout,
        memory_mb=memory_limit,
        cases_seed=cases_seed,
    )


def _weights(weights: Optional[Path], preset: Preset, seed: int) -> tuple[Weights, list[str]]:
    if weights is None:
        return Weights(preset=preset.value, seed=seed), []
    path = weights / "model.safetensors" if weights.is_dir() else weights
    if not path.is_file():
        raise WeightsError(f"{path}: no such weights file")
    return Weights(file=path), check_weights_file(path)


def _warn(warnings: list[str]) -> None:
    for warning in warnings:
        err_console().print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=True)


ERRORS = (AutograderError, StageError, UsageError, WeightsError)


@autograder_app.command()
def gradescope(
    out: Annotated[
        Path, typer.Option("--out", metavar="FILE", help="The zip to upload as the assignment's autograder.")
    ] = Path("autograder.zip"),
    wheel: WheelOpt = None,
    without_solution: WithoutSolutionOpt = False,
    weights: WeightsOpt = None,
    preset: GradescopePresetOpt = Preset.tiny,
    seed: SeedOpt = 0,
    stages_dir: StagesDirOpt = None,
    stage: StageOpt = None,
    timeout: TimeoutOpt = None,
    memory_limit: MemoryOpt = None,
    cases_seed: CasesSeedOpt = None,
    time_budget: Annotated[
        float,
        typer.Option(
            "--time-budget",
            metavar="SECONDS",
            min=1,
            help="Seconds one submission may take in all, from run_autograder's start; keep it below the "
            "assignment's Gradescope timeout. The grader stops before it ends and keeps the credit of what it graded.",
        ),
    ] = 540,
) -> None:
    """Write autograder.zip for Gradescope: setup.sh, run_autograder, this version's wheel, stages, weights.

    run_autograder grades /autograder/submission with `theinference grade` and always leaves a valid /autograder/results/results.json (0 points and the reason when the submission cannot be graded).

    It says the container the bundle needs (CPU, memory, timeout): the default, the tiny preset within 540 s, fits Gradescope's default container; the gpt2 preset needs more, and it says what to raise.
    """
    grading = _grading(stages_dir, stage, timeout, memory_limit, cases_seed)
    chosen, warnings = _weights(weights, preset, seed)
    with tempfile.TemporaryDirectory(prefix="theinference-wheel-") as workdir:
        found, wheel_warnings = obtain_wheel(wheel, Path(workdir))
        if without_solution:
            found = strip_solution(found, Path(workdir) / "without-solution")
        write_gradescope_bundle(out, found, chosen, grading, time_budget)
    _warn(warnings + wheel_warnings)
    what = (
        f"weights {chosen.file}"
        if chosen.file
        else f"{chosen.preset} synthetic weights (seed {chosen.seed}) made at setup"
    )
    own = f", stages from {', '.join(map(str, grading.stages_dirs))}" if grading.stages_dirs else ""
    err_console().print(f"wrote {out} ({found.name}, {what}{own})", soft_wrap=True)
    _container(chosen, time_budget)


def _container(chosen: Weights, time_budget: float) -> None:
    """Say what Gradescope's container must give (the assignment's Autograder Settings), and what to raise."""
    need = needs(chosen, time_budget)
    says = f"Gradescope: this bundle needs {need} (a {time_budget:g} s time budget)"
    if need.fits_in(GRADESCOPE_DEFAULT):
        err_console().print(f"{says}: Gradescope's default container ({GRADESCOPE_DEFAULT}) fits it", soft_wrap=True)
        return
    raise_ = []
    if need.cpus > GRADESCOPE_DEFAULT.cpus:
        raise_.append(f"CPU to {need.cpus:g}")
    if need.memory_mb > GRADESCOPE_DEFAULT.memory_mb:
        raise_.append(f"memory to at least {need.memory_mb} MB")
    if need.timeout_minutes > GRADESCOPE_DEFAULT.timeout_minutes:
        raise_.append(f"the timeout to at least {need.timeout_minutes} min")
    smaller = (
        "" if chosen.file is not None or chosen.preset == "tiny" else "; or grade on the tiny preset (the default)"
    )
    _warn(
        [
            f"{says}, more than Gradescope's default container ({GRADESCOPE_DEFAULT}): in the assignment's "
            f"Autograder Settings raise {', '.join(raise_)}{smaller}"
        ]
    )


@autograder_app.command()
def github(
    out: Annotated[Path, typer.Option("--out", metavar="FILE", help="Where to write the workflow.")] = Path(
        ".github/workflows/grade.yml"
    ),
    shards: Annotated[
        int, typer.Option("--shards", metavar="N", min=1, max=256, help="Machines grading at once (the matrix size).")
    ] = 4,
    roster: Annotated[
        Path,
        typer.Option(
            "--roster", metavar="FILE", help="The file listing the repositories to grade, one owner/name per line."
        ),
    ] = Path("submissions.txt"),
    repo: Annotated[
        Path, typer.Option("--repo", metavar="DIR", help="The root of the repository the workflow lives in.")
    ] = Path("."),
    wheel: WheelOpt = None,
    without_solution: WithoutSolutionOpt = False,
    weights: WeightsOpt = None,
    preset: PresetOpt = Preset.gpt2,
    seed: SeedOpt = 0,
    stages_dir: StagesDirOpt = None,
    stage: StageOpt = None,
    timeout: TimeoutOpt = None,
    memory_limit: MemoryOpt = None,
    cases_seed: CasesSeedOpt = None,
    deadline: Annotated[
        Optional[str],
        typer.Option(
            "--deadline",
            metavar="DATETIME",
            help="Grade each repository's last commit before this ISO 8601 time with its zone (2026-12-01T23:59:00Z).",
        ),
    ] = None,
) -> None:
    """Write a GitHub Actions workflow that grades a class on a matrix (`grade --shard I/N`) and merges the shards.

    This version's wheel is put in .github/theinference/ beside it: commit both.
    """
    when = parse_deadline(deadline) if deadline else None  # refused before anything is written
    grading = _grading(stages_dir, stage, timeout, memory_limit, cases_seed)
    chosen, warnings = _weights(weights, preset, seed)
    repo_path(out, repo)
    with tempfile.TemporaryDirectory(prefix="theinference-wheel-") as workdir:
        found, wheel_warnings = obtain_wheel(wheel, Path(workdir))
        if without_solution:
            found = strip_solution(found, Path(workdir) / "without-solution")
        placed = repo / ".github" / "theinference" / found.name
        text = render_workflow(repo, shards, placed, chosen, grading, roster, when)
        copy_wheel(found, placed.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, text)
    _warn(warnings + wheel_warnings)
    if not roster.is_file():
        _warn([f"{roster} does not exist yet: list the repositories to grade in it (see the workflow's comments)"])
    err_console().print(
        f"wrote {out} and {placed}: commit both, then run the workflow from the Actions tab", soft_wrap=True
    )


@autograder_app.command()
def wheel(
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="Directory to write the wheel into.")] = Path(
        "dist"
    ),
    wheel: WheelOpt = None,
    without_solution: WithoutSolutionOpt = False,
) -> None:
    """Write theinference's wheel (this version's, built from its source checkout or its installed files, or
    --wheel's), optionally without the reference solution."""
    with tempfile.TemporaryDirectory(prefix="theinference-wheel-") as workdir:
        found, warnings = obtain_wheel(wheel, Path(workdir))
        written = strip_solution(found, out) if without_solution else copy_wheel(found, out)
    _warn(warnings)
    err_console().print(
        f"wrote {written}" + (" (without the reference solution)" if without_solution else ""), soft_wrap=True
    )
