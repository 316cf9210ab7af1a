"""Benchmark: the cache-scaling stage's ratio for the reference solution and every no-cache mutant.

    python bench/cache_scaling.py [--shapes tiny,gpt2] [--lengths 8,224] [--repeats 3] [--timeout 600]
                                  [--subjects solution,recompute-only,...]

For each weights shape (synthetic, made in a temporary directory), grades the built-in
cache-scaling stage, exactly as `theinference test` does, for the reference solution, a
recompute-only adapter (run_greedy = src.gpt2.generate) and each mutant whose manifest expects
`no-cache` there; prints each subject's ratio (CPU ms per token at the longest length over the
shortest), its margin to the stage's max_ratio (threshold / ratio for code that must pass,
ratio / threshold for code that must fail: above 1 is on the right side), and the verdict.
--lengths/--repeats override the stage's (on the gpt2 shape a recompute of 224 tokens takes
minutes; shorter lengths show the same shape of growth).
"""

import argparse
import dataclasses
import shutil
import tempfile
from pathlib import Path

from theinference.course import load_course
from theinference.grading.grade import GradeContext, grade
from theinference.proc.launch import SubprocessLauncher
from theinference.grading.mutants import build_mutant, load_mutants
from theinference.bundled import data_dir
from theinference.grading.stages import load_stages
from theinference.model.synth import write_synthetic
from theinference.model.weights import load_model

_RECOMPUTE = """
import functools
import theinference
from src.gpt2 import generate, load_weights


@functools.cache
def _model():
    return load_weights(theinference.weights_path())


def run_greedy(prompt_ids, n_new):
    params, n_head = _model()
    return generate(params, prompt_ids, n_new, n_head)
"""


def subjects(work: Path) -> list[tuple[str, Path, bool]]:
    """(name, course dir, must pass) for the solution, a recompute-only adapter and the no-cache mutants."""
    solution = data_dir("course") / "solution"
    recompute = work / "recompute-only"
    shutil.copytree(solution, recompute)
    (recompute / "tests" / "adapters.py").write_text(_RECOMPUTE)
    found = [("solution", solution, True), ("recompute-only", recompute, False)]
    for mutant in load_mutants(data_dir("course") / "mutants"):
        if mutant.expect.get("cache-scaling") == ("no-cache",):
            found.append((mutant.name, build_mutant(mutant, solution, work / mutant.name), False))
    return found


def stage_for(args):
    stage = next(s for s in load_stages([data_dir("stages")]) if s.id == "cache-scaling")
    spec = stage.scaling
    if args.lengths:
        spec = dataclasses.replace(spec, lengths=tuple(int(n) for n in args.lengths.split(",")))
    if args.repeats:
        spec = dataclasses.replace(spec, repeats=args.repeats)
    cases = tuple(dataclasses.replace(c, inputs={**c.inputs, "n_new": spec.lengths[-1]}) for c in stage.cases)
    return dataclasses.replace(stage, scaling=spec, cases=cases, timeout=args.timeout)


def report(name: str, must_pass: bool, result, threshold: float) -> str:
    case = result.cases[0]
    if case.scaling is None:
        return f"  {name:<26} {'-':>7} {'-':>7}  {result.status}: {case.message[:70]}"
    ratio = case.scaling.ratio
    margin = threshold / ratio if must_pass else ratio / threshold
    verdict = "ok" if (result.status == "pass") == must_pass else "WRONG VERDICT"
    return f"  {name:<26} {ratio:7.2f} {margin:7.2f}  {result.status} ({verdict})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,gpt2")
    parser.add_argument("--lengths", default="")
    parser.add_argument("--repeats", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--subjects", default="", help="only these subjects (comma-separated names)")
    args = parser.parse_args()
    stage = stage_for(args)
    with tempfile.TemporaryDirectory(prefix="theinference-bench-") as tmp:
        work = Path(tmp)
        found = [s for s in subjects(work) if not args.subjects or s[0] in args.subjects.split(",")]
        for shape in args.shapes.split(","):
            write_synthetic(work / shape, preset=shape, seed=0)
            model = load_model(work / shape / "model.safetensors")
            print(
                f"{shape}: lengths {list(stage.scaling.lengths)}, repeats {stage.scaling.repeats}, "
                f"max_ratio {stage.scaling.max_ratio:g}"
            )
            print(f"  {'subject':<26} {'ratio':>7} {'margin':>7}  verdict")
            for name, course, must_pass in found:
                ctx = GradeContext(course=load_course(course), model=model, launcher=SubprocessLauncher())
                print(report(name, must_pass, grade(stage, ctx), stage.scaling.max_ratio), flush=True)


if __name__ == "__main__":
    main()
