"""Short plain-text summaries of results, shared by the CI renderers."""

from theinference.untrusted import for_terminal
from theinference.grading.judge.results import CaseResult, Diagnosis, Guarantee, RunResult, StageResult, Status


def run_summary(run: RunResult) -> str:
    """The run in one line: "N of M stages passed, X/Y points"."""
    earned, possible = run.points
    passed = sum(s.status == Status.PASS for s in run.stages)
    return f"{passed} of {len(run.stages)} stages passed, {earned:g}/{possible:g} points"


def timed_calls(total: int, diagnostic: int) -> str:
    """ "6 timed calls", and the diagnostic ones if any (they only tell no-cache from too-slow)."""
    timed = f"{total - diagnostic} timed calls"
    return f"{timed} (and {diagnostic} diagnostic ones, which tell no-cache from too-slow)" if diagnostic else timed


def _bound(t) -> str:
    return "at least " if t.stopped_at == t.lengths[-1] else ""  # the longest call was stopped: lower bounds


def both_figures(t) -> str:
    """(a) and (b) as the terminal states them, each only once its calls ran ("" if neither did)."""
    bound, first, last = _bound(t), t.lengths[0], t.lengths[-1]
    parts = []
    if t.ratio is not None:
        parts.append(
            f"(a) per-token cost {bound}×{t.ratio:.2f} from {first} to {last} tokens (at most ×{t.max_ratio:g} passes)"
        )
    if t.fraction is not None:
        parts.append(
            f"(b) {last} tokens cost {bound}{t.fraction:.0%} of the oracle's full recompute here "
            f"(at most {t.max_fraction:.0%} passes)"
        )
    return " · ".join(parts)


def guarantee_text(guarantee: str, accounting: str) -> str:
    """What a cache-scaling verdict's CPU count proves, in words ("" for a grade of record)."""
    missed = f"the {accounting} does not count a process that ends without being waited for"
    if guarantee == Guarantee.SELF_CHECK:
        return (
            f"a self-check, not a grade of record: {missed} (grades of record come from CI on Linux, where a cgroup "
            "counts every process)"
        )
    if guarantee == Guarantee.UNPROVABLE:
        return (
            f"not provable in grading mode: {missed}, so no pass is given on its count (a cgroup counts every "
            "process: run the grader as root, or in a delegated cgroup v2 subtree)"
        )
    return ""


def scaling_summary(case: CaseResult) -> str:
    """cache-scaling's numbers in one line: how counted, ms per token at each length, both tests' figures."""
    t = case.scaling
    assert t is not None, "called for cache-scaling cases only"
    per = ", ".join(
        f"{n} tokens > {ms:.3g} ms/token (stopped)" if n == t.stopped_at else f"{n} tokens {ms:.3g} ms/token"
        for n, ms in zip(t.lengths, t.ms_per_token)
        if ms is not None
    )
    note = f" ({t.weights_note})" if t.weights_note else ""
    bound = _bound(t)
    if bound:
        per += " (a lower bound: that call was stopped)"
    figures = []
    if t.ratio is not None:
        figures.append(f"(a) ratio {bound}{t.ratio:.2f} (at most {t.max_ratio:g})")
    if t.fraction is not None:
        figures.append(f"(b) {bound}{t.fraction:.0%} of the oracle's full recompute (at most {t.max_fraction:.0%})")
    if not figures:
        figures.append(f"not judged: the case ended before its {t.lengths[-1]}-token call")
    guarantee = guarantee_text(t.guarantee, t.accounting)
    return (
        f"CPU time per token, counted by the grader ({t.accounting}){note}: {per or 'no call finished'}; "
        + "; ".join(figures)
        + (f"; {guarantee}" if guarantee else "")
    )


def case_summary(case: CaseResult) -> str:
    """One paragraph: status and message, the timings if any, the diagnosed shape and the hint (the student's text escaped)."""
    lines = [f"{case.name}: {case.status}" + (f" — {for_terminal(case.message)}" if case.message else "")]
    if case.at:
        lines.append(for_terminal(f"at {case.at[0]}:{case.at[1]}"))
    if case.scaling:
        lines.append(scaling_summary(case))
    if case.diagnosis:
        lines += diagnosis_lines(case.diagnosis)
    if case.traceback:
        lines.append(for_terminal(case.traceback.rstrip()))
    return "\n".join(lines)


def diagnosis_lines(d: Diagnosis) -> list[str]:
    """A diagnosis as the terminal tells it: shape, finding (or the known bugs ruled out), hint."""
    lines = [f"shape: {d.shape} — {d.summary}"] if d.shape else []
    if d.bug:
        lines.append(f"finding: {d.bug}: {d.evidence}")
    elif d.evidence:
        lines.append(f"known bugs: {d.evidence}")
    if d.hint:
        lines.append(f"hint: {d.hint}")
    return lines


def cross_case_summary(stage: StageResult) -> str:
    """For a stage read across its cases (one row each): that diagnosis in a paragraph; "" for any other stage."""
    if stage.status == Status.PASS or stage.cross_case is None:
        return ""
    return "\n".join([f"{stage.id}, read across its cases:", *diagnosis_lines(stage.cross_case)])


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
    across = cross_case_summary(stage)
    return "\n\n".join([head, *([across] if across else []), *grouped_summary(shown)])
