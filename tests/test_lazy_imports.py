"""What a plain `test` run imports: watch mode's observers and progress bars only when they are used (each is a part
of the grader's own time before the student's code runs)."""

import ast
import subprocess
import sys

import pytest

# Imported by `theinference.cli.test` only where used: --watch, a bar while weights are made on a terminal.
LAZY = ["watchdog", "rich.progress", "theinference.grading.drive.watch", "theinference.cli.watch"]


@pytest.mark.slow
def test_the_test_command_module_imports_watch_mode_and_progress_bars_only_when_used():
    probe = f"import sys; import theinference.cli.test; print([m for m in {LAZY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert ast.literal_eval(out) == []


# Each command's module, imported by `theinference.cli.app` only when that command is run or listed.
OTHER_COMMANDS = [
    "theinference.cli.grade",
    "theinference.cli.stages",
    "theinference.cli.autograder",
    "theinference.cli.course",
    "theinference.cli.weights",
    "theinference.cli.oracle",
    "theinference.cli.report",
]


@pytest.mark.slow
def test_running_one_command_imports_no_other_commands_module():
    probe = (
        "import sys; from typer.testing import CliRunner; from theinference.cli.app import app; "
        "result = CliRunner().invoke(app, ['test', '--help']); assert result.exit_code == 0, result.output; "
        f"print([m for m in {OTHER_COMMANDS!r} + ['theinference.cli.test'] if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert ast.literal_eval(out) == ["theinference.cli.test"]
