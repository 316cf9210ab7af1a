"""GitHub Actions: `::error` annotations at the student's line, and a Markdown job summary."""

import os

from theinference.report.text import (
    case_summary,
    cross_case_summary,
    group_cases,
    grouped_summary,
    repeated_note,
    run_summary,
    scaling_summary,
)
from theinference.untrusted import for_terminal, markdown_code_block, workflow_data, workflow_property
from theinference.grading.judge.results import RunResult, StageResult, Status


def _relative(path: str) -> str:
    workspace = os.environ.get("GITHUB_WORKSPACE") or os.getcwd()
    try:
        return os.path.relpath(path, workspace) if os.path.isabs(path) else path
    except ValueError:
        return path


def _location(run: RunResult, stage: StageResult) -> str:
    """Where the first failing case's traceback left the course directory, else the adapter's definition."""
    at = next((c.at for c in stage.cases if c.status != Status.PASS and c.at), None)
    path, line = (
        (os.path.join(run.course, at[0]), at[1])
        if at
        else (stage.adapter_source or stage.adapters_file, stage.adapter_line)
    )
    return f"file={workflow_property(_relative(path))}" + (f",line={line}" if line else "")


def render_annotations(run: RunResult) -> str:
    """One `::error` per stage that did not pass, at the student's line; a `::notice` per passed cost proof (its CPU
    meter, and whether the verdict is a grade of record or a self-check); a `::notice` with the total."""
    lines = []
    for stage in run.stages:
        if stage.status == Status.PASS:  # a passed cost proof still says how it was counted, and what that proves
            title = workflow_property(f"theinference {stage.id}")
            lines += [f"::notice title={title}::{workflow_data(scaling_summary(c))}" for c in stage.cases if c.scaling]
            continue
        title = workflow_property(f"theinference {stage.id}: {stage.status}")
        failing = grouped_summary([c for c in stage.cases if c.status != Status.PASS])
        across = cross_case_summary(stage)
        failing = [across, *failing] if across else failing
        lines.append(f"::error {_location(run, stage)},title={title}::{workflow_data(chr(10).join(failing))}")
    for line in run.course_supplied:
        lines.append(f"::warning title={workflow_property('theinference: not the instructor')}::{workflow_data(line)}")
    lines.append(f"::notice title=theinference::{run_summary(run)}; isolation: {run.isolation}")
    return "\n".join(lines) + "\n"


def render_summary(run: RunResult, version: str) -> str:
    """A Markdown summary for $GITHUB_STEP_SUMMARY."""
    earned, possible = run.points
    out = [
        f"## theinference: {earned:g}/{possible:g} points",
        "",
        "| stage | status | cases | points |",
        "|---|---|---|---|",
    ]
    for stage in run.stages:
        mark = "✅" if stage.status == Status.PASS else "❌"
        out.append(
            f"| `{stage.id}` | {mark} {stage.status} | {stage.passed_cases}/{len(stage.cases)} | "
            f"{stage.points:g}/{stage.max_points:g} |"
        )
    for stage in run.stages:
        if cross_case_summary(stage):
            out += ["", f"### `{stage.id}` · across its cases", "", markdown_code_block(cross_case_summary(stage))]
        for group in group_cases([c for c in stage.cases if c.status != Status.PASS]):
            more = f" ({repeated_note(group)})" if len(group) > 1 else ""
            heading = for_terminal(f"### `{stage.id}` · {group[0].name}{more}")
            out += ["", heading, "", markdown_code_block(case_summary(group[0]))]
    if run.course_supplied:
        out += ["", *(f"> **not the instructor's:** {for_terminal(line)}  " for line in run.course_supplied)]
    seed = f" · seed {run.seed}" if run.seed is not None else ""
    out += [
        "",
        f"<sub>theinference {version} · weights `{run.weights_path}`{seed} · "
        f"isolation: {run.isolation} ({run.isolation_summary})</sub>",
        "",
    ]
    return "\n".join(out)
