"""The screen of `theinference test --watch`: cleared and redrawn after every re-grade."""

import sys
import threading
import time
from pathlib import Path

from rich.markup import escape

from theinference import __version__
from theinference.cli.consoles import console_for, err_console
from theinference.report.terminal import render_finding, render_footer, render_run
from theinference.grading.drive.watch import Regrade, Watch


def render_regrade(report: Regrade, root) -> None:
    """A re-grade's screen; a failing one's in two parts: its verdicts at once (fingerprinting), then, once the
    failure is matched against known bugs (unmatched set), what that adds under them, never the report again."""
    console = console_for(sys.stdout)
    if report.unmatched is not None:
        _render_findings(console, report, root)
        return
    console.clear()
    when = time.strftime("%H:%M:%S", time.localtime(report.at))
    if report.waiting:
        console.print(
            f"[dim]{when}[/dim] [bold yellow]{escape(report.error)}[/bold yellow] — Ctrl-C exits", soft_wrap=True
        )
        return
    what = ", ".join(_relative(p, root) for p in report.changed) if report.changed else "first run"
    console.print(f"[dim]{when} · {escape(what)} · graded in {report.seconds:.2f} s[/dim]", soft_wrap=True)
    if report.error:
        console.print(f"[bold red]error:[/bold red] {escape(report.error)}", soft_wrap=True)
    elif report.result is not None:
        # the points and what to do next close the report once the findings are out
        render_run(console, report.result, __version__, footer=not report.fingerprinting)
    if report.fingerprinting:
        console.print("[dim]matching the failure against known bugs…[/dim]")
        return
    _render_closing(console, report, root)


def _render_findings(console, report: Regrade, root) -> None:
    """What fingerprinting a shown failure adds: each stage's findings, then the report's closing lines."""
    assert report.unmatched is not None and report.result is not None, "called once a shown failure is matched"
    shown = {stage.id: stage for stage in report.unmatched.stages}
    for stage in report.result.stages:
        render_finding(console, stage, shown.get(stage.id))
    if report.error:
        console.print(f"[bold red]error:[/bold red] {escape(report.error)}", soft_wrap=True)
    render_footer(console, report.result)
    _render_closing(console, report, root)


def _render_closing(console, report: Regrade, root) -> None:
    if report.notice:
        console.print(report.notice, markup=False, soft_wrap=True)
    keys = "Enter re-runs, q+Enter quits, " if sys.stdin.isatty() else ""
    console.print(f"\n[dim]watching {escape(str(root))} for changes — {keys}Ctrl-C exits[/dim]", soft_wrap=True)


def _relative(path: str, root) -> str:
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return path


def run_watch(watch: Watch) -> int:
    """Watch until q or Ctrl-C; exit code 0 either way, 2 if the file watcher cannot start."""
    try:
        watch.start_observer()
    except OSError as e:
        hint = "" if watch.poll else " Try --poll (polling works on WSL2 Windows mounts and network filesystems)."
        err_console().print(
            f"[bold red]error:[/bold red] cannot watch {watch.session.course.root}: {e}.{hint}", soft_wrap=True
        )
        return 2
    if sys.stdin.isatty():
        watch.start_keys()
    try:
        watch.loop(threading.Event())
    except KeyboardInterrupt:
        pass
    finally:
        watch.stop_observer()
    return 0
