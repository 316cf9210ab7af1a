"""Benchmark: how often fingerprinting names the right bug, and what it costs next to the oracle.

    python bench/diagnosis.py [--seeds 0 1 2 3] [--gpt2 DIR] [--skip-gallery-on-gpt2] [--jobs 2]

(1) Precision: grades every mutant of the gallery (course/mutants/, each a classic bug applied
to the reference solution) on every fingerprinted stage, on `tiny` synthetic weights for each
seed and on the `gpt2` shape, through the real grading path (student processes and all). For
each mutant × stage whose manifest names a fingerprint and that fails, the named diagnosis is
`exact` (the manifest's bugs), `wrong` (another bug, stated as fact: must never happen) or
`unnamed` (no known bug matched: the shape's suspects are shown instead). Prints a line per
mutant × stage and the overall rate (target >= 95% exact, 0 wrong).
(2) Cost, on the gpt2 shape: per stage, the oracle's time for all the stage's cases, then the
time to fingerprint a failing output that is one known bug (the usual case) and one that is
none (every candidate computed on the cheapest failing case), as a ratio (target <= 5x).
"""

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from theinference.grading.bugs import BUILTIN_BUGS, bug_output
from theinference.grading.check import check_course
from theinference.grading.fingerprint import fingerprint_stage
from theinference.grading.grade import OracleCache, _case_result, cross_case_diagnosis
from theinference.grading.oracle_registry import resolve_oracle
from theinference.bundled import data_dir
from theinference.course import Course
from theinference.grading.results import StageResult
from theinference.proc.runner import CallOutcome
from theinference.grading.stages import load_stages, stage_dirs
from theinference.model.synth import write_synthetic
from theinference.model.weights import load_model


def fingerprinted_stages():
    return [s for s in load_stages(stage_dirs(None)) if s.bugs]


def precision(weights: Path, label: str, jobs: int) -> list[str]:
    """Grade the gallery on these weights; one verdict (exact | wrong | unnamed | passes) per expectation."""
    stages = fingerprinted_stages()
    result = check_course(data_dir("course"), stages, stages, load_model(weights), jobs=jobs)
    verdicts = []
    for cell in result.cells:
        if cell.expected_bugs is None:
            continue
        if cell.got == "pass":
            verdict = "passes"  # the bug does not show at this stage's tolerance on these weights
        elif cell.got_bugs == cell.expected_bugs:
            verdict = "exact"
        else:
            verdict = "wrong" if cell.got_bugs else "unnamed"
        named = ", ".join(sorted(cell.got_bugs)) or "-"
        print(f"  {label:8} {cell.subject:28} {cell.stage:22} {verdict:8} named: {named}", flush=True)
        verdicts.append(verdict)
    return verdicts


def _failing_result(stage, model, cache, output_of) -> StageResult:
    """A graded stage whose student output for each case is output_of(case), as grade() builds it."""
    spec = resolve_oracle(stage.oracle, stage.source)
    cases = [
        _case_result(stage, case, CallOutcome(status="ok", value=output_of(case)), _Ctx(model, cache), spec)
        for case in stage.cases
    ]
    return StageResult(
        id=stage.id,
        title=stage.title,
        status="fail",
        cases=cases,
        points=0,
        max_points=stage.points,
        adapter=stage.adapter,
        adapters_file="",
        lesson="",
        atol=stage.atol,
        rtol=stage.rtol,
        compare=stage.compare,
        cross_case=cross_case_diagnosis(stage, cases),
    )


class _Ctx:
    def __init__(self, model, cache):
        self.model, self.cache = model, cache
        self.course = Course(root=Path("."), adapters=Path("tests/adapters.py"))


def cost(weights: Path) -> None:
    """Oracle time per stage vs fingerprinting time for a known bug and for an unknown one."""
    model = load_model(weights)
    rng = np.random.default_rng(0)
    for stage in fingerprinted_stages():
        spec = resolve_oracle(stage.oracle, stage.source)
        cache = OracleCache()
        start = time.perf_counter()
        for case in stage.cases:
            cache.get(model, stage, spec, case)
        oracle_s = time.perf_counter() - start
        bug = BUILTIN_BUGS["missing-scale"]
        known = _failing_result(stage, model, cache, lambda c: bug_output(bug, spec, stage.oracle, model, c.inputs))
        unknown = _failing_result(
            stage,
            model,
            cache,
            lambda c: (lambda e: e + 0.1 * rng.standard_normal(e.shape))(cache.get(model, stage, spec, c)),
        )
        times = []
        for result in (known, unknown):
            fresh = OracleCache(entries={k: v for k, v in cache.entries.items() if "bug" not in k})
            start = time.perf_counter()
            fingerprint_stage(stage, result, model, fresh)
            times.append(time.perf_counter() - start)
        named = (known.diagnosis.bug if known.diagnosis else "") or "-"
        print(
            f"  {stage.id:22} oracle {oracle_s:6.2f} s · fingerprint, known bug ({named}): {times[0]:6.2f} s "
            f"= {times[0] / oracle_s:4.1f}x · unknown bug: {times[1]:6.2f} s = {times[1] / oracle_s:4.1f}x   (target <= 5x)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3], help="tiny seeds")
    parser.add_argument("--gpt2", type=Path, help="a gpt2-shape checkpoint directory (default: made in a temp dir)")
    parser.add_argument("--skip-gallery-on-gpt2", action="store_true", help="only the cost on gpt2, not the gallery")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        print("precision over the mutant gallery:")
        for seed in args.seeds:
            out = Path(tmp) / f"tiny-{seed}"
            write_synthetic(out, preset="tiny", seed=seed)
            verdicts += precision(out / "model.safetensors", f"tiny-{seed}", args.jobs)
        gpt2 = args.gpt2 or Path(tmp) / "gpt2"
        if not (gpt2 / "model.safetensors").is_file():
            print("making gpt2-shape synthetic weights ...", flush=True)
            write_synthetic(gpt2, preset="gpt2", seed=0)
        if not args.skip_gallery_on_gpt2:
            verdicts += precision(gpt2 / "model.safetensors", "gpt2", args.jobs)
        shown = [v for v in verdicts if v != "passes"]
        exact, wrong = shown.count("exact"), shown.count("wrong")
        print(
            f"named exactly: {exact} of {len(shown)} failing mutant × stage ({100 * exact / max(1, len(shown)):.1f}%, "
            f"target >= 95%); wrong claims stated as fact: {wrong} (target 0); "
            f"unnamed: {shown.count('unnamed')}; invisible at tolerance: {verdicts.count('passes')}"
        )
        print("fingerprint cost on the gpt2 shape:")
        cost(gpt2 / "model.safetensors")


if __name__ == "__main__":
    main()
