"""The persistent oracle cache: a repeated `test` computes no oracle output; the store is never trusted blindly."""

import json
import os

import numpy as np
import pytest

from theinference.model import gpt2 as oracle
from theinference.cli.common import OracleProgress
from theinference.grading.oracle.store import OracleStore
from theinference.bundled import data_dir
from theinference.model.weights_choice import user_cache_dir
from theinference.grading.spec.stages import load_stages
from theinference.model.synth import write_synthetic
from theinference.grading.spec.checks import ScalingCheck


@pytest.fixture
def forwards(monkeypatch):
    """Counts every GPT-2 forward the grader's oracle runs (all oracle outputs go through these two)."""
    calls = {"n": 0}
    for name in ("hidden_states", "layer0_attn_sublayer"):
        real = getattr(oracle, name)

        def counted(*args, _real=real, **kwargs):
            calls["n"] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(oracle, name, counted)
    return calls


def _verdicts(cli, course, weights, *extra) -> tuple[int, list]:
    result = cli("test", *extra, "--course", course, "--weights", weights, "--format", "json")
    doc = json.loads(result.stdout)
    return result.exit_code, [(s["id"], s["status"], [c["status"] for c in s["cases"]]) for s in doc["stages"]]


def _entries() -> list:
    return sorted((user_cache_dir() / "oracle" / "outputs").glob("*.npy"))


@pytest.mark.slow
def test_a_second_run_computes_no_oracle_output(cli, solution_course, tiny_path, forwards):
    # Every stage whose outputs the store keeps: cache-scaling checks fresh random prompts and measures the
    # oracle's cost on this machine in every run, by design (tests/e2e/test_scaling.py).
    stages = [
        arg
        for s in load_stages([data_dir("stages")])
        if not isinstance(s.check, ScalingCheck)
        for arg in ("--stage", s.id)
    ]
    first = _verdicts(cli, solution_course, tiny_path, *stages)
    computed = forwards["n"]
    second = _verdicts(cli, solution_course, tiny_path, *stages)
    assert computed > 0 and forwards["n"] == computed  # the second run ran no forward at all
    assert first == second and first[0] == 0


def test_a_corrupt_or_truncated_entry_is_computed_again(cli, solution_course, tiny_path, forwards):
    first = _verdicts(cli, solution_course, tiny_path, "--stage", "prove-one-layer")
    entries = _entries()
    assert len(entries) >= 2
    entries[0].write_bytes(entries[0].read_bytes()[:-7])  # truncated
    data = bytearray(entries[1].read_bytes())
    data[-1] ^= 0xFF  # one flipped bit of the array
    entries[1].write_bytes(bytes(data))
    before = forwards["n"]
    assert _verdicts(cli, solution_course, tiny_path, "--stage", "prove-one-layer") == first
    assert forwards["n"] - before == 2  # exactly the two damaged outputs, rewritten
    before = forwards["n"]
    assert _verdicts(cli, solution_course, tiny_path, "--stage", "prove-one-layer") == first
    assert forwards["n"] == before


def test_new_weights_content_invalidates_and_a_touch_does_not(cli, solution_course, tmp_path, forwards):
    weights = write_synthetic(tmp_path / "w", preset="tiny", seed=0)
    _verdicts(cli, solution_course, weights, "--stage", "prove-one-layer")
    os.utime(weights, ns=(1, 1))  # a new mtime, the same bytes: the hash is taken again, the outputs still hold
    before = forwards["n"]
    _verdicts(cli, solution_course, weights, "--stage", "prove-one-layer")
    assert forwards["n"] == before
    write_synthetic(tmp_path / "w", preset="tiny", seed=1)  # other weights at the same path
    _verdicts(cli, solution_course, weights, "--stage", "prove-one-layer")
    assert forwards["n"] > before


@pytest.mark.parametrize("how", [["--untrusted"], ["--format", "gradescope"], "CI=true", "grade"])
def test_untrusted_grading_never_reads_the_store(cli, solution_course, tiny_path, forwards, monkeypatch, how, tmp_path):
    assert _verdicts(cli, solution_course, tiny_path, "--stage", "prove-one-layer")[0] == 0
    store = OracleStore(user_cache_dir() / "oracle")
    for entry in _entries():  # poisoned as student code running as the same user could: well-formed, wrong
        store.write_entry(entry, np.zeros_like(store.read_entry(entry)))
    assert _verdicts(cli, solution_course, tiny_path, "--stage", "prove-one-layer")[0] == 1  # trusted: its own business
    before = forwards["n"]
    if how == "CI=true":
        monkeypatch.setenv("CI", "true")
        result = cli("test", "--stage", "prove-one-layer", "--course", solution_course, "--weights", tiny_path)
    elif how == "grade":  # a batch of submissions
        out = tmp_path / "grades.csv"
        result = cli("grade", solution_course, "--stage", "prove-one-layer", "--weights", tiny_path, "--out", out)
        assert out.read_text().splitlines()[1].split(",")[1] == "pass"
    else:
        result = cli("test", *how, "--stage", "prove-one-layer", "--course", solution_course, "--weights", tiny_path)
    assert result.exit_code == 0, result.stdout
    assert forwards["n"] > before


def test_eviction_keeps_the_store_under_its_cap_and_drops_the_least_recently_used(tiny_model, tmp_path):
    cap = 1 << 20
    store = OracleStore(tmp_path / "store", max_bytes=cap)
    value = np.ones(40_000, np.float32)  # 160 KB: the cap holds six
    paths = []
    for i in range(20):
        store.output(tiny_model, ("test", i), lambda: value * i)
        paths.append(sorted(store.outputs.glob("*.npy"), key=os.path.getmtime)[-1])
        if i == 1:
            first_two = list(paths)
        if i >= 2:
            store.output(tiny_model, ("test", 0), lambda: pytest.fail("entry 0 was evicted"))  # kept in use
        assert sum(p.stat().st_size for p in store.outputs.iterdir()) <= cap
    assert first_two[0].exists() and not first_two[1].exists()


def test_a_store_that_cannot_be_written_costs_only_a_recompute(cli, solution_course, tiny_path, forwards):
    root = user_cache_dir() / "oracle"
    root.parent.mkdir(parents=True, exist_ok=True)
    root.write_text("not a directory")
    for _ in range(2):
        assert _verdicts(cli, solution_course, tiny_path, "--stage", "prove-one-layer")[0] == 0
    assert forwards["n"] > 0


def test_computing_oracle_outputs_prints_a_line_each_off_a_terminal(cli, solution_course, tiny_path, monkeypatch):
    monkeypatch.setattr(OracleProgress, "DELAY", 0.0)  # on tiny weights nothing is slow: every output counts
    [stage] = [s for s in load_stages([data_dir("stages")]) if s.id == "prove-one-layer"]
    first = cli("test", "--stage", stage.id, "--course", solution_course, "--weights", tiny_path, "--format", "json")
    for case in stage.cases:
        assert f"oracle: computed {stage.id}: {case.name} in " in first.stderr
    assert json.loads(first.stdout)["status"] == "pass"  # stdout is the document alone
    again = cli("test", "--stage", stage.id, "--course", solution_course, "--weights", tiny_path, "--format", "json")
    assert "oracle:" not in again.stderr and json.loads(again.stdout)["status"] == "pass"
