"""Short plain-text summaries of results, shared by the CI renderers."""

from theinference.untrusted import for_terminal
from theinference.grading.results import CaseResult, RunResult, StageResult, Status


def run_summary(run: RunResult) -> str:
    """The run in one line: "N of M stages passed, X/Y points"."""
    earned, possible = run.points
    passed = sum(s.status == Status.PASS for s in run.stages)
    return f"{passed} of {len(run.stages)} stages passed, {earned:g}/{possible:g} points"


def scaling_summary(case: CaseResult) -> str:
    """cache-scaling's numbers in one line: how counted, ms per token at each length, both tests' figures."""
    t = case.scaling
    assert t is not None, "called for cache-scaling cases only"
    per = ", ".join(f"{n} tokens {ms:.3g} ms/token" for n, ms in zip(t.lengths, t.ms_per_token))
    fraction = f"{t.fraction:.0%}" if t.fraction is not None else "?"
    note = f" ({t.weights_note})" if t.weights_note else ""
    return (
        f"CPU time per token, counted by the grader ({t.accounting}){note}: {per}; (a) ratio {t.ratio:.2f} "
        f"(at most {t.max_ratio:g}); (b) {fraction} of the oracle's full recompute (at most {t.max_fraction:.0%})"
    )


def case_summary(case: CaseResult) -> str:
    """One paragraph: status and message, the timings if any, the diagnosed shape and the hint (the student's text escaped)."""
    lines = [f"{case.name}: {case.status}" + (f" — {for_terminal(case.message)}" if case.message else "")]
    if case.at:
        lines.append(for_terminal(f"at {case.at[0]}:{case.at[1]}"))
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


REPEATS_NAMED = 5  # a repeated error lists this many of the other cases by name


def group_cases(cases: list[CaseResult]) -> list[list[CaseResult]]:
    """Cases whose summaries are the same but for the name, together, in order of first appearance."""
    groups: dict[str, list[CaseResult]] = {}
    for case in cases:
        groups.setdefault(case_summary(case)[len(case.name) :], []).append(case)
    return list(groups.values())


def repeated_note(group: list[CaseResult]) -> str:
    """'same error in 9 more cases (b, c, …)' for a group of repeats, '' for a single case."""
    others = [c.name for c in group[1:]]
    if not others:
        return ""
    what = "failure" if group[0].status == Status.FAIL else "result" if group[0].status == Status.PASS else "error"
    names = ", ".join(others[:REPEATS_NAMED]) + (", …" if len(others) > REPEATS_NAMED else "")
    return f"same {what} in {len(others)} more case{'s' if len(others) > 1 else ''} ({for_terminal(names)})"


def grouped_summary(cases: list[CaseResult]) -> list[str]:
    """A paragraph per distinct outcome among cases: a repeated one told once, with how many more cases had it."""
    return [case_summary(g[0]) + (f"\n{repeated_note(g)}" if len(g) > 1 else "") for g in group_cases(cases)]


def stage_summary(stage: StageResult) -> str:
    """The stage's line and a paragraph per distinct outcome of the cases that did not pass."""
    head = (
        f"{stage.id}: {stage.status} · {stage.passed_cases}/{len(stage.cases)} cases · "
        f"{stage.points:g}/{stage.max_points:g} points"
    )
    shown = [c for c in stage.cases if c.status != Status.PASS or c.scaling]
    return "\n\n".join([head, *grouped_summary(shown)])
