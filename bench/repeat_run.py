"""Benchmark: a repeated `theinference test --all` of the reference solution, cold then warm oracle cache.

    python bench/repeat_run.py [--weights PATH] [--runs 2]

On the default gpt2-shape synthetic weights (made on first use, as `test` would), grades a copy
of course/solution with `theinference test --all` in a fresh process, first with an empty
oracle cache directory, then again with the cache the first run left. For each run it prints
the wall time (process start to exit, as the user waits for it), the time inside the student's
processes and the fraction of the wall time outside them (target for the warm run: <= 10%).

"Inside the student's processes" is measured in the grading process: the time each stage's
`run_adapter` takes to hand over its next event (from writing the first student process's job and
starting it until the last one is reaped), so not the time the grader spends between events (the
comparison and diagnosis of each case as it arrives, oracle lookups included; the output-size caps
are set before the run, from each case's expected shape). The student's process may keep computing
meanwhile, so this undercounts the inside time: the outside fraction printed is an upper bound.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def measure_child(out: str, argv: list[str]) -> None:
    """In the grading process: run the CLI with run_adapter timed as described above; write totals to out."""
    import atexit

    from theinference.cli import app as cli
    from theinference.grading.judge import grade

    totals = {"inside": 0.0, "stages": 0}
    real_run = grade.run_adapter

    def run_adapter(job):  # the runner's time is the time spent getting its next event
        events = real_run(job)
        while True:
            start = time.perf_counter()
            try:
                event = next(events)
            except StopIteration:
                totals["stages"] += 1
                return
            finally:
                totals["inside"] += time.perf_counter() - start
            yield event

    grade.run_adapter = run_adapter
    atexit.register(lambda: Path(out).write_text(json.dumps(totals)))
    sys.argv = ["theinference", *argv]
    cli.main()


def timed_run(course: Path, weights: Path, cache: Path, out: Path) -> dict:
    # Bytecode is written, as an installed package has it: a run should not pay for compiling the grader.
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "THEINFERENCE_CACHE": str(cache)}
    args = [
        "test",
        "--all",
        "--course",
        str(course),
        "--weights",
        str(weights),
        "--format",
        "json",
        "--output",
        str(out.with_suffix(".results.json")),
    ]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(out), "--", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"theinference test exited {done.returncode}:\n{done.stderr}")
    return {**json.loads(out.read_text()), "wall": wall}


def default_weights() -> Path:
    from theinference.model.weights_choice import ensure_weights, resolve_weights

    choice = resolve_weights(None, None)
    ensure_weights(choice, lambda done, total: print(f"\rmaking {choice.path}: {done}/{total} tensors", end=""))
    return choice.path


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        measure_child(sys.argv[2], sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, help="model.safetensors (default: the default synthetic gpt2 shape)")
    parser.add_argument("--runs", type=int, default=2, help="runs in all: the first cold, the others warm")
    args = parser.parse_args()
    from theinference.bundled import data_dir

    weights = args.weights or default_weights()
    with tempfile.TemporaryDirectory(prefix="theinference-bench-") as tmp:
        course = Path(tmp) / "solution"
        shutil.copytree(data_dir("course") / "solution", course)
        print(f"test --all of the reference solution, weights {weights}, {os.cpu_count()} cores")
        print(f"{'run':<16}{'wall s':>8}{'student s':>11}{'outside s':>11}{'outside':>9}")
        for i in range(args.runs):
            r = timed_run(course, weights, Path(tmp) / "cache", Path(tmp) / f"run{i}.json")
            outside = r["wall"] - r["inside"]
            name = "empty cache" if i == 0 else "warm cache"
            print(f"{name:<16}{r['wall']:>8.2f}{r['inside']:>11.2f}{outside:>11.2f}{outside / r['wall']:>9.0%}")


if __name__ == "__main__":
    main()
