"""report/jsonout.py: the "theinference.results" and "theinference.batch" documents a CI script parses.

The field sets asserted here are the ones the README documents (its "JSON results" section): a field added,
renamed or dropped fails here until the README and this test say so too.
"""

import json

import pytest

from theinference.grading.drive.batch import GradedWith, ShardRecord, SubmissionResult
from theinference.grading.drive.copies import Copy
from theinference.grading.judge.results import Diagnosis, Status
from theinference.report.jsonout import SCHEMA, SCHEMA_VERSION, batch_document, render_json, run_document

from .builders import (
    HOSTILE,
    ROWS,
    SCALING,
    TOKENS,
    case,
    check_snapshot,
    error_case,
    mixed_run,
    replace,
    row,
    run,
    scaling,
    stage,
    stage_spec,
    step_time,
)

RUN_FIELDS = {
    "schema",
    "schema_version",
    "theinference_version",
    "status",
    "points",
    "max_points",
    "course",
    "seed",
    "weights",
    "untrusted",
    "course_supplied",
    "notices",
    "isolation",
    "processes",
    "stages",
}
STAGE_FIELDS = {
    "id",
    "title",
    "status",
    "points",
    "max_points",
    "passed_cases",
    "total_cases",
    "adapter",
    "adapters_file",
    "lesson",
    "compare",
    "seconds",
    "diagnosis",
    "cross_case",
    "source",
    "visibility",
    "float64_cases",
    "cases",
}
CASE_FIELDS = {
    "name",
    "status",
    "message",
    "detail",
    "inputs",
    "texts",
    "seconds",
    "clock",
    "loading",
    "first_bad_row",
    "rows",
    "steps",
    "expected_tokens",
    "got_tokens",
    "diagnosis",
    "traceback",
    "stdout",
    "stderr",
    "at",
    "scaling",
}
ROW_FIELDS = {"row", "position", "token", "max_abs", "max_rel", "n_bad", "n", "n_nonfinite", "worst_index"}
ROW_FIELDS |= {"expected", "got", "ok"}
STEP_FIELDS = {"step", "position", "got", "expected", "gap", "allowed", "verdict"}
DIAGNOSIS_FIELDS = {"shape", "summary", "hint", "bugs", "bug", "evidence"}
CLOCK_FIELDS = {"charged_seconds", "timeout", "cpu_seconds", "waited_seconds", "wall_seconds"}
SCALING_FIELDS = {
    "lengths",
    "cpu_seconds",
    "ms_per_token",
    "marginal_ms_per_token",
    "ratio",
    "max_ratio",
    "fraction_of_recompute",
    "max_fraction",
    "accounting",
    "accounting_complete",
    "guarantee",
    "floor_ms_per_token",
    "oracle_cpu_seconds",
    "oracle_step_ms",
    "speedup",
    "stopped_at",
    "weights_note",
    "calls",
}
CALL_FIELDS = {"n_new", "cpu_seconds", "wall_seconds", "stopped", "clock", "prompt_tokens", "diagnostic"}


def parsed(result, version: str = "0.1.0") -> dict:
    """The document as a CI script reads it: strict JSON (no NaN or Infinity tokens)."""

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(render_json(result, version), parse_constant=refuse)


def test_snapshot():
    check_snapshot("results.json", render_json(mixed_run(), "0.1.0"))


def test_every_documented_field_and_no_other():
    doc = parsed(mixed_run())
    assert set(doc) == RUN_FIELDS
    assert (doc["schema"], doc["schema_version"]) == (SCHEMA, SCHEMA_VERSION) == ("theinference.results", 1)
    assert set(doc["weights"]) == {"path", "source", "why", "synthetic", "config"}
    assert set(doc["isolation"]) == {"level", "summary"}
    for s in doc["stages"]:
        assert set(s) - {"tolerance", "tie"} == STAGE_FIELDS
        for c in s["cases"]:
            assert set(c) == CASE_FIELDS
    cases = {c["name"]: c for s in doc["stages"] for c in s["cases"]}
    assert set(cases["long"]["rows"][0]) == ROW_FIELDS
    assert set(cases["long"]["diagnosis"]) == DIAGNOSIS_FIELDS
    assert set(cases["sentence"]["steps"][0]) == STEP_FIELDS
    assert set(cases["cost"]["scaling"]) == SCALING_FIELDS
    assert set(cases["cost"]["scaling"]["calls"][0]) == CALL_FIELDS


def test_status_and_points_of_the_run():
    doc = parsed(mixed_run())
    assert (doc["status"], doc["points"], doc["max_points"], doc["seed"]) == ("fail", 20, 50, 7)
    assert parsed(run())["status"] == "pass"
    assert [s["status"] for s in doc["stages"]] == ["pass", "fail", "error", "fail", "pass"]
    per_step = doc["stages"][1]
    assert (per_step["passed_cases"], per_step["total_cases"]) == (1, 2)


def test_the_tolerance_is_told_as_the_stage_file_gives_it():
    rows, tokens, cost = (parsed(run([stage(check=c)]))["stages"][0] for c in (ROWS, TOKENS, SCALING))
    assert (rows["compare"], rows["tolerance"], "tie" in rows) == ("rows", {"atol": 1e-4, "rtol": 1e-3}, False)
    assert (tokens["compare"], tokens["tie"], "tolerance" in tokens) == ("tokens", {"rtol": 1e-4}, False)
    assert (cost["compare"], cost["tie"]) == ("scaling", {"rtol": 1e-4})


def test_non_finite_numbers_are_strings():
    nan_row = replace(row(0, 1.0), max_abs=float("inf"), max_rel=float("nan"), got=float("-inf"), n_nonfinite=3)
    doc = parsed(run([stage(status=Status.FAIL, cases=[case(status=Status.FAIL, rows=[nan_row])])]))
    written = doc["stages"][0]["cases"][0]["rows"][0]
    assert (written["max_abs"], written["max_rel"], written["got"]) == ("inf", "nan", "-inf")
    assert written["n_nonfinite"] == 3


def test_first_bad_row_and_the_case_location():
    doc = parsed(mixed_run())
    cases = {c["name"]: c for s in doc["stages"] for c in s["cases"]}
    assert cases["long"]["first_bad_row"] == 1
    assert cases["short"]["first_bad_row"] is None
    assert cases["broken"]["at"] == {"file": "tests/adapters.py", "line": 3}
    assert cases["short"]["at"] is None


def test_a_diagnosis_gives_its_bugs_as_a_list_and_as_one_string():
    found = Diagnosis("no-pattern", "no shape", "", bugs=("wpe-off-by-one", "mask-diagonal"), evidence="to 3e-7")
    doc = parsed(run([stage(status=Status.FAIL, cases=[case(status=Status.FAIL, diagnosis=found)])]))
    d = doc["stages"][0]["cases"][0]["diagnosis"]
    assert d["bugs"] == ["wpe-off-by-one", "mask-diagonal"]
    assert d["bug"] == "wpe-off-by-one, mask-diagonal"
    assert doc["stages"][0]["diagnosis"] == d  # the stage's headline: its one diagnosed case


def test_the_clock_of_a_case_and_of_its_loading():
    timed = case(clock=step_time(1.5, 30.0), loading=step_time(0.25, 30.0))
    c = parsed(run([stage(cases=[timed])]))["stages"][0]["cases"][0]
    assert set(c["clock"]) == CLOCK_FIELDS
    assert (c["clock"]["charged_seconds"], c["clock"]["timeout"], c["loading"]["charged_seconds"]) == (1.5, 30.0, 0.25)
    assert parsed(run())["stages"][0]["cases"][0]["clock"] is None


def test_scaling_carries_the_derived_figures():
    s = parsed(mixed_run())["stages"][4]["cases"][0]["scaling"]
    assert s["lengths"] == [8, 480]
    assert s["ms_per_token"] == [10.0, 10.0]
    assert s["marginal_ms_per_token"][0] is None and abs(s["marginal_ms_per_token"][1] - 10.0) < 1e-9
    assert s["ratio"] == pytest.approx(1.0) and s["fraction_of_recompute"] == pytest.approx(0.2)
    assert s["speedup"] == pytest.approx(5.0)
    assert s["guarantee"] == "record" and s["accounting_complete"] is True


def test_scaling_with_a_length_that_never_ran_is_null_not_a_number():
    unfinished = scaling(seconds=(0.08, None), calls=())
    doc = parsed(run([stage("cache-scaling", Status.FAIL, [case(status=Status.FAIL, scaling=unfinished)])]))
    s = doc["stages"][0]["cases"][0]["scaling"]
    assert s["cpu_seconds"] == [0.08, None] and s["ms_per_token"][1] is None
    assert (s["ratio"], s["fraction_of_recompute"], s["speedup"]) == (None, None, None)


def test_the_students_text_is_kept_verbatim_and_still_valid_json():
    """JSON escapes what it must; the reader gets the student's exact message, not a mangled one."""
    doc = parsed(run([stage(status=Status.ERROR, cases=[error_case(message=HOSTILE, stdout=HOSTILE)])]))
    c = doc["stages"][0]["cases"][0]
    assert c["message"] == HOSTILE and c["stdout"] == HOSTILE


def test_the_version_given_is_the_one_written():
    assert parsed(run(), "7.8.9")["theinference_version"] == "7.8.9"


def test_untrusted_and_what_the_course_supplied():
    doc = run_document(run(untrusted=True, course_supplied=["timeout = 99"], notices=["ignored stages/"]), "0")
    assert (doc["untrusted"], doc["course_supplied"], doc["notices"]) == (True, ["timeout = 99"], ["ignored stages/"])
    assert doc["weights"]["synthetic"] == "tiny preset, seed 0"
    assert run_document(run(synthetic=None), "0")["weights"]["synthetic"] is None


GRADED = GradedWith("0.1.0", "sha256:abc (tiny preset, seed 0)", "sha256:def", None)


def test_batch_document_of_graded_and_ungradable_submissions():
    stages = [stage_spec("prove-one-layer", points=10), stage_spec("greedy", points=10)]
    results = [
        SubmissionResult("alice", "/s/alice", run(), seconds=2.0, copies=[Copy("reference-solution", ("src/a.py",))]),
        SubmissionResult("bob", "/s/bob", None, error="no tests/adapters.py in /s/bob"),
    ]
    doc = batch_document(results, stages, GRADED, shard=ShardRecord(2, 3, 40, "sha256:123"))
    assert (doc["schema"], doc["schema_version"], doc["stages"]) == (
        "theinference.batch",
        1,
        ["prove-one-layer", "greedy"],
    )
    assert doc["interrupted"] is None and doc["graded_with"]["weights"] == GRADED.weights
    alice, bob = doc["submissions"]
    assert (alice["status"], alice["points"], alice["max_points"]) == ("pass", 10, 10)
    assert alice["results"]["schema"] == "theinference.results"
    assert alice["copy_of"] == [{"of": "reference-solution", "files": ["src/a.py"], "similarity": 1.0, "regions": []}]
    assert (alice["shard"], alice["batch_submissions"], alice["batch_ids"]) == ("2/3", 40, "sha256:123")
    # could not be graded: an error, 0 of the whole course's points, and why
    assert (bob["status"], bob["points"], bob["max_points"], bob["results"]) == ("error", 0, 20, None)
    assert "no tests/adapters.py" in bob["error"]


def test_batch_names_the_cases_the_machine_was_too_busy_for():
    busy = case("two-tokens", Status.TIMEOUT, detail="machine-busy", message="timed out")
    result = SubmissionResult("carol", "/s/carol", run([stage("forward", Status.TIMEOUT, [busy, case()])]))
    doc = batch_document([result], [stage_spec("forward")], GRADED, interrupted="interrupted after 1 of 2")
    assert doc["submissions"][0]["machine_busy"] == [{"stage": "forward", "case": "two-tokens"}]
    assert doc["interrupted"] == "interrupted after 1 of 2"
    assert "shard" not in doc["submissions"][0]
