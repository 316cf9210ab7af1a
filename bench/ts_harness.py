"""Benchmark: the Node harness's cost per case against the Python child's, side by side.

    python bench/ts_harness.py [--cases 40] [--rows 1] [--repeats 3] [--tsx DIR]

The same trivial adapter (it returns `rows` rows of n_vocab float32 numbers filled with one value, so
the work is the harness's, not the student's) is written as tests/adapters.py, tests/adapters.mjs and
tests/adapters.ts, and run through theinference.proc.runner.run_adapter exactly as a stage runs it:
once with 1 case, once with `cases` cases, each `repeats` times (the fastest kept). Per worker it prints
the start-up (the 1-case run: process start, import of the adapters, one call, reaping) and the cost
per further case ((T(cases) - T(1)) / (cases - 1): one call, the result converted to .npy, written, and
read back by the grader), for the Python child from the zygote and from a fresh interpreter, and for
Node on the .mjs file and on the .ts file (through tsx, found in the nearest node_modules at or above
--tsx DIR, default course/ts: `npm install` at the repository's root puts it there). Wall time, and the CPU time of the student's processes (everything the monitor reaped; not
measurable for zygote workers, which are not the grader's children), which a busy machine disturbs far less.
"""

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

N_VOCAB = 50257
PY = """
def run_decode_step(prompt_ids, next_id):
    return [[0.5] * {n}] * {rows} if {rows} > 1 else [0.5] * {n}
"""
JS = """
export function runDecodeStep(promptIds{ts_args}, nextId{ts_id}){ts_ret} {{
  const row = new Array({n}).fill(0.5);
  return {rows} > 1 ? Array.from({{ length: {rows} }}, () => row) : row;
}}
"""


def course(root: Path, kind: str, rows: int, node_modules: Path | None) -> Path:
    (root / "tests").mkdir(parents=True)
    if kind == "py":
        (root / "tests" / "adapters.py").write_text(PY.format(n=N_VOCAB, rows=rows))
    else:
        typed = kind == "ts"
        text = JS.format(
            n=N_VOCAB,
            rows=rows,
            ts_args=": number[]" if typed else "",
            ts_id=": number" if typed else "",
            ts_ret=": number[] | number[][]" if typed else "",
        )
        (root / "tests" / f"adapters.{kind}").write_text(text)
        if typed and node_modules is not None:
            (root / "node_modules").symlink_to(node_modules, target_is_directory=True)
    return root


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_run(root: Path, kind: str, n_cases: int, launcher, weights: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the student's processes: their monitor's reaped tree; 0 from the zygote)."""
    from theinference.proc.runner import AdapterJob, run_all

    adapters = root / "tests" / f"adapters.{kind}"
    job = AdapterJob(
        course_root=root,
        adapters=adapters,
        names=("run_decode_step", "runDecodeStep"),
        calls=tuple(((464, 3290), 318) for _ in range(n_cases)),
        weights=weights,
        timeout=60,
        launcher=launcher,
    )
    started, cpu = time.perf_counter(), _children_cpu()
    outcomes = run_all(job)
    seconds, cpu = time.perf_counter() - started, _children_cpu() - cpu
    bad = [o for o in outcomes if o.status != "ok"]
    if bad:
        sys.exit(f"{kind}: {bad[0].status}: {bad[0].message}\n{bad[0].stderr}")
    return seconds, cpu


def main() -> None:
    from theinference.bundled import data_dir
    from theinference.proc.launch import SubprocessLauncher, ZygoteLauncher
    from theinference.proc.node import find_tsx, node_executable

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tsx", type=Path, default=data_dir("course") / "ts")
    args = parser.parse_args()
    if node_executable() is None:
        sys.exit("node is not installed: nothing to compare")
    tsx = find_tsx(args.tsx.resolve())
    workers = [("python, zygote", "py", ZygoteLauncher), ("python, fresh", "py", SubprocessLauncher)]
    workers.append(("node, .mjs", "mjs", SubprocessLauncher))
    if tsx is not None:
        workers.append(("node + tsx, .ts", "ts", SubprocessLauncher))
    else:
        print(f"(no tsx at or above {args.tsx}: `npm install` at the repository's root adds the .ts row)")
    with tempfile.TemporaryDirectory(prefix="theinference-bench-") as tmp:
        weights = Path(tmp) / "model.safetensors"
        weights.write_bytes(b"")  # never read: the adapters ignore it
        print(f"{args.cases} cases, each returning {args.rows} x {N_VOCAB} numbers; fastest of {args.repeats}")
        print(f"{'':<18} {'wall time':^32}   {'CPU time (student processes)':^32}")
        print(f"{'worker':<18} {'start-up':>14} {'per further case':>17}   {'start-up':>14} {'per further case':>17}")
        for name, kind, make in workers:
            root = course(Path(tmp) / kind, kind, args.rows, tsx.parents[2] if tsx else None)
            launcher = make()
            try:
                launcher.warm()
                timed_run(root, kind, 1, launcher, weights)  # warms the zygote and the page cache
                ones = [timed_run(root, kind, 1, launcher, weights) for _ in range(args.repeats)]
                manys = [timed_run(root, kind, args.cases, launcher, weights) for _ in range(args.repeats)]
            finally:
                launcher.close()
            row = f"{name:<18}"
            for i in (0, 1):
                one, many = min(o[i] for o in ones), min(m[i] for m in manys)
                per_case = (many - one) / (args.cases - 1)
                row += f" {one * 1000:>11.0f} ms {per_case * 1000:>14.1f} ms  " if many else f" {'-':>14} {'-':>17}  "
            print(row.rstrip())
            shutil.rmtree(root)


if __name__ == "__main__":
    main()
