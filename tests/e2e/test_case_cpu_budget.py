"""A case's CPU budget follows from its work (grading/spec/timeouts.py), and a case the machine starved is retried,
then marked and listed for regrading (proc/runner.py, grading/judge/grade.py, grade's CSV and JSON)."""

import csv
import json
import re

import pytest

from conftest import write_adapters
from theinference.bundled import data_dir
from theinference.grading.oracle.cache import OracleCache
from theinference.grading.oracle.registry import resolve_oracle
from theinference.grading.spec.stages import load_stage
from theinference.grading.spec.timeouts import CPU_FACTOR, CPU_FLOOR, NODE_FACTOR, Timeouts, cpu_budget

LOOP = "def run_forward(seq_ids):\n    while True:\n        pass\n"
HANG = "import time\ndef run_layer_equiv(seq_ids):\n    time.sleep(600)\n"
BUDGET = re.compile(
    r"timed out: used ([\d.]+) s of CPU without answering, on a case the reference computes in ([\d.e-]+) s "
    r"\(a case may use ([\d.]+) s of CPU here\)"
)


def test_the_budget_is_the_floor_plus_many_times_the_references_cpu_and_more_for_typescript():
    numpy, node = cpu_budget(0.02, node=False), cpu_budget(0.02, node=True)
    assert numpy.seconds == pytest.approx(CPU_FLOOR + 0.02 * CPU_FACTOR)
    assert node.seconds == pytest.approx(CPU_FLOOR + 0.02 * CPU_FACTOR * NODE_FACTOR)
    assert node.seconds > numpy.seconds and cpu_budget(2.0, node=False).seconds == pytest.approx(CPU_FLOOR + 100)
    message = cpu_budget(0.02, node=False).message(93.0)
    assert message.startswith(
        "timed out: used 93 s of CPU without answering, on a case the reference computes in 0.02 s"
    )
    assert "not a verdict" not in message


def test_the_instructors_timeout_alone_bounds_a_case_and_a_courses_does_not():
    assert not Timeouts(command_line=3.0).cpu_budgeted
    assert Timeouts(course=7.0).cpu_budgeted and Timeouts().cpu_budgeted


def test_the_cache_times_the_oracle_and_measures_once_what_the_store_kept(tiny_model):
    stage = load_stage(data_dir("stages") / "forward.toml")
    spec, case = resolve_oracle(stage.oracle, stage.source), stage.cases[0]
    cache = OracleCache()
    cache.get(tiny_model, stage, spec, case)
    timed = cache.cost(tiny_model, stage, spec, case)
    assert 0 < timed < 5 and list(cache.costs.values()) == [timed]
    # An output served without computing it here (as from the store): its cost is measured once, then kept.
    kept = OracleCache(entries=dict(cache.entries))
    assert kept.costs == {} and kept.cost(tiny_model, stage, spec, case) > 0 and len(kept.costs) == 1


@pytest.mark.slow
def test_an_infinite_loop_on_tiny_is_the_students_timeout_with_its_cpu_and_the_references(cli, tmp_path, tiny_path):
    # No --timeout: the stage's own 120 s is the outer bound, the case's CPU budget (seconds, on tiny) the inner one.
    course = tmp_path / "course"
    write_adapters(course, LOOP)
    result = cli("test", "--course", course, "--weights", tiny_path, "--stage", "forward", "--format", "json")
    case = json.loads(result.stdout)["stages"][0]["cases"][0]
    assert case["status"] == "timeout" and case["detail"] == ""
    found = BUDGET.fullmatch(case["message"])
    assert found, case["message"]
    used, reference, budget = (float(g) for g in found.groups())
    assert used >= budget and budget == pytest.approx(CPU_FLOOR + CPU_FACTOR * reference, rel=0.05, abs=0.01)
    assert case["clock"]["cpu_seconds"] >= budget and case["clock"]["charged_seconds"] < case["clock"]["timeout"]


@pytest.mark.slow
def test_with_the_instructors_timeout_a_loop_is_timed_by_it_alone(cli, tmp_path, tiny_path):
    course = tmp_path / "course"
    write_adapters(course, LOOP)
    args = ("--weights", tiny_path, "--stage", "forward", "--timeout", CPU_FLOOR + 3, "--format", "json")
    case = json.loads(cli("test", "--course", course, *args).stdout)["stages"][0]["cases"][0]
    assert case["status"] == "timeout" and case["message"].startswith(f"timed out after {CPU_FLOOR + 3:g} s")


@pytest.mark.slow
def test_a_starved_case_is_retried_in_fresh_children_then_marked_and_listed_for_regrading(
    cli, tmp_path, tiny_path, monkeypatch
):
    # The kernel's count as on a starved machine (every moment waited for a CPU): only the wall-clock backstop ends
    # the case, with next to no CPU used. The machine's, not the code's: run again, then recorded as machine-busy.
    from theinference.proc import accounting, clock, runner, worker
    from test_robustness import _starve

    write_adapters(tmp_path / "subs" / "slow", HANG)
    monkeypatch.setattr(clock, "BACKSTOP_SLACK", 1.0)
    _starve(monkeypatch, accounting)
    children, real = [], worker.Worker.__init__

    def counted(self, job, start, *rest, **kw):
        children.append(start)
        real(self, job, start, *rest, **kw)

    monkeypatch.setattr(worker.Worker, "__init__", counted)
    out_json, out_csv = tmp_path / "grades.json", tmp_path / "grades.csv"
    args = (tmp_path / "subs" / "slow", "--weights", tiny_path, "--stage", "prove-one-layer", "--timeout", 0.5)
    assert cli("grade", *args, "--format", "json", "--out", out_json).exit_code == 0
    assert children == [0] * (1 + runner.MACHINE_RETRIES)  # the first case, afresh each time; the rest skipped
    doc = json.loads(out_json.read_text())["submissions"][0]
    first = doc["results"]["stages"][0]["cases"][0]
    assert first["detail"] == "machine-busy" and first["message"].startswith("the machine was too busy"), first
    assert doc["machine_busy"] == [{"stage": "prove-one-layer", "case": first["name"]}]

    assert cli("grade", *args, "--out", out_csv).exit_code == 0
    row = next(csv.DictReader(out_csv.open()))
    assert row["machine_busy"] == f"prove-one-layer: {first['name']}"
