"""Every CI format carries the diagnosis of every failing stage: shape, finding, hint, as the terminal does.

One mutant (the attention scale left out) fails a stage of every kind: single-step-attention and
decode-step (one row per case: diagnosed across cases), prove-one-layer (rows diagnosed per case)
and greedy (tokens).
"""

import json
import re
import xml.etree.ElementTree as ET

import pytest

from conftest import write_adapters, write_quick_scaling_stage
from test_scaling import RECOMPUTE
from theinference.bundled import data_dir
from theinference.grading.tools.mutants import build_mutant, load_mutant

MUTANT = "missing-attn-scale"
KINDS = {  # stage -> how it is diagnosed
    "single-step-attention": "across cases",
    "decode-step": "across cases",
    "prove-one-layer": "per case",
    "greedy": "tokens",
}


def _github_data(text: str) -> str:
    return text.replace("%0A", "\n").replace("%0D", "\r").replace("%25", "%")


def stage_texts(fmt: str, stdout: str, out, summary, stages=tuple(KINDS)) -> dict[str, str]:
    """What a reader of that format sees about each stage, by stage id."""
    if fmt == "junit":
        root = ET.fromstring(stdout)
        return {
            suite.get("name"): "\n".join(f.text or "" for f in suite.iter() if f.tag in ("failure", "error"))
            + "\n".join(f.get("message", "") for f in suite.iter() if f.tag in ("failure", "error"))
            for suite in root.iter("testsuite")
        }
    if fmt == "gradescope":
        return {t["name"].split(":")[0]: t["output"] for t in json.loads(out.read_text())["tests"]}
    texts = {}
    for line in stdout.splitlines():
        found = re.match(r"::error [^:]*title=theinference ([a-z-]+)%3A \w+::(.*)", line)
        if found:
            texts[found[1]] = _github_data(found[2])
    sections = re.split(r"\n### `", summary.read_text())
    for stage in stages:
        texts[stage] += "\n" + "\n".join(s for s in sections if s.startswith(f"{stage}`"))
    return texts


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["junit", "github", "gradescope"])
def test_every_failing_stage_carries_shape_finding_and_hint(cli, tmp_path, tiny_path, monkeypatch, fmt):
    mutant = load_mutant(data_dir("course") / "mutants" / MUTANT / "manifest.toml")
    course = build_mutant(mutant, data_dir("course") / "solution", tmp_path / MUTANT)
    out, summary = tmp_path / "results.json", tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    extra = ["--output", out] if fmt == "gradescope" else []
    stages = [arg for s in KINDS for arg in ("--stage", s)]
    result = cli("test", "--course", course, "--weights", tiny_path, *stages, "--format", fmt, *extra)
    assert result.exit_code == 1, result.output
    texts = stage_texts(fmt, result.stdout, out, summary)
    for stage, kind in KINDS.items():
        text = texts[stage]
        assert "shape: " in text and "hint: " in text, (fmt, stage, kind, text)
        for bug in mutant.fingerprint.get(stage, ()):
            assert f"finding: {bug}: your output equals GPT-2" in text, (fmt, stage, kind, text)
        if kind == "across cases":
            assert "read across" in text and "1 of 1 rows outside" in text, (fmt, stage, text)
        if kind == "tokens":
            assert "shape: token-mismatch" in text, (fmt, stage, text)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["junit", "github", "gradescope"])
def test_a_failing_cache_scaling_stage_carries_its_shape_figures_and_hint(
    cli, tmp_path, tiny_path, proof_cache, monkeypatch, fmt
):
    """cache-scaling, the fourth kind: a recompute fails as no-cache, with both tests' figures, how the CPU
    was counted and the stopped call marked as a lower bound, in every CI format."""
    monkeypatch.setenv("THEINFERENCE_CACHE", str(proof_cache))
    stages_dir = write_quick_scaling_stage(tmp_path / "quick-stages")
    course = tmp_path / "recompute"
    write_adapters(course, RECOMPUTE)
    out, summary = tmp_path / "results.json", tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    extra = ["--output", out] if fmt == "gradescope" else []
    result = cli(
        "test", "--course", course, "--weights", tiny_path, "--stages-dir", stages_dir, "--stage", "quick-scaling",
        "--format", fmt, *extra,
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    text = stage_texts(fmt, result.stdout, out, summary, stages=("quick-scaling",))["quick-scaling"]
    assert "shape: no-cache" in text and "hint: " in text, (fmt, text)
    assert "counted by the grader (" in text and "(a) ratio" in text and "of the oracle's full recompute" in text
    assert "320 tokens > " in text and "(stopped)" in text, (fmt, text)
    if fmt == "junit":
        props = {p.get("name"): p.get("value") for p in ET.fromstring(result.stdout).iter("property")}
        assert props["stopped_at"] == "320" and props["accounting"].startswith(("cgroup", "process tree"))
