"""Benchmark: the cost floor of cache-scaling (oraclecost.cost_floor) against the reference cache, side by side in one run.

    python bench/cost_floor.py [--rounds N] [--repeats N]

A count below the floor fails as tampering, so the floor must sit well under what an honest cache costs. The floor
is the oracle's one-token step (oraclecost.step_seconds: one BLAS thread, this process's CPU, as grading measures it)
divided by oraclecost.FLOOR_SHARE, per token: a cached decode step still reads every weight once. The reference
cache (course/solution) is graded on the built-in stage exactly as `theinference test` does (the grader counts the
CPU of its whole process tree, call by call), and each of its calls' CPU per token is set over the floor.

Two passes, printed side by side: `quiet` (the machine as it is) and `loaded` (beside two CPU burners per core).
The floor and the cache are each measured in both, and crossed: the cache measured quiet over the floor measured
loaded is the worst case (a floor measured while the grader was starved, a cache run once the machine was free).
Every ratio must stay above 1 with margin: the figure printed is the least over every call of the stage.
"""

import argparse
import dataclasses
import tempfile
from pathlib import Path

import busy

from theinference.bundled import data_dir
from theinference.course import load_course
from theinference.grading.judge import oraclecost
from theinference.grading.judge.grade import GradeContext, grade
from theinference.grading.oracle.cache import OracleCache
from theinference.grading.spec.stages import load_stages
from theinference.model.synth import write_synthetic
from theinference.model.weights import load_model
from theinference.proc.launch import SubprocessLauncher


def measure(stage, model, proof, rounds: int) -> dict:
    """The floor (the cheapest of `rounds` measurements) and the reference cache's CPU per token, call by call."""
    floor = min(oraclecost.cost_floor(oraclecost.step_seconds(proof)) for _ in range(rounds))
    per_token: list[float] = []
    accounting = ""
    for _ in range(rounds):
        ctx = GradeContext(
            course=load_course(data_dir("course") / "solution"),
            model=model,
            cache=OracleCache(),
            launcher=SubprocessLauncher(),
        )
        result = grade(stage, ctx)
        case = result.cases[0]
        assert case.scaling is not None and result.status == "pass", case.message
        accounting = case.scaling.accounting
        per_token += [c.cpu_seconds / c.n_new for c in case.scaling.calls if not c.stopped]
    return {"floor": floor, "per_token": per_token, "accounting": accounting}


def run_pass(label: str, stage, model, proof, rounds: int) -> dict:
    burners = busy.start() if label == "loaded" else []
    try:
        return measure(stage, model, proof, rounds)
    finally:
        busy.stop(burners)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="gradings (and floor measurements) per pass")
    parser.add_argument("--repeats", type=int, default=0, help="timed rounds per grading (default: the stage's)")
    args = parser.parse_args()
    stage = next(s for s in load_stages([data_dir("stages")]) if s.id == "cache-scaling")
    if args.repeats:
        params = dataclasses.replace(stage.check.params, repeats=args.repeats)
        stage = dataclasses.replace(stage, check=dataclasses.replace(stage.check, params=params))
    with tempfile.TemporaryDirectory(prefix="theinference-bench-") as tmp:
        write_synthetic(Path(tmp) / "tiny", preset="tiny", seed=0)
        model = load_model(Path(tmp) / "tiny" / "model.safetensors")
        proof, _ = oraclecost.proof_model(stage, model, OracleCache())
        figures = {label: run_pass(label, stage, model, proof, args.rounds) for label in ("quiet", "loaded")}
    share = oraclecost.FLOOR_SHARE
    print(f"cache-scaling's cost floor: the oracle's one-token step / {share:g}, per token (proof preset)")
    print(f"  CPU counted by: {figures['quiet']['accounting']}")
    for label, f in figures.items():
        cheapest = min(f["per_token"])
        print(
            f"  {label:>6}: floor {1000 * f['floor']:.3g} ms/token (step {1000 * share * f['floor']:.3g} ms); "
            f"reference cache {1000 * cheapest:.3g} ms/token at its cheapest of {len(f['per_token'])} calls"
        )
    print("  reference cache's cheapest call per token over the floor (above 1: the cache is above the floor)")
    print(f"  {'cache measured':>16} | {'floor quiet':>12} | {'floor loaded':>12}")
    for label, f in figures.items():
        cheapest = min(f["per_token"])
        ratios = [cheapest / figures[floor]["floor"] for floor in ("quiet", "loaded")]
        print(f"  {label:>16} | {ratios[0]:>12.2f} | {ratios[1]:>12.2f}")


if __name__ == "__main__":
    main()
