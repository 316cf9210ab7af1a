"""The `theinference` command: every command listed here, each defined in its group's module."""

import sys
import traceback
from importlib import metadata
from typing import Annotated

import typer

from theinference import __version__
from theinference.cli import help as cli_help
from theinference.cli.autograder import autograder_app
from theinference.cli.common import EXIT_CONFIG, EXIT_INTERNAL, ConfigErrorsExit
from theinference.cli.consoles import err_console
from theinference.cli.course import demo_command, init_command
from theinference.cli.grade import GradeCommand, grade_command
from theinference.cli.oracle import oracle_command
from theinference.cli.report import report_command
from theinference.cli.stages import stages_app
from theinference.cli.test import test_command
from theinference.cli.weights import weights_app
from theinference.proc import interrupt

cli_help.apply()
app = typer.Typer(
    cls=ConfigErrorsExit,
    name="theinference",
    help="The grader for the course 'Build your own KV cache'.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(weights_app, name="weights")
app.add_typer(stages_app, name="stages")
app.add_typer(autograder_app, name="autograder")
app.command("test")(test_command)
app.command("oracle")(oracle_command)
app.command("grade", cls=GradeCommand)(grade_command)
app.command("report")(report_command)
app.command("init")(init_command)
app.command("demo")(demo_command)


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


@app.command()
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
