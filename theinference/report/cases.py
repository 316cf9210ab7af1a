"""What the terminal report shows of a failing case: its status and message, its table (report/tables.py), its
diagnosis (shape, finding, hint), a generation's text, the cache proof's figures, and what the student's code printed."""

from rich.table import Table
from rich.text import Text

from theinference.model import tokenizer
from theinference.untrusted import for_terminal
from theinference.report.statuses import presentation
from theinference.report.tables import rows_table, scaling_table, sparkline, token_window, tokens_table
from theinference.report.text import both_figures, guarantee_text, timed_calls
from theinference.grading.judge.results import NO_ANSWER, CaseResult, Diagnosis, Status


def _timed_calls(t) -> str:
    return timed_calls(len(t.calls), sum(1 for c in t.calls if c.diagnostic))


def scaling_lines(case: CaseResult) -> list[Text]:
    """How the cost was counted, both tests' figures, and (on a pass) the speed-up over a recompute."""
    t = case.scaling
    assert t is not None, "called for cache-scaling cases only"
    lines = [
        Text(
            f"  counted by the grader ({t.accounting}): CPU of your whole process tree in {_timed_calls(t)}, "
            "each on a fresh random prompt (the cheapest call of each length counts)",
            style="dim",
        ),
    ]
    figures = both_figures(t)
    if figures:
        lines.append(Text(f"  {figures}", style="dim"))
    if t.weights_note:
        lines.insert(0, Text(f"  {t.weights_note}", style="dim"))
    guarantee = guarantee_text(t.guarantee, t.accounting)
    if guarantee:
        lines.append(Text(f"  {guarantee}", style="yellow"))
    if case.status == Status.PASS and t.speedup is not None:
        lines.append(
            Text(
                f"  your cache: {t.lengths[-1]} tokens in {t.seconds[-1]:.2f} s of CPU; "
                f"a full recompute: {t.oracle_seconds:.2f} s; {t.speedup:.1f}× faster",
                style="green",
            )
        )
    return lines


def _status_and_message(case: CaseResult) -> Text:
    """`timed out — message`; a message that begins with the status's word (every timeout's does: "timed out after
    60 s while running") goes on from the word, which is said once."""
    status, message = presentation(case.status), for_terminal(case.message)
    if message.startswith(status.words):
        return Text.assemble((status.words, status.style), message[len(status.words) :])
    return Text.assemble((status.words, status.style), (f" — {message}" if message else "", ""))


def case_body(case: CaseResult, vocab: bool, plain: bool, width: int, shared: str = "") -> list:
    parts: list[Text | Table] = [
        labelled(
            f"case {for_terminal(case.name)}",
            "bold",
            _status_and_message(case),
        )
    ]
    if case.rows and case.status == Status.FAIL:
        parts.append(rows_table(case, vocab, plain, width))
        if len(case.rows) > 1:  # one character says nothing the table does not
            parts.append(Text(f"  error by position: {sparkline([r.max_abs for r in case.rows], plain)}"))
    if case.status == Status.FAIL and any(s.verdict == "mismatch" for s in case.steps):  # not for right tokens
        parts.append(tokens_table(case, plain))
        parts.extend(_greedy_text(case))
    if case.scaling:
        parts.append(scaling_table(case, plain))
        parts.extend(scaling_lines(case))
    if case.diagnosis and shared == "shape+hint":  # the finding is said once for the stage, after its cases
        d = case.diagnosis
        parts.extend(diagnosis_lines(Diagnosis(shape=d.shape, summary=d.summary, hint=d.hint)))
    elif case.diagnosis:
        parts.extend(diagnosis_lines(case.diagnosis, shape_only=shared == "shape"))
    if case.traceback:
        parts.append(Text(for_terminal(case.traceback.rstrip()), style="dim"))
    output = (case.stdout + case.stderr).strip()
    if output and case.status in NO_ANSWER:
        parts.append(Text("  output of your code:\n" + for_terminal(output[-2000:]), style="dim"))
    return parts


def labelled(label: str, style: str, body: Text) -> Table:
    """`  label: text`, the text wrapping under itself rather than under the label."""
    grid = Table.grid()
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(Text(f"  {label}: ", style=style), body)
    return grid


def diagnosis_lines(
    d: Diagnosis, shape_only: bool = False, finding_only: bool = False, with_hint: bool = True
) -> list[Table]:
    """Shape, then the fingerprint's finding (or that no known bug matched), then the hint.

    shape_only: the shape alone (the stage states the rest once for all its cases); finding_only: the rest;
    with_hint False: not the hint (it is on screen already).
    """
    lines = []
    if d.shape and not finding_only:
        lines.append(labelled("shape", "bold", Text.assemble((d.shape, "magenta"), f" — {d.summary}")))
    if shape_only:
        return lines
    if d.bug:
        lines.append(labelled("finding", "bold green", Text.assemble((d.bug, "bold"), f" — {d.evidence}")))
    elif d.evidence:
        lines.append(labelled("known bugs", "bold", Text(d.evidence)))
    if d.hint and with_hint:
        lines.append(labelled("hint", "bold yellow", Text(d.hint)))
    return lines


_PROMPT_CHARS = 60  # the end of a long prompt is what the generation continues


def _greedy_text(case: CaseResult) -> list[Text]:
    """The prompt's end and both continuations as text over the steps the table shows (on synthetic weights,
    gibberish: the ids are what count)."""
    prompt = case.texts.get("prompt") or tokenizer.decode(case.inputs.get("prompt", []))
    if len(prompt) > _PROMPT_CHARS:
        prompt = "…" + prompt[-_PROMPT_CHARS:]
    lo, hi = token_window(case)
    more = "…" if hi < min(len(case.expected_tokens), len(case.got_tokens)) else ""
    steps = f"steps {lo + 1}–{hi}:" if lo > 0 or more else ""
    lines = [Text(f"  {'prompt:':<9} {prompt!r}")]
    if steps:
        lines.append(Text(f"  {steps}", style="dim"))
    for label, tokens in (("expected:", case.expected_tokens), ("got:", case.got_tokens)):
        lines.append(Text(f"  {label:<9} {tokenizer.decode(tokens[lo:hi])!r}{more}"))
    return lines
