"""Watch mode: re-grade whenever a course file changes, with weights and oracle outputs kept warm.

One queue carries file events (from watchdog) and key presses (Enter re-runs, q+Enter quits).
A burst of events — an editor's write-rename-delete, a formatter touching ten files — is
coalesced by a short quiet window into one re-grade; events that arrive while a grade runs
are queued and give exactly one more re-grade when it ends. If the course directory is
renamed away or deleted, watch mode says it is waiting, grades nothing, and when a directory
is back at the path it watches that one afresh and re-grades.
"""

import fnmatch
import os
import queue
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from theinference.grading.judge.events import Event, Listener, VerdictsDone, ignore
from theinference.grading.judge.results import RunResult
from theinference.errors import ConfigError
from theinference.grading.drive.session import Session, choose_stages

DEBOUNCE = 0.05  # seconds of quiet that end a burst of file events
WATCHED_SUFFIXES = (".py", ".toml", ".ts", ".mts", ".cts", ".js", ".mjs", ".cjs")  # both editions' sources
SKIPPED_DIRS = ("__pycache__", "node_modules")
IGNORED_NAMES = ("*.swp", "*.swx", "*.swo", "*~", ".#*", "#*#", "4913", "flycheck_*", "*.tmp", ".~*")
_FILE_EVENTS = {"created", "modified", "moved", "deleted"}
BACK = "(course directory back)"  # what a re-grade after the course directory reappeared shows as changed


def _dir_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a directory, or None if there is none at the path."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None


def is_relevant(path: str, root: Path) -> bool:
    """A source (.py, .ts, ...) or .toml file under root, not an editor temp file, in no hidden dir, cache or node_modules."""
    p = Path(path)
    if p.suffix not in WATCHED_SUFFIXES or any(fnmatch.fnmatch(p.name, pat) for pat in IGNORED_NAMES):
        return False
    try:
        parts = p.resolve().relative_to(root.resolve()).parts
    except ValueError:
        return False
    return not any(part.startswith(".") or part in SKIPPED_DIRS for part in parts[:-1])


def _tree_state(root: Path) -> list | None:
    """(path, mtime, size) of every file in the tree outside hidden dirs and caches; None if root is no directory."""
    if _dir_id(root) is None:
        return None
    state = []
    for parent, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS]
        for name in files:
            try:
                stat = os.stat(os.path.join(parent, name))
            except OSError:
                continue  # removed while walking
            state.append((parent, name, stat.st_mtime_ns, stat.st_size))
    return sorted(state)


class _Handler(FileSystemEventHandler):
    def __init__(self, root: Path, events: queue.Queue):
        self.root, self.events = root, events

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type not in _FILE_EVENTS:
            return
        for path in (event.src_path, getattr(event, "dest_path", "")):
            if path and is_relevant(str(path), self.root):
                self.events.put(("file", str(path)))


@dataclass
class Regrade:
    """What one re-grade saw: the files that triggered it, when, and the result (or a config error)."""

    changed: list[str]
    at: float
    result: RunResult | None = None
    error: str = ""
    seconds: float = 0.0
    waiting: bool = False  # not a grade: the course directory is gone and watch mode waits for it
    notice: str = ""
    fingerprinting: bool = False  # the verdict is shown; the failure is being matched against known bugs
    # Once fingerprinted: the result as its verdict was shown (result is then the fingerprinted one); None before.
    unmatched: RunResult | None = None


@dataclass
class Watch:
    session: Session
    stage_ids: list[str] | None  # None: the first stage not yet passed, re-chosen at every re-grade
    on_regrade: Callable[[Regrade], None]
    poll: bool = False
    debounce: float = DEBOUNCE
    events: queue.Queue = field(default_factory=queue.Queue)
    observer: BaseObserver | None = None
    watched_id: tuple[int, int] | None = None  # the directory the observer watches, to notice it being replaced
    # Called again once a failing re-grade is fingerprinted (the verdict was shown before: the call shows what the
    # fingerprint adds, Regrade.unmatched being what was shown); None: not fingerprinted.
    on_fingerprint: Callable[[Regrade], None] | None = None
    listen: Listener = ignore  # told every event of each re-grade's run (the live line)

    def start_observer(self) -> None:
        """Start watchdog on the course directory (PollingObserver with poll=True)."""
        root = self.session.course.root
        observer = PollingObserver(timeout=0.1) if self.poll else Observer()
        observer.schedule(_Handler(root, self.events), str(root), recursive=True)
        observer.start()
        self.observer, self.watched_id = observer, _dir_id(root)

    def stop_observer(self) -> None:
        """Stop the file watcher, if one runs."""
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=2)
            self.observer = None

    def _root_replaced(self) -> bool:
        """True when the watched directory is no longer at the course path (renamed, deleted, recreated)."""
        return self.observer is not None and _dir_id(self.session.course.root) != self.watched_id

    def _wait_for_root(self, stop: threading.Event) -> bool:
        """Say the course directory is gone, wait until one is back, watch it afresh; False on quit."""
        root = self.session.course.root
        self.stop_observer()
        self.on_regrade(
            Regrade(
                changed=[],
                at=time.time(),
                waiting=True,
                error=f"{root} is gone (renamed or deleted): waiting for it to come back",
            )
        )
        previous, current = None, _tree_state(root)
        while current is None or current != previous:  # absent, or still being copied or checked out
            if stop.is_set() or self._quit_requested():
                return False
            time.sleep(0.1)
            previous, current = current, _tree_state(root)
        self.start_observer()
        return True

    def _quit_requested(self) -> bool:
        """Drop queued file events (they name a directory that has moved); True if q was pressed."""
        while True:
            try:
                kind, value = self.events.get_nowait()
            except queue.Empty:
                return False
            if kind == "key" and value in ("q", "quit"):
                return True

    def start_keys(self) -> None:
        """Read Enter / q+Enter from a terminal's stdin into the event queue."""

        def read() -> None:
            for line in sys.stdin:
                self.events.put(("key", line.strip().lower()))
            self.events.put(("key", "eof"))

        threading.Thread(target=read, daemon=True, name="theinference-keys").start()

    def _drain_burst(self, first: str) -> list[str]:
        """Collect events until `debounce` seconds pass with none; return the changed files."""
        changed = [first]
        while True:
            try:
                kind, value = self.events.get(timeout=self.debounce)
            except queue.Empty:
                return sorted(set(changed))
            if kind == "file":
                changed.append(value)
            elif value == "q":
                self.events.put((kind, value))  # keep the quit for the main loop
                return sorted(set(changed))

    def regrade(self, changed: list[str]) -> Regrade:
        """Grade the watched stages once (Session.run), the verdicts shown as soon as they are out and a failure's
        findings after them; a configuration error is shown, not raised."""
        report = Regrade(changed=changed, at=time.time())
        started = time.perf_counter()

        def told(event: Event) -> None:
            self.listen(event)
            if isinstance(event, VerdictsDone):
                report.result, report.notice = event.run, event.notice
                report.seconds = time.perf_counter() - started
                report.fingerprinting = not event.run.passed and self.on_fingerprint is not None
                self.on_regrade(report)  # the verdict is on screen; the finding follows

        try:
            # theinference.toml or a stage file changed, or the course directory is back: its settings again
            self.session.reload(settings=BACK in changed or any(p.endswith(".toml") for p in changed))
            done = self.session.run(choose_stages(self.session, self.stage_ids), told)
        except (ConfigError, OSError) as e:
            report.error = str(e)
            if report.result is None:  # nothing shown yet: the error is the screen
                report.seconds = time.perf_counter() - started
                self.on_regrade(report)
                return report
        else:
            if report.fingerprinting:
                report.unmatched, report.result = report.result, done
        if report.fingerprinting:
            assert self.on_fingerprint is not None
            report.unmatched = report.unmatched or report.result
            report.fingerprinting = False
            self.on_fingerprint(report)
        return report

    def loop(self, stop: threading.Event) -> None:
        """Grade once, then re-grade on every burst of changes until `q` or stop is set."""
        self.regrade([])
        while not stop.is_set():
            if self._root_replaced():
                if not self._wait_for_root(stop):
                    return
                self.regrade([BACK])
                continue
            try:
                kind, value = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            if kind == "key" and value in ("q", "quit", "eof"):
                if value != "eof":
                    return
                continue
            changed = self._drain_burst(value) if kind == "file" else ["(Enter)"]
            if not self._root_replaced():  # never grade a path that has just gone away
                self.regrade(changed)
