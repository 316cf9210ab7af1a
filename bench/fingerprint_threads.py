"""Benchmark: fingerprinting with one BLAS thread against numpy's default, side by side in one run.

    python bench/fingerprint_threads.py [--gpt2] [--only NAME...] [--rounds 3]

The oracle and the fingerprints run in the grader's process, with numpy's default BLAS threads (one per core),
while the student's process may be running beside it. For each mistake of bench/diagnosis.py (graded once, its
oracle outputs kept), the same cold fingerprinting is timed with BLAS held to one thread and with the default,
alternating, `--rounds` times each (a busy machine only adds time: the fastest counts), as wall time and as this
process's CPU time. It prints both, their ratios (one thread over the default: below 1 means one thread is
faster), and whether both named the same bugs (they must: the threads change the order of sums, not a verdict).
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

from threadpoolctl import threadpool_info, threadpool_limits  # type: ignore[import-untyped]

from theinference.grading.tools.check import named_bugs
from theinference.grading.drive.grader import Grader, RunOptions
from theinference.grading.spec.stages import load_stages, stage_dirs
from theinference.model.synth import write_synthetic
from theinference.model.weights import load_model
from theinference.model.weights_choice import WeightsChoice

sys.path.insert(0, str(Path(__file__).resolve().parent))

from diagnosis import MISTAKES, make_course  # noqa: E402

DEFAULT_ONLY = ["f-scale-sqrt-n-embd", "f-attn-uses-ln-2", "c-cached-mlp-ln-1", "l-decode-pos-plus-one"]


def timed(grader: Grader, stages, graded, kept, oracle: dict, limit: int | None):
    """One cold fingerprinting of graded (the arrays kept for it put back each time: fingerprinting takes them):
    (wall s, CPU s, the bugs the last stage named)."""
    grader.cache.entries.clear()
    grader.cache.entries.update(oracle)
    grader.unmatched = kept
    with threadpool_limits(limits=limit):
        wall, cpu = time.perf_counter(), time.process_time()
        done = grader.fingerprint(stages, graded)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, named_bugs(done.stages[-1])


def measure(grader: Grader, by_id: dict, name: str, root: Path, rounds: int) -> dict:
    style, subs, stage_ids, _ = MISTAKES[name]
    stages = [by_id[i] for i in stage_ids]
    graded = grader.grade(make_course(root / name, style, subs), stages, RunOptions(fingerprint=False))
    oracle = dict(grader.cache.entries)  # grading computed the oracle's outputs: every round starts from them
    kept = grader.unmatched  # the student's arrays, beside the graded run
    best = {1: [float("inf"), float("inf")], None: [float("inf"), float("inf")]}
    named: dict = {}
    for _ in range(rounds):
        for limit in (1, None):
            wall, cpu, bugs = timed(grader, stages, graded, kept, oracle, limit)
            best[limit] = [min(best[limit][0], wall), min(best[limit][1], cpu)]
            named.setdefault(limit, bugs)
    return {"stage": stage_ids[-1], "one": best[1], "default": best[None], "same": named[1] == named[None]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpt2", action="store_true", help="the gpt2 shape (default: tiny)")
    parser.add_argument("--only", nargs="*", default=DEFAULT_ONLY, help="these mistakes of bench/diagnosis.py")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    threads = sum(pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas")
    preset = "gpt2" if args.gpt2 else "tiny"
    print(f"{preset} weights; numpy's default BLAS threads here: {threads}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        weights = write_synthetic(Path(tmp) / preset, preset=preset)
        model = load_model(weights)
        by_id = {s.id: s for s in load_stages(stage_dirs(None))}
        with Grader(WeightsChoice(weights, "--weights", ""), model) as grader:
            walls, cpus = [], []
            for name in args.only:
                m = measure(grader, by_id, name, Path(tmp), args.rounds)
                (w1, c1), (wd, cd) = m["one"], m["default"]
                walls.append(w1 / wd)
                cpus.append(c1 / cd)
                print(
                    f"  {name:28} {m['stage']:18} wall {w1:6.2f} s vs {wd:6.2f} s = {w1 / wd:4.2f}x · "
                    f"CPU {c1:6.2f} s vs {cd:6.2f} s = {c1 / cd:4.2f}x · same bugs named: {m['same']}",
                    flush=True,
                )
    print(
        f"one thread over the default, median of {len(walls)}: wall {sorted(walls)[len(walls) // 2]:.2f}x, "
        f"CPU {sorted(cpus)[len(cpus) // 2]:.2f}x"
    )


if __name__ == "__main__":
    main()
