"""The gallery under the portable mechanisms: every mutant of both editions is caught as its manifest says, with
the process mechanisms Windows gets (no fork, no subreaper, no PR_SET_PDEATHSIG, psutil for the tree, reader threads
on pipes, the TypeScript worker over a loopback socket), /proc hidden and no cgroup, through the real CLI; the Python
edition also with Windows' Python (what it lacks made absent: tests/portable/sitecustomize.py).

The cost stage's verdicts under those mechanisms are tests/test_meters.py's (the reference passes, a recompute is
no-cache, counted by psutil with /proc hidden)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import scaled
from test_check import _table_rows
from test_portable_procs import LIKE_WINDOWS, _env, _marked
from test_typescript import node_modules  # noqa: F401 - the fixture
from theinference.bundled import data_dir
from theinference.grading.spec.checks import ScalingCheck
from theinference.grading.spec.stages import load_stages
from theinference.proc.node import node_executable

OUTPUT_STAGES = [s.id for s in load_stages([data_dir("stages")]) if not isinstance(s.check, ScalingCheck)]
WINDOWS_LIKE = {**LIKE_WINDOWS, "THEINFERENCE_PIPES": "threads", "THEINFERENCE_NODE_CHANNEL": "socket"}
# Python as on Windows in the grader and every student process: no fcntl, resource, ...; no os.getloadavg,
# signal.SIGKILL, ...; os.open without O_BINARY refused (tests/portable/sitecustomize.py).
WINDOWS_PYTHON = str(Path(__file__).parents[1] / "portable")


def _check_hidden(source: Path, weights: Path, env: dict, real_proc: Path) -> subprocess.CompletedProcess:
    """`stages check` of source's gallery with /proc an empty tmpfs (psutil reads the real one at real_proc) and no
    cgroups, as on a laptop."""
    real_proc.mkdir()
    wrap = ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/sys/fs/cgroup", "--bind", "/proc", str(real_proc)]
    wrap += ["--tmpfs", "/proc", "--"]
    command = [sys.executable, "-m", "theinference", "stages", "check", "--source", str(source), "--weights"]
    command += [str(weights), *(a for s in OUTPUT_STAGES for a in ("--stage", s))]
    env = {**env, "THEINFERENCE_PSUTIL_PROCFS": str(real_proc), "COLUMNS": "200"}
    return subprocess.run([*wrap, *command], env=env, capture_output=True, text=True, timeout=scaled(1800))


@pytest.mark.slow
@pytest.mark.parametrize("edition", ["python", "typescript"])
def test_every_mutant_is_caught_as_its_manifest_says_with_windows_mechanisms_and_proc_hidden(
    edition, tiny_path, tmp_path, request, gallery_cache, monkeypatch
):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    bundled = data_dir("course") if edition == "python" else data_dir("course") / "ts"
    source = shutil.copytree(bundled, tmp_path / "course", ignore=shutil.ignore_patterns("BUNDLED", "node_modules"))
    if edition == "typescript":
        if node_executable() is None:
            pytest.skip("Node.js is not installed")
        modules = request.getfixturevalue("node_modules")  # skips where there is no tsx
        if modules is not None:  # each subject finds it above its own directory
            (source / "node_modules").symlink_to(modules, target_is_directory=True)
    monkeypatch.setenv("THEINFERENCE_CACHE", str(gallery_cache))  # the oracle store test_check's gallery fills
    env, marker = _env(WINDOWS_LIKE)
    # Not the TypeScript edition: there its recompute mutant's long per-step call came within its 120 s wall-clock
    # timeout at this machine's load (timed out once, at load 10-160), and a flake would prove nothing.
    if edition == "python":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (WINDOWS_PYTHON, env.get("PYTHONPATH", "")) if p)
    try:
        done = _check_hidden(source, tiny_path, env, tmp_path / "real-proc")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "stages check passed" in done.stdout and "0 mismatches, 0 problems" in done.stdout
        mutants = sorted(p.name for p in (bundled / "mutants").iterdir() if p.is_dir())
        rows = _table_rows(done.stdout)
        for subject in ["solution", "starter", *mutants]:  # every cell checked, and as the manifest says
            assert rows[subject].count("✔") == len(OUTPUT_STAGES) and "✘" not in rows[subject], rows[subject]
        assert _marked(marker) == []  # nothing the check started outlives it
    finally:
        for process in _marked(marker):
            process.kill()
