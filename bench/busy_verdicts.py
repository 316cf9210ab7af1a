"""Benchmark: verdicts that load cannot flip. Every stage, through the real CLI, quiet and beside CPU burners.

    python bench/busy_verdicts.py --out DIR [--cache DIR] [--weights gpt2] [--subjects a,b] [--load] [--table]

Grades each subject with `theinference test --all --format json` (a subprocess, a fresh copy of its course in
a temporary directory) and keeps the report as DIR/quiet/SUBJECT.json, or with --load as DIR/loaded/SUBJECT.json,
grading beside two CPU burners per core (started when the pass starts, stopped when it ends). Then prints, per
subject x stage, side by side for the passes DIR holds: the verdict; the step the grader charged most (wall time
less run-queue wait) against its timeout, and the margin (timeout / charged; above 1 is inside); the stage's
charged total against its budget (timeout x (cases + 1)) and that margin; the CPU seconds of the student's
process tree and the seconds it waited for a CPU, summed over the steps the grader timed; and for cache-scaling
(a) the per-token ratio and (b) the fraction of a recompute, each with its margin (threshold / figure).

Subjects: `reference` (the bundled solution), `functional`, `classes`, `loops` (the independent student
implementations of bench/students/, rendered with no mistake, as bench/diagnosis.py renders them) and
`mistake:NAME` (one of bench/diagnosis.py's MISTAKES patched in, graded on the stages it lists). A correct subject must pass every stage in
every pass; a mistake must get the same verdict (status, shape and bug named) in every pass: load may flip
neither a pass to a fail nor a fail to a pass. The last line says whether that held.

--cache sets THEINFERENCE_CACHE for every grading (default: DIR/cache): the weights are made once, and the
oracle's outputs are kept there, so passes after the first do not recompute them (the grader's work, never
charged to the student; cache-scaling measures the oracle's recompute every run, by design). Run the quiet pass
first; run each --load pass under whatever lock the machine's users share for CPU burners.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from diagnosis import MISTAKES, make_course  # noqa: E402
import busy  # noqa: E402

from theinference.bundled import data_dir  # noqa: E402

STYLES = ("functional", "classes", "loops")
DEFAULT_SUBJECTS = "reference,classes,mistake:l-decode-pos-plus-one"
PASSES = ("quiet", "loaded")


def make_subject(name: str, root: Path) -> tuple[Path, list[str]]:
    """A fresh course directory for a subject, and the stages to grade (none: every stage)."""
    if name == "reference":
        shutil.copytree(data_dir("course") / "solution", root)
    elif name in STYLES:
        make_course(root, name, {})
    elif name.startswith("mistake:") and name.removeprefix("mistake:") in MISTAKES:
        style, subs, stages, _ = MISTAKES[name.removeprefix("mistake:")]
        make_course(root, style, subs)
        return root, stages  # where it shows, after the stages it must pass (as bench/diagnosis.py grades it)
    else:
        raise SystemExit(f"unknown subject {name!r}: reference, {', '.join(STYLES)} or mistake:NAME")
    return root, []


def grade(course: Path, stages: list[str], weights: str, env: dict, log: Path) -> dict:
    """`theinference test --all --format json` (or those stages) on the course: the report, parsed."""
    command = [sys.executable, "-m", "theinference", "test", "--format", "json"]
    command += [arg for stage in stages for arg in ("--stage", stage)] or ["--all"]
    command += ["--course", str(course), "--weights", weights]
    with log.open("w") as err:
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=err, text=True, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"theinference exited {done.returncode} on {course} (see {log})")
    return json.loads(done.stdout)


def run_pass(label: str, subjects: list[str], args) -> None:
    out = Path(args.out) / label
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "THEINFERENCE_CACHE": str(Path(args.cache or Path(args.out) / "cache").resolve())}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a SIGTERM (timeout, kill) still stops the burners
    burners = busy.start() if label == "loaded" else []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in subjects:
                course, stages = make_subject(name, Path(tmp) / name.replace(":", "-"))
                started, load = time.monotonic(), os.getloadavg()[0]
                report = grade(course, stages, args.weights, env, out / f"{name}.log")
                report["bench"] = {"minutes": (time.monotonic() - started) / 60, "load_before": load}
                report["bench"]["load_after"] = os.getloadavg()[0]
                (out / f"{name}.json").write_text(json.dumps(report))
                print(f"  … {label} {name}: {report['status']} in {report['bench']['minutes']:.1f} min", flush=True)
    finally:
        busy.stop(burners)


def _steps(stage: dict) -> list[dict]:
    """Every step the grader timed in a stage: each case and import, or each cache-scaling call."""
    steps = []
    for case in stage["cases"]:
        steps += [step for step in (case.get("clock"), case.get("loading")) if step]
        if case.get("scaling"):
            steps += [call["clock"] for call in case["scaling"]["calls"] if call.get("clock")]
    return steps


def _margin(threshold: float | None, figure: float | None) -> str:
    if threshold is None or figure is None or not isinstance(figure, (int, float)):
        return "-"
    return f"{threshold / figure:.1f}" if figure > 0 else "inf"


def verdict(stage: dict) -> str:
    """A stage's verdict as a user sees it: status, and for a failure its shape and the bug named."""
    found = stage.get("diagnosis") or next((c["diagnosis"] for c in stage["cases"] if c.get("diagnosis")), None)
    if stage["status"] == "pass" or not found:
        return stage["status"]
    return f"{stage['status']} {found.get('shape') or ''} {found.get('bug') or ''}".strip()


def cells(stage: dict) -> list[str]:
    steps = _steps(stage)
    worst = max(steps, key=lambda s: s["charged_seconds"] / s["timeout"], default=None)
    charged = sum(s["charged_seconds"] for s in steps)
    timeout = worst["timeout"] if worst else None
    budget = timeout * (len(stage["cases"]) + 1) if timeout and stage["compare"] != "scaling" else None
    row = [
        verdict(stage),
        f"{worst['charged_seconds']:.1f}/{timeout:g}" if worst else "-",
        _margin(timeout, worst["charged_seconds"] if worst else None),
        f"{charged:.1f}/{budget:g}" if budget else "-",
        _margin(budget, charged) if budget else "-",
        f"{sum(s['cpu_seconds'] for s in steps):.1f}",
        f"{sum(s['waited_seconds'] for s in steps):.1f}",
    ]
    scaling = next((c["scaling"] for c in stage["cases"] if c.get("scaling")), None)
    if scaling:
        ratio, fraction = scaling.get("ratio"), scaling.get("fraction_of_recompute")
        row.append(
            f"(a) {ratio or 0:.2f} m {_margin(scaling['max_ratio'], ratio)}  "
            f"(b) {fraction or 0:.1%} m {_margin(scaling['max_fraction'], fraction)}"
        )
    return row


HEADER = ["verdict", "worst step", "margin", "stage", "margin", "CPU s", "wait s"]
WIDTHS = [34, 11, 6, 12, 6, 7, 7]


def _line(values: list[str]) -> str:
    return " ".join(f"{v:>{w}}" if i else f"{v:<{w}}" for i, (v, w) in enumerate(zip(values, WIDTHS)))


def print_table(out: Path) -> bool:
    """Print the passes DIR holds side by side; True when no verdict differs from the subject's expectation."""
    reports = {p: {f.stem: json.loads(f.read_text()) for f in sorted((out / p).glob("*.json"))} for p in PASSES}
    held = True
    for name in sorted(set(reports["quiet"]) | set(reports["loaded"])):
        runs = [(p, reports[p][name]) for p in PASSES if name in reports[p]]
        print(
            f"\n{name}: "
            + "; ".join(
                f"{p} {r['bench']['minutes']:.1f} min, load {r['bench']['load_before']:.1f}"
                f"→{r['bench']['load_after']:.1f}"
                for p, r in runs
            )
        )
        print(f"  {'stage':<22} " + " | ".join(f"{p + ': ' + _line(HEADER)}" for p, _ in runs))
        extra = []
        for index, stage in enumerate(runs[0][1]["stages"]):
            per_pass = [cells(r["stages"][index]) for _, r in runs]
            print(
                f"  {stage['id']:<22} "
                + " | ".join(" " * (len(p) + 2) + _line(c[:7]) for (p, _), c in zip(runs, per_pass))
            )
            extra += [f"  {stage['id']:<22} {p}: {c[7]}" for (p, _), c in zip(runs, per_pass) if len(c) > 7]
            verdicts = {c[0] for c in per_pass}
            if len(verdicts) > 1 or (not name.startswith("mistake:") and verdicts != {"pass"}):
                held = False
                print(f"  !! {stage['id']}: {' vs '.join(c[0] for c in per_pass)}")
        print("\n".join(extra))
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for the reports (kept across passes)")
    parser.add_argument("--cache", help="THEINFERENCE_CACHE for every grading (default: OUT/cache)")
    parser.add_argument("--weights", default="gpt2", help="weights to grade on (default: the gpt2 shape)")
    parser.add_argument("--subjects", default=DEFAULT_SUBJECTS, help=f"comma-separated (default: {DEFAULT_SUBJECTS})")
    parser.add_argument("--load", action="store_true", help="this pass beside two CPU burners per core")
    parser.add_argument("--table", action="store_true", help="only print the table of the passes OUT holds")
    args = parser.parse_args()
    if not args.table:
        run_pass("loaded" if args.load else "quiet", args.subjects.split(","), args)
    held = print_table(Path(args.out))
    print(
        f"\nverdicts {'held' if held else 'DID NOT HOLD'}: correct subjects pass every stage, each mistake's "
        "verdict is the same in every pass"
    )


if __name__ == "__main__":
    main()
