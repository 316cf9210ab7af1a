"""Benchmark: the Gradescope bundle in a simulated container, grading the reference solution.

    python bench/gradescope_sim.py --out DIR [--cpu 0] [--memory-mb 768] [--preset tiny] [--keep-apt]

Builds the bundle with `theinference autograder gradescope` (the default: tiny preset, 540 s budget), lays it
out as Gradescope does under DIR/ag (AUTOGRADER_ROOT: source/ holds the unzipped bundle, submission/ the bundled
reference solution), then runs source/setup.sh and source/run_autograder as Gradescope would, each pinned to one
CPU (`taskset -c CPU`) inside a memory cgroup this script makes (cgroup v2 `memory.max`, else v1
`memory.limit_in_bytes`), as root. Prints each step's wall time and peak memory, and the score of results.json
against its possible points: the reference solution must get full marks.

setup.sh installs packages with apt-get: unless --keep-apt, `apt-get` is a stub on PATH that prints what it was
asked and does nothing (this machine has bubblewrap and Python 3.11 already; a simulation should not upgrade the
machine's packages). pip installs the wheel's dependencies through pip's own configuration.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from theinference.bundled import data_dir

V2, V1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")


def make_cgroup(name: str, memory_mb: int) -> tuple[Path, str]:
    """A memory cgroup capped at memory_mb, and the file its peak usage is read from."""
    limit = str(memory_mb << 20)
    if (V2 / "cgroup.controllers").exists():
        group = V2 / name
        group.mkdir(exist_ok=True)
        (group / "memory.max").write_text(limit)
        (group / "memory.swap.max").write_text("0")
        return group, "memory.peak"
    group = V1 / name
    group.mkdir(exist_ok=True)
    (group / "memory.limit_in_bytes").write_text(limit)
    return group, "memory.max_usage_in_bytes"


def reset_peak(group: Path, peak: str) -> None:
    if peak == "memory.max_usage_in_bytes":
        (group / peak).write_text("0")


def run_step(script: Path, group: Path, peak: str, cpu: int, env: dict, log: Path) -> tuple[float, int, int]:
    """Run script inside the cgroup on one CPU: (wall seconds, exit status, peak bytes)."""
    reset_peak(group, peak)
    # The shell joins the cgroup, then becomes the pinned script: every process it starts is in both.
    inner = f"echo $$ > {group / 'cgroup.procs'} && exec taskset -c {cpu} bash {script}"
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(["sh", "-c", inner], env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    seconds = time.monotonic() - started
    used = int((group / peak).read_text()) if (group / peak).exists() else -1
    return seconds, done.returncode, used


def layout(out: Path, preset: str) -> Path:
    """The bundle built and unzipped as Gradescope lays it out; the reference solution as the submission."""
    root = out / "ag"
    shutil.rmtree(root, ignore_errors=True)
    bundle = out / "autograder.zip"
    command = [sys.executable, "-m", "theinference", "autograder", "gradescope", "--out", str(bundle)]
    subprocess.run(command + ["--preset", preset], check=True)
    with zipfile.ZipFile(bundle) as z:
        z.extractall(root / "source")
    for name in ("setup.sh", "run_autograder"):
        (root / "source" / name).chmod(0o755)
    shutil.copytree(data_dir("course") / "solution", root / "submission")
    return root


def apt_stub(out: Path) -> Path:
    stub = out / "stub-bin"
    stub.mkdir(exist_ok=True)
    (stub / "apt-get").write_text('#!/bin/sh\necho "apt-get stub (simulation): $*"\n')
    (stub / "apt-get").chmod(0o755)
    return stub


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="work directory (its ag/ is the simulated /autograder)")
    parser.add_argument("--cpu", type=int, default=0, help="the one CPU both steps run on (default 0)")
    parser.add_argument("--memory-mb", type=int, default=768, help="memory cap (default 768: Gradescope's default)")
    parser.add_argument("--preset", default="tiny", help="the bundle's --preset (default tiny, the bundle's own)")
    parser.add_argument("--keep-apt", action="store_true", help="let setup.sh run the real apt-get")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = layout(out, args.preset)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "THEINFERENCE_CACHE")}
    env["AUTOGRADER_ROOT"] = str(root)
    if not args.keep_apt:
        env["PATH"] = f"{apt_stub(out)}:{env['PATH']}"
    # Not this environment's theinference: the bundle's own, installed by setup.sh into ag/venv.
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if not p.startswith(sys.prefix))
    group, peak = make_cgroup(f"theinference-gradescope-sim-{os.getpid()}", args.memory_mb)
    try:
        figures = {}
        for step in ("setup.sh", "run_autograder"):
            seconds, status, used = run_step(root / "source" / step, group, peak, args.cpu, env, out / f"{step}.log")
            figures[step] = (seconds, status, used)
            print(f"{step}: {seconds:.1f} s, exit {status}, peak {used / 2**20:.0f} MB (log {out / f'{step}.log'})")
            if status != 0:
                raise SystemExit(f"{step} failed: see {out / f'{step}.log'}")
    finally:
        group.rmdir()
    results = json.loads((root / "results" / "results.json").read_text())
    possible = sum(t["max_score"] for t in results["tests"])
    print(f"results.json: {results['score']:g} of {possible:g} points")
    for test in results["tests"]:
        print(f"  {test['name']}: {test['score']:g}/{test['max_score']:g} {test['status']}")
    full = results["score"] == possible > 0
    print(
        f"\n{'full marks' if full else 'NOT full marks'} on CPU {args.cpu} within {args.memory_mb} MB: "
        f"setup {figures['setup.sh'][0]:.0f} s, grading {figures['run_autograder'][0]:.0f} s"
    )


if __name__ == "__main__":
    main()
