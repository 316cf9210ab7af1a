"""Every CI format carries the diagnosis of every failing stage: shape, finding, hint, as the terminal does.

One mutant (the attention scale left out) fails a stage of every kind: single-step-attention and
decode-step (one row per case: diagnosed across cases), prove-one-layer (rows diagnosed per case)
and greedy (tokens).
"""

import json
import re
import xml.etree.ElementTree as ET

import pytest

from typer.testing import CliRunner

from conftest import _isolate, write_adapters, write_quick_scaling_stage
from test_scaling import RECOMPUTE
import theinference.cli.test as cli_test
from theinference import __version__
from theinference.bundled import data_dir
from theinference.cli.app import app
from theinference.grading.tools.mutants import build_mutant, load_mutant
from theinference.report import TEXT_FORMATS
from theinference.report.github import render_summary

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


class Graded:
    """One subject's gradings through the real CLI, each once per module: `--format junit` (trusted), whose run also
    gives github's annotations and step summary (rendered from that same run; the CLI's github output itself:
    test_formats.py), and `--format gradescope` (untrusted, so graded on its own)."""

    def __init__(self, tmp_path_factory, lock_dir: str, course, args, cache=None):
        self.tmp_path_factory, self.lock_dir, self.course, self.args, self.cache = (
            tmp_path_factory, lock_dir, course, args, cache,
        )  # fmt: skip
        self.results: dict[str, tuple] = {}

    def texts(self, fmt: str, stages=tuple(KINDS)) -> tuple[object, dict[str, str]]:
        """(the CLI's result, what a reader of fmt sees about each stage)."""
        graded_as = "gradescope" if fmt == "gradescope" else "junit"
        if graded_as not in self.results:
            root = self.tmp_path_factory.mktemp(f"graded-{graded_as}")
            out, runs = root / "results.json", []
            with pytest.MonkeyPatch.context() as monkeypatch:
                _isolate(monkeypatch, root)
                if self.cache is not None:
                    monkeypatch.setenv("THEINFERENCE_CACHE", str(self.cache))
                monkeypatch.setattr("theinference.grading.drive.grader.lock_dir", lambda: self.lock_dir)
                emit = cli_test._emit
                monkeypatch.setattr(cli_test, "_emit", lambda run, *a: (runs.append(run), emit(run, *a)))
                extra = ["--output", str(out)] if graded_as == "gradescope" else []
                argv = ["test", "--course", str(self.course), *map(str, self.args), "--format", graded_as, *extra]
                result = CliRunner().invoke(app, argv, catch_exceptions=False)
            self.results[graded_as] = (result, runs[0], out, root)
        result, run, out, root = self.results[graded_as]
        stdout, summary = result.stdout, root / "summary.md"
        if fmt == "github":
            stdout = TEXT_FORMATS["github"](run, __version__)
            summary.write_text(render_summary(run, __version__))
        return result, stage_texts(fmt, stdout, out, summary, stages)


@pytest.fixture(scope="module")
def mutant_graded(tmp_path_factory, tiny_path, _worker_lock_dir):
    mutant = load_mutant(data_dir("course") / "mutants" / MUTANT / "manifest.toml")
    course = build_mutant(mutant, data_dir("course") / "solution", tmp_path_factory.mktemp("mutant") / MUTANT)
    stages = [arg for s in KINDS for arg in ("--stage", s)]
    return mutant, Graded(tmp_path_factory, _worker_lock_dir, course, ["--weights", tiny_path, *stages])


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["junit", "github", "gradescope"])
def test_every_failing_stage_carries_shape_finding_and_hint(mutant_graded, fmt):
    mutant, graded = mutant_graded
    result, texts = graded.texts(fmt)
    assert result.exit_code == 1, result.output
    for stage, kind in KINDS.items():
        text = texts[stage]
        assert "shape: " in text and "hint: " in text, (fmt, stage, kind, text)
        for bug in mutant.fingerprint.get(stage, ()):
            assert f"finding: {bug}: your output equals GPT-2" in text, (fmt, stage, kind, text)
        if kind == "across cases":
            assert "read across" in text and "1 of 1 rows outside" in text, (fmt, stage, text)
        if kind == "tokens":
            assert "shape: token-mismatch" in text, (fmt, stage, text)


@pytest.fixture(scope="module")
def recompute_graded(tmp_path_factory, tiny_path, proof_cache, _worker_lock_dir):
    root = tmp_path_factory.mktemp("recompute")
    stages_dir = write_quick_scaling_stage(root / "quick-stages")
    course = root / "recompute"
    write_adapters(course, RECOMPUTE)
    args = ["--weights", tiny_path, "--stages-dir", stages_dir, "--stage", "quick-scaling"]
    return Graded(tmp_path_factory, _worker_lock_dir, course, args, cache=proof_cache)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["junit", "github", "gradescope"])
def test_a_failing_cache_scaling_stage_carries_its_shape_figures_and_hint(recompute_graded, fmt):
    """cache-scaling, the fourth kind: a recompute fails as no-cache, with both tests' figures, how the CPU
    was counted and the stopped call marked as a lower bound, in every CI format."""
    result, texts = recompute_graded.texts(fmt, stages=("quick-scaling",))
    assert result.exit_code == 1, result.output
    text = texts["quick-scaling"]
    assert "shape: no-cache" in text and "hint: " in text, (fmt, text)
    assert "counted by the grader (" in text and "(a) ratio" in text and "of the oracle's full recompute" in text
    assert "320 tokens > " in text and "(stopped)" in text, (fmt, text)
    if fmt == "junit":
        props = {p.get("name"): p.get("value") for p in ET.fromstring(result.stdout).iter("property")}
        assert props["stopped_at"] == "320" and props["accounting"].startswith(("cgroup", "process tree"))
