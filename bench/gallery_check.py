"""`theinference stages check` of the whole gallery, side by side: every cell graded (--no-reuse) and the default
(a mutant's stage whose calls reach only the solution's code takes the solution's verdict, marked =).

    python bench/gallery_check.py                 # the whole gallery on tiny, each way once
    python bench/gallery_check.py --stage forward --stage greedy
    python bench/gallery_check.py --rounds 2      # alternate the two ways, twice each

Each run is the real command in a fresh process with a cold user cache (its oracle store and the `proof` preset
made anew), so the runs differ only in what they grade. Both must pass with the same verdict in every cell: the
bench says so, or stops. The issue's target: the whole gallery in 10 minutes on 2 cores.

Measured on 2 cores shared with other jobs (load 6 to 14), tiny weights, 43 subjects:
  the six output stages (--stage each but cache-scaling), side by side in one run:
    --no-reuse 557.5 s, reuse 186.1 s: 3.00x faster, every one of the 258 cells the same both ways
  the whole gallery (7 stages, 301 cells), `theinference stages check --weights tiny`, cold cache, one run each
  (not side by side: load ~15 for the first, 15 to 470 for the second):
    before this change 1504 s (one cell a timeout: the machine's load), with it 1169 s; 137 of 301 cells reused.
  What is left is mostly the cost stage, which runs alone (costlock.py): a no-cache mutant's cache-scaling takes
  1 to 3 minutes there, and no reuse applies to code the stage runs.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time


def run(args: list[str], reuse: bool) -> tuple[float, int, dict[tuple[str, int], str], str]:
    """Seconds, exit code, the table's cells ((subject, column) -> mark and verdict, the = marker left out), last line."""
    with tempfile.TemporaryDirectory(prefix="bench-gallery-") as cache:
        env = {**os.environ, "THEINFERENCE_CACHE": cache, "COLUMNS": "400", "NO_COLOR": "1"}
        command = [sys.executable, "-m", "theinference", "stages", "check", "--weights", "tiny", *args]
        began = time.monotonic()
        done = subprocess.run(
            [*command, *([] if reuse else ["--no-reuse"])], env=env, capture_output=True, text=True, check=False
        )
        seconds = time.monotonic() - began
    cells = {}
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) > 1 and parts[0] and parts[0] != "subject" and not set(parts[0]) <= set("-+"):
            for column, text in enumerate(parts[1:]):
                cells[(parts[0], column)] = re.sub(r"\s*= solution$", "", text)
    summary = next((line for line in reversed(done.stdout.splitlines()) if "stages check" in line), done.stderr[-400:])
    return seconds, done.returncode, cells, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", action="append", default=[], help="check only this stage (repeatable)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each way, alternated")
    options = parser.parse_args()
    args = [a for s in options.stage for a in ("--stage", s)]
    print(f"cpus: {os.cpu_count()}, load before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    times: dict[bool, list[float]] = {False: [], True: []}
    seen: dict[bool, dict] = {}
    for round_ in range(options.rounds):
        for reuse in (False, True):
            seconds, code, cells, summary = run(args, reuse)
            way = "reuse (default)" if reuse else "--no-reuse     "
            print(f"round {round_ + 1} {way}: {seconds:7.1f} s, exit {code}: {summary}", flush=True)
            if code != 0:
                sys.exit(f"stages check failed ({way.strip()}): the bench measures a passing gallery")
            times[reuse].append(seconds)
            seen[reuse] = cells
    if seen[False] != seen[True]:
        differ = sorted(k for k in seen[False].keys() | seen[True].keys() if seen[False].get(k) != seen[True].get(k))
        sys.exit(f"the two ways disagree in {len(differ)} cell(s), e.g. {differ[:3]}")
    slow, fast = min(times[False]), min(times[True])
    print(f"every cell the same both ways ({len(seen[True])} cells)")
    print(f"--no-reuse {slow:.1f} s, reuse {fast:.1f} s (fastest of {options.rounds}): {slow / fast:.2f}x faster")
    print(f"load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
