"""Benchmark: batch grading speed-up from parallel student processes.

    python bench/batch.py [--copies 20]

Grades N copies of the reference solution on tiny weights with `theinference grade --jobs 1`
and `--jobs 2`, in the same run, and prints both wall times and the speed-up (target >= 1.8x
on 2 cores). With --jobs 1 a student's numpy may use every core for BLAS; with --jobs N the
grader gives each student cores/N BLAS threads, so a third run (--jobs 1, one BLAS thread)
shows the speed-up at equal per-student resources.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from theinference.proc.launch import blas_env
from theinference.bundled import data_dir
from theinference.model.synth import write_synthetic


def timed_grade(subs: list[Path], weights: Path, jobs: int, out: Path, env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "theinference",
            "grade",
            *map(str, subs),
            "--weights",
            str(weights),
            "--jobs",
            str(jobs),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, **(env or {})},
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        weights = write_synthetic(tmp / "weights", preset="tiny", seed=0)
        subs = []
        for i in range(args.copies):
            subs.append(tmp / "subs" / f"student-{i:02d}")
            shutil.copytree(data_dir("course") / "solution", subs[-1])
        one = timed_grade(subs, weights, 1, tmp / "one.csv")
        one_single = timed_grade(subs, weights, 1, tmp / "one1.csv", blas_env(1))
        two = timed_grade(subs, weights, 2, tmp / "two.csv")
        print(f"{args.copies} submissions, all stages, tiny weights, {os.cpu_count()} cores")
        print(f"--jobs 1 (students use every core for BLAS): {one:6.2f} s")
        print(f"--jobs 1 (students limited to 1 BLAS thread): {one_single:6.2f} s")
        print(f"--jobs 2 (1 BLAS thread per student):        {two:6.2f} s")
        print(f"speed-up --jobs 2 vs --jobs 1:            {one / two:6.2f}x   (target >= 1.8x on 2 cores)")
        print(f"speed-up with equal BLAS threads per student: {one_single / two:6.2f}x")


if __name__ == "__main__":
    main()
