"""Short plain-text summaries of results, shared by the CI renderers."""

from theinference.results import CaseResult, StageResult


def case_summary(case: CaseResult) -> str:
    """One paragraph: status and message, the diagnosed shape and the hint."""
    lines = [f"{case.name}: {case.status}" + (f" — {case.message}" if case.message else "")]
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
        lines.append(case.traceback.rstrip())
    return "\n".join(lines)


def stage_summary(stage: StageResult) -> str:
    """The stage's line and a paragraph per case that did not pass."""
    head = (f"{stage.id}: {stage.status} · {stage.passed_cases}/{len(stage.cases)} cases · "
            f"{stage.points:g}/{stage.max_points:g} points")
    return "\n\n".join([head, *(case_summary(c) for c in stage.cases if c.status != "pass")])
