"""Short plain-text summaries of results, shared by the CI renderers."""

from theinference.report.untrusted import for_terminal
from theinference.grading.results import CaseResult, RunResult, StageResult


def run_summary(run: RunResult) -> str:
    """The run in one line: "N of M stages passed, X/Y points"."""
    earned, possible = run.points
    passed = sum(s.status == "pass" for s in run.stages)
    return f"{passed} of {len(run.stages)} stages passed, {earned:g}/{possible:g} points"


def scaling_summary(case: CaseResult) -> str:
    """cache-scaling's numbers in one line: ms per token at each length, the ratio, the speed-up."""
    t = case.scaling
    assert t is not None, "called for cache-scaling cases only"
    per = ", ".join(f"{n} tokens {ms:.3g} ms/token" for n, ms in zip(t.lengths, t.ms_per_token))
    faster = f"; {t.speedup:.1f}× faster than the oracle's recompute (estimated)" if t.speedup is not None else ""
    return (f"CPU time per token ({t.blas_threads} BLAS thread(s)): {per}; ratio {t.ratio:.2f} "
            f"(at most {t.max_ratio:g}){faster}")


def case_summary(case: CaseResult) -> str:
    """One paragraph: status and message, the timings if any, the diagnosed shape and the hint (the student's text escaped)."""
    lines = [f"{case.name}: {case.status}" + (f" — {for_terminal(case.message)}" if case.message else "")]
    if case.scaling:
        lines.append(scaling_summary(case))
    if case.diagnosis:
        if case.diagnosis.shape:
            lines.append(f"shape: {case.diagnosis.shape} — {case.diagnosis.summary}")
        if case.diagnosis.bug:
            lines.append(f"finding: {case.diagnosis.bug}: {case.diagnosis.evidence}")
        elif case.diagnosis.evidence:
            lines.append(f"known bugs: {case.diagnosis.evidence}")
        if case.diagnosis.hint:
            lines.append(f"hint: {case.diagnosis.hint}")
    if case.traceback:
        lines.append(for_terminal(case.traceback.rstrip()))
    return "\n".join(lines)


def stage_summary(stage: StageResult) -> str:
    """The stage's line and a paragraph per case that did not pass."""
    head = (f"{stage.id}: {stage.status} · {stage.passed_cases}/{len(stage.cases)} cases · "
            f"{stage.points:g}/{stage.max_points:g} points")
    shown = [c for c in stage.cases if c.status != "pass" or c.scaling]
    return "\n\n".join([head, *(case_summary(c) for c in shown)])
