"""Benchmark: cache-scaling's two tests counted by each CPU meter, side by side in one run.

    python bench/meters.py [--load] [--sources cgroup,proc,psutil-no-children] [--subjects a,b] [--repeats N]
                           [--stop-at X]

Grades the built-in cache-scaling stage exactly as `theinference test` does, for the reference cache (must pass),
the careful recompute (the no-cache mutant decode-recomputes-last-row: every layer over the whole sequence, the LM
head on the last row only) and a plain recompute (the no-cache mutant decode-recomputes), each counted by every
meter (THEINFERENCE_METER, theinference.proc.accounting): the run's cgroup, the /proc tree, and psutil with reaped
children's CPU ignored (THEINFERENCE_PSUTIL_CHILDREN=0: how psutil counts on macOS and Windows, where an exited
process keeps the last reading seen of it). Subject by subject, the meters take turns, so each subject's figures
are measured under the same load; one oracle cache per pass, so (b)'s full recompute is the same for every meter.

For each it prints (a) the per-token ratio (longest over shortest length: at most max_ratio passes) and (b) the
longest call's fraction of the oracle's full recompute (at most max_fraction passes), each with its margin
(threshold / figure for code that must pass, figure / threshold for code that must fail: above 1 is on the right
side; '>' marks a lower bound, from a call stopped at its budget), what a stopped call's verdict rests on (as
bench/cache_scaling.py prints them: "diag", a token's marginal cost after the diagnostic calls' long prompt over the
short calls' rate, against costcase._GROWTH; "grew", the longest call's CPU over its tokens at the short calls' rate,
against costcase._GROWN), the verdict (and, where it is wrong, its message) and the source the report names.

--stop-at X stops the longest call at X times (b)'s floor instead of at the floor, so that the margins of code that
must fail are measured up to X (a recompute's longest call then finishes: its (a) ratio is measured too).
--load runs everything a second time beside two CPU burners per core (started for that pass, stopped after it) and
prints both passes side by side. psutil reads this machine's /proc here, as it reads the real procfs bound
elsewhere where a test hides /proc (THEINFERENCE_PSUTIL_PROCFS, tests/test_meters.py): the same readings.
"""

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cache_scaling import row, stage_for  # noqa: E402
import busy  # noqa: E402

from theinference.bundled import data_dir  # noqa: E402
from theinference.course import load_course  # noqa: E402
from theinference.grading.judge import costcase  # noqa: E402
from theinference.grading.judge.grade import GradeContext, grade  # noqa: E402
from theinference.grading.oracle.cache import OracleCache  # noqa: E402
from theinference.grading.tools.mutants import build_mutant, load_mutants  # noqa: E402
from theinference.model.synth import write_synthetic  # noqa: E402
from theinference.model.weights import load_model  # noqa: E402
from theinference.proc import accounting  # noqa: E402
from theinference.proc.launch import SubprocessLauncher  # noqa: E402

SOURCES = {
    "cgroup": {accounting.METER_ENV: "cgroup"},
    "proc": {accounting.METER_ENV: "proc"},
    "psutil-no-children": {accounting.METER_ENV: "psutil", accounting.PSUTIL_CHILDREN_ENV: "0"},
}
MUTANTS = {"careful-recompute": "decode-recomputes-last-row", "plain-recompute": "decode-recomputes"}


def subjects(work: Path) -> list[tuple[str, Path, bool]]:
    """(name, course dir, must pass): the reference cache and the two no-cache mutants."""
    solution = data_dir("course") / "solution"
    found = [("reference-cache", solution, True)]
    mutants = {m.name: m for m in load_mutants(data_dir("course") / "mutants")}
    for name, mutant in MUTANTS.items():
        assert mutants[mutant].expect.get("cache-scaling") == ("no-cache",), f"{mutant} is no longer a no-cache mutant"
        found.append((name, build_mutant(mutants[mutant], solution, work / mutant), False))
    return found


@contextlib.contextmanager
def metered(source: str):
    """The environment that forces this meter, for the grades inside."""
    saved = {name: os.environ.get(name) for name in (accounting.METER_ENV, accounting.PSUTIL_CHILDREN_ENV)}
    os.environ.update(SOURCES[source])
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_pass(stage, model, found, sources) -> dict[tuple[str, str], list[str]]:
    """Every subject under every meter, the meters taking turns subject by subject: (subject, source) -> its row."""
    cache, rows = OracleCache(), {}
    for name, course, must_pass in found:
        for source in sources:
            with metered(source):
                ctx = GradeContext(course=load_course(course), model=model, cache=cache, launcher=SubprocessLauncher())
                result = grade(stage, ctx)
            figures = row(name, must_pass, result)
            counted = result.cases[0].scaling
            figures.append(counted.accounting if counted is not None else "-")
            if figures[7].endswith("WRONG") or "WRONG " in figures[7]:  # why, in its own words
                figures[7] += f" ({result.cases[0].message[:70]})"
            rows[(name, source)] = figures
            print(f"  … {name} [{source}]: {' '.join(figures[1:])}", file=sys.stderr, flush=True)
    return rows


def print_table(passes: list[tuple[str, dict]], found, sources) -> None:
    print("margins (above 1: on the right side of the threshold)")
    header = f"  {'subject':<18} {'meter':<19}"
    for label, _ in passes:
        header += f" | {label + ': (a) ratio  margin  (b) of recompute  margin         diag  grew  verdict':<84}"
    print(header + " | source named")
    for name, _, _ in found:
        for source in sources:
            line = f"  {name:<18} {source:<19}"
            for _, rows in passes:
                _, ratio, m_a, fraction, m_b, diag, grew, verdict, named = rows[(name, source)]
                line += f" | {ratio:>9} {m_a:>7} {fraction:>17} {m_b:>7} {diag:>12} {grew:>5}  {verdict:<20}"
            print(f"{line} | {named}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", action="store_true", help="also run beside two CPU burners per core")
    parser.add_argument("--sources", default=",".join(SOURCES), help="the meters (comma-separated)")
    parser.add_argument("--subjects", default="", help="only these subjects (comma-separated names)")
    parser.add_argument("--repeats", type=int, default=0, help="timed rounds per subject (default: the stage's)")
    parser.add_argument("--stop-at", type=float, default=0.0, help="stop the longest call at this multiple of (b)")
    args = parser.parse_args()
    sources = [s for s in args.sources.split(",") if s]
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        sys.exit(f"unknown meter source {unknown[0]!r}: one of {', '.join(SOURCES)}")
    stage = stage_for(argparse.Namespace(graded="", lengths="", repeats=args.repeats))
    if args.stop_at:
        costcase._KILL_AT = args.stop_at
        stage = dataclasses.replace(stage, timeout=3600)
    spec = stage.check.params
    with tempfile.TemporaryDirectory(prefix="theinference-bench-") as tmp:
        work = Path(tmp)
        found = [s for s in subjects(work) if not args.subjects or s[0] in args.subjects.split(",")]
        write_synthetic(work / "tiny", preset="tiny", seed=0)
        model = load_model(work / "tiny" / "model.safetensors")
        print(
            f"cache-scaling on the proof preset: lengths {list(spec.lengths)}, repeats {spec.repeats}, "
            f"(a) max_ratio {spec.max_ratio:g}, (b) max_fraction {spec.max_fraction:g}"
        )
        passes = [("quiet", run_pass(stage, model, found, sources))]
        if args.load:
            burners = busy.start()
            try:
                passes.append(("two burners per core", run_pass(stage, model, found, sources)))
            finally:
                busy.stop(burners)
        print_table(passes, found, sources)


if __name__ == "__main__":
    main()
