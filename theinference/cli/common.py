"""Pieces the CLI's command modules share: exit codes, consoles, error reporting, progress."""

import sys
import threading
import time
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup
from rich.markup import escape

from theinference.cli.consoles import err_console
from theinference.terminals import is_plain
from theinference.errors import ConfigError
from theinference import files

EXIT_OK, EXIT_FAIL, EXIT_CONFIG, EXIT_INTERNAL = 0, 1, 2, 3


def write_atomic(path: Path, text: str) -> None:
    """Write a results file whole or not at all, never through a link (theinference.files)."""
    files.write_atomic(path, text)


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


class ItemProgress:
    """Progress of counted work on stderr: a rich bar on a terminal; elsewhere (CI logs, pipes) plain
    lines, one per finished item or, with `lines`, about that many in all, so a log keeps moving."""

    def __init__(self, label: str, unit: str, lines: int | None = None):
        self.label, self.unit, self.lines = label, unit, lines
        self.plain = is_plain(sys.stderr)
        self.bar: Any = None  # a rich Progress, made on the first item (rich.progress is imported only then)
        self.task: Any = None

    def __call__(self, done: int, total: int, item: str = "") -> None:
        if self.plain:
            if self.lines is None or done == total or done * self.lines // total > (done - 1) * self.lines // total:
                what = f": {item}" if item else ""
                err_console().print(f"{self.label} [{done}/{total} {self.unit}]{what}", markup=False, soft_wrap=True)
            return
        if self.bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn(self.label),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TimeElapsedColumn(),
                TextColumn("{task.fields[item]}"),
                console=err_console(),
            )
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total, item="")
        assert self.task is not None
        self.bar.update(self.task, completed=done, item=escape(item))
        if done == total:
            self.close()

    def close(self) -> None:
        """Take the bar off the terminal (also when the work stopped early)."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def synth_progress() -> ItemProgress:
    """Progress of making synthetic weights: about ten plain lines when stderr is not a terminal."""
    return ItemProgress("making synthetic weights", "steps", lines=10)


class OracleProgress:
    """Told by the oracle cache when it computes an output it does not hold (minutes on the gpt2 shape, once).

    On a terminal, a computation that lasts over DELAY seconds shows a status line on stderr; elsewhere, a
    line is printed whenever the computations not yet reported have taken DELAY seconds, so CI logs move.
    """

    DELAY = 1.0

    def __init__(self):
        self.console = err_console()
        self.live = not is_plain(sys.stderr)  # what err_console was made by
        self.count, self.began = 0, 0.0
        self.unsaid = [0, 0.0]  # outputs computed and their seconds since the last line printed
        self.timer, self.status = None, None

    def start(self, label: str) -> None:
        self.began = time.monotonic()
        if self.live:
            self.timer = threading.Timer(self.DELAY, self._show, [label])
            self.timer.daemon = True
            self.timer.start()

    def _show(self, label: str) -> None:
        self.status = self.console.status(f"oracle: computing {escape(label)} ({self.count} done)")
        self.status.start()

    def finish(self, label: str) -> None:
        seconds = time.monotonic() - self.began
        self.count += 1
        self.unsaid = [self.unsaid[0] + 1, self.unsaid[1] + seconds]
        if self.timer is not None:
            self.timer.cancel()
            self.timer.join()  # a status being shown right now is stopped below, not left behind
            self.timer = None
        if self.status is not None:
            self.status.stop()
            self.status = None
        if not self.live and self.unsaid[1] >= self.DELAY:  # about a line per DELAY seconds of computing
            count, spent = self.unsaid
            text = f"{label} in {spent:.1f} s" if count == 1 else f"{count} outputs in {spent:.1f} s, the last {label}"
            self.console.print(f"oracle: computed {text}", markup=False, highlight=False, soft_wrap=True)
            self.unsaid = [0, 0.0]
