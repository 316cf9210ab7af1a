"""spec/timeouts.py: the seconds each adapter call gets, and a case's CPU budget inside it."""

import pytest

from theinference.grading.spec.timeouts import (
    CPU_FACTOR,
    CPU_FLOOR,
    NODE_FACTOR,
    Timeouts,
    cpu_budget,
    recompute_factor,
)

from .builders import stage_spec

STAGE = stage_spec(timeout=30.0)


def test_the_command_line_wins_then_the_course_then_the_stage():
    assert Timeouts().for_stage(STAGE) == 30.0
    assert Timeouts(course=12.0).for_stage(STAGE) == 12.0
    assert Timeouts(command_line=5.0, course=12.0).for_stage(STAGE) == 5.0


def test_a_cpu_budget_unless_the_instructor_gave_the_timeout():
    assert Timeouts().cpu_budgeted and Timeouts(course=12.0).cpu_budgeted
    assert not Timeouts(command_line=5.0).cpu_budgeted


def test_the_report_says_the_course_chose_only_when_it_did():
    assert Timeouts(course=12.0).chosen_by_course
    assert not Timeouts().chosen_by_course
    assert not Timeouts(command_line=5.0, course=12.0).chosen_by_course  # overridden: the course chose nothing


def test_cpu_budget_follows_the_reference_cost():
    assert cpu_budget(0.0, node=False).seconds == CPU_FLOOR
    assert cpu_budget(0.2, node=False).seconds == CPU_FLOOR + 0.2 * CPU_FACTOR
    assert cpu_budget(0.2, node=True).seconds == CPU_FLOOR + 0.2 * CPU_FACTOR * NODE_FACTOR


def test_the_timeout_message_gives_what_was_used_and_allowed():
    budget = cpu_budget(0.1, node=False)
    assert budget.message(10.04) == (
        "timed out: used 10 s of CPU without answering, on a case the reference computes in 0.1 s "
        "(a case may use 10 s of CPU here)"
    )


def test_a_generation_is_budgeted_for_a_recompute_of_every_step():
    # Step k of a submission without a cache runs the model over all P + k tokens: N*P + N*(N-1)/2 for N steps,
    # against the P + N the oracle consumes. Such a submission must pass every stage but the cost one.
    prompt, cont = list(range(11)), list(range(47))
    assert recompute_factor({"prompt": prompt, "cont": cont}) == (47 * 11 + 47 * 46 / 2) / 58
    assert recompute_factor({"prompt": prompt, "n_new": 47}) == recompute_factor({"prompt": prompt, "cont": cont})
    assert recompute_factor({"seq": prompt}) == 1.0 and recompute_factor({"prompt": prompt, "next_id": 5}) == 1.0
    budget = cpu_budget(0.024, node=False, inputs={"prompt": prompt, "cont": cont})
    assert budget.seconds == pytest.approx(CPU_FLOOR + 0.024 * CPU_FACTOR * (47 * 11 + 47 * 46 / 2) / 58)
    assert cpu_budget(0.024, node=False, inputs={"seq": prompt}).seconds == cpu_budget(0.024, node=False).seconds
