"""Benchmark: a class's points do not depend on the machine's load. One small class, graded quiet and loaded.

    python bench/class_points.py --out DIR [--weights tiny] [--jobs 2] [--table]

Builds a class of five submissions: `reference` (the bundled solution), `no-cache` (the mutant
decode-recomputes: every decode step recomputes the whole sequence), `hang` (the solution whose run_forward
loops forever: every later stage is correct), `crash` (the solution whose run_decode_step kills itself with
SIGSEGV) and `bug` (the mutant missing-attn-scale). Grades it twice with `theinference grade --format json`
(a subprocess, every stage, --jobs 2): once on the machine as it is (DIR/quiet.json), once beside two CPU
burners per core started before the grading and stopped after it (DIR/loaded.json). Then prints the points per
submission and per stage side by side, what each row lists to regrade (machine-busy or stopped by the time
budget), and whether every submission's points are identical in both passes. --table only prints the table of
the passes DIR holds.

The two passes share THEINFERENCE_CACHE (DIR/cache): the weights and the oracle's outputs are made once (the
grader's work, never charged to a student).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import busy

from theinference.bundled import data_dir
from theinference.grading.tools.mutants import build_mutant, load_mutant

PASSES = ("quiet", "loaded")
MUTANTS = {"no-cache": "decode-recomputes", "bug": "missing-attn-scale"}
BROKEN = {  # the solution with one adapter replaced: (adapter, body)
    "hang": ("run_forward", "while True:\n        pass"),
    "crash": ("run_decode_step", "import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)"),
}


def make_class(root: Path) -> list[Path]:
    """The five submissions' course directories under root."""
    solution = data_dir("course") / "solution"
    shutil.copytree(solution, root / "reference")
    for name, mutant in MUTANTS.items():
        build_mutant(load_mutant(data_dir("course") / "mutants" / mutant / "manifest.toml"), solution, root / name)
    for name, (adapter, body) in BROKEN.items():
        shutil.copytree(solution, root / name)
        adapters = root / name / "tests" / "adapters.py"
        adapters.write_text(adapters.read_text() + f"\n\ndef {adapter}(*args):\n    {body}\n")
    return sorted(root.iterdir())


def run_pass(label: str, args) -> None:
    out = Path(args.out)
    env = {**os.environ, "THEINFERENCE_CACHE": str((out / "cache").resolve())}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a SIGTERM (timeout, kill) still stops the burners
    burners = busy.start() if label == "loaded" else []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            subs = make_class(Path(tmp) / "class")
            command = [sys.executable, "-m", "theinference", "grade", *map(str, subs), "--format", "json"]
            command += ["--weights", args.weights, "--jobs", str(args.jobs), "--out", str(out / f"{label}.json")]
            started, load = time.monotonic(), os.getloadavg()[0]
            with (out / f"{label}.log").open("w") as err:
                done = subprocess.run(command, env=env, stderr=err, check=False)
            if done.returncode != 0:
                raise SystemExit(f"theinference grade exited {done.returncode} (see {out / f'{label}.log'})")
            minutes = (time.monotonic() - started) / 60
            print(f"  … {label}: {minutes:.1f} min, load {load:.1f} before, {os.getloadavg()[0]:.1f} after", flush=True)
    finally:
        busy.stop(burners)


def _points(doc: dict) -> dict[str, tuple[str, dict[str, str], list[str]]]:
    """Per submission: its points, each stage's "status points", and what it lists to regrade."""
    rows = {}
    for sub in doc["submissions"]:
        stages = {s["id"]: f"{s['status']} {s['points']:g}" for s in (sub["results"] or {}).get("stages", [])}
        rows[sub["id"]] = (f"{sub['points']:g}/{sub['max_points']:g}", stages, sub.get("regrade", []))
    return rows


def print_table(out: Path) -> bool:
    """The side-by-side table; True if every submission got the same points (total and per stage) in each pass."""
    passes = {p: _points(json.loads((out / f"{p}.json").read_text())) for p in PASSES if (out / f"{p}.json").exists()}
    if len(passes) < 2:
        print(f"only {', '.join(passes) or 'no'} pass(es) in {out}: run both to compare")
        return False
    quiet, loaded = passes["quiet"], passes["loaded"]
    print(f"{'submission':<11}{'quiet':>9}{'loaded':>9}  same  stages that differ / to regrade")
    same = True
    for sub in sorted(quiet.keys() | loaded.keys()):
        (q_total, q_stages, q_regrade), (l_total, l_stages, l_regrade) = quiet.get(sub), loaded.get(sub)
        differ = [
            f"{s}: {q_stages.get(s)} vs {l_stages.get(s)}" for s in q_stages if q_stages.get(s) != l_stages.get(s)
        ]
        points_same = q_total == l_total and all(
            q.split()[1] == (l_stages.get(s) or " -").split()[1] for s, q in q_stages.items()
        )
        same &= points_same
        regrades = f"regrade quiet {q_regrade or '-'}, loaded {l_regrade or '-'}"
        print(
            f"{sub:<11}{q_total:>9}{l_total:>9}  {'yes' if points_same else 'NO ':<4}  {'; '.join(differ) or '-'}; {regrades}"
        )
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for the passes' grades.json (kept across runs)")
    parser.add_argument("--weights", default="tiny", help="weights to grade on (default: the tiny preset)")
    parser.add_argument("--jobs", type=int, default=2, help="submissions graded at a time (default 2)")
    parser.add_argument("--table", action="store_true", help="only print the table of the passes OUT holds")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if not args.table:
        for label in PASSES:
            run_pass(label, args)
    same = print_table(Path(args.out))
    print(f"\npoints {'identical' if same else 'DIFFER'} in the quiet and the loaded pass")


if __name__ == "__main__":
    main()
