"""Benchmark: the cache proof's two tests for the reference cache, every no-cache submission and every trick.

    python bench/cache_scaling.py [--load] [--runs N] [--graded gpt2] [--lengths 8,480] [--subjects a,b]
                                  [--edition ts] [--repeats N] [--no-stop] [--diagnostic]

Grades the built-in cache-scaling stage exactly as `theinference test` does (the grader drives each
timed call and counts the CPU of the student's whole process tree) for: the reference solution
(must pass), the solution computing in float64 (must pass: (b) is then set against the oracle's float64
recompute); a careful recompute (every layer over the whole sequence, the LM head on the last row
only) in float32 and in float64, a plain recompute, each mutant whose manifest expects `no-cache`, short calls padded to a flat
cost, and the six tricks of bench/scaling_subjects.py and a
float32 careful recompute whose decode step claims float64 (all must fail). For each it prints (a) the
per-token ratio and (b) the longest call's fraction of the oracle's full recompute, with the margin
to each threshold (threshold / figure for code that must pass, figure / threshold for code that must
fail: above 1 is on the right side; '>' marks a lower bound, from a call stopped at its budget), and
what a stopped call's verdict rests on: the longest call's CPU over what its tokens cost at the shortest
calls' rate ("grew"), and what a token costs after the diagnostic calls' long prompt over what one costs in the
short calls ("diag", and the long diagnostic call's new tokens: a cache's stays under costcase._GROWTH, a
recompute's passes it). --diagnostic makes every subject take the diagnostic calls (grading takes them only where
"grew" cannot show).

--no-stop lets every call run to its end instead of stopping it at the floor, so the figures of code
that must fail are measured, not bounded (slow: a recompute of 480 tokens takes about a minute; a
TypeScript one, half an hour); --stop-at X stops the longest call at X times the floor instead, so a
margin is measured up to X (a lower bound '>X' at a bounded cost).
--load runs everything a second time with two CPU burners per core alongside, and prints both tables
side by side in one run (--load-only: the loaded passes only). --graded SHAPE runs the stage on synthetic weights of that shape (weights =
"graded") instead of the proof preset; --lengths overrides the stage's lengths, --repeats its rounds.

--edition ts grades the TypeScript edition instead (run by Node, so (b)'s floor is scaled by
costcase.NODE_FACTOR as in grading): the TS reference solution (must pass) and every TS mutant whose
manifest expects it to fail on cost, `no-cache` or `too-slow` (course/ts/mutants: the careful recompute
decode-recomputes-last-row, and decode-recomputes, which applies the LM head to every row). It needs the TypeScript course's tsx
(`npm install` at the repository's root).
"""

import argparse
import dataclasses
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import busy  # noqa: E402
from scaling_subjects import (  # noqa: E402
    CAREFUL_RECOMPUTE,
    FLOAT64_CACHE,
    FLOAT64_CLAIM,
    FLOAT64_RECOMPUTE,
    PADDING,
    SLOW_CACHE,
    TRICKS,
)

from theinference.bundled import data_dir  # noqa: E402
from theinference.course import load_course  # noqa: E402
from theinference.grading.judge import costcase  # noqa: E402
from theinference.grading.judge.grade import GradeContext, grade  # noqa: E402
from theinference.grading.oracle.cache import OracleCache  # noqa: E402
from theinference.grading.tools.mutants import build_mutant, load_mutants  # noqa: E402
from theinference.grading.spec.stages import load_stages  # noqa: E402
from theinference.model.synth import write_synthetic  # noqa: E402
from theinference.model.weights import load_model  # noqa: E402
from theinference.proc.launch import SubprocessLauncher  # noqa: E402
from theinference.proc.node import find_tsx  # noqa: E402

_PLAIN_RECOMPUTE = """
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


def _course(work: Path, name: str, adapters: str) -> Path:
    course = work / name
    shutil.copytree(data_dir("course") / "solution", course)
    (course / "tests" / "adapters.py").write_text(adapters)
    return course


def subjects(work: Path) -> list[tuple[str, Path, bool]]:
    """(name, course dir, must pass) for every subject."""
    solution = data_dir("course") / "solution"
    found = [
        ("solution", solution, True),
        ("float64-cache", _course(work, "float64-cache", FLOAT64_CACHE), True),
        ("careful-recompute", _course(work, "careful-recompute", CAREFUL_RECOMPUTE), False),
        ("float64-recompute", _course(work, "float64-recompute", FLOAT64_RECOMPUTE), False),
        ("plain-recompute", _course(work, "plain-recompute", _PLAIN_RECOMPUTE), False),
        ("padded-recompute", _course(work, "padded-recompute", PADDING), False),
        ("slow-cache (too-slow)", _course(work, "slow-cache", SLOW_CACHE), False),
    ]
    for mutant in load_mutants(data_dir("course") / "mutants"):
        if mutant.expect.get("cache-scaling") == ("no-cache",):
            found.append((mutant.name, build_mutant(mutant, solution, work / mutant.name), False))
    found += [(f"trick:{name}", _course(work, f"trick-{name}", source), False) for name, source in TRICKS.items()]
    found.append(("trick:float64-claim", _course(work, "trick-float64-claim", FLOAT64_CLAIM), False))
    return found


def ts_subjects(work: Path) -> list[tuple[str, Path, bool]]:
    """(name, course dir, must pass) for the TypeScript edition: its solution and its no-cache mutants."""
    ts = data_dir("course") / "ts"
    if find_tsx(ts) is None:
        sys.exit("the TypeScript course has no tsx: run `npm install` at the repository's root")
    solution = ts / "solution"  # finds the tsx above it; build_mutant links it into each mutant
    found = [("ts-solution", solution, True)]
    for mutant in load_mutants(ts / "mutants"):
        if set(mutant.expect.get("cache-scaling", ())) & {"no-cache", "too-slow"}:  # fails on cost, tokens right
            built = build_mutant(mutant, solution, work / f"ts-{mutant.name}")
            found.append((f"ts-{mutant.name}", built, False))
    return found


def stage_for(args):
    stage = next(s for s in load_stages([data_dir("stages")]) if s.id == "cache-scaling")
    spec = stage.check.params
    if args.graded:
        spec = dataclasses.replace(spec, weights="graded")
    if args.lengths:
        spec = dataclasses.replace(spec, lengths=tuple(int(n) for n in args.lengths.split(",")))
    if args.repeats:
        spec = dataclasses.replace(spec, repeats=args.repeats)
    cases = tuple(dataclasses.replace(c, inputs={**c.inputs, "n_new": spec.lengths[-1]}) for c in stage.cases)
    return dataclasses.replace(stage, check=dataclasses.replace(stage.check, params=spec), cases=cases)


def _margin(value: float | None, threshold: float, must_pass: bool, lower_bound: bool) -> str:
    if value is None or value <= 0:
        return "-"
    margin = threshold / value if must_pass else value / threshold
    return f"{'>' if lower_bound and not must_pass else ''}{margin:.2f}"


def row(name: str, must_pass: bool, result) -> list[str]:
    case = result.cases[0]
    t = case.scaling
    right = (result.status == "pass") == must_pass
    verdict = f"{result.status}{'' if right else ' WRONG'}"
    shape = case.diagnosis.shape if case.diagnosis else ""
    if t is None:
        return [name, "-", "-", "-", "-", "-", "-", f"{verdict} {shape}".strip()]
    stopped = t.stopped_at == t.lengths[-1]
    fraction = t.fraction
    ratio = None if t.stopped_at else t.ratio
    short_ms = t.ms_per_token[0]
    return [
        name,
        "-" if ratio is None else f"{ratio:.2f}",
        _margin(ratio, t.max_ratio, must_pass, False),
        "-" if fraction is None else f"{'>' if stopped else ''}{fraction:.1%}",
        _margin(fraction, t.max_fraction, must_pass, stopped),
        # what a stopped call's verdict rests on: the diagnostic call's cost over a short call's, and the longest
        # call's cost over what its tokens cost at the short calls' rate
        _growth(t),
        f"{'>' if stopped else ''}{t.seconds[-1] / (short_ms * t.lengths[-1] / 1000):.2f}" if short_ms else "-",
        f"{verdict} {shape}".strip(),
    ]


def _growth(t) -> str:
    """The diagnostic calls' finding: a token's marginal cost after the long prompt over the short calls' rate."""
    ones = [c.cpu_seconds for c in t.calls if c.diagnostic and c.n_new == 1 and not c.stopped]
    long = [c for c in t.calls if c.diagnostic and c.n_new > 1 and not c.stopped]
    short = [c.cpu_seconds / c.n_new for c in t.calls if c.n_new == t.lengths[0] and not (c.diagnostic or c.stopped)]
    if not (ones and long and short):
        return "-"
    return f"{(long[0].cpu_seconds - min(ones)) / (long[0].n_new - 1) / min(short):.2f} ({long[0].n_new})"


def run_all(stage, graded_model, found) -> list[list[str]]:
    cache = OracleCache()  # one per pass: the oracle's costs are measured under this pass's load
    rows = []
    for name, course, must_pass in found:
        ctx = GradeContext(course=load_course(course), model=graded_model, cache=cache, launcher=SubprocessLauncher())
        rows.append(row(name, must_pass, grade(stage, ctx)))
        print(f"  … {name}: {' '.join(rows[-1][1:])}", file=sys.stderr, flush=True)
    return rows


def print_table(title: str, passes: list[tuple[str, list[list[str]]]]) -> None:
    print(title)
    header = f"  {'subject':<30}"
    for label, _ in passes:
        header += f" | {label + ': (a) ratio  margin  (b) of recompute  margin         diag  grew  verdict':<96}"
    print(header)
    for i in range(len(passes[0][1])):
        line = f"  {passes[0][1][i][0]:<30}"
        for _, rows in passes:
            name, ratio, m_a, fraction, m_b, steps, grew, verdict = rows[i]
            line += f" | {ratio:>9} {m_a:>7} {fraction:>17} {m_b:>7} {steps:>12} {grew:>5}  {verdict:<30}"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", action="store_true", help="also run with two CPU burners per core alongside")
    parser.add_argument("--load-only", action="store_true", help="with --load: skip the quiet passes")
    parser.add_argument("--runs", type=int, default=1, help="passes of each condition (the verdict must not flip)")
    parser.add_argument("--graded", default="", help="run on synthetic weights of this shape (weights = graded)")
    parser.add_argument("--lengths", default="")
    parser.add_argument("--subjects", default="", help="only these subjects (comma-separated names)")
    parser.add_argument("--edition", choices=("py", "ts"), default="py", help="the course edition to grade")
    parser.add_argument("--repeats", type=int, default=0, help="timed rounds per subject (default: the stage's)")
    parser.add_argument(
        "--no-stop",
        action="store_true",
        help="let every call finish (no stop at the floor): the real figures of code that must fail, slowly",
    )
    parser.add_argument("--diagnostic", action="store_true", help="every subject takes the diagnostic call")
    parser.add_argument("--stop-at", type=float, default=0.0, help="stop the longest call at this multiple of (b)")
    args = parser.parse_args()
    stage = stage_for(args)
    if args.diagnostic:
        costcase.CostCase.needs_diagnostic = lambda self: True  # type: ignore[method-assign]
    if args.no_stop or args.stop_at:
        costcase._KILL_AT = args.stop_at or 1e9
        stage = dataclasses.replace(stage, timeout=3600)
    with tempfile.TemporaryDirectory(prefix="theinference-bench-") as tmp:
        work = Path(tmp)
        every = ts_subjects(work) if args.edition == "ts" else subjects(work)
        found = [s for s in every if not args.subjects or s[0] in args.subjects.split(",")]
        shape = args.graded or "tiny"
        write_synthetic(work / shape, preset=shape, seed=0)
        model = load_model(work / shape / "model.safetensors")
        spec = stage.check.params
        print(
            f"cache-scaling on {'graded ' + shape if args.graded else 'the proof preset'}: lengths {list(spec.lengths)}, "
            f"repeats {spec.repeats}, (a) max_ratio {spec.max_ratio:g}, (b) max_fraction {spec.max_fraction:g}"
        )
        passes = []
        for run in range(0 if args.load and args.load_only else args.runs):
            passes.append((f"quiet #{run + 1}", run_all(stage, model, found)))
        if args.load:
            burners = busy.start()
            try:
                for run in range(args.runs):
                    passes.append((f"load #{run + 1}", run_all(stage, model, found)))
            finally:
                busy.stop(burners)
        print_table("margins (above 1: on the right side of the threshold)", passes)


if __name__ == "__main__":
    main()
