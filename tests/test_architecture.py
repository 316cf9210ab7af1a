"""The layers of the package: no module imports a layer above its own (see ARCHITECTURE.md)."""

import ast
import dataclasses
import sys
from pathlib import Path

import pytest

import theinference
from theinference.proc import sandbox

# What each layer may import (besides the standard library and third-party packages). The base
# is the package's top-level modules (theinference/__init__.py, bundled.py, course.py, trust.py).
ALLOWED = {
    "base": {"base"},
    "model": {"base", "model"},
    "proc": {"base", "proc"},
    "grading": {"base", "model", "proc", "grading"},
    "report": {"base", "model", "grading", "report"},
    "cli": {"base", "model", "proc", "grading", "report", "cli"},
}


# grading's rooms, lowest first: each may import only itself and the rooms before it (judging never the drivers).
ROOMS = ("oracle", "spec", "judge", "drive", "tools")


def room(module: str) -> str | None:
    """The room of grading a dotted module name belongs to (None: not in a room, e.g. grading/__init__)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "grading" and parts[2] in ROOMS else None


def room_allows(importer: str, target: str) -> bool:
    mine, theirs = room(importer), room(target)
    return mine is None or theirs is None or ROOMS.index(theirs) <= ROOMS.index(mine)


def layer(module: str) -> str:
    """The layer a dotted module name of package belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else "base"


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package under root, by dotted name (the entry point __main__ left out)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] != "__main__":
            found[".".join(parts)] = path
    return found


def imported(path: Path, module: str, known: set[str], top_level_only: bool = False) -> set[str]:
    """The modules among known that the file imports (anywhere in it, or at module level only)."""
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's package, level - 1 packages up
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return names & known


def violations(root: Path, package: str) -> list[str]:
    """One line per import of a higher layer: "importer (layer) imports imported (layer)"."""
    found = modules(root, package)
    problems = []
    for name, path in found.items():
        mine = layer(name)
        for target in sorted(imported(path, name, set(found))):
            theirs = layer(target)
            if theirs not in ALLOWED[mine] and target != package:
                problems.append(f"{name} ({mine}) imports {target} ({theirs})")
            elif not room_allows(name, target):
                problems.append(f"{name} (grading's {room(name)} room) imports {target} ({room(target)} room)")
    return problems


PACKAGE_ROOT = Path(theinference.__file__).parent


@pytest.mark.slow
def test_no_module_imports_a_higher_layer():
    assert violations(PACKAGE_ROOT, "theinference") == []


@pytest.mark.parametrize(
    "importer, line, bad",
    [
        ("model/gpt2.py", "from pkg.grading import stages\n", True),
        ("proc/runner.py", "import pkg.report.terminal\n", True),
        ("grading/judge/grade.py", "def f():\n    from pkg.cli import app\n", True),
        ("report/terminal.py", "from pkg import cli\n", True),
        ("proc/runner.py", "from ..grading import stages\n", True),
        ("model/__init__.py", "from .. import report\n", True),
        ("bundled.py", "from pkg.model import gpt2\n", True),
        ("grading/judge/grade.py", "from pkg.model import gpt2\n", False),
        ("cli/app.py", "from pkg.report import terminal\n", False),
        ("grading/judge/grade.py", "from pkg.grading.drive import grader\n", True),
        ("grading/judge/grade.py", "def f():\n    from pkg.grading.tools.check import x\n", True),
        ("grading/spec/stages.py", "from ..judge import grade\n", True),
        ("grading/oracle/registry.py", "from pkg.grading.spec.stages import StageSpec\n", True),
        ("grading/drive/grader.py", "from pkg.grading.judge import grade\n", False),
        ("grading/judge/grade.py", "from pkg.grading.spec import stages\n", False),
    ],
)
def test_the_checker_finds_a_higher_layer_import(tmp_path, importer, line, bad):
    """The checker itself: a synthetic package with one import, upward or downward."""
    root = tmp_path / "pkg"
    for sub in ALLOWED:
        if sub != "base":
            (root / sub).mkdir(parents=True)
            (root / sub / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    for name in (
        "model/gpt2.py",
        "grading/oracle/registry.py",
        "grading/spec/stages.py",
        "grading/judge/grade.py",
        "grading/drive/grader.py",
        "grading/tools/check.py",
        "report/terminal.py",
        "proc/runner.py",
        "cli/app.py",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).parent.joinpath("__init__.py").touch()
        (root / name).write_text("")
    (root / "bundled.py").write_text("")
    (root / importer).write_text(line)
    assert bool(violations(root, "pkg")) == bad, violations(root, "pkg")


def test_the_sandbox_stub_holds_everything_the_student_side_imports():
    """The worker side runs from a copy of a few files: they import only the stdlib and each other."""
    stub = {
        f"theinference.{Path(f).with_suffix('').as_posix().replace('/', '.')}".removesuffix(".__init__")
        for f in sandbox.STUB_FILES
    }
    found = modules(PACKAGE_ROOT, "theinference")
    for name in stub:
        tree = ast.parse(found[name].read_text())
        top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        assert top - {"theinference"} <= sys.stdlib_module_names, (name, top)
        assert imported(found[name], name, set(found), top_level_only=True) <= stub, name


def private_imports(root: Path, package: str) -> list[str]:
    """Each `from module import _name` of the package that takes a private name of another of its modules."""
    found = modules(root, package)
    problems = []
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith(package)):
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            problems += [f"{name} imports {p} from {node.module or '.'}" for p in private]
    return problems


def test_no_module_imports_another_modules_private_names():
    assert private_imports(PACKAGE_ROOT, "theinference") == []


def test_a_private_name_imported_from_another_module_is_named(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "runner.py").write_text("def _child(): ...\ndef run(): ...\n")
    (tmp_path / "pkg" / "calls.py").write_text("from pkg.runner import _child, run\n")
    assert private_imports(tmp_path / "pkg", "pkg") == ["pkg.calls imports _child from pkg.runner"]


def test_what_a_run_of_student_code_returns_is_frozen():
    """A job, the runner's events and each call's outcome are built whole, never amended (proc/jobs.py)."""
    from theinference.proc import jobs

    built = [v for v in vars(jobs).values() if isinstance(v, type) and dataclasses.is_dataclass(v)]
    assert {c.__name__ for c in built} >= {"AdapterJob", "CallOutcome", "CaseDone", "StepTime"}
    assert [c.__name__ for c in built if not c.__dataclass_params__.frozen] == []  # type: ignore[attr-defined]
