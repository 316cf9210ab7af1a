"""`theinference oracle`: write a stage's oracle inputs and expected arrays to an .npz file."""

from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from theinference.cli.common import synth_progress
from theinference.cli.consoles import err_console
from theinference.grading.judge import oraclecost
from theinference.grading.tools.export import oracle_arrays
from theinference.grading.oracle.cache import OracleCache
from theinference.errors import UsageError
from theinference.grading.drive.session import select_stages
from theinference.grading.drive.plan import CourseNeed, plan_run
from theinference.grading.spec.checks import ScalingCheck
from theinference.cli.options import CourseOpt, StagesDirOpt, WeightsOpt


def oracle_command(
    stage: Annotated[str, typer.Option("--stage", metavar="ID", help="The stage whose cases to export.")],
    out: Annotated[Path, typer.Option("--out", metavar="FILE", help="The .npz file to write.")],
    case: Annotated[
        Optional[list[str]], typer.Option("--case", metavar="NAME", help="Only this case (repeatable).")
    ] = None,
    course: CourseOpt = None,
    weights: WeightsOpt = None,
    stages_dir: StagesDirOpt = None,
) -> None:
    """Write the oracle's inputs and expected outputs for a stage's cases to FILE.npz.

    Keys: '<case>.<input>' (token ids, counts), '<case>.expected' (what your adapter must return), for forward also every block's output to compare layer by layer ('<case>.embed', '<case>.block<i>.attn' after block i's attention, '<case>.block<i>.mlp' after its MLP, '<case>.ln_f', each [n, n_embd]), for greedy and cache-scaling '<case>.logits' (the logits each choice was made from), and 'meta' (JSON: the stage's tolerance as its file gives it).
    """
    plan = plan_run(course, need=CourseNeed.OPTIONAL, weights=weights, stages_dirs=stages_dir or [])
    [spec] = select_stages(plan.stages(), [stage])
    names = [c.name for c in spec.cases]
    for wanted in case or []:
        if wanted not in names:
            raise UsageError(f"stage '{stage}' has no case '{wanted}' (cases: {', '.join(names)})")
    cases = [c for c in spec.cases if not case or c.name in case]
    _, model, _ = plan.load_weights(synth_progress())
    if isinstance(
        spec.check, ScalingCheck
    ):  # cache-scaling runs on its own weights (the proof preset): its tokens are those
        model, _ = oraclecost.proof_model(spec, model, OracleCache())
    arrays = oracle_arrays(spec, model, cases)
    np.savez(out, **arrays)  # type: ignore[arg-type]  # numpy's stub does not take **arrays
    err_console().print(f"wrote {out}: {len(cases)} case(s) of {stage} against {model.path}", soft_wrap=True)
