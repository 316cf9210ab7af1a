"""Hidden stages: a stage file's `visibility` is each Gradescope test's, and the student's summary line leaves it out."""

import json

import pytest

from conftest import write_adapters
from theinference.bundled import data_dir

OFF = """\
from src.gpt2 import load_weights
from src.kvcache import layer_attn_incremental
import theinference

def run_layer_equiv(seq_ids):
    params, n_head = load_weights(theinference.weights_path())
    return layer_attn_incremental(params, seq_ids, n_head) + 0.5
"""


@pytest.fixture
def hidden_stages(tmp_path):
    """A copy of prove-one-layer with other cases, kept from students until the due date."""
    stages = tmp_path / "stages"
    stages.mkdir()
    text = (data_dir("stages") / "prove-one-layer.toml").read_text()
    text = text.replace('id = "prove-one-layer"', 'id = "held-back-layer"\nvisibility = "after_due_date"')
    (stages / "held-back.toml").write_text(text.replace('lesson = "', 'lesson = "' + str(data_dir("stages")) + "/"))
    return stages


def grade(cli, tmp_path, tiny_path, stages, submission):
    out = tmp_path / "results.json"
    result = cli(
        "grade", submission, "--format", "gradescope", "--out", out, "--weights", tiny_path,
        "--stages-dir", stages, "--stage", "prove-one-layer", "--stage", "held-back-layer",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_a_hidden_stage_is_after_the_due_date_and_out_of_the_students_summary(cli, tmp_path, tiny_path, hidden_stages):
    write_adapters(tmp_path / "student", OFF)
    doc = grade(cli, tmp_path, tiny_path, hidden_stages, tmp_path / "student")
    visibility = {t["name"].split(":")[0]: t["visibility"] for t in doc["tests"]}
    assert visibility == {"prove-one-layer": "visible", "held-back-layer": "after_due_date"}
    assert all(t["status"] == "failed" for t in doc["tests"])
    # the line every student sees counts only the visible stage
    assert "0 of 1 stages passed, 0/10 points" in doc["output"]
    assert "1 more stage(s) shown after the due date" in doc["output"]

    (tmp_path / "empty").mkdir()  # not gradable at all: the hidden stage stays hidden
    doc = grade(cli, tmp_path, tiny_path, hidden_stages, tmp_path / "empty")
    assert {t["name"].split(":")[0]: t["visibility"] for t in doc["tests"]} == visibility


def test_an_unknown_visibility_is_refused(cli, hidden_stages):
    path = hidden_stages / "held-back.toml"
    path.write_text(path.read_text().replace('"after_due_date"', '"after-due-date"'))
    result = cli("stages", "list", "--stages-dir", hidden_stages)
    assert result.exit_code == 2
    assert f"{path}: field 'visibility': must be one of visible, after_due_date" in " ".join(result.stderr.split())
