"""The bundle commands after a plain `pip install .` (not editable): the wheel they carry is made again from the
installed files."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, check=False)


def _contents(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n) for n in z.namelist() if not n.endswith(".dist-info/RECORD")}


@pytest.mark.slow
def test_a_wheel_install_makes_its_own_wheel_again_and_it_installs(tmp_path):
    built = _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(tmp_path / "dist"),
        str(ROOT),
    )
    assert built.returncode == 0, built.stderr
    [original] = (tmp_path / "dist").glob("theinference-*.whl")
    site = tmp_path / "site"
    installed = _run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(original))
    assert installed.returncode == 0, installed.stderr
    # The installed copy first on the path (its dependencies from this environment), run from elsewhere.
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = _run(sys.executable, "-c", "import theinference; print(theinference.__file__)", env=env, cwd=tmp_path)
    assert where.stdout.strip() == str(site / "theinference" / "__init__.py")
    made = _run(
        sys.executable,
        "-m",
        "theinference",
        "autograder",
        "wheel",
        "--out",
        str(tmp_path / "out"),
        env=env,
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    assert "installed from a wheel" not in made.stderr and "--wheel PATH" not in made.stderr
    [again] = (tmp_path / "out").glob("theinference-*.whl")
    assert again.name == original.name
    assert _contents(again) == _contents(original)  # every file, byte for byte; bytecode and pip's notes left out
    reinstalled = _run(
        sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "again"), str(again)
    )
    assert reinstalled.returncode == 0, reinstalled.stderr  # its RECORD's hashes hold


def test_the_bundle_asks_for_the_node_version_theinference_requires():
    import re

    from theinference.bundled import asset

    required = re.search(r"install Node\.js (\d+) or later", (ROOT / "theinference" / "proc" / "node.py").read_text())
    assert required is not None
    setup = Path(asset("autograder/setup.sh")).read_text()
    versions = set(re.findall(r"Node\.js \(?(\d+(?:\.\d+)?) or later", setup))
    assert versions == {required.group(1)}, versions  # not 18.19 where theinference and the README say 20
    assert f"-lt {required.group(1)} ]" in setup  # and an older node is said to be too old
