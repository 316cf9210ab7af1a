"""JUnit XML: one testsuite per stage, one testcase per case (GitHub/GitLab test reporters read it)."""

import os
import xml.etree.ElementTree as ET

from theinference.report.text import case_summary, cross_case_summary, scaling_summary
from theinference.untrusted import for_terminal
from theinference.grading.judge.results import NO_ANSWER, CaseResult, RunResult, StageResult, Status


def _scaling_properties(scaling) -> list[ET.Element]:
    values = [
        (
            "cpu_ms_per_token",
            " ".join(f"{n}:{ms:.4g}" for n, ms in zip(scaling.lengths, scaling.ms_per_token) if ms is not None),
        ),
        ("ratio", "" if scaling.ratio is None else f"{scaling.ratio:.4g}"),
        ("max_ratio", f"{scaling.max_ratio:g}"),
        ("fraction_of_recompute", "" if scaling.fraction is None else f"{scaling.fraction:.4g}"),
        ("max_fraction", f"{scaling.max_fraction:g}"),
        ("accounting", scaling.accounting),
        ("accounting_complete", str(scaling.complete).lower()),
        ("guarantee", scaling.guarantee),
    ]
    if scaling.stopped_at is not None:  # that length's figure is a lower bound
        values.append(("stopped_at", str(scaling.stopped_at)))
    if scaling.speedup is not None:
        values.append(("speedup", f"{scaling.speedup:.4g}"))
    return [ET.Element("property", name=name, value=value) for name, value in values]


def _location(run: RunResult, stage: StageResult, case: CaseResult) -> dict[str, str]:
    """file= and line=: where a failing case's traceback left the course, else where the adapter is defined."""
    if case.status != Status.PASS and case.at:
        return {"file": os.path.join(run.course, case.at[0]), "line": str(case.at[1])}
    where = {"file": stage.adapter_source or stage.adapters_file}
    return where | ({"line": str(stage.adapter_line)} if stage.adapter_line else {})


def render_junit(run: RunResult, version: str) -> str:
    earned, possible = run.points
    root = ET.Element("testsuites", name="theinference", tests=str(sum(len(s.cases) for s in run.stages)))
    failures = errors = 0
    for stage in run.stages:
        suite = ET.SubElement(
            root, "testsuite", name=stage.id, tests=str(len(stage.cases)), time=f"{stage.seconds:.3f}"
        )
        props = ET.SubElement(suite, "properties")
        for name, value in (
            ("title", stage.title),
            ("points", f"{stage.points:g}"),
            ("max_points", f"{stage.max_points:g}"),
            ("status", stage.status),
            ("weights", run.weights_path),
            ("isolation", f"{run.isolation}: {run.isolation_summary}"),
            *((f"processes.{key}", value) for key, value in run.processes.items()),
            ("theinference_version", version),
            ("source", stage.origin),
            ("course_supplied", "; ".join(run.course_supplied)),
            *((("seed", str(run.seed)),) if run.seed is not None else ()),  # no seed: no random cases, no property
        ):
            ET.SubElement(props, "property", name=name, value=value)
        stage_failures = stage_errors = 0
        for case in stage.cases:
            attributes = {"classname": f"theinference.{stage.id}", "name": case.name, "time": f"{case.seconds:.3f}"}
            element = ET.SubElement(suite, "testcase", attributes | _location(run, stage, case))
            if case.scaling:
                ET.SubElement(element, "properties").extend(_scaling_properties(case.scaling))
            if case.status == Status.PASS:
                if case.scaling:  # a failure's text carries these numbers; a pass shows them here
                    ET.SubElement(element, "system-out").text = scaling_summary(case)
                continue
            # no answer from the student's code, or none the grader could prove: not a failure of the code
            tag = "error" if case.status in NO_ANSWER or case.status == Status.UNPROVEN else "failure"
            # A stage read across its cases diagnoses none of them alone: each failing case carries the stage's.
            diagnosis = case.diagnosis or (stage.cross_case if case.status == Status.FAIL else None)
            message = diagnosis.summary if diagnosis else (for_terminal(case.message) or case.status)
            detail = ET.SubElement(element, tag, type=case.status, message=message)
            across = cross_case_summary(stage) if case.status == Status.FAIL else ""
            detail.text = case_summary(case) + (f"\n{across}" if across else "")
            if case.stdout or case.stderr:
                ET.SubElement(element, "system-out").text = for_terminal(case.stdout + case.stderr)
            stage_errors += tag == "error"
            stage_failures += tag == "failure"
        suite.set("failures", str(stage_failures))
        suite.set("errors", str(stage_errors))
        failures, errors = failures + stage_failures, errors + stage_errors
    root.set("failures", str(failures))
    root.set("errors", str(errors))
    root.set("points", f"{earned:g}/{possible:g}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
