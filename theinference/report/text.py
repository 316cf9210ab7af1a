"""Short plain-text summaries of results, shared by the CI renderers."""

from theinference.report.untrusted import for_terminal
from theinference.results import CaseResult, StageResult


def case_summary(case: CaseResult) -> str:
    """One paragraph: status and message, the diagnosed shape and the hint (the student's text escaped)."""
    lines = [f"{case.name}: {case.status}" + (f" — {for_terminal(case.message)}" if case.message else "")]
    if case.diagnosis:
        lines.append(f"shape: {case.diagnosis.shape} — {case.diagnosis.summary}")
        if case.diagnosis.hint:
            lines.append(f"hint: {case.diagnosis.hint}")
    if case.traceback:
        lines.append(for_terminal(case.traceback.rstrip()))
    return "\n".join(lines)


def stage_summary(stage: StageResult) -> str:
    """The stage's line and a paragraph per case that did not pass."""
    head = (f"{stage.id}: {stage.status} · {stage.passed_cases}/{len(stage.cases)} cases · "
            f"{stage.points:g}/{stage.max_points:g} points")
    return "\n\n".join([head, *(case_summary(c) for c in stage.cases if c.status != "pass")])
