"""What a cache-scaling verdict rests on: the meter that counted the CPU, and a count no cache could give.

Built inputs only (no student process, no oracle run): a meter that misses processes gives no pass in grading mode
and a self-check on the student's own run, every format says which; a count that fell, or below what any cache
costs, fails as tampering. The end-to-end cases are in test_scaling_proof_cli.py.
"""

import json
import random
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console

from theinference.bundled import data_dir
from theinference.grading.judge import costcase, costverdict, oraclecost, scaling
from theinference.grading.judge.results import (
    CaseResult,
    Guarantee,
    RunResult,
    StageResult,
    Status,
    TimedCall,
)
from theinference.grading.spec.stages import load_stages
from theinference.proc.runner import CallOutcome
from theinference.report.gradescope import render_gradescope
from theinference.report.jsonout import render_json
from theinference.report.junit import render_junit
from theinference.report.terminal import render_stage
from theinference.report.text import scaling_summary

STAGE = next(s for s in load_stages([data_dir("stages")]) if s.id == "cache-scaling")  # lengths 8 and 480
STEP = 0.005  # the oracle's one-token step, as if measured here: the floor is a fifth, 1 ms a token
COSTS = oraclecost.Costs({8: 0.06, 480: 30.0}, STEP)


class Meter:
    """A meter whose readings are given in advance."""

    def __init__(self, readings, complete=True):
        self.readings, self.complete = list(readings), complete
        self.name = "cgroup v2 cpu.stat" if complete else "process tree (/proc)"

    def cpu_seconds(self) -> float:
        return self.readings.pop(0)


def _run(complete: bool = True, untrusted: bool = False) -> costcase.CostCase:
    ctx = SimpleNamespace(
        course=SimpleNamespace(adapters=Path("tests") / "adapters.py"),
        model=SimpleNamespace(config=SimpleNamespace(n_ctx=512, n_vocab=50257), path="proof", stamp=()),
        cache=SimpleNamespace(memo=lambda key, measure: COSTS),
        on_case=None,
        untrusted=untrusted,
    )
    run = costcase.CostCase(STAGE, ctx, timeout=120.0, weights_note="")
    run.complete = complete
    run.accounting = Meter([], complete).name
    return run


def _timed(run: costcase.CostCase, short: float, long: float) -> costverdict.Verdict:
    """Both lengths timed at these CPU seconds, then judged as grading does."""
    for n, cpu in ((8, short), (480, long)):
        run.calls.append(TimedCall(n, cpu, cpu, prompt_tokens=4))
    return costverdict.unproven(costverdict.judge(run.stage, run.scaling_result()))


A_CACHE = (8 * 0.006, 480 * 0.006)  # 6 ms a token at both lengths: 9.6% of the recompute
A_RECOMPUTE = (8 * 0.006, 20.0)  # 67% of the recompute


def test_a_complete_meter_gives_a_grade_of_record_in_every_mode():
    for untrusted in (False, True):
        verdict = _timed(_run(complete=True, untrusted=untrusted), *A_CACHE)
        assert verdict.status == Status.PASS and verdict.scaling.guarantee == Guarantee.RECORD
        assert verdict.scaling.complete and scaling_summary(_case(verdict)).endswith("(at most 35%)")


def test_an_incomplete_meter_in_grading_mode_gives_no_pass_and_says_what_would_prove_it():
    verdict = _timed(_run(complete=False, untrusted=True), *A_CACHE)
    assert verdict.status == Status.UNPROVEN and verdict.scaling.guarantee == Guarantee.UNPROVABLE
    assert "a count by the process tree (/proc) cannot prove a cache (it misses a process that ends" in verdict.message
    assert "run the grader as root" in verdict.message and "delegated cgroup v2 subtree" in verdict.message
    assert "systemd-run --user --scope -p Delegate=yes" in verdict.message
    assert verdict.scaling.fraction == pytest.approx(0.096)  # the figures are still shown


def test_an_incomplete_meter_in_grading_mode_still_fails_a_cost_too_high():
    """It can only miss CPU: a cost found over (b) is over it."""
    verdict = _timed(_run(complete=False, untrusted=True), *A_RECOMPUTE)
    assert verdict.status == Status.FAIL and verdict.diagnosis.shape == "no-cache"
    assert verdict.scaling.guarantee == Guarantee.UNPROVABLE


def test_an_incomplete_meter_on_the_students_own_run_passes_as_a_self_check():
    verdict = _timed(_run(complete=False, untrusted=False), *A_CACHE)
    assert verdict.status == Status.PASS and verdict.scaling.guarantee == Guarantee.SELF_CHECK
    said = scaling_summary(_case(verdict))
    assert "a self-check, not a grade of record: the process tree (/proc) does not count a process" in said
    assert "grades of record come from CI on Linux, where a cgroup counts every process" in said


def test_a_call_counted_below_the_floor_is_tampering():
    run = _run()
    assert oraclecost.cost_floor(STEP) == pytest.approx(0.001)
    assert run.tampered(480 * 0.0011, 480, "timed call 2") is None  # just above the floor: any cache's cost
    verdict = run.tampered(480 * 0.0008, 480, "timed call 2")  # 0.8 ms a token: 96 ms under the floor
    assert verdict.status == Status.FAIL and verdict.diagnosis.shape == "cost-tampered"
    assert "timed call 2 was counted 0.384 s of CPU for 480 tokens (0.8 ms a token)" in verdict.message
    assert "no cache costs less than 1 ms a token here (1/5 of the oracle's one-token step, 5 ms" in verdict.message


def test_a_short_call_under_the_floor_by_less_than_a_meters_rounding_says_nothing():
    """8 tokens at the floor are 8 ms: under two clock ticks, which a coarse meter may round away."""
    assert _run().tampered(0.0, 8, "timed call 1") is None


@pytest.mark.parametrize("cpu", [-0.2, -1.0])
def test_a_negative_cost_is_tampering(cpu):
    verdict = _run(complete=False).tampered(cpu, 8, "timed call 1")
    assert verdict.diagnosis.shape == "cost-tampered"
    assert f"fell by {-cpu:.3g} s in all by the end of timed call 1" in verdict.message


def test_a_count_that_fell_during_a_call_is_tampering_even_if_the_call_ends_positive():
    """Seen at the session's polls: a child counted while it ran, then gone with its CPU when it ended unseen."""
    run = _run(complete=False)
    run.meter = costcase.WatchedMeter(Meter([1.0, 1.4, 3.2, 1.5, 1.9], complete=False))
    readings = [run.meter.cpu_seconds() for _ in range(5)]
    assert readings[-1] - readings[0] > 0 and run.meter.fell == pytest.approx(1.7)
    assert run.meter.name == "process tree (/proc)" and not run.meter.complete
    verdict = run.tampered(0.9, 480, "timed call 2")
    assert verdict.diagnosis.shape == "cost-tampered" and "fell by 1.7 s" in verdict.message


def test_a_finished_call_is_checked_against_the_floor_as_it_arrives(monkeypatch):
    """Through the call loop: the verdict comes from the call that was counted too little, not later."""
    run = _run()
    monkeypatch.setattr(run, "wrong_tokens", lambda *args: None)
    counted = iter([0.05, 0.1])  # 8 tokens at 6 ms, then 480 tokens in 0.1 s: under the 0.48 s floor
    session = SimpleNamespace(
        call=lambda *args: CallOutcome(status="ok", value=np.zeros(1), cpu_seconds=next(counted), seconds=0.1)
    )
    verdict = scaling._timed_rounds(session, run, random.Random(0), lambda n: 8 * n, 0)
    assert verdict.diagnosis.shape == "cost-tampered" and "for 480 tokens" in verdict.message
    assert [c.n_new for c in run.calls] == [8, 480]  # the judged call is in the figures


def test_small_falls_add_up_work_hidden_in_many_short_processes():
    """Each process seen running for 40 ms, then gone with its CPU: under the resolution one by one, not in all."""
    run = _run(complete=False)
    run.meter = costcase.WatchedMeter(Meter([0.0, 0.04, 0.0, 0.04, 0.0, 0.04, 0.0], complete=False))
    for _ in range(7):
        run.meter.cpu_seconds()
    assert run.meter.fell == pytest.approx(0.12)
    assert run.tampered(1.0, 480, "timed call 2").diagnosis.shape == "cost-tampered"


def test_a_stopped_call_whose_count_fell_is_tampering_not_a_cost():
    run = _run(complete=False)
    run.calls.append(TimedCall(8, 0.05, 0.05, prompt_tokens=4))
    run.meter = costcase.WatchedMeter(Meter([0.0, 2.0, 0.5], complete=False))
    for _ in range(3):
        run.meter.cpu_seconds()
    outcome = CallOutcome(status="timeout", cpu_seconds=11.0, limit="cpu")
    stopped = costcase.judge_stopped(run, outcome, 480)
    assert stopped.diagnosis.shape == "no-cache"  # what the stop alone would say
    assert run.tampered(11.0, 0, "timed call 2").diagnosis.shape == "cost-tampered"


def _case(verdict: costverdict.Verdict) -> CaseResult:
    return CaseResult(name="generation", status=verdict.status, message=verdict.message, scaling=verdict.scaling)


def _run_result(verdict: costverdict.Verdict) -> RunResult:
    points = 10.0 if verdict.status == Status.PASS else 0.0
    stage = StageResult(
        id="cache-scaling", title=STAGE.title, status=verdict.status, cases=[_case(verdict)], points=points,
        max_points=10.0, adapter="run_greedy", adapters_file="tests/adapters.py", lesson="", check=STAGE.check,
    )  # fmt: skip
    return RunResult(
        course="c", weights_path="w", weights_source="--weights", weights_why="", synthetic=None, config={},
        stages=[stage], untrusted=True,
    )  # fmt: skip


def test_every_format_carries_the_guarantee_structured_and_in_words():
    unproven = _run_result(_timed(_run(complete=False, untrusted=True), *A_CACHE))
    doc = json.loads(render_json(unproven, "0"))
    case = doc["stages"][0]["cases"][0]
    assert case["status"] == "unproven" and doc["stages"][0]["points"] == 0
    t = case["scaling"]
    assert t["guarantee"] == "unprovable" and t["accounting_complete"] is False
    assert t["accounting"] == "process tree (/proc)" and t["floor_ms_per_token"] == pytest.approx(1.0)

    junit = ET.fromstring(render_junit(unproven, "0"))
    testcase = next(junit.iter("testcase"))
    props = {p.get("name"): p.get("value") for p in testcase.iter("property")}
    assert props["guarantee"] == "unprovable" and props["accounting_complete"] == "false"
    assert testcase.find("error") is not None and testcase.find("failure") is None  # not the code's failure

    gradescope = json.loads(render_gradescope(unproven, "0"))
    assert gradescope["score"] == 0 and gradescope["tests"][0]["status"] == "failed"
    output = gradescope["tests"][0]["output"]
    assert "generation: unproven — no credit" in output and "not provable in grading mode" in output

    record = json.loads(render_json(_run_result(_timed(_run(), *A_CACHE)), "0"))["stages"][0]["cases"][0]
    assert record["scaling"]["guarantee"] == "record" and record["scaling"]["accounting_complete"] is True


def _terminal(run: RunResult) -> str:
    console = Console(record=True, width=200, color_system=None, force_terminal=False)
    render_stage(console, run.stages[0], 50257)
    return " ".join(console.export_text().split())


def test_the_terminal_says_not_provable_here_and_a_self_check_plainly():
    said = _terminal(_run_result(_timed(_run(complete=False, untrusted=True), *A_CACHE)))
    assert (
        "? cache-scaling" in said and "case generation: not provable here — no credit: in grading mode a count" in said
    )
    assert "CPU ms/token" in said and "(b) 480 tokens cost 10% of the oracle's full recompute" in said
    self_check = _terminal(_run_result(_timed(_run(complete=False), *A_CACHE)))
    assert "✔ cache-scaling" in self_check and "a self-check, not a grade of record" in self_check
    record = _terminal(_run_result(_timed(_run(), *A_CACHE)))
    assert "✔ cache-scaling" in record and "self-check" not in record and "provable" not in record


def test_the_class_report_shows_the_guarantee_from_the_json_document():
    from theinference.report import htmlsubmission as html

    for verdict, said in (
        (_timed(_run(complete=False, untrusted=True), *A_CACHE), "not provable in grading mode: the process tree"),
        (_timed(_run(complete=False), *A_CACHE), "a self-check, not a grade of record"),
    ):
        case = json.loads(render_json(_run_result(verdict), "0"))["stages"][0]["cases"][0]
        assert said in html._scaling(case)
    record = json.loads(render_json(_run_result(_timed(_run(), *A_CACHE)), "0"))["stages"][0]["cases"][0]
    assert "guarantee" not in html._scaling(record) and "of the oracle's full recompute here (at most" in html._scaling(
        record
    )
