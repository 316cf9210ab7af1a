"""`stages check` grades a mutant's stage again only where the stage's calls reach the mutant's edit: the digest
of what a stage runs (grading/tools/reach.py), and the check's cells taken from the solution's."""

import shutil
import tempfile
from pathlib import Path

import pytest

from theinference.bundled import data_dir
from theinference.grading.spec.stages import load_stages
from theinference.grading.tools.check import called_adapters
from theinference.grading.tools.mutants import build_mutant, load_mutants
from theinference.grading.tools.reach import stage_digest

STAGES = {s.id: s for s in load_stages([data_dir("stages")])}


def _digests(root: Path) -> dict[str, str]:
    return {stage_id: stage_digest(root, called_adapters(s)) for stage_id, s in STAGES.items()}


@pytest.fixture
def solution(tmp_path) -> Path:
    return shutil.copytree(data_dir("course") / "solution", tmp_path / "solution")


def _edit(root: Path, file: str, find: str, replace: str) -> None:
    path = root / file
    text = path.read_text()
    assert text.count(find) == 1, find
    path.write_text(text.replace(find, replace))


def test_an_edit_counts_for_the_stages_that_reach_it_and_no_other(solution, tmp_path):
    before = _digests(solution)
    # gpt2.forward is the full forward pass: run_forward reaches it, the cached path (greedy, the cost) never does.
    _edit(solution, "src/gpt2.py", "    x = embed(params, ids)\n", "    x = embed(params, ids) * 1.0\n")
    after = _digests(solution)
    assert after["forward"] != before["forward"]
    assert after["greedy"] == before["greedy"] and after["cache-scaling"] == before["cache-scaling"]


def test_the_cost_stage_counts_the_decode_step_it_asks_for_its_precision(solution):
    """cache-scaling calls run_decode_step too (which precision its logits are in): an edit there is its code."""
    before = _digests(solution)
    _edit(
        solution,
        "tests/adapters.py",
        "def run_decode_step(prompt_ids, next_id):\n",
        "def run_decode_step(prompt_ids, next_id):\n    prompt_ids = list(prompt_ids)\n",
    )
    after = _digests(solution)
    assert after["cache-scaling"] != before["cache-scaling"] and after["decode-step"] != before["decode-step"]
    assert after["greedy"] == before["greedy"]


def test_module_statements_and_other_files_count_for_every_stage_reaching_the_module(solution):
    before = _digests(solution)
    _edit(solution, "src/kvcache.py", "import numpy as np\n", "import numpy as np\n\nSCALE = 1.0\n")
    after = _digests(solution)
    assert after["greedy"] != before["greedy"] and after["forward"] == before["forward"]
    (solution / "src" / "table.json").write_text("{}")
    assert all(_digests(solution)[s] != after[s] for s in STAGES)


def test_a_module_imported_whole_is_followed_through_its_attributes(solution):
    _edit(
        solution,
        "tests/adapters.py",
        "from src.gpt2 import forward, load_weights\n",
        "from src import gpt2\nfrom src.gpt2 import load_weights\n",
    )
    _edit(
        solution,
        "tests/adapters.py",
        "    return forward(params, seq_ids, n_head)",
        "    return gpt2.forward(params, seq_ids, n_head)",
    )
    before = _digests(solution)
    _edit(solution, "src/gpt2.py", "    x = embed(params, ids)\n", "    x = embed(params, ids) * 1.0\n")
    assert _digests(solution)["forward"] != before["forward"]


def test_dynamic_code_makes_the_whole_tree_the_digest(solution):
    _edit(
        solution,
        "tests/adapters.py",
        "    return forward(params, seq_ids, n_head)",
        '    return getattr(__import__("src.gpt2").gpt2, "forward")(params, seq_ids, n_head)',
    )
    before = _digests(solution)
    _edit(solution, "src/gpt2.py", "    x = embed(params, ids)\n", "    x = embed(params, ids) * 1.0\n")
    after = _digests(solution)
    assert all(after[s] != before[s] for s in STAGES)  # no stage's calls can be told apart: none is reused


@pytest.mark.parametrize(
    "find, replace",
    [
        ("from src.gpt2 import forward, load_weights\n", "from src.gpt2 import *\n"),
        ("from src.gpt2 import forward, load_weights\n", "from src.gpt2 import load_weights\n"),  # imported below
    ],
)
def test_imports_no_rule_follows_make_the_whole_tree_the_digest(solution, find, replace):
    _edit(solution, "tests/adapters.py", find, replace)
    if "*" not in replace:
        _edit(
            solution,
            "tests/adapters.py",
            "    params, n_head = _model()\n    return forward(",
            "    from src.gpt2 import forward\n\n    params, n_head = _model()\n    return forward(",
        )
    before = _digests(solution)
    _edit(solution, "src/gpt2.py", "    x = embed(params, ids)\n", "    x = embed(params, ids) * 1.0\n")
    assert _digests(solution)["greedy"] != before["greedy"]  # greedy never reaches forward, but nothing can say so


def test_no_mutant_of_the_gallery_has_the_solutions_code_where_its_manifest_expects_a_failure():
    """The reuse never hides a failure the gallery's manifests expect (what grading each cell would show), and it
    saves grading in every stage (an edit most stages never reach)."""
    solution = data_dir("course") / "solution"
    reference = _digests(solution)
    reused = dict.fromkeys(STAGES, 0)
    with tempfile.TemporaryDirectory() as tmp:
        for mutant in load_mutants(data_dir("course") / "mutants"):
            digests = _digests(build_mutant(mutant, solution, Path(tmp) / mutant.name))
            assert any(digests[s] != reference[s] for s in STAGES), mutant.name  # every mutant is graded somewhere
            for stage_id, digest in digests.items():
                if digest == reference[stage_id]:
                    reused[stage_id] += 1
                    assert "pass" in mutant.expect.get(stage_id, ("pass",)), (mutant.name, stage_id)
    assert all(reused.values()), reused


@pytest.mark.slow
def test_a_stage_the_edit_never_reaches_takes_the_solutions_verdict_and_a_wrong_manifest_is_still_caught(
    cli, tiny_path, tmp_path
):
    source = tmp_path / "course"
    shutil.copytree(data_dir("course") / "solution", source / "solution")
    shutil.copytree(data_dir("course") / "mutants" / "greedy-one-short", source / "mutants" / "greedy-one-short")
    shutil.copytree(data_dir("course") / "mutants" / "no-mlp-residual", source / "mutants" / "no-mlp-residual")
    manifest = source / "mutants" / "no-mlp-residual" / "manifest.toml"
    manifest.write_text(manifest.read_text().replace("[expect]\n", '[expect]\nprove-one-layer = "all-rows-off"\n'))
    args = ("--stage", "prove-one-layer", "--stage", "greedy")
    result = cli("stages", "check", "--source", source, "--weights", tiny_path, *args)
    rows = {line.split("|")[0].strip(): line for line in result.stdout.splitlines() if "|" in line}
    # greedy-one-short edits the cached generation loop: prove-one-layer (layer 0's attention) never reaches it.
    assert "✔ pass = solution" in rows["greedy-one-short"].split("|")[1], result.stdout
    assert "= solution" not in rows["greedy-one-short"].split("|")[2]
    # no-mlp-residual leaves layer 0's attention as it is: the manifest that says otherwise is still a mismatch.
    assert "mismatch: no-mlp-residual × prove-one-layer: expected all-rows-off, got pass" in result.stdout
    assert result.exit_code == 1
    assert "3 of the checks (marked =) took the solution's verdict" in result.stdout
