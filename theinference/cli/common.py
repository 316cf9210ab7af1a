"""Pieces the CLI's command modules share: exit codes, consoles, error reporting, progress."""

import os
import sys
import tempfile
from types import MappingProxyType
from pathlib import Path

import typer
from typer.core import TyperGroup
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from theinference.grading.randomcases import resolve_seed
from theinference.errors import ConfigError, UsageError
from theinference.grading.session import RunOptions
from theinference.proc.limits import Limits

EXIT_OK, EXIT_FAIL, EXIT_CONFIG, EXIT_INTERNAL = 0, 1, 2, 3


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def console_for(stream) -> Console:
    """A console on stream; plain (no colour) when not a terminal, in CI or with NO_COLOR."""
    plain = in_ci() or not stream.isatty()
    return Console(file=stream, no_color=plain or None, highlight=False, soft_wrap=False,
                   force_terminal=False if plain else None, width=None if stream.isatty() else 160)


def err_console() -> Console:
    return console_for(sys.stderr)


def write_atomic(path: Path, text: str) -> None:
    """Write a results file whole or not at all: a temporary file beside it, renamed over it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def config_error(e: Exception) -> typer.Exit:
    """Print a usage/configuration error and return the Exit to raise (code 2)."""
    err_console().print(f"[bold red]error:[/bold red] {escape(str(e))}", soft_wrap=True)
    return typer.Exit(EXIT_CONFIG)


class ConfigErrorsExit(TyperGroup):
    """The top-level command group: a ConfigError raised by any command is printed once and exits 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ConfigError as e:
            raise config_error(e) from None


class _SynthProgress:
    """A progress callback for `write_synthetic`: a rich bar on stderr while tensors are drawn."""

    def __init__(self):
        self.progress = None
        self.task = None

    def __call__(self, done: int, total: int) -> None:
        if self.progress is None:
            self.progress = Progress(TextColumn("making synthetic weights"), BarColumn(), TextColumn("{task.completed}/{task.total} tensors"),
                                     TimeElapsedColumn(), console=err_console(), disable=in_ci())
            self.progress.start()
            self.task = self.progress.add_task("synth", total=total)
        self.progress.update(self.task, completed=done)
        if done == total:
            self.progress.stop()


def synth_progress() -> _SynthProgress:
    return _SynthProgress()


def run_options(timeout: float | None, memory_limit_mb: int, seed: str | None, untrusted: bool = False,
                all_cases: bool = False, submission_timeout: float | None = None, env: dict | None = None) -> RunOptions:
    """RunOptions from command-line values; untrusted grading (and CI) gives students an allow-listed environment."""
    try:
        resolved = resolve_seed(seed)
    except ValueError:
        raise UsageError(f"--seed takes an integer or 'random', not {seed!r}") from None
    limits = Limits(timeout=timeout, memory_mb=memory_limit_mb or None, untrusted=untrusted or in_ci(),
                    env=MappingProxyType(dict(env or {})))
    return RunOptions(limits=limits, seed=resolved, all_cases=all_cases, submission_timeout=submission_timeout or None)
