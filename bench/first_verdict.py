"""Benchmark: how soon a failing run says something, and what a failing submission costs in `grade`.

    python bench/first_verdict.py [--preset tiny|gpt2] [--stage per-step-identity] [--mutant decode-wpe-off-by-one]
                                  [--repeats 3] [--grade-stages STAGE...]

In temporary copies of the reference solution and of one mutant (a known bug), on a synthetic
preset made on first use in $THEINFERENCE_CACHE (so a gpt2-shape file is made once and reused):

1. `theinference test --stage STAGE` on the mutant, as a student runs it, with the oracle store
   warm (one run first fills it): the time from start to the header line, to the stage's verdict
   line and to the end of the report (finding included), each read from stdout as it streams. The
   student code's own time for the stage (the adapter's compute, summed over its cases) comes
   from a `--format json` run of the same stage in the same bench run. Targets: verdict <= 1.2x
   and whole report <= 2x the student's time.
2. `theinference grade` of the solution and the mutant in one batch (--jobs 1, untrusted: no
   oracle store, bug oracles computed in the batch): the mutant's seconds over the solution's.
   Target: <= 1.5x.

Every figure is printed with the ratio it feeds, all measured in one run on this machine.
"""

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from theinference.bundled import data_dir
from theinference.grading.mutants import build_mutant, load_mutants


def _cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "theinference", *map(str, args)]


def streamed(course: Path, preset: str, stage: str) -> dict[str, float]:
    """Seconds from start to the first stdout line, to the stage's verdict line, and to the end."""
    env = {**os.environ, "COLUMNS": "100"}
    started = time.perf_counter()
    proc = subprocess.Popen(
        _cli("test", "--course", course, "--weights", preset, "--stage", stage),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    times: dict[str, float] = {}
    for line in proc.stdout:
        now = time.perf_counter() - started
        times.setdefault("first line", now)
        if line.lstrip().startswith(("✘ " + stage, "✔ " + stage, "⏱ " + stage)):
            times.setdefault("verdict", now)
    proc.wait()
    times["report"] = time.perf_counter() - started
    times.setdefault("verdict", times["report"])
    times.setdefault("first line", times["report"])
    return times


def student_seconds(course: Path, preset: str, stage: str, out: Path) -> float:
    """The adapter's own compute time for the stage, summed over its cases (from a JSON report)."""
    subprocess.run(
        _cli("test", "--course", course, "--weights", preset, "--stage", stage, "--format", "json", "--output", out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    document = json.loads(out.read_text())
    return sum(case["seconds"] for s in document["stages"] for case in s["cases"])


def batch_seconds(subs: list[Path], preset: str, stages: list[str], out: Path) -> dict[str, float]:
    """Each submission's seconds in one `grade` batch (--jobs 1)."""
    picks = [a for s in stages for a in ("--stage", s)]
    subprocess.run(
        _cli("grade", *subs, "--weights", preset, *picks, "--jobs", 1, "--out", out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    with out.open(encoding="utf-8") as f:
        return {row["id"]: float(row["seconds"]) for row in csv.DictReader(f)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "gpt2"])
    parser.add_argument("--stage", default="per-step-identity")
    parser.add_argument("--mutant", default="decode-wpe-off-by-one")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grade-stages", nargs="*", default=None, help="stages graded in the batch (default: --stage)")
    parser.add_argument("--only", choices=["test", "grade"], help="measure only one of the two")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="theinference-bench-") as tmp:
        root = Path(tmp)
        solution = root / "solution"
        shutil.copytree(data_dir("course") / "solution", solution)
        [mutant] = [m for m in load_mutants(data_dir("course") / "mutants") if m.name == args.mutant]
        buggy = build_mutant(mutant, solution, root / args.mutant)

        if args.only != "grade":
            measure_test(args, buggy, root)
        if args.only != "test":
            measure_grade(args, solution, buggy, root)


def measure_test(args: argparse.Namespace, buggy: Path, root: Path) -> None:
    """Start to first line, verdict and report of a failing `test`, against the student's own time."""
    started = time.perf_counter()
    streamed(buggy, args.preset, args.stage)  # makes the weights if needed and fills the oracle store
    print(f"warm-up run (weights made if missing, oracle store filled): {time.perf_counter() - started:.1f} s")

    runs, students = [], []
    for i in range(args.repeats):
        students.append(student_seconds(buggy, args.preset, args.stage, root / f"run-{i}.json"))
        runs.append(streamed(buggy, args.preset, args.stage))
    student = statistics.median(students)
    print(f"\n`test --stage {args.stage}` on mutant {args.mutant}, {args.preset} weights, warm store")
    print(f"  student code's own time for the stage: {student:.2f} s (median of {args.repeats})")
    for key, target in (("first line", None), ("verdict", 1.2), ("report", 2.0)):
        seconds = statistics.median(r[key] for r in runs)
        goal = f" (target <= {target}x)" if target else ""
        print(f"  start -> {key:<10} {seconds:6.2f} s = {seconds / student:5.2f}x the student's time{goal}")


def measure_grade(args: argparse.Namespace, solution: Path, buggy: Path, root: Path) -> None:
    """A failing submission's seconds in `grade` over a passing one's."""
    stages = args.grade_stages or [args.stage]
    times = batch_seconds([solution, buggy], args.preset, stages, root / "grades.csv")
    passing, failing = times["solution"], times[args.mutant]
    print(f"\n`grade` of the solution and {args.mutant} on {', '.join(stages)} (--jobs 1, no oracle store)")
    print(f"  passing {passing:.2f} s · failing {failing:.2f} s = {failing / passing:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
