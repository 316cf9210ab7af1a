"""The `theinference` command: every command listed here, each defined in its group's module."""

import importlib
import sys
import traceback
from importlib import metadata
from typing import Annotated, Any

import typer

from theinference import __version__
from theinference.cli import help as cli_help
from theinference.cli.common import EXIT_CONFIG, EXIT_INTERNAL, ConfigErrorsExit
from theinference.cli.consoles import err_console
from theinference.proc import interrupt

# Every command, in --help's order: (module, its command function or Typer group, the command's class).
# A command's module is imported only when that command is run, listed (--help, completion) or asked for: `test`
# does not pay for the imports of `grade`, `stages` or `autograder` before the student's code runs.
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "test": ("theinference.cli.test", "test_command", None),
    "oracle": ("theinference.cli.oracle", "oracle_command", None),
    "grade": ("theinference.cli.grade", "grade_command", "GradeCommand"),
    "report": ("theinference.cli.report", "report_command", None),
    "init": ("theinference.cli.course", "init_command", None),
    "demo": ("theinference.cli.course", "demo_command", None),
    "version": ("theinference.cli.app", "version", None),
    "weights": ("theinference.cli.weights", "weights_app", None),
    "stages": ("theinference.cli.stages", "stages_app", None),
    "autograder": ("theinference.cli.autograder", "autograder_app", None),
}


def load_command(name: str) -> Any:
    """COMMANDS[name] as click's command, built by typer as `app.command` or `app.add_typer` would build it."""
    module_name, attribute, cls = COMMANDS[name]
    module = importlib.import_module(module_name)
    target = getattr(module, attribute)
    holder = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name)
    else:
        holder.command(name, cls=getattr(module, cls) if cls else None)(target)
    return typer.main.get_group(holder).commands[name]


class _Commands(dict):
    """click's table of the top-level commands: every name of COMMANDS there from the start (for --help, completion
    and "Did you mean"), each command built the first time it is looked up."""

    def __getitem__(self, name: str) -> Any:
        command = super().__getitem__(name)
        if command is None:
            command = load_command(name)
            self[name] = command
        return command

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def items(self) -> Any:
        return [(name, self[name]) for name in self]

    def values(self) -> Any:
        return [self[name] for name in self]


class LazyCommands(ConfigErrorsExit):
    """The top-level group, whose commands are built on first use (_Commands)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _Commands(dict.fromkeys(COMMANDS))

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names, none built


cli_help.apply()
app = typer.Typer(
    cls=LazyCommands,
    name="theinference",
    help="The grader for the course 'Build your own KV cache'.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def installed_version() -> str:
    """The installed distribution's version (the source's __version__ when run uninstalled)."""
    try:
        return metadata.version("theinference")
    except metadata.PackageNotFoundError:
        return __version__


def version_line() -> str:
    """What `theinference --version` and `theinference version` both print."""
    return f"theinference {installed_version()}"


def _print_version(value: bool) -> None:
    if value:
        print(version_line())
        raise typer.Exit(0)


@app.callback()
def handle_root_options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print theinference's version and exit."
        ),
    ] = False,
) -> None:
    """The grader for the course 'Build your own KV cache'."""


def version() -> None:
    """Print theinference's version (the same line as --version)."""
    print(version_line())


def main() -> None:
    """Entry point: run the CLI; an unexpected exception is reported as a grader bug (exit 3)."""
    interrupt.install()
    try:
        app()
    except SystemExit as e:
        # click turns an interrupt inside a command into "Aborted!" and exit 1: report the signal instead
        # (watch mode, which Ctrl-C ends normally, exits 0).
        if interrupt.exit_code() and e.code != 0:
            sys.exit(interrupt.exit_code())
        raise
    except KeyboardInterrupt:
        sys.exit(interrupt.exit_code() or 130)
    except Exception:  # noqa: BLE001 - the last line of defence: say it is our bug
        err_console().print(
            "[bold red]theinference internal error[/bold red] — this is a bug in the grader, not in your code. "
            "Please report it with the traceback below."
        )
        err_console().print(traceback.format_exc(), markup=False, highlight=False)
        sys.exit(EXIT_INTERNAL)


__all__ = ["app", "main", "EXIT_CONFIG"]
