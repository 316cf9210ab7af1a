"""The CLI's conventions: --version, shell completion, and every command's --help complete and in one style."""

import re
from importlib import metadata

import pytest
import typer

from theinference import __version__
from theinference.cli.app import app
from theinference.cli.common import EXIT_CONFIG, EXIT_FAIL, EXIT_INTERNAL, EXIT_OK


def _commands(command, path=()):
    """(path, click command) for the root and every command and subcommand below it."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(typer.main.get_command(app)))
# What may follow an option in --help: an UPPERCASE metavar (FILE, I/N, SUBMISSION_DIR...) or the
# choices in brackets, then optionally a range ([x>=0.001]).
METAVAR = re.compile(r"([A-Z][A-Z_/]*(\.\.\.)?|\[[a-z0-9|-]+\])( \[[^\]]+\])?")


def test_version_flag_prints_the_installed_version(cli):
    result = cli("--version")
    assert result.exit_code == 0
    assert result.stdout == f"theinference {metadata.version('theinference')}\n"
    assert metadata.version("theinference") == __version__  # the reports' version is the installed one


def test_show_completion_prints_a_script_that_completes_commands(cli, monkeypatch):
    # Without shell detection typer takes the shell as the option's value.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    result = cli("--show-completion", "bash")
    assert result.exit_code == 0
    assert "complete -o default -F _theinference_completion theinference" in result.stdout
    # What the script asks for on <TAB> after `theinference stages ch`:
    monkeypatch.setenv("_THEINFERENCE_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", "theinference stages ch")
    monkeypatch.setenv("COMP_CWORD", "2")
    completed = cli()
    assert completed.exit_code == 0 and completed.stdout.split() == ["check"]


def test_install_completion_is_offered(cli):
    result = cli("--help")
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda p: " ".join(p) or "theinference")
def test_every_help_is_complete_and_in_one_style(cli, path):
    command = COMMANDS[path]
    result = cli(*path, "--help")
    assert result.exit_code == 0
    text = result.stdout
    assert command.help and command.help.strip().splitlines()[0], f"{path}: no one-line summary"
    # Rich help keeps a later paragraph's line breaks, leaving half-empty lines at 80 columns: one line each.
    later = [p for p in command.help.strip().split("\n\n")[1:] if "\n" in p.strip()]
    assert not later, f"{path}: a help paragraph broken over lines: {later}"
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert not re.search(r"[<{]", usage), usage
    assert "<bool>" not in text
    for param in command.params:
        assert param.help, f"{path}: {param.name} has no help text"
        if not isinstance(param, typer.core.TyperOption):
            assert param.metavar and param.metavar.upper() == param.metavar, f"{path}: argument {param.name}"
            continue
        [row] = [line for line in text.splitlines() if re.match(rf"[│\s*]*{re.escape(param.opts[0])}(\s|$)", line)]
        after = re.split(r"\s{2,}", row.split(param.opts[0], 1)[1].strip())[0] if not param.is_flag else ""
        if param.is_flag:
            assert re.search(rf"{re.escape(param.opts[0])}\s{{2,}}{re.escape(param.help.split()[0])}", row), row
        else:
            assert METAVAR.fullmatch(after), f"{path}: {param.opts[0]} shows {after!r}"


def test_a_flag_takes_no_value(cli, solution_course):
    result = cli("test", "--all", "true", "--course", solution_course)
    assert result.exit_code == EXIT_CONFIG
    assert "unexpected extra argument" in result.output.lower()


def test_test_help_names_every_exit_code(cli):
    text = " ".join(cli("test", "--help").stdout.split())
    codes = text.split("Exit codes:", 1)[1]
    for code, meaning in (
        (EXIT_OK, "every selected stage passed"),
        (EXIT_FAIL, "some stage failed"),
        (EXIT_CONFIG, "usage or configuration error"),
        (EXIT_INTERNAL, "internal error"),
    ):
        assert f"{code} {meaning}" in codes


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda p: " ".join(p) or "root")
def test_every_option_names_its_value_as_the_project_does(cli, path):
    """Not typer's name for the type (PATH, TEXT, FLOAT): an explicit metavar, or the choices in brackets."""
    text = cli(*path, "--help").stdout
    for param in COMMANDS[path].params:
        if isinstance(param, typer.core.TyperOption) and not param.is_flag and not param.metavar:
            [row] = [line for line in text.splitlines() if re.match(rf"[│\s*]*{re.escape(param.opts[0])}(\s|$)", line)]
            assert row.split(param.opts[0], 1)[1].strip().startswith("["), f"{path}: {param.opts[0]}: {row}"
