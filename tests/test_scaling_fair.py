"""cache-scaling's floor in the student's precision, its early stop and the run's deadline.

The rules from the calls' CPU alone (no student process), as tests/test_scaling_verdicts.py does; one test grades a
real submission against a deadline.
"""

import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import scaled, write_quick_scaling_stage
from theinference.bundled import data_dir
from theinference.course import load_course
from theinference.grading.judge import costcase, costverdict, oraclecost
from theinference.grading.judge.grade import GradeContext, grade
from theinference.grading.judge.results import ScalingResult, Status, TimedCall
from theinference.grading.oracle.cache import OracleCache
from theinference.grading.spec.stages import load_stages
from theinference.model.weights import load_model
from theinference.proc.calls import DEADLINE, Budget, _poll
from theinference.proc.launch import SubprocessLauncher
from theinference.proc.runner import CallOutcome

STAGE = next(s for s in load_stages([data_dir("stages")]) if s.id == "cache-scaling")  # lengths 8 and 480
COSTS = {
    "float32": oraclecost.Costs({8: 1.0, 480: 50.0}, 0.01),
    "float64": oraclecost.Costs({8: 2.5, 480: 125.0}, 0.05, "float64"),  # a float64 step converts every weight
}


def _run(dtype: str = "float32") -> costcase.CostCase:
    ctx = SimpleNamespace(
        course=SimpleNamespace(adapters=Path("tests") / "adapters.py"),
        model=SimpleNamespace(config=SimpleNamespace(n_ctx=512, n_vocab=50257), path="proof", stamp=()),
        cache=SimpleNamespace(memo=lambda key, measure: COSTS[key[-1]]),  # the key ends with the precision
        on_case=None,
        untrusted=False,
    )
    return costcase.CostCase(STAGE, ctx, timeout=120.0, weights_note="", dtype=dtype)


def _diagnostics(run: costcase.CostCase, per_token: float, prefill: float = 0.5) -> None:
    prompt = run.diagnostic_prompt()
    run.calls.append(TimedCall(1, prefill, prefill, prompt_tokens=prompt, diagnostic=True))
    n_new = run.diagnostic_length(prefill)
    cpu = prefill + (n_new - 1) * per_token
    run.calls.append(TimedCall(n_new, cpu, cpu, prompt_tokens=prompt, diagnostic=True))


def test_the_float64_run_is_set_against_the_float64_recompute_and_says_so():
    run = _run("float64")
    assert run.timed_budget(480).cpu == pytest.approx(STAGE.check.params.max_fraction * 125.0)
    assert "your decode step returns float64 logits" in run.weights_note
    run.calls.append(TimedCall(8, 0.5, 0.5, prompt_tokens=4))
    outcome = CallOutcome(status="timeout", cpu_seconds=run.timed_budget(480).cpu, limit="cpu")
    verdict = costcase.judge_stopped(run, outcome, 480)
    assert "by the oracle here in float64 (125 s)" in verdict.message, verdict.message


@pytest.mark.parametrize(("per_token", "refused"), [(0.06, False), (0.15, True)])
def test_a_float64_claim_counts_only_where_a_token_costs_what_a_float64_cache_costs(per_token, refused):
    """The claim is the student's: in the float64 run the diagnostic calls always run, and a token after their long
    prompt must cost about the oracle's float64 step (50 ms here), not a recompute's forward over the prompt."""
    run = _run("float64")
    run.calls.append(TimedCall(8, 8 * per_token, 8 * per_token, prompt_tokens=4))  # padded short calls: flat
    assert run.needs_diagnostic()  # whatever the short calls cost
    _diagnostics(run, per_token)
    verdict = run.refused()
    assert (verdict is not None) == refused
    if verdict is not None:
        assert verdict.detail == costcase.REFUSED
        assert "3.0× the oracle's float64 single-token step" in verdict.message, verdict.message
        assert "so (b) stays set against the float32 recompute" in verdict.message
    assert _run().refused() is None  # the float32 run has no claim to weigh


@pytest.mark.parametrize(("now", "grown"), [(50.0, None), (60.0, None), (90.0, 1.8), (400.0, 2.0)])
def test_a_busier_machine_measures_the_oracle_again_and_the_case_runs_against_that_at_most_twice(
    now, grown, monkeypatch
):
    """The oracle's costs were measured once, before the submission ran; a flat cost stopped over (b) while the
    machine got busier (CPU seconds stretch under contention) is set against the costs measured again, grown by at
    most 2x: a careful recompute (about 100% of the oracle's) still fails (b)'s 35% by far."""
    monkeypatch.setattr(oraclecost, "recompute_seconds", lambda model, prompt, n_new, dtype: now)
    drift = oraclecost.drifted_costs(STAGE, SimpleNamespace(), COSTS["float32"])
    if grown is None:
        assert drift is None
        return
    assert drift is not None
    costs, factor = drift
    assert factor == pytest.approx(grown)
    assert costs.recompute == pytest.approx({8: grown, 480: 50.0 * grown}) and costs.step == pytest.approx(0.01 * grown)
    run = costcase.CostCase(STAGE, _run().ctx, timeout=120.0, weights_note="", costs=costs)
    assert run.timed_budget(480).cpu == pytest.approx(STAGE.check.params.max_fraction * 50.0 * grown)
    # A careful recompute costs the oracle's recompute (50 s) even on a quiet machine: stopped at the grown budget.
    assert run.timed_budget(480).cpu <= 0.7 * 50.0


def test_the_oracle_computes_in_float64_as_a_promoted_student_does(tiny_path):
    model = load_model(tiny_path)
    ids = [464, 318, 257, 1332]
    narrow, wide = (oraclecost._last_logits(model, ids, dtype) for dtype in ("float32", "float64"))
    assert narrow.dtype == np.float32 and wide.dtype == np.float64 and wide.shape == narrow.shape == (1, 50257)
    assert int(np.argmax(wide)) == int(np.argmax(narrow))
    np.testing.assert_allclose(wide, narrow, rtol=1e-3, atol=1e-3)


def _figures(short: float, long: float, recompute: float = 50.0) -> ScalingResult:
    return ScalingResult(lengths=(8, 480), seconds=(short, long), max_ratio=3.0, max_fraction=0.35, accounting="cgroup",
                         oracle_seconds=recompute)  # fmt: skip


def test_rounds_stop_once_the_verdict_is_clear_beyond_the_margin():
    assert costverdict.clear(_figures(0.08, 4.8))  # flat, 10% of a recompute: a pass no round can undo
    assert not costverdict.clear(_figures(0.08, 14.0))  # 28%: inside (b), not clearly, so the next round runs
    assert not costverdict.clear(_figures(0.08, 4.8 * 2.5))  # 2.5x: inside (a), not clearly
    assert costverdict.clear(_figures(0.08, 4.8 * 5))  # 5x: over (a) by more than the margin
    assert not costverdict.clear(_figures(0.08, None))  # type: ignore[arg-type]


def test_a_call_stopped_at_the_runs_deadline_is_a_timeout_that_says_so_and_no_timing():
    run = _run()
    run.calls.append(TimedCall(8, 0.08, 0.1, prompt_tokens=4))
    message = "stopped while running: the submission's time budget of 30 s ran out"
    outcome = CallOutcome(status="timeout", message=message, cpu_seconds=2.0, limit=DEADLINE)
    verdict = costcase.judge_stopped(run, outcome, 480)
    assert verdict.status == Status.TIMEOUT and verdict.detail == DEADLINE and verdict.diagnosis is None
    assert verdict.message.startswith(message) and "1 timed call had finished" in verdict.message
    assert [c.n_new for c in verdict.scaling.calls] == [8]  # the cut call is no length's cost


def test_a_call_far_from_its_budget_is_read_less_often():
    assert _poll(Budget(cpu=60.0, timeout=120.0), used=1.0) == 0.5
    assert _poll(Budget(cpu=60.0, timeout=120.0), used=59.99) == 0.05


@pytest.mark.slow
def test_the_stage_stops_at_the_runs_deadline_with_a_timeout_that_says_so(tmp_path, tiny_path, monkeypatch):
    """A run whose deadline comes while a timed call waits: the case ends there, a timeout naming the budget."""
    course = tmp_path / "course"
    (course / "tests").mkdir(parents=True)
    (course / "src").symlink_to(data_dir("course") / "solution" / "src")
    (course / "tests" / "adapters.py").write_text(
        textwrap.dedent(
            """
            import os, time
            from pathlib import Path
            import theinference
            from src.gpt2 import load_weights
            from src.kvcache import generate_cached

            def run_greedy(prompt_ids, n_new):
                if Path(os.environ["WARMED"]).exists():
                    time.sleep(3600)  # every timed call: waits past the run's deadline
                Path(os.environ["WARMED"]).touch()
                params, n_head = load_weights(theinference.weights_path())
                return generate_cached(params, prompt_ids, n_new, n_head)
            """
        )
    )
    monkeypatch.setenv("WARMED", str(tmp_path / "warmed"))
    stages = write_quick_scaling_stage(tmp_path / "stages", 40)
    toml = stages / "quick-scaling.toml"  # a call's own timeout far past the deadline, however slow the machine
    toml.write_text(toml.read_text().replace("\ntimeout = 120\n", "\ntimeout = 3600\n"))
    stage = next(s for s in load_stages([stages]) if s.id == "quick-scaling")
    assert stage.timeout == 3600
    budget = scaled(20.0)
    ctx = GradeContext(
        course=load_course(course),
        model=load_model(tiny_path),
        cache=OracleCache(),
        launcher=SubprocessLauncher(),
        deadline=time.monotonic() + budget,
        budget=budget,
    )
    case = grade(stage, ctx).cases[0]
    assert (tmp_path / "warmed").exists(), case.message  # the warm-up ran; the deadline came in a timed call
    assert case.status == Status.TIMEOUT and case.detail == DEADLINE, case.message
    assert f"the submission's time budget of {budget:g} s ran out" in case.message
    assert "the call generating 8 tokens" in case.message and "0 timed calls had finished" in case.message
