"""Every command finds the same stages, and the oracle export is whole for every kind of stage (issue 24's two bugs)."""

import json
import shutil

import numpy as np
import pytest

from conftest import write_quick_scaling_stage
from theinference.bundled import data_dir


def _course_with_extra_stage(tmp_path):
    """A course whose theinference.toml names a stage directory holding one stage of its own."""
    course = tmp_path / "course"
    shutil.copytree(data_dir("course") / "starter", course)
    extra = course / "extra"
    extra.mkdir()
    text = (data_dir("stages") / "forward.toml").read_text()
    text = text.replace('id = "forward"', 'id = "mlp-probe"').replace("order = 10", "order = 99")
    text = text.replace('lesson = "../course/lessons/forward.md"', 'lesson = "probe.md"')
    (extra / "mlp-probe.toml").write_text(text.replace('aliases = ["runForward"]', "aliases = []"))
    (extra / "probe.md").write_text("# The probe\n\nA stage of this course's own.\n")
    toml = course / "theinference.toml"
    toml.write_text(toml.read_text() + '\nstages_dirs = ["extra"]\n')
    return course


def test_stages_list_and_show_find_the_courses_own_stage_dirs(cli, tmp_path):
    course = _course_with_extra_stage(tmp_path)
    listed = cli("stages", "list", "--course", course)
    assert listed.exit_code == 0, listed.output
    assert "mlp-probe" in listed.stdout and "forward" in listed.stdout
    shown = cli("stages", "show", "mlp-probe", "--course", course)
    assert shown.exit_code == 0, shown.output
    assert "A stage of this course's own." in shown.stdout


@pytest.mark.slow
def test_oracle_export_of_cache_scaling_has_its_logits_and_tie_tolerance(
    cli, tmp_path, tiny_path, proof_cache, monkeypatch
):
    monkeypatch.setenv("THEINFERENCE_CACHE", str(proof_cache))
    out = tmp_path / "expected.npz"
    stages = write_quick_scaling_stage(tmp_path / "stages", longest=24)  # the built-in stage, its generation shorter
    result = cli("oracle", "--stage", "quick-scaling", "--stages-dir", stages, "--weights", tiny_path, "--out", out)
    assert result.exit_code == 0, result.output
    arrays = np.load(out)
    meta = json.loads(str(arrays["meta"]))
    assert meta["tie_rtol"] == 1e-4 and "atol" not in meta
    tokens, logits = arrays["generation.expected"], arrays["generation.logits"]
    assert len(tokens) == 24 and logits.shape[0] == len(tokens) and np.array_equal(logits.argmax(axis=-1), tokens)
    assert "proof" in meta["weights"]  # the weights the stage runs on, not the graded tiny ones
