"""cache-scaling through the real CLI on tiny weights: a cache passes, a recompute fails as "no
cache" (by its growing cost, or by outlasting the timeout), wrong tokens fail on tokens, and the
verdicts hold while another process burns CPU."""

import json
import multiprocessing
import shutil
import xml.etree.ElementTree as ET

import pytest

from conftest import write_adapters, write_quick_scaling_stage
from theinference.bundled import data_dir

MODEL = """\
import functools
import numpy as np
import theinference
from src.gpt2 import forward, load_weights
from src.kvcache import generate_cached

@functools.cache
def _model():
    return load_weights(theinference.weights_path())
"""

RECOMPUTE = (
    MODEL
    + """
def run_greedy(prompt_ids, n_new):
    # No cache: every step runs the model over the whole sequence so far.
    params, n_head = _model()
    ids = list(prompt_ids)
    for _ in range(n_new):
        ids.append(int(np.argmax(forward(params, ids, n_head)[-1])))
    return ids[len(prompt_ids):]
"""
)

WRONG_TOKEN = (
    MODEL
    + """
def run_greedy(prompt_ids, n_new):
    # Fast (cached) but one token wrong.
    params, n_head = _model()
    out = generate_cached(params, prompt_ids, n_new, n_head)
    out[n_new // 2] = (out[n_new // 2] + 1) % 50257
    return out
"""
)


@pytest.fixture
def quick_stages(tmp_path):
    return write_quick_scaling_stage(tmp_path / "quick-stages")


def grade_quick(cli, course, tiny_path, quick_stages, *extra):
    return cli(
        "test",
        "--course",
        course,
        "--weights",
        tiny_path,
        "--stages-dir",
        quick_stages,
        "--stage",
        "quick-scaling",
        *extra,
    )


def _burn(seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(10_000))


@pytest.mark.slow
def test_the_solution_passes_and_shows_the_table_and_its_speedup(cli, solution_course, tiny_path):
    result = cli("test", "--course", solution_course, "--weights", tiny_path, "--stage", "cache-scaling")
    assert result.exit_code == 0, result.stdout
    assert "✔ cache-scaling" in result.stdout
    assert "CPU ms/token" in result.stdout and "marginal ms/token" in result.stdout
    assert "one BLAS thread" in result.stdout
    assert "your cache: 224 tokens in" in result.stdout and "faster" in result.stdout


@pytest.mark.slow
def test_a_recompute_fails_as_no_cache_with_its_growth_in_numbers(cli, tmp_path, tiny_path, quick_stages):
    course = tmp_path / "recompute"
    write_adapters(course, RECOMPUTE)
    result = grade_quick(cli, course, tiny_path, quick_stages)
    assert result.exit_code == 1
    assert "per-token cost grows" in result.stdout and "from 4 to 96 tokens" in result.stdout
    assert "shape: no-cache" in result.stdout
    assert "With a cache, token k costs about the same as token 1." in " ".join(result.stdout.split())


@pytest.mark.slow
def test_a_recompute_past_the_timeout_fails_as_no_cache_not_as_a_bare_timeout(cli, tmp_path, tiny_path):
    course = tmp_path / "recompute"
    write_adapters(course, RECOMPUTE)
    result = cli("test", "--course", course, "--weights", tiny_path, "--stage", "cache-scaling", "--timeout", "2")
    assert result.exit_code == 1
    assert "✘ cache-scaling" in result.stdout and "failed" in result.stdout
    text = " ".join(result.stdout.split())  # rich wraps long lines
    assert "timed out after 2 s" in text and "takes seconds with a cache" in text
    assert "shape: no-cache" in result.stdout


def test_the_starter_is_not_started(cli, tmp_path, tiny_path):
    starter = tmp_path / "starter"
    shutil.copytree(data_dir("course") / "starter", starter)
    result = cli("test", "--course", starter, "--weights", tiny_path, "--stage", "cache-scaling")
    assert result.exit_code == 1
    assert "not started: run_greedy()" in result.stdout


@pytest.mark.slow
def test_fast_wrong_tokens_fail_on_tokens_not_on_timing(cli, tmp_path, tiny_path, quick_stages):
    course = tmp_path / "wrong"
    write_adapters(course, WRONG_TOKEN)
    result = grade_quick(cli, course, tiny_path, quick_stages)
    assert result.exit_code == 1
    assert "token 48 of 96 differs" in result.stdout and "shape: token-mismatch" in result.stdout
    assert "CPU ms/token" not in result.stdout and "no-cache" not in result.stdout


@pytest.mark.slow
def test_the_verdicts_hold_while_another_process_burns_cpu(cli, solution_course, tmp_path, tiny_path, quick_stages):
    recompute = tmp_path / "recompute"
    write_adapters(recompute, RECOMPUTE)
    burner = multiprocessing.get_context("spawn").Process(target=_burn, args=(120.0,), daemon=True)
    burner.start()
    try:
        passing = grade_quick(cli, solution_course, tiny_path, quick_stages)
        failing = grade_quick(cli, recompute, tiny_path, quick_stages)
    finally:
        burner.kill()
        burner.join()
    assert passing.exit_code == 0, passing.stdout
    assert failing.exit_code == 1 and "shape: no-cache" in failing.stdout


@pytest.mark.slow
def test_json_junit_and_gradescope_carry_the_numbers(cli, solution_course, tiny_path, quick_stages):
    doc = json.loads(grade_quick(cli, solution_course, tiny_path, quick_stages, "--format", "json").stdout)
    scaling = doc["stages"][0]["cases"][0]["scaling"]
    assert doc["stages"][0]["compare"] == "scaling"
    assert scaling["lengths"] == [4, 96] and scaling["max_ratio"] == 1.5 and scaling["blas_threads"] == 1
    assert len(scaling["ms_per_token"]) == 2 and scaling["marginal_ms_per_token"][0] is None
    assert scaling["ratio"] == pytest.approx(scaling["ms_per_token"][1] / scaling["ms_per_token"][0])
    assert scaling["speedup"] > 0

    junit = ET.fromstring(grade_quick(cli, solution_course, tiny_path, quick_stages, "--format", "junit").stdout)
    props = {p.get("name"): p.get("value") for p in junit.iter("testcase").__next__().iter("property")}
    assert props["cpu_ms_per_token"].startswith("4:") and " 96:" in props["cpu_ms_per_token"]
    assert float(props["ratio"]) <= 1.5 and props["blas_threads"] == "1"

    gradescope = json.loads(grade_quick(cli, solution_course, tiny_path, quick_stages, "--format", "gradescope").stdout)
    assert gradescope["tests"][0]["status"] == "passed"
    assert "4 tokens" in gradescope["tests"][0]["output"] and "96 tokens" in gradescope["tests"][0]["output"]


def test_lengths_beyond_the_context_are_scaled_down_to_fit(cli, solution_course, tiny_path, tmp_path):
    stages = write_quick_scaling_stage(tmp_path / "long-stages")
    stage = stages / "quick-scaling.toml"
    stage.write_text(stage.read_text().replace("lengths = [4, 96]", "lengths = [20, 1000]"))  # tiny: n_ctx 256
    result = grade_quick(cli, solution_course, tiny_path, stages, "--format", "json")
    assert result.exit_code == 0, result.stdout
    case = json.loads(result.stdout)["stages"][0]["cases"][0]
    assert case["scaling"]["lengths"] == [5, 256] and case["inputs"]["n_new"] == 256
