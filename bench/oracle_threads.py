"""Benchmark: the oracle's own computation with one BLAS thread against numpy's default, side by side in one run.

    python bench/oracle_threads.py [--presets tiny gpt2] [--rounds 3] [--passes quiet loaded] [--stages ID...]

The grader computes every case's oracle output in its own process (Grader.warm before a batch's students run,
OracleCache.get as a stage is graded), with numpy's default BLAS threads (one per core), while students'
processes may be running beside it. For each stage, all its cases are computed cold (a fresh OracleCache, no
store) with BLAS held to one thread and with the default, alternating, `--rounds` times each (a busy machine only
adds time: the fastest counts), as wall time and as this process's CPU time. The stages are those Grader.warm
computes (every stage that compares rows) and greedy, whose oracle continuation (computed here as
bench/diagnosis.py does) is the work of the teacher-forced pass that verifies a student's tokens; cache-scaling
is left out (the stage times its own recompute).

Two passes, printed side by side: `quiet` (the machine as it is) and `loaded` (beside two CPU burners per core,
started when the pass starts and stopped when it ends; run it under whatever lock the machine's users share
for CPU burners). Ratios are one thread over the default: below 1, one thread is faster. The outputs of the two
must agree (the threads change the order of sums, not the answer): the largest difference is printed.
"""

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import busy

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits  # type: ignore[import-untyped]

from theinference.grading.judge import oraclecost
from theinference.grading.oracle.cache import OracleCache
from theinference.grading.oracle.registry import resolve_oracle
from theinference.grading.spec.stages import load_stages, stage_dirs
from theinference.model.synth import write_synthetic
from theinference.model.weights import load_model

PASSES = ("quiet", "loaded")


def timed(model, stage, spec, limit: int | None) -> tuple[float, float, list[np.ndarray]]:
    """One cold computation of every case of the stage: (wall s, CPU s, the outputs)."""
    cache = OracleCache()
    with threadpool_limits(limits=limit):
        wall, cpu = time.perf_counter(), time.process_time()
        outs = [cache.get(model, stage, spec, case) for case in stage.cases]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, outs


def measure(model, stages, rounds: int) -> dict:
    """Per stage: the fastest (wall, CPU) with one thread and with the default, and how far their outputs differ."""
    figures = {}
    for limit in (1, None):  # untimed: the first products of a process start BLAS's threads and fault pages in
        timed(model, stages[0], resolve_oracle(stages[0].oracle, stages[0].source), limit)
    for stage in stages:
        spec = resolve_oracle(stage.oracle, stage.source)
        best = {1: [float("inf"), float("inf")], None: [float("inf"), float("inf")]}
        outs: dict = {}
        for _ in range(rounds):
            for limit in (1, None):
                wall, cpu, got = timed(model, stage, spec, limit)
                best[limit] = [min(best[limit][0], wall), min(best[limit][1], cpu)]
                outs.setdefault(limit, got)
        differ = max(
            float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0))
            for a, b in zip(outs[1], outs[None])
        )
        figures[stage.id] = {"one": best[1], "default": best[None], "differ": differ}
    return figures


def run_pass(label: str, model, stages, rounds: int) -> dict:
    burners = busy.start() if label == "loaded" else []
    try:
        load = os.getloadavg()[0]
        figures = measure(model, stages, rounds)
        print(f"    {label} pass done (1-minute load {load:.1f} at its start, {os.getloadavg()[0]:.1f} at its end)")
        for stage_id, m in figures.items():  # as soon as the pass ends: a long run stopped later keeps them
            (w1, c1), (wd, cd) = m["one"], m["default"]
            print(f"      {label} {stage_id:22} wall {w1 / wd:4.2f}x, CPU {c1 / cd:4.2f}x", flush=True)
        return figures
    finally:
        busy.stop(burners)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="*", default=["tiny", "gpt2"], choices=["tiny", "gpt2"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", nargs="*", default=list(PASSES), choices=PASSES)
    parser.add_argument("--stages", nargs="*", default=[], help="only these stages")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a SIGTERM still stops the burners
    threads = sum(pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas")
    print(f"numpy's default BLAS threads here: {threads}; {os.cpu_count()} cores", flush=True)
    ratios: dict = {p: {"wall": [], "cpu": []} for p in args.passes}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            model = load_model(write_synthetic(Path(tmp) / preset, preset=preset))
            stages = [
                oraclecost.fit_to_context(s, model.config.n_ctx)  # as Grader.warm computes them
                for s in load_stages(stage_dirs(None))
                if not s.checks_tokens or s.id == "greedy"
            ]
            stages = [s for s in stages if not args.stages or s.id in args.stages]
            print(f"{preset} weights, {args.rounds} rounds of each, fastest counting:", flush=True)
            figures = {p: run_pass(p, model, stages, args.rounds) for p in args.passes}
            for stage in stages:
                cells = []
                for p in args.passes:
                    m = figures[p][stage.id]
                    (w1, c1), (wd, cd) = m["one"], m["default"]
                    ratios[p]["wall"].append(w1 / wd)
                    ratios[p]["cpu"].append(c1 / cd)
                    cells.append(
                        f"{p}: wall {w1:6.2f} s vs {wd:6.2f} s = {w1 / wd:4.2f}x, CPU {c1:6.2f} s vs {cd:6.2f} s "
                        f"= {c1 / cd:4.2f}x, outputs differ by {m['differ']:.1e}"
                    )
                print(f"  {preset:5} {stage.id:22} " + " | ".join(cells), flush=True)
    for p in args.passes:
        wall, cpu = sorted(ratios[p]["wall"]), sorted(ratios[p]["cpu"])
        print(
            f"{p}: one thread over the default, median of {len(wall)} stage x weights: wall {wall[len(wall) // 2]:.2f}x "
            f"(range {wall[0]:.2f}-{wall[-1]:.2f}), CPU {cpu[len(cpu) // 2]:.2f}x (range {cpu[0]:.2f}-{cpu[-1]:.2f})"
        )


if __name__ == "__main__":
    main()
